"""Compression defences on what a client shares: top-k sparsification (pruning) and quantisation.

``topk``: in every shared tensor (``scope: tensor``) or over all of them (``scope: global``) the fraction p of
entries of smallest magnitude is set to 0 (gradient pruning, Zhu et al. 2019 §6). ``quantize``: uniform
symmetric quantisation of every shared tensor to ``bits`` bits, ``2^(bits−1) − 1`` levels each side of 0 on
``[−max|t|, max|t|]`` (round to nearest, or unbiased stochastic rounding); 1 bit is signSGD with the mean magnitude.
"""

from __future__ import annotations

from typing import Any

from gi.world.fl.defences.base import Context, Spec, register_defence

SCOPES = ("tensor", "global")


@register_defence("topk", "shared", "zero the fraction p of smallest-magnitude shared entries (scope: tensor | "
                  "global)", "p, the pruned fraction", valid=lambda s: 0 <= s < 1, valid_text="in [0, 1)",
                  scope="tensor")
def topk(shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    import torch

    scope, p = spec.params["scope"], spec.strength
    if scope not in SCOPES:
        from gi.core.errors import ConfigError

        raise ConfigError(f"topk params.scope={scope!r}; valid: {list(SCOPES)}")
    if p == 0:
        return dict(shared)

    def threshold(values: Any) -> Any:
        k = int(p * values.numel())  # entries dropped
        return values.abs().flatten().kthvalue(k).values if k > 0 else values.new_tensor(-1.0)

    if scope == "global":
        cut = threshold(torch.cat([t.flatten() for t in shared.values()]))
        return {k: torch.where(t.abs() > cut, t, torch.zeros_like(t)) for k, t in shared.items()}
    return {k: torch.where(t.abs() > threshold(t), t, torch.zeros_like(t)) for k, t in shared.items()}


@register_defence("quantize", "shared", "uniform symmetric quantisation of every shared tensor (stochastic rounding "
                  "optional)", "bits per entry", valid=lambda s: s >= 1 and float(s).is_integer(),
                  valid_text="an integer >= 1", stochastic=False)
def quantize(shared: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    import torch

    bits = int(spec.strength)
    out = {}
    for k, t in shared.items():
        scale = t.abs().max()
        if bits == 1 or scale == 0:
            out[k] = t.sign() * t.abs().mean()
            continue
        levels = 2 ** (bits - 1) - 1
        x = t / scale * levels
        if spec.params["stochastic"]:
            low = x.floor()
            x = low + (torch.rand(t.shape, generator=ctx.generator, dtype=t.dtype) < (x - low)).to(t.dtype)
        else:
            x = x.round()
        out[k] = x / levels * scale
    return out
