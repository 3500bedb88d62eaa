"""Analytic inversion of fully-connected nets (soft-label paper §4.2, eq. 6–7); conv bodies: test_conv.py."""

from __future__ import annotations

import pytest
import torch

import fcn_analytic
import labels
from gi.analysis.metrics import psnr
from gi.capture import Capture
from gi.core.errors import CaptureError, GIError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build

C = 10


def _sample(model, seed: int = 0, eps: float = 0.3) -> tuple[Capture, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, *model.spec["in_shape"], generator=g)
    y = torch.full((1, C), eps / C)
    y[0, seed % C] += 1 - eps
    cap, truth = capture_gradients(model, x, y, Protocol(label_aug="smoothing"))
    return cap, truth.images


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh", "leaky_relu", "elu"])
def test_bias_free_fcn_is_inverted_exactly(activation):
    model = build("mlp", C, activation=activation, in_shape=(3, 12, 12), widths=(96, 48), bias=False,
                  bias_last=False, seed=1)
    cap, x = _sample(model, seed=2)
    result = labels.recover(cap, "soft-lambda")
    assert result.ok
    inv = fcn_analytic.invert(cap, result)
    assert inv.image.shape == x.shape and float(psnr(inv.image, x)) > 60
    assert inv.exact and [layer.route for layer in inv.layers] == ["label-result", "derivative", "derivative"]
    if activation == "relu":
        assert inv.layers[1].rows_used < inv.layers[1].rows  # dead ReLUs give zero rows, skipped


def test_biased_fcn_uses_bias_gradients():
    model = build("mlp", C, in_shape=(1, 10, 10), widths=(64, 32), bias=True, bias_last=True, seed=3)
    cap, x = _sample(model, seed=4)
    inv = fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    assert float(psnr(inv.image, x)) > 60 and inv.exact
    assert [layer.route for layer in inv.layers] == ["label-result", "bias", "bias"]
    inv_no_label = fcn_analytic.invert(cap)  # the bias alone gives the last-layer feature
    assert float(psnr(inv_no_label.image, x)) > 60 and inv_no_label.layers[0].route == "bias"


def test_fcn4_default_shape_is_read_out_without_solving_a_system(monkeypatch):
    """A fully-connected body is inverted by closed-form read-outs (eq. 6–7: one rank-one read-out per layer),
    its cost counted rather than timed: no least-squares system is formed or solved."""
    import fcn_analytic.conv as conv

    monkeypatch.setattr(conv, "solve_normal_equations", lambda *a: pytest.fail("a fully-connected layer was solved"))
    monkeypatch.setattr(torch.linalg, "lstsq", lambda *a, **k: pytest.fail("a least-squares solve"))
    model = build("fcn4", C, in_shape=(3, 16, 16), widths=(256, 128, 64), seed=5)
    cap, x = _sample(model, seed=6)
    inv = fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    assert float(psnr(inv.image, x)) > 60 and inv.exact
    assert [layer.route for layer in inv.layers] == ["label-result", "derivative", "derivative", "derivative"]


def test_last_layer_features_from_soft_label_only():
    """Any label method's soft label gives λ by fitting eq. 4 (no features in the result)."""
    model = build("mlp", C, in_shape=(1, 8, 8), widths=(32,), bias=False, bias_last=False, seed=7)
    cap, x = _sample(model, seed=8)
    full = labels.recover(cap, "soft-lambda")
    soft_only = labels.LabelResult.from_counts("given", full.counts, soft=full.soft)
    feats = fcn_analytic.last_layer_features(cap, soft_only)
    torch.testing.assert_close(feats, full.features, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(feats.float(), model.features(x), rtol=1e-4, atol=1e-5)
    inv = fcn_analytic.invert(cap, soft_only)
    assert inv.layers[0].route == "fitted-lambda" and float(psnr(inv.image, x)) > 60
    with pytest.raises(GIError, match="soft-lambda"):
        fcn_analytic.last_layer_features(cap, labels.LabelResult.from_counts("hard", full.counts))


def test_not_invertible_or_unsupported_is_an_error():
    lenet5 = build("lenet5", C, bias_last=False, seed=9)  # max-pooling: not invertible layer by layer
    cap, _ = _sample(lenet5)
    with pytest.raises(GIError, match="not invertible layer by layer: body.0.2 is MaxPool2d"):
        fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))
    silu = build("mlp", C, activation="silu", in_shape=(1, 6, 6), widths=(16,), bias=False, bias_last=False, seed=9)
    cap, _ = _sample(silu)
    with pytest.raises(GIError, match="SiLU"):
        fcn_analytic.invert(cap, labels.recover(cap, "soft-lambda"))


