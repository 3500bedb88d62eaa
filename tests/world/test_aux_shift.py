"""The aux set's distribution shifts (`aux.shift`, RLU §4.7 Table 5): the transforms, draw_aux, the config checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gi.core import names
from gi.core.errors import ConfigError
from gi.world.aux_shift import AUX_SHIFTS, shift_images
from gi.world.build import draw_aux
from gi.world.data import ImageDataset
from gi.world.setup import AuxConfig


def _images(seed: int = 0) -> torch.Tensor:
    return torch.rand(6, 3, 12, 12, generator=torch.Generator().manual_seed(seed))


def _dataset() -> ImageDataset:
    return ImageDataset(torch.rand(40, 1, 8, 8, generator=torch.Generator().manual_seed(3)),
                        torch.arange(4).repeat(10), 4, name="toy")


@pytest.mark.parametrize("shift", sorted(AUX_SHIFTS))
def test_every_shift_keeps_shape_and_range_and_is_the_identity_at_strength_zero(shift):
    x = _images()
    assert torch.allclose(shift_images(x, shift, 0.0, torch.Generator().manual_seed(1)), x, atol=1e-6)
    y = shift_images(x, shift, 0.5, torch.Generator().manual_seed(1))
    assert y.shape == x.shape and float(y.min()) >= 0 and float(y.max()) <= 1
    assert float((y - x).abs().mean()) > 1e-3  # it does shift


def test_contrast_divides_the_spread_about_the_image_mean():
    x = _images()
    y = shift_images(x, "contrast", 1.0, torch.Generator())
    assert torch.allclose(y.mean(dim=(1, 2, 3)), x.mean(dim=(1, 2, 3)), atol=1e-6)
    assert torch.allclose(y.std(dim=(1, 2, 3)), x.std(dim=(1, 2, 3)) / 2, atol=1e-6)


def test_blur_keeps_a_flat_image_and_smooths_noise():
    flat = torch.full((1, 1, 9, 9), 0.3)
    assert torch.allclose(shift_images(flat, "blur", 1.5, torch.Generator()), flat, atol=1e-6)
    x = _images()
    assert float(shift_images(x, "blur", 1.0, torch.Generator()).std()) < 0.6 * float(x.std())


def test_noise_is_drawn_from_the_generator():
    x = _images()
    a, b = (shift_images(x, "noise", 0.1, torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, shift_images(x, "noise", 0.1, torch.Generator().manual_seed(6)))


def test_draw_aux_shifts_the_images_it_draws_and_keeps_their_labels():
    data = _dataset()
    plain, idx = draw_aux(data, 3, torch.Generator().manual_seed(0))
    shifted, idx2 = draw_aux(data, 3, torch.Generator().manual_seed(0), None, "contrast", 1.0)
    assert torch.equal(idx, idx2) and torch.equal(plain.labels, shifted.labels)
    assert torch.allclose(shifted.images, shift_images(plain.images, "contrast", 1.0, torch.Generator()))
    assert not torch.allclose(shifted.images, plain.images)


def test_the_static_name_list_is_the_registry():
    assert sorted(names.AUX_SHIFTS) == sorted(AUX_SHIFTS)


@pytest.mark.parametrize(("given", "match"), [
    ({"shift": "fog", "shift_strength": 0.5}, r"aux.shift='fog': unknown aux shift; valid: \['blur', 'contrast'"),
    ({"shift": "noise", "shift_strength": -0.1}, r"aux.shift_strength=-0.1: expected a finite number >= 0"),
    ({"shift": "noise", "shift_strength": float("nan")}, r"aux.shift_strength=\.nan: expected a finite"),
    ({"shift_strength": 0.5}, r"aux.shift_strength=0.5: expected 0 without aux.shift"),
])
def test_bad_shift_configs_are_one_line_errors(given, match):
    with pytest.raises(ConfigError, match=match):
        AuxConfig(**given)


def test_bad_shift_arguments_of_the_library_call_are_errors():
    with pytest.raises(ConfigError, match="unknown aux shift"):
        shift_images(_images(), "fog", 0.5, torch.Generator())
    with pytest.raises(ConfigError, match="aux.shift_strength=-1"):
        shift_images(_images(), "blur", -1, torch.Generator())


def test_a_bad_shift_fails_at_config_load_without_torch():
    code = ("import sys\nfrom gi.core.errors import ConfigError\nfrom gi.world.setup import AuxConfig\n"
            "try:\n    AuxConfig(shift='fog', shift_strength=1.0)\nexcept ConfigError:\n    pass\n"
            "else:\n    raise SystemExit('no error')\nassert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_huge_blur_from_a_config_stays_bounded():
    """σ = 1e12 would ask for a 6e12-tap kernel; the radius is capped at the image's side, and the result is the
    image's near-constant blur, still in [0, 1]."""
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    out = shift_images(images, "blur", 1e12, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and float(out.min()) >= 0 and float(out.max()) <= 1
