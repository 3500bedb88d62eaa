"""Noise and clipping on what a client shares (the DP family of Abadi et al. 2016 and the soft-label paper §5.2).

``clip``: the global L2 norm of the shared tensors clipped to C. ``gaussian`` / ``laplace``: zero-mean noise of
standard deviation σ on every shared tensor (Laplace of scale b = σ/√2, so both have variance σ²); with
``on: gradient`` an update gets ``η·σ`` (σ on the gradient-like ``−Δθ/η``). ``gaussian-step``: N(0, σ²) on every
local step's batch-summed gradient, i.e. ``σ/|B|`` on the mean gradient (DP-SGD style noise without per-example
clipping, as RLU §4.10 cites; the legacy ``dp_scale: step``). These were ``gi.world.fl.dp.privatize`` and
``step_noise``;
the legacy ``Protocol.dp_*`` fields map onto them (:func:`gi.world.fl.defences.base.specs`) and draw the same numbers.
"""

from __future__ import annotations

import math
from typing import Any

from gi.world.fl.defences.base import Context, Spec, register_defence

ON = ("shared", "gradient")


def noise_like(t: Any, kind: str, std: float, generator: Any) -> Any:
    """Zero-mean noise of standard deviation ``std`` shaped like ``t``: ``gaussian`` or ``laplace`` (inverse CDF,
    scale ``std/√2``)."""
    import torch

    if kind == "gaussian":
        return torch.randn(t.shape, generator=generator, dtype=t.dtype) * std
    u = torch.rand(t.shape, generator=generator, dtype=t.dtype) - 0.5
    return -(std / math.sqrt(2.0)) * u.sign() * torch.log((1 - 2 * u.abs()).clamp_min(torch.finfo(t.dtype).tiny))


def _shared_noise(kind: str, shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    on = spec.params["on"]
    if on not in ON:
        from gi.core.errors import ConfigError

        raise ConfigError(f"defence {spec.name}: params.on={on!r}; valid: {list(ON)}")
    std = spec.strength * (ctx.protocol.lr if on == "gradient" and ctx.protocol.is_update else 1.0)
    if std == 0:
        return dict(shared)
    return {k: t + noise_like(t, kind, std, ctx.generator) for k, t in shared.items()}


@register_defence("gaussian", "shared", "zero-mean Gaussian noise on every shared tensor (on: shared | gradient)",
                  "σ, the noise standard deviation", on="shared")
def gaussian(shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    return _shared_noise("gaussian", shared, spec, ctx)


@register_defence("laplace", "shared", "zero-mean Laplace noise (scale σ/√2) on every shared tensor",
                  "σ, the noise standard deviation", on="shared")
def laplace(shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    return _shared_noise("laplace", shared, spec, ctx)


@register_defence("clip", "shared", "clip the global L2 norm of the shared tensors", "C, the norm bound",
                  valid=lambda s: s > 0, valid_text="> 0")
def clip(shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    norm = math.sqrt(float(sum((t.double() ** 2).sum() for t in shared.values())))
    factor = min(1.0, spec.strength / max(norm, 1e-12))
    return {k: t * factor for k, t in shared.items()}


@register_defence("gaussian-step", "step", "N(0, σ²) on every local step's batch-summed gradient (σ/|B| on the mean)",
                  "σ, the noise standard deviation on the summed gradient")
def gaussian_step(grads: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    if spec.strength == 0:
        return grads
    std = spec.strength / ctx.batch_size
    return {k: g + noise_like(g, "gaussian", std, ctx.generator) for k, g in grads.items()}
