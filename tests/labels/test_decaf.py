"""Decaf (Dai et al. 2024): null classes from update signs, closed-form bases, non-negative decomposition."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.core.errors import ConfigError
from gi.world.data import ImageDataset
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build
from labels.decaf import decompose, null_classes
from tests.factories import patterned_batch

C = 5


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return patterned_batch(n, C, seed, pattern_seed=4321)


def _cnn(activation: str = "relu"):
    return build("cnn", C, activation=activation, in_shape=(1, 6, 6), seed=0).double()


def _client(counts: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels_ = _data(600, seed)
    idx = torch.cat([torch.nonzero(labels_ == c).flatten()[:k] for c, k in enumerate(counts)])
    return images[idx].double(), labels_[idx]


@pytest.mark.parametrize("counts", [[10, 0, 30, 0, 5], [0, 0, 0, 7, 0], [12, 12, 12, 12, 12]])
def test_null_classes_found_exactly_on_relu(counts):
    """Algorithm 1: with ReLU features and SGD, a null class's row can only decrease (the paper's proof)."""
    images, labels_ = _client(counts)
    protocol = Protocol(scheme="fedavg", batch_size=8, lr=0.05, local_epochs=2, drop_last=False)
    cap, truth = simulate_client(_cnn(), (images, labels_), protocol, torch.Generator().manual_seed(0))
    result = labels.recover(cap, "decaf", aux=ImageDataset(*_data(200, 9), C))
    assert result.ok
    assert result.info["null"] == [c for c, k in enumerate(counts) if k == 0]
    assert all(float(result.proportions[c]) == 0.0 for c, k in enumerate(counts) if k == 0)
    assert float(result.proportions.sum()) == pytest.approx(1.0)


def test_one_full_batch_step_with_the_clients_own_samples_is_exact():
    """One SGD step on the whole local set changes the last layer by −α Σ_c p_c ∇W L_c exactly; with the
    client's own samples as aux the bases are exact, so eq. 21 (with the summed calibrator) recovers p."""
    images, labels_ = _client([9, 3, 0, 14, 6], seed=1)
    cap, truth = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=10_000, lr=0.1),
                                 torch.Generator().manual_seed(0))
    aux = ImageDataset(images, labels_, C)
    for solver in ("nnls", "gd"):
        result = labels.recover(cap, "decaf", aux=aux, solver=solver, epochs=20000)
        assert torch.allclose(result.proportions, truth.proportions, atol=1e-6 if solver == "nnls" else 1e-3), solver
    assert torch.equal(labels.recover(cap, "decaf", aux=aux).counts, truth.counts)
    # the literal union-mean calibrator splits η between collinear bases and biases the estimate
    mean = labels.recover(cap, "decaf", aux=aux, calibrator="mean")
    assert mean.ok


def test_threshold_for_leaky_activations():
    images, labels_ = _client([10, 0, 20, 0, 10], seed=2)
    protocol = Protocol(scheme="fedavg", batch_size=8, lr=0.05, local_epochs=1)
    cap, _ = simulate_client(_cnn("leaky_relu"), (images, labels_), protocol, torch.Generator().manual_seed(0))
    target = (cap.update["fc.weight"] / protocol.lr).double()
    loose = null_classes(target, 0.0)
    strict = null_classes(target, float(target.amax()) + 1.0)
    assert strict.all() and loose.sum() <= strict.sum()
    result = labels.recover(cap, "decaf", aux=ImageDataset(*_data(200, 9), C), threshold=float(target.amax()) + 1.0)
    assert not result.ok and "null" in result.info["reason"]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_decompose_recovers_non_negative_factors(k, seed):
    g = torch.Generator().manual_seed(seed)
    bases = torch.randn(40, k, generator=g, dtype=torch.float64)
    eta = torch.rand(k, generator=g, dtype=torch.float64)
    assert torch.allclose(decompose(bases, bases @ eta), eta, atol=1e-8)
    gd = decompose(bases, bases @ eta, "gd", epochs=5000)
    assert (gd >= 0).all() and float((bases @ gd - bases @ eta).norm()) < 1e-3 * max(1.0, float(eta.norm()))


