"""fcn_analytic.disaggregate.last_layer_inputs: each sample's last-layer input from the batch gradient and its
labels (soft-label paper eq. 2 for a batch), and the feature targets built on it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcn_analytic.disaggregate import last_layer_inputs
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.problem import capture_features, feature_targets, last_layer_source, slot_features
from gi.core.errors import GIError
from gi.label_result import LabelResult
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build, features_and_logits


def _head(labels: list[int], classes: int = 10, dim: int = 64, seed: int = 0, bias: bool = True):
    """∇W, ∇b of the mean cross-entropy of a random head on nonnegative inputs, and what made them."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(classes, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    b = 0.1 * torch.randn(classes, generator=g, dtype=torch.float64) if bias else None
    h = torch.relu(torch.randn(len(labels), dim, generator=g, dtype=torch.float64))
    y = torch.nn.functional.one_hot(torch.tensor(labels), classes).double()
    delta = torch.softmax(h @ w.T + (0 if b is None else b), 1) - y
    return delta.T @ h / len(labels), (delta.mean(0) if bias else None), w, b, y, h, delta


def _matched(found: torch.Tensor, truth: torch.Tensor, labels: torch.Tensor) -> float:
    """Largest relative error of each true row against its nearest found row of the same label (samples of one
    class may come in either order)."""
    dist = torch.cdist(truth, found) + 1e9 * (labels[:, None] != labels[None, :])
    return float((dist.min(1).values / truth.norm(dim=1)).max())


def test_each_sample_of_a_batch_with_repeated_labels_is_recovered_exactly():
    labels = [3, 3, 3, 1, 1, 7, 0, 5]  # three samples of class 3, two of class 1
    gw, gb, w, b, y, h, delta = _head(labels)
    got = last_layer_inputs(gw, gb, w, b, y)
    cls = torch.tensor(labels)
    assert _matched(got.inputs, h, cls) < 1e-7 and _matched(got.output_errors, delta, cls) < 1e-7
    assert got.residual < 1e-9 and 1 <= got.draws <= 48
    # the class means ∇W_c/∇b_c are not these features: every sample's feature is mixed into every row
    means = gw[cls] / gb[cls, None]
    assert float(((means - h).norm(dim=1) / h.norm(dim=1)).min()) > 0.05


