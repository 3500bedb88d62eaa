"""The last-layer feature of one sample and the gradient of the loss w.r.t. the logits.

For one sample ``∇W = δ xᵀ`` and ``∇b = δ`` (soft-label paper eq. 2), so ``x`` follows from the bias
gradient (Aono et al. 2017; the paper's §2), or, without a bias, from the recovered scalar λ: ``x = λ·g_r``
(§3.1). δ then follows from ``∇W x = δ‖x‖²``.
"""

from __future__ import annotations

import torch

from gi.capture import Capture
from gi.core.errors import CaptureError, GIError
from gi.label_result import LabelResult

Tensor = torch.Tensor


def last_layer_features(capture: Capture, label_result: LabelResult | None = None) -> Tensor:
    """The input ``x`` (1, D) of the last layer, float64.

    Sources, in order: ``label_result.features`` (``soft-lambda``'s ``λ·g_r``); the shared bias gradient
    ``x = ∇Wᵀ∇b/‖∇b‖²`` (every row of ∇W is ``∇b_r·x``); or a λ fitted to ``label_result.soft`` (eq. 4
    solved for the label another method recovered). Raises :class:`GIError` when none applies.
    """
    return feature_source(capture, label_result)[0]


def feature_source(capture: Capture, label_result: LabelResult | None = None) -> tuple[Tensor, str]:
    """:func:`last_layer_features` and where they came from: ``label-result`` | ``bias`` | ``fitted-lambda``."""
    if capture.num_samples != 1:
        raise GIError(f"last-layer features are analytic for one sample; this capture holds {capture.num_samples}")
    gw, gb = capture.last_layer(torch.float64)
    features = None if label_result is None else label_result.features
    if features is not None:
        features = features.to(torch.float64).reshape(1, -1)
        if features.shape[1] != gw.shape[1]:
            raise CaptureError(f"label result features have {features.shape[1]} entries; the last layer takes "
                               f"{gw.shape[1]}: result and capture differ")
        return features, "label-result"
    if gb is not None and torch.any(gb != 0):
        return (gw.T @ gb / gb.dot(gb)).view(1, -1), "bias"
    soft = None if label_result is None else label_result.soft
    if soft is not None:
        from labels.soft_label import fit_lambda, row_of

        lam, _ = fit_lambda(capture, soft.reshape(-1))
        return (lam * gw[row_of(capture)]).view(1, -1), "fitted-lambda"
    raise GIError("no last-layer feature: the label result has neither features nor soft labels and the capture "
                  "shares no last-layer bias gradient; run labels.recover(capture, 'soft-lambda') first")


def output_gradient(capture: Capture, features: Tensor) -> Tensor:
    """δ = ∂L/∂z (C,) of the last layer: ∇b when shared, else the least-squares ``∇W x/‖x‖²`` (eq. 7 read
    row-wise: every row of ∇W is ``δ_i·xᵀ``)."""
    gw, gb = capture.last_layer(torch.float64)
    if gb is not None:
        return gb
    x = features.reshape(-1).to(torch.float64)
    norm = x.dot(x)
    if norm == 0:
        raise GIError("last-layer feature is zero; δ cannot be read from ∇W")
    return gw @ x / norm