def test_clear_errors():
    images, labels_ = _client([5, 5, 5, 5, 5])
    cap, _ = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=8),
                             torch.Generator().manual_seed(0))
    aux = ImageDataset(*_data(100, 9), C)
    with pytest.raises(ConfigError, match="solver"):
        labels.recover(cap, "decaf", aux=aux, solver="adam")
    with pytest.raises(ConfigError, match="calibrator"):
        labels.recover(cap, "decaf", aux=aux, calibrator="median")
    with pytest.raises(ConfigError, match="null_test"):
        labels.recover(cap, "decaf", aux=aux, null_test="bayes")
    with pytest.raises(ConfigError, match="min_count"):
        labels.recover(cap, "decaf", aux=aux, null_test="calibrated", min_count=-1.0)
    with pytest.raises(ConfigError, match="null_removal"):
        labels.recover(cap, "decaf", aux=aux, null_removal="no")
    with pytest.raises(ConfigError, match="aux"):
        labels.recover(cap, "decaf", aux=None)
    few = ImageDataset(aux.images[aux.labels != 2], aux.labels[aux.labels != 2], C)
    result = labels.recover(cap, "decaf", aux=few)
    assert not result.ok and "2" in result.info["reason"]


def test_calibrator_does_not_change_the_nnls_fit_and_decaf_paper_is_the_literal_form():
    """g_u lies in the cone of the g_c, so with exact NNLS every calibrator gives the same estimate;
    ``decaf-paper`` is Algorithms 2–3 as written (union-mean g_u, projected GD from 0)."""
    images, labels_ = _client([9, 3, 0, 14, 6], seed=3)
    protocol = Protocol(scheme="fedavg", batch_size=8, lr=0.05, local_epochs=2, drop_last=False)
    cap, _ = simulate_client(_cnn(), (images, labels_), protocol, torch.Generator().manual_seed(0))
    aux = ImageDataset(*_data(200, 9), C)
    ref = labels.recover(cap, "decaf", aux=aux).proportions
    for calibrator in ("mean", "none"):
        got = labels.recover(cap, "decaf", aux=aux, calibrator=calibrator).proportions
        assert torch.allclose(got, ref, atol=1e-6), calibrator
    paper = labels.recover(cap, "decaf-paper", aux=aux)
    literal = labels.recover(cap, "decaf", aux=aux, solver="gd", calibrator="mean", epochs=1000)
    assert paper.method == "decaf-paper" and paper.ok
    assert torch.equal(paper.proportions, literal.proportions) and paper.info["null"] == [2]
    assert float(paper.proportions.sum()) == pytest.approx(1.0)


def test_without_null_removal_every_class_enters_the_decomposition():
    """§IV-E ablation: no class is removed, every class has a basis in the decomposition (and η_u, when the solver
    uses it, is added to absent classes too: Table XIV)."""
    images, labels_ = _client([10, 0, 30, 0, 5])
    protocol = Protocol(scheme="fedavg", batch_size=8, lr=0.05, local_epochs=2, drop_last=False)
    cap, _ = simulate_client(_cnn(), (images, labels_), protocol, torch.Generator().manual_seed(0))
    aux = ImageDataset(*_data(200, 9), C)
    kept = labels.recover(cap, "decaf", aux=aux, null_removal=False)
    assert kept.ok and kept.info["null"] == [] and kept.info["null_removal"] is False
    assert len(kept.info["eta"]) == C + 1  # every class and the calibrator
    assert float(kept.proportions.sum()) == pytest.approx(1.0)
    removed = labels.recover(cap, "decaf", aux=aux)
    assert removed.info["null"] == [1, 3] and len(removed.info["eta"]) == C - 2 + 1


def test_calibrated_null_test_readmits_a_one_sample_class_with_exact_bases():
    """One full-batch step with the client's own samples as aux (plus other samples of the absent class): the
    per-class bases are exact, so the decomposition of every class gives the true counts. Algorithm 1 calls the
    one-sample class null (its positive row is outweighed); the calibrated test re-admits it and keeps the truly
    absent class null."""
    counts = [40, 1, 0, 40, 40]
    images, labels_ = _client(counts, seed=4)
    cap, truth = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=10_000, lr=0.1),
                                 torch.Generator().manual_seed(0))
    other, other_labels = _data(300, 11)
    aux = ImageDataset(torch.cat([images, other[other_labels == 2].double()]),
                       torch.cat([labels_, other_labels[other_labels == 2]]), C)
    sign = labels.recover(cap, "decaf", aux=aux)
    assert sign.info["null"] == [1, 2]  # the sign test misses the one-sample class
    calibrated = labels.recover(cap, "decaf", aux=aux, null_test="calibrated")
    assert calibrated.info["sign_null"] == [1, 2] and calibrated.info["null"] == [2]
    assert calibrated.info["null_counts"] == pytest.approx([float(k) for k in counts], abs=1e-6)
    assert torch.equal(calibrated.counts, truth.counts)
    strict = labels.recover(cap, "decaf", aux=aux, null_test="calibrated", min_count=1.5)
    assert strict.info["null"] == [1, 2]

