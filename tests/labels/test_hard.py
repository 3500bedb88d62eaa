"""Hard-label baselines: iDLG (Zhao et al. 2020), its batch extension, GradInversion's row minimum (Yin et al. 2021)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build

C = 10


def test_idlg_single_sample_weight_rows_and_bias():
    """B = 1, one-hot CE: only the true class has p − y < 0; with non-negative features the row sums of ∇W carry
    that sign (bias-free sigmoid LeNet), with a bias ∇b carries it directly (any feature sign)."""
    g = torch.Generator().manual_seed(0)
    lenet = build("lenet", C, init="uniform", bias_last=False, seed=0)
    linear = build("linear", C, in_shape=(1, 8, 8), bias_last=True, seed=0)  # normalised pixels: mixed signs
    for label in range(C):
        for model, source in ((lenet, "weight-row-sum"), (linear, "bias")):
            x = torch.rand(1, *model.spec["in_shape"], generator=g)
            cap, truth = capture_gradients(model, x, torch.tensor([label]), Protocol())
            r = labels.recover(cap, "idlg")
            assert r.ok and int(r.counts.argmax()) == label and int(r.counts.sum()) == 1
            assert r.info["source"] == source


def test_idlg_fails_on_smoothed_labels_where_soft_lambda_does_not():
    """The paper's point (§2): with label smoothing p_y − y_y can be positive, so the sign rule breaks."""
    model = build("lenet", C, init="uniform", bias_last=False, seed=1)
    g = torch.Generator().manual_seed(1)
    wrong = 0
    for i in range(30):
        x = torch.rand(1, 3, 32, 32, generator=g)
        y = torch.full((1, C), 0.045)
        y[0, i % C] = 1 - 0.45 + 0.045
        cap, truth = capture_gradients(model, x, y, Protocol(label_aug="smoothing"))
        wrong += int(labels.recover(cap, "idlg").counts.argmax()) != i % C
        assert int(labels.recover(cap, "soft-lambda").counts.argmax()) == i % C
    assert wrong > 0


@pytest.mark.parametrize("method", ["idlg", "idlg-batch", "yin"])
def test_zero_gradient_is_a_failure(method):
    model = build("lenet", C, bias_last=False, seed=2)
    cap, _ = capture_gradients(model, torch.rand(1, 3, 32, 32), torch.tensor([3]), Protocol())
    cap.gradients = {k: torch.zeros_like(v) for k, v in cap.gradients.items()}
    r = labels.recover(cap, method)
    assert not r.ok and "zero" in r.info["reason"]


def test_idlg_refuses_batches_with_ok_false():
    """A single-sample method on a batch cannot decide: ok=False with the reason, never counts summing to 1."""
    model = build("lenet", C, bias_last=False, seed=3)
    cap, _ = capture_gradients(model, torch.rand(2, 3, 32, 32), torch.tensor([1, 2]), Protocol(batch_size=2))
    result = labels.recover(cap, "idlg")
    assert not result.ok and "one sample" in result.info["reason"] and int(result.counts.sum()) == 0


def test_label_stage_door_rejects_bad_captures_and_options():
    model = build("lenet", C, bias_last=True, seed=3)
    cap, _ = capture_gradients(model, torch.rand(1, 3, 32, 32), torch.tensor([1]), Protocol())
    nan = dataclasses.replace(cap, gradients={**cap.gradients, "fc.bias": cap.gradients["fc.bias"] * float("nan")})
    as_int = dataclasses.replace(cap, gradients={**cap.gradients, "fc.weight": cap.gradients["fc.weight"].int()})
    wrong = dataclasses.replace(cap, gradients={**cap.gradients, "fc.weight": cap.gradients["fc.weight"][:, :5]})
    for method in ("idlg", "idlg-batch", "yin"):
        with pytest.raises(CaptureError, match="'fc.bias' contains NaN"):
            labels.recover(nan, method)
        with pytest.raises(CaptureError, match="dtype"):
            labels.recover(as_int, method)
        with pytest.raises(CaptureError, match="shape"):
            labels.recover(wrong, method)
    with pytest.raises(ConfigError, match=r"no option\(s\) \['nosuch'\]; valid: \[\]"):
        labels.recover(cap, "idlg", nosuch=1)
    with pytest.raises(ConfigError, match="valid: .*'samples'"):
        labels.recover(cap, "rlu", nosuch=1)


@pytest.mark.parametrize("method", ["idlg-batch", "yin"])
def test_batch_rules_find_distinct_labels_on_relu_net(method):
    model = build("mlp", C, in_shape=(3, 16, 16), widths=(64,), bias_last=False, seed=4)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        y = torch.randperm(C, generator=g)[:4]
        cap, truth = capture_gradients(model, torch.rand(4, 3, 16, 16, generator=g), y, Protocol(batch_size=4))
        r = labels.recover(cap, method)
        assert r.ok and torch.equal(r.counts, truth.counts)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 12), method=st.sampled_from(["idlg-batch", "yin"]))
def test_batch_counts_sum_to_batch(seed, batch, method):
    model = build("mlp", C, in_shape=(1, 4, 4), widths=(16,), seed=seed % 13)
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(C, (batch,), generator=g)
    cap, _ = capture_gradients(model, torch.rand(batch, 1, 4, 4, generator=g), y, Protocol(batch_size=batch))
    r = labels.recover(cap, method)
    assert int(r.counts.sum()) == batch and bool((r.counts >= 0).all())
    torch.testing.assert_close(r.proportions.sum(), torch.tensor(1.0, dtype=torch.float64))
