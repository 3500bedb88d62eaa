"""The input layer's TV-prior solve (fcn_analytic.prior) and the ReLU LeNet walk it completes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import fcn_analytic
import labels
from fcn_analytic.prior import refine_input
from gi.analysis.metrics import psnr
from gi.attack.recon.mismatch import shared_mismatch
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build

MEAN = torch.full((3, 1, 1), 0.5, dtype=torch.float64)
STD = torch.full((3, 1, 1), 0.25, dtype=torch.float64)


def _smooth_image(seed: int, size: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, 3, 3, 3, generator=g, dtype=torch.float64)
    return F.interpolate(coarse, size=size, mode="bilinear", align_corners=False)[0].clamp(0.05, 0.95)


def _layer(channels: int, seed: int, image_seed: int):
    """A 3×3 conv of ``channels`` outputs on a smooth image: the layer, its weight, the image (pixels and
    normalised), its pre-activation, a random δ and the weight gradient; the generator, to draw more from."""
    conv = nn.Conv2d(3, channels, 3, stride=1, padding=1)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(channels, 3, 3, 3, generator=g, dtype=torch.float64)
    p = _smooth_image(image_seed)
    x = (p - MEAN) / STD
    z = F.conv2d(x[None], w, padding=1)[0]
    delta = torch.randn(z.shape, generator=g, dtype=torch.float64)
    gw = torch.nn.grad.conv2d_weight(x[None], w.shape, delta[None], padding=1)
    return conv, w, p, x, z, delta, gw, g


def test_a_determined_layer_is_recovered_exactly_from_a_grey_start():
    """Every unit active and 12·27 gradient rows + 768 forward rows for 192 unknowns: the penalties alone (no TV)
    pin the image down, from a flat grey start."""
    conv, w, p, x, z, delta, gw, g = _layer(12, seed=0, image_seed=1)
    valid = torch.ones_like(z, dtype=torch.bool)
    out = refine_input(conv, w, None, z, valid, ~valid, delta, gw, MEAN, STD, torch.zeros_like(x), tv_weight=0.0,
                       iterations=500)
    assert float(psnr((out.x * STD + MEAN)[None], p[None])) > 60  # measured ~100+ dB
    assert out.residual < 1e-4 and out.forward_residual < 1e-4 and out.hinge == 0


def test_the_tv_prior_fills_a_null_space_that_min_norm_leaves_at_zero():
    """4·27 gradient rows + a quarter of the 256 forward rows, fewer than the 192 unknowns (the ReLU LeNet's input
    layer in small): with the TV prior the smooth image comes back far better than the penalties alone leave it."""
    conv, w, p, x, z, delta, gw, g = _layer(4, seed=2, image_seed=3)
    valid = torch.rand(z.shape, generator=g) < 0.25
    args = (conv, w, None, z, valid, torch.zeros_like(valid), delta, gw, MEAN, STD, torch.zeros_like(x))
    plain = refine_input(*args, tv_weight=0.0, iterations=300)
    prior = refine_input(*args, tv_weight=1e-3, iterations=300)
    got = [float(psnr((r.x * STD + MEAN)[None], p[None])) for r in (plain, prior)]
    assert got[1] > got[0] + 3, got
    assert prior.residual < 1e-2 and prior.forward_residual < 1e-2


def test_relu_lenet_hidden_layers_are_exact_and_the_image_beats_its_mean_colour():
    """The DLG LeNet with ReLU (S1 of docs/results/realistic.md) on a real CIFAR-10 image: conv3's and conv2's inputs
    come back to float precision (the dead units' zeros snapped), the under-determined input layer by the TV prior,
    far above the image's mean colour (measured 32.5 dB against 14.8 dB). The dead units' margin and the body
    polish keep every ReLU mask the capture's, so the image reproduces the shared gradient (measured relative
    mismatch 1.3e-4; 8.3e-2 with neither, where some of conv1's dead pre-activations sat at +1e-4)."""
    ds = gdata.load("cifar10-samples")
    model = build("lenet", 10, activation="relu", init="uniform", seed=0)
    x = ds.images[0:1]
    inputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: inputs.__setitem__(n, i[0].detach().double().reshape(-1)))
             for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    y = torch.zeros(1, 10)
    y[0, int(ds.labels[0])] = 1
    cap, truth = capture_gradients(model, x, y, Protocol())
    for h in hooks:
        h.remove()
    inv = fcn_analytic.invert(cap, labels.recover(cap, "auto"))
    for name in ("body.4", "body.2"):
        rec, true = inv.features[name].reshape(-1), inputs[name]
        assert float((rec - true).norm() / true.norm()) < 1e-4, name  # measured ~1e-6
    assert "TV prior" in inv.layers[-1].route and "TV prior" not in inv.layers[-2].route
    assert max(fcn_analytic.layer_error(layer) for layer in inv.layers) < 1e-2  # answered by attack.analytic_tol
    mean_colour = truth.images.mean((2, 3), keepdim=True).expand_as(truth.images)
    assert float(psnr(inv.image, truth.images)) > float(psnr(mean_colour, truth.images)) + 10
    assert shared_mismatch(cap, inv.image, y) < 1e-2
    polished = inv.info["polish"]  # the input layer needed the prior, every layer above was determined
    assert polished["objective_after"] < polished["objective_before"]
