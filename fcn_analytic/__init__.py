"""Analytic feature recovery (soft-label paper, Wang, Liang & He 2024, §4.2).

``last_layer_features(capture, label_result)`` returns the input of the last layer of one sample;
``invert(capture, label_result)`` reconstructs the whole input of a fully-connected net layer by layer
(eq. 6–7), or of a convolutional body with invertible activations (R-GAP's recursive step, ``fcn_analytic.conv``),
and returns it in pixel space.
"""

from __future__ import annotations

from fcn_analytic.activations import ACTIVATION_DERIVATIVES, ACTIVATION_INVERSES
from fcn_analytic.features import feature_source, last_layer_features, output_gradient
from fcn_analytic.invert import AnalyticLayer, FCNInversion, LayerReport, analytic_layers, invert, layer_error

__all__ = [
    "ACTIVATION_DERIVATIVES",
    "ACTIVATION_INVERSES",
    "AnalyticLayer",
    "FCNInversion",
    "LayerReport",
    "analytic_layers",
    "feature_source",
    "invert",
    "layer_error",
    "last_layer_features",
    "output_gradient",
]