@settings(max_examples=6, deadline=None, derandomize=True)
@given(batch=st.integers(2, 6), seed=st.integers(0, 1000), bias=st.booleans())
def test_any_batch_below_the_class_count_is_recovered(batch, seed, bias):
    labels = torch.randint(0, 4, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    gw, gb, w, b, y, h, _ = _head(labels, seed=seed, bias=bias)
    got = last_layer_inputs(gw, gb, w, b, y, seed=seed)
    assert got.inputs.shape == h.shape and _matched(got.inputs, h, torch.tensor(labels)) < 1e-6


def test_labels_that_do_not_fit_the_gradient_leave_a_large_residual():
    """The labels key the system: the same gradient with one sample's label changed is not explained."""
    gw, gb, w, b, y, h, _ = _head([3, 3, 1, 7, 0, 5])
    wrong = y.clone()
    wrong[0] = torch.nn.functional.one_hot(torch.tensor(9), 10).double()
    assert last_layer_inputs(gw, gb, w, b, y).residual < 1e-9
    assert last_layer_inputs(gw, gb, w, b, wrong).residual > 1e-2


def test_a_resnet_batch_gives_every_slot_its_own_feature():
    """The zoo's untrained ResNet-32 (BatchNorm in train mode) on 6 CIFAR-10 samples with a repeated class, from
    the float32 gradient: feature_targets gives each slot its own 64-d feature (the class means are off by
    tens of percent there), and wrong slot labels fall back to the class means."""
    data = load("cifar10-samples")
    idx = [i for i in range(20) if int(data.labels[i]) in (0, 1, 2, 3, 6)][:6]
    images, labels = data.images[idx], data.labels[idx]
    assert len(set(labels.tolist())) < 6  # a class occurs twice
    model = build("resnet32", 10, in_shape=(3, 32, 32), seed=0)
    capture, _ = capture_gradients(model, images, labels, Protocol(batch_size=6, model_mode="train"))
    with torch.no_grad():
        h = features_and_logits(capture.model().double().train(), images.double(), capture.last_layer_name)[0]
    soft = torch.nn.functional.one_hot(labels, 10).double()
    got = feature_targets(capture, None, soft)
    assert _matched(got, h, labels) < 1e-3  # float32 gradient: exact up to its rounding
    gw, gb = capture.last_layer(torch.float64)
    means = gw[labels] / gb[labels, None]
    assert float(((means - h).norm(dim=1) / h.norm(dim=1)).median()) > 0.05
    wrong = soft.roll(1, 1)
    assert slot_features(capture, wrong) is None
    assert torch.allclose(feature_targets(capture, None, wrong), gw[wrong.argmax(1)] / gb[wrong.argmax(1), None])
    # the features stage's record says which source served
    right = LabelResult.from_counts("truth", soft.sum(0).long(), soft=soft.float())
    bad = LabelResult.from_counts("truth", wrong.sum(0).long(), soft=wrong.float())
    on, off = ReconConfig(feature_weight=1.0), ReconConfig(feature_weight=0.0)
    assert "keyed by its label" in last_layer_source(on, [capture], [right])
    assert last_layer_source(on, [capture], [bad]) == "grad_W_c / grad_b_c per slot"
    assert last_layer_source(on, [capture, capture], [right, bad]).endswith(
        "for 1 of 2 captures; grad_W_c / grad_b_c per slot for the rest")
    # with the feature term on, capture_features serves the per-slot solve; off, only the cheap class means
    # (recorded, matched by no term), and the record says so
    order = torch.argsort(labels, stable=True)  # the slots' canonical order (labels_for_slots): by class
    assert _matched(capture_features(on, [capture], [right])[0], h[order], labels[order]) < 1e-3
    assert torch.allclose(capture_features(off, [capture], [right])[0], means[order])
    assert last_layer_source(off, [capture], [right]) == "grad_W_c / grad_b_c per slot"


def test_slot_features_apply_only_to_a_fedsgd_cross_entropy_batch_below_the_class_count():
    model = build("cnn", 4, in_shape=(1, 8, 8), seed=0, activation="relu", channels=(4,), hidden=8)
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 1, 2])
    soft = torch.nn.functional.one_hot(y, 4).double()
    capture, _ = capture_gradients(model, x[:3], y[:3], Protocol(batch_size=3))
    assert slot_features(capture, soft[:3]) is not None
    four, _ = capture_gradients(model, x, y, Protocol(batch_size=4))
    assert slot_features(four, soft) is None  # B = C: the output errors span at most C − 1 directions
    focal, _ = capture_gradients(model, x[:3], y[:3], Protocol(batch_size=3, loss="focal"))
    assert slot_features(focal, soft[:3]) is None
    hot, _ = capture_gradients(model, x[:3], y[:3], Protocol(batch_size=3, temperature=3.0))  # softmax(z/3)
    got = slot_features(hot, soft[:3])
    with torch.no_grad():
        h = features_and_logits(hot.model().double(), x[:3].double(), hot.last_layer_name)[0]
    assert got is not None and _matched(got, h, y[:3]) < 1e-4


def test_bad_inputs_are_clear_errors():
    gw, gb, w, b, y, _, _ = _head([3, 1, 7])
    with pytest.raises(GIError, match="one shape"):
        last_layer_inputs(gw, gb, w[:, :-1], b, y)
    with pytest.raises(GIError, match="given together"):
        last_layer_inputs(gw, gb, w, None, y)
    with pytest.raises(GIError, match="fit C=10"):
        last_layer_inputs(gw, gb, w, b, y[:, :-1])
    with pytest.raises(GIError, match="determined only for"):
        last_layer_inputs(gw, gb, w, b, y[:1])
    with pytest.raises(GIError, match="starts=0"):
        last_layer_inputs(gw, gb, w, b, y, starts=0)
    big = torch.zeros(1000, 64, dtype=torch.float64)  # B = 64 of 1000 classes: ~25 GiB per round, refused first
    with pytest.raises(GIError, match=r"need 25\.\d GiB per round"):
        last_layer_inputs(big, torch.zeros(1000), big, torch.zeros(1000), torch.eye(1000)[:64])
    gw2, gb2, w2, b2, y2, h2, delta2 = _head([3, 1, 7], seed=1)
    twice = torch.cat([h2[:2], h2[:1]])  # two samples with one input: rank 2 for a batch of 3
    with pytest.raises(GIError, match="rank < B=3"):
        last_layer_inputs(delta2.T @ twice / 3, delta2.mean(0), w2, b2, y2)
