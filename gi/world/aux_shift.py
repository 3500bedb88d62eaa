"""Distribution shifts of the attacker's aux images: a registry of image transforms (``aux.shift``).

RLU (Chen & Vikalo 2024, §4.7, Table 5) estimates the moments of the output logits (its Assumption 3.1) from
an aux set drawn from a *shifted* distribution: CIFAR-10.1 or CIFAR-10.2, new images collected the way CIFAR-10
was, against models trained on CIFAR-10. Those sets are not bundled offline, so a shift is made here from the
aux images themselves: each entry of :data:`AUX_SHIFTS` maps pixel images in [0, 1], ``(N, C, H, W)``, and a
``strength`` ≥ 0 (0: the images unchanged) to shifted images in [0, 1]. The labels are kept: it is a covariate
shift, as that of the paper's reproduced test sets. Add one with ``@register_aux_shift("name")``; its name must
also be listed in :data:`gi.core.names.AUX_SHIFTS` (configs are checked against it without torch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gi.core.errors import ConfigError
from gi.core.registry import registrar

Tensor = torch.Tensor
AuxShift = Callable[[Tensor, float, torch.Generator], Tensor]

AUX_SHIFTS: dict[str, AuxShift] = {}
register_aux_shift = registrar(AUX_SHIFTS, "aux shift")


@register_aux_shift("contrast")
def lower_contrast(images: Tensor, strength: float, generator: torch.Generator) -> Tensor:
    """Every image's contrast divided by ``1 + strength`` about its own mean pixel value (a photometric shift)."""
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    return mean + (images - mean) / (1.0 + strength)


@register_aux_shift("noise")
def add_gaussian_noise(images: Tensor, strength: float, generator: torch.Generator) -> Tensor:
    """Pixel noise N(0, strength²), i.i.d., drawn with ``generator``, clipped to [0, 1] (a sensor shift)."""
    noise = torch.randn(images.shape, generator=generator, dtype=images.dtype)
    return (images + strength * noise).clamp(0.0, 1.0)


@register_aux_shift("blur")
def gaussian_blur(images: Tensor, strength: float, generator: torch.Generator) -> Tensor:
    """A Gaussian blur of standard deviation ``strength`` pixels per channel (kernel radius ⌈3σ⌉, at most the
    image's side; edges replicated; an optics / resampling shift)."""
    if strength == 0:
        return images
    n, c, h, w = images.shape
    # ⌈3σ⌉, bounded by the image: a wider kernel only repeats the replicated edge (and a huge σ from a config
    # must not allocate a huge kernel)
    radius = max(1, min(int(torch.tensor(3.0 * strength).ceil()), max(h, w)))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype)
    kernel = torch.exp(-0.5 * (x / strength) ** 2)
    kernel = kernel / kernel.sum()
    flat = images.reshape(n * c, 1, h, w)
    flat = torch.nn.functional.pad(flat, (radius, radius, 0, 0), mode="replicate")
    flat = torch.nn.functional.conv2d(flat, kernel.view(1, 1, 1, -1))
    flat = torch.nn.functional.pad(flat, (0, 0, radius, radius), mode="replicate")
    flat = torch.nn.functional.conv2d(flat, kernel.view(1, 1, -1, 1))
    return flat.reshape(n, c, h, w)


def shift_images(images: Tensor, shift: str, strength: float, generator: torch.Generator) -> Tensor:
    """``images`` under the registered shift ``shift`` of ``strength`` (see the module docstring); a
    :class:`ConfigError` naming ``aux.shift`` / ``aux.shift_strength`` for an unknown shift or a negative or
    non-finite strength."""
    if shift not in AUX_SHIFTS:
        raise ConfigError(f"aux.shift={shift!r}: unknown aux shift; valid: {sorted(AUX_SHIFTS)}")
    if not (isinstance(strength, int | float) and 0 <= strength < float("inf")):
        raise ConfigError(f"aux.shift_strength={strength!r}: must be a finite number >= 0")
    return AUX_SHIFTS[shift](images, float(strength), generator).contiguous()
