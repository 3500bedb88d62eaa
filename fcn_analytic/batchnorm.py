"""A client's BatchNorm batch statistics from the buffers a FedAvg update carries (one local step: exactly).

A client in train mode updates every BatchNorm layer's running buffers with its batch's per-channel mean μ_B and
unbiased variance s²_B (PyTorch's rule, momentum m):

    r₁ = (1 − m) r₀ + m μ_B,        v₁ = (1 − m) v₀ + m s²_B,        s²_B = σ²_B · n / (n − 1),

with n = B·H·W the values per channel of the layer's input (B samples of H × W maps) and σ²_B the biased variance
the normalisation itself divides by. A FedAvg client sends its ``state_dict``, buffers included, so the server holds
r₀, v₀ (θᵗ) and r₁, v₁ (:attr:`gi.Capture.buffers`), and one local step gives

    μ_B = (r₁ − (1 − m) r₀) / m,    σ²_B = (v₁ − (1 − m) v₀) / m · (n − 1) / n

(with ``momentum=None``, the cumulative average of t = ``num_batches_tracked`` batches: μ_B = r₀ + t (r₁ − r₀)).
With these fixed, the client's forward no longer couples its samples (LeakPro's BatchNorm example; Huang et al.,
NeurIPS 2021, show attacks weaken without them).

After k > 1 local steps the buffers give one equation per channel for k unknown batch means,
r_k = (1 − m)^k r₀ + Σ_j m (1 − m)^{k−1−j} μ_j: a weighted sum of the steps' statistics, not any one of them.
:func:`batch_statistics` then refuses, naming k.
"""

from __future__ import annotations

import math

import torch

from gi.capture import Capture
from gi.core.errors import CaptureError
from gi.world.fl.local import local_schedule

Tensor = torch.Tensor
BatchStats = dict[str, tuple[Tensor, Tensor]]


def _inputs_per_channel(capture: Capture, model: torch.nn.Module, names: list[str]) -> dict[str, int]:
    """H·W of every named BatchNorm layer's input, from one forward pass of a zero image in eval mode."""
    shapes: dict[str, torch.Size] = {}
    hooks = [model.get_submodule(n).register_forward_pre_hook(
        lambda m, a, n=n: shapes.__setitem__(n, a[0].shape)) for n in names]
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, *capture.model_spec["in_shape"]))
    finally:
        for h in hooks:
            h.remove()
    return {n: math.prod(shapes[n][2:]) for n in names}


def batch_statistics(capture: Capture) -> BatchStats:
    """Every BatchNorm layer's batch ``(mean, biased var)`` of the client's one local step, float64, from the
    capture's buffers before (``model_state``) and after (``buffers``) the round (module docstring). A
    :class:`CaptureError` says why where they are not given: no buffers, no BatchNorm layer, a client in eval mode
    (the buffers did not move), or k > 1 local steps (one equation per channel for k batch statistics)."""
    if not capture.is_update:
        raise CaptureError("batch statistics come from an update's buffers; this capture holds FedSGD gradients")
    if not capture.buffers:
        raise CaptureError("this capture carries no buffers after the round (a FedAvg client's state_dict sends "
                           "them: Capture.from_update with full state dicts, or gi.simulate_client in train mode)")
    model = capture.model()
    capture.validate(model)  # the buffers' names and shapes are the model's (a file's are read as they come)
    layers = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
              and m.track_running_stats]
    if not layers:
        raise CaptureError(f"model {capture.model_spec.get('name')!r} has no BatchNorm layer with running statistics")
    missing = [f"{n}.{b}" for n in layers for b in ("running_mean", "running_var")
               if f"{n}.{b}" not in capture.buffers or f"{n}.{b}" not in capture.model_state]
    if missing:
        raise CaptureError(f"the capture lacks the buffer(s) {missing[:3]} before or after the round")
    steps = {int(capture.buffers[f"{n}.num_batches_tracked"]) - int(capture.model_state[f"{n}.num_batches_tracked"])
             for n in layers if f"{n}.num_batches_tracked" in capture.buffers}
    if steps == {0}:
        raise CaptureError("the BatchNorm buffers did not move: the client trained in eval mode (no batch statistics "
                           "are used or shared)")
    k = max(steps) if steps else len(local_schedule(capture.protocol, capture.num_samples))
    if k != 1:
        raise CaptureError(f"the client ran {k} local steps in train mode: its buffers give one weighted sum of the "
                           f"{k} steps' batch statistics per channel, not the statistics of any one step")
    batch = local_schedule(capture.protocol, capture.num_samples)[0]
    spatial = _inputs_per_channel(capture, model, layers)
    out: BatchStats = {}
    for name in layers:
        module = model.get_submodule(name)
        r0, v0 = (capture.model_state[f"{name}.{b}"].double() for b in ("running_mean", "running_var"))
        r1, v1 = (capture.buffers[f"{name}.{b}"].double() for b in ("running_mean", "running_var"))
        if module.momentum is None:  # cumulative average over t batches
            t = int(capture.buffers[f"{name}.num_batches_tracked"])
            mean, unbiased = r0 + t * (r1 - r0), v0 + t * (v1 - v0)
        else:
            m = float(module.momentum)
            mean, unbiased = (r1 - (1 - m) * r0) / m, (v1 - (1 - m) * v0) / m
        n = batch * spatial[name]
        out[name] = (mean, unbiased * (n - 1) / n if n > 1 else torch.zeros_like(unbiased))
    return out
