"""Batch-count baselines: iLRG, LLG / LLG+ / LLG*, ZLG / ZLG+, RLG (formulas in shared/notes/reference-code.md)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi import Capture, ConfigError, Protocol, capture_gradients
from gi.world.data import ImageDataset
from gi.world.models import build
from labels.ilrg import common_embedding, mean_embeddings, split_embeddings
from labels.llg import greedy_fill
from labels.rlg import separable_classes

C = 6
SHAPE = (1, 6, 6)
COUNT_METHODS = ["posterior", "ilrg", "llg", "llg+", "llg*", "zlg", "zlg+", "rlg"]


def _capture(model, batch: int, seed: int, protocol: Protocol | None = None, labels_: torch.Tensor | None = None):
    gen = torch.Generator().manual_seed(seed)
    y = labels_ if labels_ is not None else torch.randint(0, model.num_classes, (batch,), generator=gen)
    x = torch.rand((batch, *model.spec["in_shape"]), generator=gen)
    return capture_gradients(model, x, y, protocol or Protocol(batch_size=batch))


def _aux(num_classes: int = C, per_class: int = 3, shape=SHAPE, seed: int = 99) -> ImageDataset:
    gen = torch.Generator().manual_seed(seed)
    n = per_class * num_classes
    return ImageDataset(torch.rand((n, *shape), generator=gen), torch.arange(n) % num_classes, num_classes)


# --------------------------------------------------------------------------- LLG greedy fill
def _greedy_reference(g, impact, total, preset):
    """The reference algorithm, one label at a time (tklab-tud/LLG Predictor, without breaching's stale index)."""
    g = g.clone()
    counts = torch.zeros(len(g), dtype=torch.long)
    for i in torch.argsort(g.where(preset, torch.full_like(g, torch.inf)), stable=True)[: min(int(preset.sum()),
                                                                                             total)]:
        counts[i] += 1
        g[i] -= impact
    for _ in range(total - int(counts.sum())):
        j = int(torch.argmin(g))
        counts[j] += 1
        g[j] -= impact
    return counts


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), c=st.integers(2, 12), total=st.integers(1, 50))
def test_greedy_fill_equals_the_sequential_algorithm(seed, c, total):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(c, generator=gen, dtype=torch.float64)
    impact = -float(torch.rand(1, generator=gen, dtype=torch.float64)) - 0.05
    preset = g < 0
    counts = greedy_fill(g, impact, total, preset)
    assert torch.equal(counts, _greedy_reference(g, impact, total, preset))
    assert int(counts.sum()) == total and bool((counts >= 0).all())


def test_llg_recovers_counts_when_its_model_holds():
    """Row sums built exactly as LLG models them (g_i = λ_i m + small offsets) are decoded exactly."""
    counts = torch.tensor([3, 0, 1, 0, 2, 0])
    g = counts.double() * -1.0 + torch.tensor([0.01, 0.02, 0.0, 0.03, 0.01, 0.02])
    assert torch.equal(greedy_fill(g, -1.0, 6, g < 0), counts)


# --------------------------------------------------------------------------- iLRG
def test_ilrg_mean_embedding_of_single_sample_classes():
    """ê_i = ∇W_i/∇b_i is the gradient-weighted mean of the batch's features: for a batch of one sample it is
    that sample's feature exactly, for every class (iLRG §3)."""
    model = build("linear", C, in_shape=SHAPE, norm="none", seed=0).double()
    x = torch.rand((1, *SHAPE), dtype=torch.float64)
    capture, _ = capture_gradients(model, x, torch.tensor([2]), Protocol(batch_size=1))
    w, b = capture.last_layer()
    emb = mean_embeddings(w, b)
    torch.testing.assert_close(emb, x.flatten().expand(C, -1))


def test_ilrg_on_untrained_relu_net():
    model = build("lenet5", 10, in_shape=(1, 28, 28), seed=0)
    capture, truth = _capture(model, 32, seed=1)
    result = labels.recover(capture, "ilrg")
    assert result.ok and torch.equal(result.counts, truth.counts), (result.counts, truth.counts)
    assert result.info["residual"] < 1e-3


def test_ilrg_uniform_variant_and_bad_option():
    model = build("mlp", C, in_shape=SHAPE, seed=0)
    capture, _ = _capture(model, 12, seed=0)
    assert labels.recover(capture, "ilrg", probs="uniform").ok
    with pytest.raises(ConfigError, match="probs"):
        labels.recover(capture, "ilrg", probs="bogus")


def _common_posterior_grads(counts: torch.Tensor, p: torch.Tensor, emb: torch.Tensor):
    """∇W, ∇b of the mean CE loss when every sample has the posterior ``p`` (per-sample features ``emb``)."""
    y = torch.repeat_interleave(torch.arange(len(counts)), counts)
    g = p.expand(len(y), -1) - torch.nn.functional.one_hot(y, len(counts)).double()
    return g.T @ emb / len(y), g.mean(0), y


