"""Per-sample labels of a FedSGD batch, or of a one-epoch FedAvg round of plain SGD, from a disaggregated
fully-connected layer.

A net whose first ``nn.Linear`` sees a ReLU / max-pool map shares that layer's gradient ``∇W = Δ Xᵀ``; its B
inputs X are the extreme rays of the nonnegative cone in ∇W's row space
(:func:`fcn_analytic.disaggregate.linear_inputs`: vertices by linear programs, SPEAR's sparsity sampling as the
fallback; Dimitrov et al. 2024 sample the other factor). Forwarded through the rest of the net, they give each
sample's logits z_i and last-layer input h_i, and the last layer's gradient ``∇W_L = (1/B) Σ_i δ_i h_iᵀ`` gives
each sample's output error δ_i (:func:`fcn_analytic.disaggregate.sample_errors`). For the cross-entropy loss
``δ_i = softmax(z_i) − y_i``, so the label of every sample, hard or soft (label smoothing included), is
``y_i = softmax(z_i) − δ_i`` (``softmax(z_i/T) − T·δ_i`` under a softmax temperature T): per image, not only the
batch's counts, and without aux data. A FedAvg update of plain SGD over one local epoch reads the same way: its
``−ΔW/η`` sums the steps' batch gradients, each sample once, at its own step's parameters
(:func:`fcn_analytic.disaggregate.summed_layer`); the logits are then those at θᵗ, an approximation by the
parameters' drift over the round.
"""

from __future__ import annotations

import torch

from gi.capture import Capture
from gi.core.errors import GIError
from gi.label_result import LabelResult
from labels.base import register


@register("fc-inputs", "per-sample labels of a FedSGD batch or a one-epoch plain-SGD FedAvg round: the first Linear "
                       "layer's inputs from its gradient, each sample's output error from the last layer's, "
                       "y = softmax(z) − δ (cross-entropy)")
def recover_fc_inputs(capture: Capture, aux=None, layer: str | None = None, draws: int = 1_000_000) -> LabelResult:
    """The labels of every sample of a FedSGD batch (module docstring); ``layer`` the Linear layer to disaggregate
    (default: the model's first); ``draws`` the budget of the sampling that looks for inputs the vertex search
    missed. ``ok=False`` with the reason where it does not apply: an update of another optimiser or of more than
    one epoch, one sample, a loss other than cross-entropy, a layer without shared weight and bias gradients,
    inputs not found."""
    from fcn_analytic.disaggregate import first_linear, linear_inputs, sample_errors, summed_layer

    c = capture.num_classes
    if capture.protocol.loss != "ce":
        return LabelResult.failure("fc-inputs", c, f"y = softmax(z) − δ holds for the cross-entropy loss, not "
                                                   f"protocol.loss={capture.protocol.loss!r}")
    name = layer or first_linear(capture.model())
    summed = None if name is None or name == capture.last_layer_name else summed_layer(capture, name)
    if summed is None:
        return LabelResult.failure("fc-inputs", c, f"no fully-connected layer before the last with shared weight "
                                                   f"and bias gradients, or an update that is not a plain sum of "
                                                   f"SGD steps (layer {name!r})")
    if not summed.once:
        return LabelResult.failure("fc-inputs", c, "an update of more than one local epoch: each sample's visits "
                                                   "differ by the parameters' drift, so they are not one input each")
    if summed.samples < 2:
        return LabelResult.failure("fc-inputs", c, "one sample: its layer input is ∇Wᵀ∇b/‖∇b‖²; use soft-lambda")
    try:
        found = linear_inputs(summed.weight, summed.bias, summed.samples, samples=draws, **summed.tolerances)
    except GIError as exc:
        return LabelResult.failure("fc-inputs", c, str(exc))
    logits, errors = sample_errors(capture, name, found.inputs, summed.per_mean)
    t = float(capture.protocol.temperature)  # δ = (softmax(z/T) − y)/T
    soft = (torch.softmax(logits / t, 1) - t * errors).clamp(0, 1)
    soft = soft / soft.sum(1, keepdim=True).clamp_min(1e-12)
    counts = torch.bincount(soft.argmax(1), minlength=c)
    return LabelResult.from_counts("fc-inputs", counts, soft=soft.float(),
                                   info={"layer": name, "residual": found.residual, "draws": found.draws})