def test_rank_deficient_layer_and_missing_gradient():
    # every first-layer ReLU is dead (negative weights and bias on non-negative pixels), so the second layer's input
    # is zero and its weight gradient δ₂·a₁ᵀ vanishes: no row of body.3 carries its input
    model = build("mlp", C, in_shape=(1, 6, 6), widths=(16, 8), bias=True, bias_last=True, norm="none", seed=10)
    with torch.no_grad():
        model.body[1].weight.abs_().neg_()
        model.body[1].bias.fill_(-1.0)
        model.body[3].bias.uniform_(0.5, 1.0)
    cap, _ = _sample(model)
    result = labels.recover(cap, "soft-lambda")
    assert result.ok
    with pytest.raises(GIError, match="body.3: every unit has a zero gradient.*rank-deficient"):
        fcn_analytic.invert(cap, result)
    missing = Capture(cap.model_spec, cap.model_state, cap.protocol,
                      gradients={k: v for k, v in cap.gradients.items() if k != "body.3.weight"}, meta=cap.meta)
    with pytest.raises(CaptureError, match="body.3.weight"):
        fcn_analytic.invert(missing, result)
    free = build("mlp", C, in_shape=(1, 6, 6), widths=(16, 8), bias=False, bias_last=False, seed=10)
    cap, _ = _sample(free)
    with pytest.raises(GIError, match="feature is zero"):  # no bias: δ = ∇W x/‖x‖² needs x ≠ 0
        fcn_analytic.invert(cap, features=torch.zeros(1, 8, dtype=torch.float64))


def test_batch_capture_is_an_error():
    model = build("mlp", C, in_shape=(1, 6, 6), widths=(16,), bias=False, bias_last=False, seed=11)
    cap, _ = capture_gradients(model, torch.rand(2, 1, 6, 6), torch.tensor([0, 1]), Protocol(batch_size=2))
    with pytest.raises(GIError, match="one sample"):
        fcn_analytic.last_layer_features(cap, None)


def test_snap_dead_reads_the_noise_level_from_the_negative_entries():
    """A recovered ReLU output: the negative entries are the recovery's error, so a dead unit holding +3e-4 of
    noise is snapped to 0 when the most negative entry is -2.8e-4 (1.5 x 2.8e-4 = 4.2e-4), while a true active
    unit at 6e-4 stays; with clean rounding (no entry below -1e-9) the relative bound (1e-5 of the largest) rules."""
    from torch import nn

    from fcn_analytic.invert import snap_dead

    noisy = torch.tensor([2.0, 6e-4, 3e-4, -2.8e-4, 1e-4, 0.5], dtype=torch.float64)
    assert snap_dead(nn.ReLU(), noisy).tolist() == [2.0, 6e-4, 0.0, 0.0, 0.0, 0.5]
    clean = torch.tensor([2.0, 6e-4, 1e-5, -1e-9, 3e-5, 0.5], dtype=torch.float64)
    assert snap_dead(nn.ReLU(), clean).tolist() == [2.0, 6e-4, 0.0, 0.0, 3e-5, 0.5]
    assert torch.equal(snap_dead(nn.Sigmoid(), noisy), noisy)  # only a ReLU has exact zeros to restore