def test_ilrg_common_embedding_and_split_are_exact_under_a_common_posterior():
    """Steps (a)–(b) of labels.ilrg: ``μ`` is exact when ∇W_i = ∇b_i μ, and with the batch mean and true counts
    step (b) gives every present class's exact mean embedding, even for a class whose
    ∇b_i is (almost) 0, where the paper's ratio ∇W_i/∇b_i is off by orders of magnitude."""
    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(7, generator=gen, dtype=torch.float64)
    db = torch.randn(C, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(common_embedding(db[:, None] * mu, db), mu)
    counts = torch.tensor([3, 1, 0, 4, 2, 2])
    p = torch.tensor([0.2, 0.1, 0.1, 0.3, 0.15, 0.15], dtype=torch.float64)  # p_0 B = 2.4 ≈ n_0 = 3
    p[0] = 3.0 / 12 + 1e-7
    p[1:] *= (1 - p[0]) / p[1:].sum()
    emb = torch.rand(12, 7, generator=gen, dtype=torch.float64)
    dw, db, y = _common_posterior_grads(counts, p, emb)
    assert abs(float(db[0])) < 1e-6
    present = counts > 0
    class_means = torch.stack([emb[y == i].mean(0) for i in range(C) if counts[i] > 0])
    split = split_embeddings(dw, db, emb.mean(0), counts.double(), p, 12, 1.0, 1.0, fallback=torch.zeros_like(dw))
    torch.testing.assert_close(split[present], class_means)
    assert torch.equal(split[~present], torch.zeros_like(split[~present]))
    paper_error = (mean_embeddings(dw, db)[0] - class_means[0]).norm() / class_means[0].norm()
    assert paper_error > 100


def _balanced_capture(robust_class: int = 0):
    """Untrained linear softmax net, C=6, B=12, with the bias of one present class tuned so that its ∇b_i ≈ 0
    (Σ_n p_ni ≈ n_i: the ill-conditioned row that makes the paper's ê_i = ∇W_i/∇b_i garbage)."""
    gen = torch.Generator().manual_seed(5)
    model = build("linear", C, in_shape=SHAPE, norm="none", seed=0).double()
    with torch.no_grad():
        model.fc.weight.copy_(0.05 * torch.randn(model.fc.weight.shape, generator=gen, dtype=torch.float64))
        model.fc.bias.zero_()
    y = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 4, 5])
    x = torch.rand((12, *SHAPE), generator=gen, dtype=torch.float64)
    lo, hi = -5.0, 5.0  # bisection on b_i: Σ_n p_ni = n_i (1 + 1e-6)
    target = float((y == robust_class).sum()) * (1 + 1e-6)
    for _ in range(200):
        mid = (lo + hi) / 2
        with torch.no_grad():
            model.fc.bias[robust_class] = mid
            mass = float(torch.softmax(model(x), 1)[:, robust_class].sum())
        lo, hi = (mid, hi) if mass < target else (lo, mid)
    return capture_gradients(model, x, y, Protocol(batch_size=12))


def test_ilrg_robust_recovers_a_present_class_with_vanishing_bias_gradient():
    """Regression for the table-2 misses (LeNet-5/ResNet-50 ReLU, B=32, C=10): a present class with ∇b_i ≈ 0.
    The paper's step 1 (``ilrg``, ``robust=False``) miscounts; the conditioned estimator (``ilrg-robust``) is exact."""
    capture, truth = _balanced_capture()
    _, b = capture.last_layer()
    assert 0 < abs(float(b[0])) < 1e-5
    paper = labels.recover(capture, "ilrg")
    assert paper.ok and not torch.equal(paper.counts, truth.counts) and paper.info["candidate"] == "paper"
    assert torch.equal(labels.recover(capture, "ilrg", robust=False).counts, paper.counts)
    result = labels.recover(capture, "ilrg-robust")
    assert result.method == "ilrg-robust"
    assert result.ok and torch.equal(result.counts, truth.counts), (result.counts, truth.counts, result.info)
    assert result.info["candidate"] != "paper" and result.info["robust"]
    assert result.info["rounded_residual"] < paper.info["rounded_residual"]


def test_ilrg_bad_iterations():
    model = build("mlp", C, in_shape=SHAPE, seed=0)
    capture, _ = _capture(model, 12, seed=0)
    with pytest.raises(ConfigError, match="iterations"):
        labels.recover(capture, "ilrg", iterations=-1)
    assert labels.recover(capture, "ilrg", iterations=0).info["candidate"] in ("paper", "common")


