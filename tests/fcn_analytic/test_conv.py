"""Analytic inversion of convolution layers (R-GAP's recursive step, fcn_analytic.conv) and of conv bodies."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fcn_analytic
import labels
from fcn_analytic.conv import conv_input_gradient, fwd_shape, solve_conv, solve_normal_equations, window_index
from gi.analysis.metrics import psnr
from gi.capture import Capture
from gi.core.errors import CaptureError, GIError
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build

C = 10


def _layer_system(conv: nn.Conv2d, in_shape, seed: int):
    """A float64 layer: input x, its pre-activation z − b = conv(x), a random δ and ∇W = Σ_p δ ⊗ patch(x)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *in_shape, generator=g, dtype=torch.float64)
    w = torch.randn(conv.weight.shape, generator=g, dtype=torch.float64)
    kw = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    z = F.conv2d(x, w, **kw)[0]
    delta = torch.randn(z.shape, generator=g, dtype=torch.float64)
    gw = torch.nn.grad.conv2d_weight(x, w.shape, delta[None], **kw)
    o = w.shape[0]
    return x[0], w, z.reshape(o, -1), delta.reshape(o, -1), gw


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(5, 2, 2, 1), (3, 1, 1, 1), (4, 2, 0, 1), (3, 1, 2, 2)])
def test_solve_conv_recovers_the_input_exactly(kernel, stride, padding, dilation):
    conv = nn.Conv2d(3, 6, kernel, stride=stride, padding=padding, dilation=dilation)
    in_shape = (3, 9, 9)
    x, w, z, delta, gw = _layer_system(conv, in_shape, seed=kernel + stride)
    weight = torch.rand(z.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.1
    solved = solve_conv(conv, in_shape, w, z, torch.ones_like(z, dtype=torch.bool), delta, gw, weight)
    read = torch.zeros(x.numel(), dtype=torch.bool)
    idx = window_index(conv, in_shape)
    read[idx[idx >= 0]] = True
    read = read.view(in_shape)
    torch.testing.assert_close(solved.x[read], x[read], rtol=1e-7, atol=1e-8)
    assert bool((solved.x[~read] == 0).all()) and solved.unread == int((~read).sum())
    assert solved.unread == (51 if (kernel, stride, padding) == (4, 2, 0) else 0)  # last row + column unread
    assert solved.residual < 1e-9 and solved.forward_residual < 1e-9 and solved.solver == "cholesky"
    assert solved.unknowns == x.numel() and solved.rows == z.numel() + gw.numel()


def test_gradient_rows_alone_and_masked_forward_rows():
    """Rows where σ⁻¹ is undefined (a ReLU's zeros) are dropped; the gradient rows still pin the input down."""
    conv = nn.Conv2d(2, 8, 3, stride=1, padding=1)
    in_shape = (2, 6, 6)
    x, w, z, delta, gw = _layer_system(conv, in_shape, seed=3)
    valid = z > 0
    wrong = torch.where(valid, z, torch.full_like(z, 1e3))  # what a masked row says must not matter
    solved = solve_conv(conv, in_shape, w, wrong, valid, delta, gw)
    torch.testing.assert_close(solved.x, x, rtol=1e-6, atol=1e-7)
    assert solved.rows == int(valid.sum()) + gw.numel()


def test_rank_deficient_system_falls_back_to_least_squares():
    """One output channel and a zero δ leave fewer equations than unknowns: no Cholesky, a finite min-norm answer."""
    conv = nn.Conv2d(2, 1, 3, stride=2, padding=0)
    in_shape = (2, 7, 7)
    x, w, z, delta, gw = _layer_system(conv, in_shape, seed=4)
    solved = solve_conv(conv, in_shape, w, z, torch.ones_like(z, dtype=torch.bool), delta, gw)
    assert solved.solver == "lstsq" and bool(torch.isfinite(solved.x).all())
    assert solved.residual < 1e-8  # consistent system: the equations are met, the input is not unique
    with pytest.raises(GIError, match="weight gradient is zero"):
        solve_conv(conv, in_shape, w, z, torch.ones_like(z, dtype=torch.bool), delta, torch.zeros_like(gw))


def test_window_index_and_input_gradient_match_torch():
    conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
    in_shape = (2, 5, 5)
    idx = window_index(conv, in_shape)
    x = torch.randn(1, *in_shape, dtype=torch.float64)
    cols = F.unfold(x, 3, padding=1, stride=2)[0]
    gathered = torch.where(idx >= 0, x.reshape(-1)[idx.clamp_min(0)], torch.zeros(()).double())
    torch.testing.assert_close(gathered, cols)
    assert fwd_shape(conv, in_shape) == (3, 3)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=False)
    delta = torch.randn(3, 3, 3, dtype=torch.float64)
    xr = x.clone().requires_grad_(True)
    (F.conv2d(xr, w, stride=2, padding=1)[0] * delta).sum().backward()
    torch.testing.assert_close(conv_input_gradient(conv, in_shape, w, delta), xr.grad[0])


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(t.__name__ for t in fcn_analytic.ACTIVATION_INVERSES)),
       seed=st.integers(0, 10_000))
