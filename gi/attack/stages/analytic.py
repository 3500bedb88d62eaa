"""When the features stage's analytic inversion (``fcn_analytic.invert``) answers a capture, when it only starts the
optimisation, and when it is neither (docs/architecture.md "How to add", the analytic inversion): read by the
features and reconstruct stages alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages.result import ANALYTIC_ANSWER

if TYPE_CHECKING:
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture
    from gi.label_result import LabelResult


# an inversion whose largest layer residual is at or above this is not used as a start either: rank-deficient
# layers (a ReLU LeNet's dead units) gave residuals of 0.46–40 and 4.7–5.5 dB images, below a random image's 8 dB,
# where gradient noise of 1e-2 of each gradient's std gave 0.11–0.12 and 13–18 dB (research/analytic_noise.py)
INIT_MAX_RESIDUAL = 0.3


def unusable_above(attack: ReconConfig) -> float:
    """The largest layer residual at or above which an inversion is neither the answer (``attack.analytic_tol``)
    nor the start (:data:`INIT_MAX_RESIDUAL`) of :func:`reconstruct_stage`: the features stage stops its walk there."""
    return max(INIT_MAX_RESIDUAL, attack.analytic_tol)


def inversion_residual(inversion: Any) -> float:
    """The largest relative residual of an ``fcn_analytic.invert`` result over its layers: each layer's gradient
    residual (rank-one for a Linear layer, the weight gradient's for a convolution) and its forward mismatch
    (0 up to rounding when the inversion is exact)."""
    from fcn_analytic import layer_error

    return max(layer_error(r) for r in inversion.layers)


def answers(attack: ReconConfig, residual: float | None) -> bool:
    """Whether an inversion of largest layer residual ``residual`` (None: no inversion) is the capture's answer
    (below ``attack.analytic_tol``): :func:`reconstruct_stage` optimises the other captures."""
    return residual is not None and residual < attack.analytic_tol


def analytic_reconstruction(inversion: Any, label_result: LabelResult | None, capture: Capture) -> Reconstruction:
    """A :class:`~gi.attack.recon.Reconstruction` holding ``fcn_analytic.invert``'s image (no optimisation)."""
    import torch

    from gi.attack.recon import Reconstruction
    from gi.attack.recon.problem import labels_for_slots

    image = inversion.image.float()
    soft = labels_for_slots(label_result, capture.num_samples, capture.num_classes)
    residual = inversion_residual(inversion)
    return Reconstruction(images=image, all_images=image[None], labels=soft,
                          objective=torch.tensor([residual]), best_restart=0,
                          history={"step": [], "objective": [], "warnings": [], "answered_by": ANALYTIC_ANSWER,
                                   "analytic_residual": residual},
                          seconds=float(inversion.info["seconds"]), iterations=0, all_labels=soft[None])
