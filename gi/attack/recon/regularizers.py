"""Image priors and auxiliary terms of the objective: entries of :data:`gi.attack.recon.terms.TERMS` weighted by
``attack.regularizers``, ``fn(images (P, B, C, H, W), ctx) -> (P,)``.

P counts the batched problems (captures × restarts). ``ctx`` is the :class:`gi.attack.recon.terms.Evaluation` of the
step (``ctx.model``, ``ctx.bn_targets`` the threat model grants, …; a :class:`gi.attack.recon.problem.Problem` serves
too); it never holds ground truth.
"""

from __future__ import annotations

from typing import Any

import kornia
import torch

from gi.attack.recon.term_table import REGULARIZERS, Term, register_regularizer
from gi.core.errors import ConfigError

Tensor = torch.Tensor
Regularizer = Term
__all__ = ["REGULARIZERS", "Regularizer", "register_regularizer"]


def _merge(x: Tensor) -> tuple[Tensor, int]:
    r = x.shape[0]
    return x.reshape(-1, *x.shape[2:]), r


@register_regularizer("tv")
def total_variation(x: Tensor, ctx: Any = None) -> Tensor:
    """Anisotropic TV in breaching's mean convention: mean|∂x| + mean|∂y| per image, averaged over the batch."""
    flat, r = _merge(x)
    dx = (flat[..., :, 1:] - flat[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    dy = (flat[..., 1:, :] - flat[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return (dx + dy).reshape(r, -1).mean(1)


@register_regularizer("tv-iso")
def total_variation_isotropic(x: Tensor, ctx: Any = None) -> Tensor:
    """Isotropic TV, mean over pixels of sqrt(∂x² + ∂y² + 1e-8) (kornia's spatial gradient)."""
    flat, r = _merge(x)
    g = kornia.filters.spatial_gradient(flat, mode="diff", order=1)  # (N, C, 2, H, W)
    mag = (g.pow(2).sum(2) + 1e-8).sqrt().mean(dim=(1, 2, 3))
    return mag.reshape(r, -1).mean(1)


@register_regularizer("tv-kornia")
def total_variation_kornia(x: Tensor, ctx: Any = None) -> Tensor:
    """kornia.losses.total_variation: sum of absolute differences over channels and pixels (kornia returns one
    value per channel), normalised by the image's entry count, averaged over the batch."""
    flat, r = _merge(x)
    tv = kornia.losses.total_variation(flat, reduction="sum").sum(-1) / flat[0].numel()
    return tv.reshape(r, -1).mean(1)


@register_regularizer("l2")
def l2_norm(x: Tensor, ctx: Any = None) -> Tensor:
    """Mean squared pixel value (centred at 0.5, the box's midpoint)."""
    return (x - 0.5).pow(2).mean(dim=(1, 2, 3, 4))


@register_regularizer("l2-norm")
def l2_norm_raw(x: Tensor, ctx: Any = None) -> Tensor:
    """Mean squared pixel value ‖x‖²/n (Inverting Gradients' and GradAttack's ``l2`` prior, not centred)."""
    return x.pow(2).mean(dim=(1, 2, 3, 4))


@register_regularizer("bn")
def bn_statistics(x: Tensor, ctx: Any = None) -> Tensor:
    """BatchNorm-statistics matching (DeepInversion, Yin et al. 2020, eq. 4; GradInversion's R_BN):
    Σ_l ‖μ_l(x) − μ_l*‖₂ + ‖σ²_l(x) − σ²_l*‖₂ over the BatchNorm layers, with μ_l, σ²_l the per-channel batch
    mean and (biased) variance of each problem's B images at the layer's input.

    The targets ``ctx.bn_targets`` ({module: (mean, var)}, each (1 or P, C)) are what the threat model grants:
    the client's batch statistics shared with the capture, or the model's running statistics
    (``attack.bn_stats``). Costs one extra forward pass.
    """
    targets = getattr(ctx, "bn_targets", None)
    if not targets:
        raise ConfigError("the bn regulariser needs BatchNorm statistics: the model has no BatchNorm layer, or the "
                          "capture shares no batch statistics (set attack.bn_stats=running to use the model's)")
    p, b = x.shape[:2]
    modules = dict(ctx.model.named_modules())
    seen: dict[str, Tensor] = {}
    hooks = [modules[name].register_forward_hook(lambda m, inp, out, name=name: seen.__setitem__(name, inp[0]))
             for name in targets]
    try:
        ctx.model(x.reshape(p * b, *x.shape[2:]))
    finally:
        for h in hooks:
            h.remove()
    total = 0.0
    for name, (mean_t, var_t) in targets.items():
        a = seen[name].reshape(p, b, *seen[name].shape[1:])
        dims = (1,) + tuple(range(3, a.ndim))  # batch and spatial dims of (P, B, C, ...)
        mean = a.mean(dim=dims)
        var = a.var(dim=dims, unbiased=False)
        total = total + (mean - mean_t).norm(dim=1) + (var - var_t).norm(dim=1)
    return total


@register_regularizer("aux-span")
def aux_span_distance(x: Tensor, ctx: Any = None) -> Tensor:
    """An image prior fitted on the attacker's aux set: ‖(I − PᵀP)(x − μ)‖² per image, the squared distance of x from
    the affine span of the aux images (μ their mean, P their top ``attack.aux_rank`` principal directions,
    :func:`gi.attack.recon.problem.aux_span`), summed over pixels and averaged over the batch. It keeps the
    reconstruction near images of the kind the aux set holds where the gradient leaves it free (a feature map
    that does not pin the image: docs/results/realistic.md, S4)."""
    span = getattr(ctx, "aux_span", None)
    if span is None:
        raise ConfigError("the aux-span regulariser needs the attacker's aux images (aux.per_class > 0)")
    mu, basis = span
    p, b = x.shape[:2]
    d = x.reshape(p, b, -1) - mu
    off = d - (d @ basis.T) @ basis
    return off.pow(2).sum(-1).mean(1)