def test_activation_inverse_round_trips(kind, seed):
    act_type = next(t for t in fcn_analytic.ACTIVATION_INVERSES if t.__name__ == kind)
    act = act_type()
    z = torch.randn(200, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    a = act(z)
    back, valid = fcn_analytic.ACTIVATION_INVERSES[act_type](a, act)
    assert bool(valid.any())
    torch.testing.assert_close(back[valid], z[valid], rtol=1e-6, atol=1e-8)
    deriv = fcn_analytic.ACTIVATION_DERIVATIVES[act_type](a, act)
    zr = z.clone().requires_grad_(True)
    act(zr).sum().backward()
    torch.testing.assert_close(deriv[valid], zr.grad[valid], rtol=1e-6, atol=1e-8)


def _capture(model, x, label: int = 3):
    y = torch.zeros(1, C)
    y[0, label] = 1
    cap, truth = capture_gradients(model, x, y, Protocol())
    return cap, truth.images


def test_dlg_lenet_on_real_images_is_inverted_from_its_labels(monkeypatch):
    """The DLG LeNet (sigmoid, biased convs) on bundled CIFAR-10 images: labels → features → three conv solves.
    Its cost, counted rather than timed: one Cholesky solve of the normal equations per convolution, each of the
    layer input's size (n × n, n = C·H·W: 12·8·8, 12·16·16, 3·32·32), never the stacked rows × n system."""
    conv = importlib.import_module("fcn_analytic.conv")
    solves: list[tuple[int, ...]] = []

    def counted(gram, rhs):
        solves.append(tuple(gram.shape))
        return solve_normal_equations(gram, rhs)

    monkeypatch.setattr(conv, "solve_normal_equations", counted)
    ds = gdata.load("cifar10-samples")
    model = build("lenet", C, init="uniform", seed=0)
    for i in (0, 5):
        cap, x = _capture(model, ds.images[i:i + 1], int(ds.labels[i]))
        result = labels.recover(cap, "auto")
        solves.clear()
        inv = fcn_analytic.invert(cap, result)
        assert float(psnr(inv.image, x)) > 90  # float precision (docs/results/default-job.md: 95–112 dB)
        assert [layer.name for layer in inv.layers] == ["fc", "body.4", "body.2", "body.0"]
        assert all(layer.route == "least-squares (cholesky)" for layer in inv.layers[1:])
        assert _worst(inv) < 1e-4
        assert solves == [(768, 768), (3072, 3072), (3072, 3072)]


def test_rgap_cnn6_bias_free_convs_are_inverted_exactly():
    """R-GAP's own net (zoo ``cnn6``: six bias-free convs, leaky ReLU 0.2), on a real image at 16 px."""
    ds = gdata.load("cifar10-samples")
    x = torch.nn.functional.interpolate(ds.images[2:3], size=16, mode="bilinear", align_corners=False).clamp(0, 1)
    model = build("cnn6", C, in_shape=(3, 16, 16), seed=3)
    cap, x = _capture(model, x, int(ds.labels[2]))
    inv = fcn_analytic.invert(cap, labels.recover(cap, "auto"))
    assert [layer.name for layer in inv.layers] == ["fc", *(f"body.{2 * k}" for k in range(5, -1, -1))]
    assert float(psnr(inv.image, x)) > 90 and _worst(inv) < 1e-4


def _worst(inv) -> float:
    return max(max(layer.residual, layer.forward_error or 0) for layer in inv.layers)


@pytest.mark.parametrize("activation", ["tanh", "leaky_relu", "elu"])
def test_small_conv_bodies_with_other_activations(activation):
    model = build("lenet", C, activation=activation, in_shape=(1, 16, 16), seed=2)  # the zoo's default init
    x = torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(5))
    cap, x = _capture(model, x)
    inv = fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    assert float(psnr(inv.image, x)) > 80 and _worst(inv) < 1e-5, activation


