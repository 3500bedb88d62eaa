"""Initial images (registry): ``fn(shape, generator, prior, noise) -> (N, R, B, C, H, W)`` in [0, 1].

``shape`` is (N problems, R restarts, B, C, H, W); ``prior`` (N, B, C, H, W) is an attack-side estimate of the
images (``analytic``: ``fcn_analytic.invert`` of a fully-connected net or an invertible conv body) or None.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gi.core.errors import ConfigError
from gi.core.registry import registrar

Tensor = torch.Tensor
Init = Callable[[tuple[int, ...], torch.Generator, Tensor | None, float], Tensor]
INITS: dict[str, Init] = {}


register_init = registrar(INITS, "init")


@register_init("uniform")
def uniform_init(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor | None, noise: float) -> Tensor:
    """U(0, 1) pixels (DLG's ``torch.rand``)."""
    return torch.rand(shape, generator=generator)


@register_init("gaussian")
def gaussian_init(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor | None, noise: float) -> Tensor:
    """N(0.5, 0.25²) clipped to [0, 1] (Inverting Gradients' ``randn`` in normalised space, read in pixels)."""
    return (0.5 + 0.25 * torch.randn(shape, generator=generator)).clamp(0, 1)


@register_init("constant")
def constant_init(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor | None, noise: float) -> Tensor:
    """Every pixel 0.5 (every restart identical unless ``noise`` > 0 is added to restarts after the first)."""
    out = torch.full(shape, 0.5)
    if noise > 0 and shape[1] > 1:
        out[:, 1:] += noise * torch.randn(out[:, 1:].shape, generator=generator)
    return out.clamp(0, 1)


@register_init("analytic")
def analytic_init(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor | None, noise: float) -> Tensor:
    """The analytic inversion (soft-label paper §4.2, eq. 6–7) for restart 0; restarts r ≥ 1 add N(0, noise²)."""
    if prior is None:
        raise ConfigError("attack.init=analytic needs an analytic image estimate: it exists for one sample of a "
                          "net fcn_analytic.invert covers (fully connected, or convs with invertible activations); "
                          "use init=uniform otherwise")
    return _from_prior(shape, generator, prior, noise)


@register_init("aux-mean")
def aux_mean_init(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor | None, noise: float) -> Tensor:
    """Every slot starts at the mean of the attacker's aux images (the ``aux-span`` prior's μ,
    :func:`gi.attack.recon.problem.aux_span`); restarts r ≥ 1 add N(0, noise²)."""
    if prior is None:
        raise ConfigError("attack.init=aux-mean needs the attacker's aux images: set aux.per_class > 0")
    return _from_prior(shape, generator, prior, noise)


def _from_prior(shape: tuple[int, ...], generator: torch.Generator, prior: Tensor, noise: float) -> Tensor:
    """``prior`` (per problem: one image per slot, or one for every slot) as the start of every restart of shape
    (N, R, B, C, H, W); restarts r ≥ 1 add N(0, noise²); clamped to the box."""
    n, r = shape[:2]
    out = prior.float().reshape(n, 1, -1, *shape[3:]).expand(shape).clone()
    if r > 1 and noise > 0:
        out[:, 1:] += noise * torch.randn(out[:, 1:].shape, generator=generator)
    return out.clamp(0, 1)
