"""Image priors and auxiliary terms (registry): ``fn(images (R, B, C, H, W), ctx) -> (R,)``.

``ctx`` is the :class:`gi.recon.module.Context` of the attack (model, recovered features, …); it never
holds ground truth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kornia
import torch

Tensor = torch.Tensor
Regularizer = Callable[[Tensor, Any], Tensor]
REGULARIZERS: dict[str, Regularizer] = {}


def register_regularizer(name: str) -> Callable[[Regularizer], Regularizer]:
    def wrap(fn: Regularizer) -> Regularizer:
        REGULARIZERS[name] = fn
        return fn

    return wrap


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
    """kornia.losses.total_variation (sum of absolute differences), normalised by pixel count."""
    flat, r = _merge(x)
    tv = kornia.losses.total_variation(flat, reduction="sum") / flat[0].numel()
    return tv.reshape(r, -1).mean(1)


@register_regularizer("l2")
def l2_norm(x: Tensor, ctx: Any = None) -> Tensor:
    """Mean squared pixel value (centred at 0.5, the box's midpoint)."""
    return (x - 0.5).pow(2).mean(dim=(1, 2, 3, 4))