def test_forward_rows_weighted_by_the_slope_undo_saturation(monkeypatch):
    """U(−0.5, 0.5) weights saturate tanh, so σ⁻¹ amplifies the float error of a saturated output; weighting each
    forward row by σ'(z) (generalised least squares) keeps it exact, the unweighted rows do not."""
    model = build("lenet", C, activation="tanh", in_shape=(1, 16, 16), init="uniform", seed=2)
    cap, x = _capture(model, torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(5)))
    inv = fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    assert float(psnr(inv.image, x)) > 80 and _worst(inv) < 1e-4
    walk = importlib.import_module("fcn_analytic.invert")  # the module (the package exports the function)
    monkeypatch.setattr(walk, "solve_conv", lambda *a, **kw: solve_conv(*a[:7], **kw))  # rows unweighted
    flat = fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    assert float(psnr(flat.image, x)) < 40 and _worst(flat) > 1e-2


def test_a_noisy_gradient_shows_in_the_residual():
    """Noise on the shared gradient (a defence) makes the equations inconsistent: the residual says so, so the
    pipeline optimises from the inversion instead of answering with it (attack.analytic_tol 1e-2)."""
    ds = gdata.load("cifar10-samples")
    cap, x = _capture(build("lenet", C, init="uniform", seed=0), ds.images[:1], int(ds.labels[0]))
    g = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.05 * v.std() * torch.randn(v.shape, generator=g) for k, v in cap.gradients.items()}
    noisy_cap = Capture(cap.model_spec, cap.model_state, cap.protocol, gradients=noisy, meta=cap.meta)
    inv = fcn_analytic.invert(noisy_cap, labels.recover(noisy_cap, "auto"))
    assert _worst(inv) > 1e-2


def test_bodies_outside_the_pattern_and_missing_layers_are_clear_errors():
    lenet5 = build("lenet5", C, in_shape=(1, 28, 28), seed=1)
    cap, _ = _capture(lenet5, torch.rand(1, 1, 28, 28))
    with pytest.raises(GIError, match="body.0.2 is MaxPool2d.*Conv2d → activation"):
        fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    silu = build("lenet", C, activation="silu", in_shape=(1, 16, 16), seed=1)
    cap, _ = _capture(silu, torch.rand(1, 1, 16, 16))
    with pytest.raises(GIError, match="SiLU, which has no inverse"):
        fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    lenet = build("lenet", C, in_shape=(1, 16, 16), seed=1)
    cap, _ = _capture(lenet, torch.rand(1, 1, 16, 16))
    missing = Capture(cap.model_spec, cap.model_state, cap.protocol,
                      gradients={k: v for k, v in cap.gradients.items() if k != "body.2.weight"}, meta=cap.meta)
    with pytest.raises(CaptureError, match="body.2.weight"):
        fcn_analytic.invert(missing, labels.recover(cap, "soft-lambda"))
    grouped = nn.Conv2d(4, 4, 3, groups=2)
    with pytest.raises(GIError, match="grouped convolution"):
        fcn_analytic.conv.check_conv(grouped, "body.0")


