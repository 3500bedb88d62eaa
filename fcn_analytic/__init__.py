"""Analytic feature recovery (soft-label paper, Wang, Liang & He 2024, §4.2).

``last_layer_features(capture, label_result)`` returns the input of the last layer of one sample;
``invert(capture, label_result)`` reconstructs the whole input of a fully-connected net layer by layer
(eq. 6–7) and returns it in pixel space.
"""

from __future__ import annotations

from fcn_analytic.features import feature_source, last_layer_features, output_gradient
from fcn_analytic.invert import ACTIVATION_DERIVATIVES, FCNInversion, LayerReport, fc_layers, invert

__all__ = [
    "ACTIVATION_DERIVATIVES",
    "FCNInversion",
    "LayerReport",
    "fc_layers",
    "feature_source",
    "invert",
    "last_layer_features",
    "output_gradient",
]