# --------------------------------------------------------------------------- LLG+ / LLG* / ZLG
def test_llg_plus_and_zlg_plus_on_untrained_relu_net():
    model = build("lenet5", 10, in_shape=(1, 28, 28), seed=0)
    aux = _aux(10, 5, (1, 28, 28))
    for seed in range(3):
        capture, truth = _capture(model, 32, seed=seed)
        for method in ("llg+", "llg*", "zlg", "zlg+"):
            result = labels.recover(capture, method, aux=aux)
            ins = int(torch.minimum(result.counts, truth.counts).sum()) / 32
            assert result.ok and ins >= 0.9, (method, result.counts, truth.counts)


def test_llg_collapses_with_tanh():
    """A faithful LLG reproduces the paper's failure: with tanh the row-sum signs carry no label information."""
    model = build("lenet5", 10, activation="tanh", in_shape=(1, 28, 28), seed=0)
    aux = _aux(10, 5, (1, 28, 28))
    scores = []
    for seed in range(6):
        capture, truth = _capture(model, 32, seed=seed)
        for method in ("llg", "llg*"):
            result = labels.recover(capture, method, aux=aux)
            scores.append(int(torch.minimum(result.counts, truth.counts).sum()) / 32)
    assert sum(scores) / len(scores) < 0.6


def test_zlg_prob_options():
    model = build("mlp", C, in_shape=SHAPE, seed=0)
    capture, _ = _capture(model, 12, seed=0)
    aux = _aux()
    assert labels.recover(capture, "zlg+", aux=aux, prob="positive").ok
    with pytest.raises(ConfigError, match="prob"):
        labels.recover(capture, "zlg+", aux=aux, prob="bogus")


def test_methods_without_bias_need():
    """LLG, ZLG and RLG read ∇W only; they work without a last-layer bias."""
    model = build("mlp", C, in_shape=SHAPE, bias_last=False, seed=0)
    capture, _ = _capture(model, 12, seed=0)
    for method in ("llg", "llg+", "llg*", "zlg", "zlg+"):
        assert labels.recover(capture, method, aux=_aux()).ok, method
    for method in ("posterior", "ilrg"):
        result = labels.recover(capture, method, aux=_aux())
        assert not result.ok and "bias_last=False" in result.info["reason"]


# --------------------------------------------------------------------------- RLG
def test_rlg_recovers_the_label_set_for_small_batches():
    model = build("lenet5", 20, in_shape=(3, 32, 32), seed=0)
    for seed in range(3):
        y = torch.randint(0, 20, (7,), generator=torch.Generator().manual_seed(seed))
        capture, truth = _capture(model, 7, seed=seed, labels_=y)
        result = labels.recover(capture, "rlg")
        assert result.ok
        assert torch.equal(torch.tensor(result.info["present"]), truth.counts > 0)
        assert int(result.counts.sum()) == 7


def test_rlg_refuses_unidentifiable_batches():
    model = build("mlp", C, in_shape=SHAPE, seed=0)
    capture, _ = _capture(model, 12, seed=0)
    result = labels.recover(capture, "rlg")
    assert not result.ok and "rank" in result.info["reason"]


def test_separable_classes_lp():
    # rows u_i in R^1: only the extreme rows can be separated from all others by a sign
    basis = torch.tensor([[-1.0], [0.5], [0.7]]).numpy()
    assert separable_classes(basis).tolist() == [True, False, False]


# --------------------------------------------------------------------------- properties of every method
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 40), activation=st.sampled_from(["relu", "tanh", "sigmoid"]),
       bias=st.booleans())
def test_counts_sum_to_batch_and_are_non_negative(seed, batch, activation, bias):
    model = build("mlp", C, in_shape=SHAPE, activation=activation, bias_last=bias, seed=seed, widths=(8,))
    capture, _ = _capture(model, batch, seed)
    aux = _aux(seed=seed)
    for method in COUNT_METHODS:
        result = labels.recover(capture, method, aux=aux)
        assert result.counts.dtype == torch.long and result.counts.shape == (C,)
        if result.ok:
            assert int(result.counts.sum()) == batch and bool((result.counts >= 0).all()), method
            assert float(result.proportions.sum()) == pytest.approx(1.0)
        else:
            assert result.info["reason"]


def test_nan_gradient_is_a_capture_error():
    from gi import CaptureError

    model = build("mlp", C, in_shape=SHAPE, seed=0)
    capture, _ = _capture(model, 4, seed=0)
    grads = dict(capture.gradients)
    grads["fc.weight"] = grads["fc.weight"].clone()
    grads["fc.weight"][0, 0] = float("nan")
    bad = Capture(capture.model_spec, capture.model_state, capture.protocol, gradients=grads, meta=capture.meta)
    for method in ("ilrg", "llg", "zlg", "rlg"):
        with pytest.raises(CaptureError, match="NaN"):
            labels.recover(bad, method, aux=_aux())