def test_a_failed_cholesky_leaves_the_least_squares_fallback_the_original_matrix():
    """The in-place Cholesky overwrites the diagonal and a triangle before it finds the matrix singular; the
    fallback must still solve the original system: its minimum-norm solution, to rounding."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 25, dtype=torch.float64, generator=g)
    gram = a @ a.T  # rank 25 of 40: Cholesky fails late, after most columns are factored
    rhs = gram @ torch.randn(40, dtype=torch.float64, generator=g)
    expected = torch.linalg.pinv(gram) @ rhs
    x, solver = solve_normal_equations(gram.clone(), rhs)
    assert solver == "lstsq"
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-8)
    spd = gram + torch.eye(40, dtype=torch.float64)
    x, solver = solve_normal_equations(spd.clone(), rhs)
    assert solver == "cholesky"
    torch.testing.assert_close(spd @ x, rhs, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_stop_above_ends_the_walk_at_the_first_layer_that_reaches_the_bound(activation):
    """``invert(stop_above=b)`` solves the same layers as the full walk up to the first (non-input) layer whose error
    reaches b, then stops with no image; below every error's reach it is the full walk. ReLU: rank-deficient."""
    model = build("lenet", C, activation=activation, in_shape=(1, 16, 16), seed=2)
    cap, _ = _capture(model, torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(5)))
    result = labels.recover(cap, "soft-lambda")
    full = fcn_analytic.invert(cap, result)
    errors = [fcn_analytic.layer_error(layer) for layer in full.layers]
    assert full.complete and len(errors) == 4
    for bound in sorted({*errors[1:3], errors[3] * 2 + 1}):
        stopped = fcn_analytic.invert(cap, result, stop_above=bound)
        first = next((k for k in range(1, 3) if errors[k] >= bound), None)  # layers[3] is the input layer
        if first is None:
            assert stopped.complete and torch.equal(stopped.image, full.image)
            continue
        assert not stopped.complete and stopped.image is None and not stopped.exact
        assert stopped.info["stopped_at"] == full.layers[first].name
        assert [fcn_analytic.layer_error(layer) for layer in stopped.layers] == pytest.approx(errors[:first + 1])


def _deficient_system(n: int, rank: int, zeros: int, seed: int):
    """A rank-deficient normal system ``AᵀA x = Aᵀ A x*`` (A: rank × n) with a nonnegative x* of ``zeros`` zero
    entries, and its minimum-norm answer."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rank, n, dtype=torch.float64, generator=g)
    truth = torch.rand(n, dtype=torch.float64, generator=g) + 0.1
    truth[torch.randperm(n, generator=g)[:zeros]] = 0.0
    normal = a.T @ a
    return normal, torch.linalg.pinv(normal) @ (normal @ truth), truth


def test_the_inputs_zeros_pin_a_rank_deficient_null_space():
    """x* ≥ 0 with half its entries zero and a 20-dimensional null space: the minimum-norm answer is far off, the
    nonnegative answer in the null space is x* to float precision, and it is pinned; without zeros (x* > 0) the
    null space is not pinned, and the fit leaves the minimum-norm answer where it is nonnegative already."""
    from fcn_analytic.conv import nonnegative_null_fit

    normal, minimum, truth = _deficient_system(120, 100, 60, seed=0)
    assert float((minimum - truth).norm() / truth.norm()) > 0.1
    fit = nonnegative_null_fit(normal, minimum)
    assert fit.dim == 20 and fit.pinned and fit.zeros >= 60
    assert float((fit.x - truth).norm() / truth.norm()) < 1e-6
    normal, minimum, truth = _deficient_system(120, 100, 0, seed=1)
    fit = nonnegative_null_fit(normal, minimum)
    assert fit.dim == 20 and not fit.pinned and float((fit.x - truth).norm() / truth.norm()) > 0.01
    full = torch.eye(5, dtype=torch.float64)
    assert nonnegative_null_fit(full, torch.ones(5, dtype=torch.float64)).dim == 0


def test_a_rank_deficient_hidden_layer_is_pinned_by_its_relu_zeros():
    """ReLU LeNet, PyTorch's init, seed 1, cifar10-samples 7: conv2's system leaves a null space (23 directions,
    measured), where the minimum-norm input of conv2 was 0.13 off and the walk's image 8.4 dB; the input's zeros
    pin it (2e-5 relative, measured), so the walk goes on to the image (33 dB, measured)."""
    ds = gdata.load("cifar10-samples")
    model = build("lenet", C, activation="relu", init=None, seed=1)
    cap, x = _capture(model, ds.images[7:8], int(ds.labels[7]))
    inv = fcn_analytic.invert(cap, labels.recover(cap, "auto"))
    route = next(r.route for r in inv.layers if r.name == "body.2")
    assert "null space pinned by the input's" in route
    with torch.no_grad():
        x1 = model.body[1](model.body[0](model.normalize(x))).double()
    assert float((inv.features["body.2"].reshape(x1.shape) - x1).norm() / x1.norm()) < 1e-3
    assert float(psnr(inv.image, x)) > 25
