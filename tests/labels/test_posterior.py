"""Posterior-probability label recovery (Theorems 1–2, eq. 2–3), its aux helpers and the FedSGD batch scenario."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi import Capture, ConfigError, Protocol, capture_gradients
from gi.world.data import ImageDataset
from gi.world.models import build
from gi.world.scenarios import get_scenario
from labels.aux_stats import (
    aux_forward,
    class_posteriors,
    embedded_targets,
    focal_weight,
    label_embedding,
    logit_gradients,
)

# Estimates are exact up to ~1e-7: capture_gradients builds its soft targets in float32.
C = 6
SHAPE = (1, 6, 6)

PROTOCOLS = {
    "ce": {},
    "ce-tau0.8": {"temperature": 0.8},
    "ce-tau1.2": {"temperature": 1.2},
    "focal": {"loss": "focal", "focal_alpha": 0.25, "focal_gamma": 2.0},
    "focal-tau1.2": {"loss": "focal", "focal_alpha": 0.25, "focal_gamma": 2.0, "temperature": 1.2},
    "focal-smooth-alt": {"loss": "focal", "focal_gamma": 2.0, "label_aug": "smoothing-alt", "label_eps": 0.1},
    "ce-smooth": {"label_aug": "smoothing", "label_eps": 0.25},
    "ce-smooth-alt": {"label_aug": "smoothing-alt", "label_eps": 0.25},
    "bce": {"loss": "bce"},
}


def _targets(y: torch.Tensor, protocol: Protocol) -> torch.Tensor:
    emb = label_embedding(protocol, C)
    return embedded_targets(y, C, emb)


def constant_sum_images(n: int, gen: torch.Generator) -> torch.Tensor:
    """Images in [0.4, 0.6] whose pixel sums are all equal (so every linear-model feature sum is equal)."""
    r = torch.rand((n, *SHAPE), generator=gen, dtype=torch.float64)
    return 0.5 + 0.1 * (r - r.mean(dim=(1, 2, 3), keepdim=True))


def exact_setup(bias: str = "random", bias_last: bool = True, protocol: dict | None = None, batch: int = 23,
                seed: int = 0):
    """Linear softmax model with W = 0 (every sample has the same posterior: eq. 3 and iLRG hold exactly),
    float64 throughout; images with equal pixel sums (ZLG's Ō assumption holds exactly too)."""
    gen = torch.Generator().manual_seed(seed)
    model = build("linear", C, in_shape=SHAPE, init="zero-last", norm="none", bias_last=bias_last, seed=seed).double()
    if bias_last:
        with torch.no_grad():
            model.fc.bias.copy_(torch.randn(C, generator=gen, dtype=torch.float64) if bias == "random" else 0.0)
    proto = Protocol(batch_size=batch, **(protocol or {}))
    y = torch.randint(0, C, (batch,), generator=gen)
    x = constant_sum_images(batch, gen)
    capture, truth = capture_gradients(model, x, _targets(y, proto), proto)
    aux = ImageDataset(constant_sum_images(4 * C, gen).float(), torch.arange(4 * C) % C, C)
    return capture, truth, aux


# --------------------------------------------------------------------------- Theorem 1 (eq. 2)
@pytest.mark.parametrize("name", ["ce", "ce-tau1.2", "focal", "focal-tau1.2", "bce"])
def test_theorem1_focal_weight_matches_autograd(name):
    """∇z = Φ(α_c, p_c, γ)/τ · (p − y) for one-hot targets (Table 1), checked against autograd of the loss."""
    proto = Protocol(**PROTOCOLS[name])
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(16, C, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, C, (16,), generator=gen)
    grads = logit_gradients(z, _targets(y, proto), proto)
    tau = proto.temperature
    p = torch.sigmoid(z / tau) if proto.loss == "bce" else torch.softmax(z / tau, 1)
    p_c = p.gather(1, y[:, None])
    phi = torch.stack([focal_weight(p_c[i].expand(C), proto)[0] for i in range(16)])
    expected = phi[:, None] * (p - torch.nn.functional.one_hot(y, C).double())
    torch.testing.assert_close(grads, expected, rtol=1e-10, atol=1e-12)


def test_focal_weight_limits():
    proto = Protocol(loss="focal", focal_gamma=2.0)
    p = torch.tensor([0.0, 0.5, 1.0 - 1e-15, 1.0], dtype=torch.float64)
    phi = focal_weight(p, proto)
    assert torch.isfinite(phi).all() and (phi >= 0).all()
    assert phi[-1] == 0  # (1 − p)^γ → 0
    assert torch.allclose(focal_weight(p, Protocol()), torch.ones(4, dtype=torch.float64))


def test_label_embeddings_both_conventions():
    assert label_embedding(Protocol(), 10) == (1.0, 0.0)
    y_pos, y_neg = label_embedding(Protocol(label_aug="smoothing", label_eps=0.1), 10)
    assert y_pos == pytest.approx(0.91) and y_neg == pytest.approx(0.01)
    y_pos, y_neg = label_embedding(Protocol(label_aug="smoothing-alt", label_eps=0.1), 10)
    assert y_pos == pytest.approx(0.9) and y_neg == pytest.approx(0.1 / 9)
    assert isinstance(label_embedding(Protocol(label_aug="smoothing"), 10), str)
    assert isinstance(label_embedding(Protocol(label_aug="mixup"), 10), str)


# --------------------------------------------------------------------------- Theorem 2 (eq. 3), exact cases
@pytest.mark.parametrize("name", sorted(PROTOCOLS))
@pytest.mark.parametrize("weighting", ["paper", "per-sample"])
def test_posterior_exact_when_all_posteriors_equal(name, weighting):
    """W = 0 and b = 0: every sample's posterior is the same and every focal weight too, so eq. 3 is exact."""
    capture, truth, aux = exact_setup(bias="zero", protocol=PROTOCOLS[name])
    result = labels.recover(capture, "posterior", aux=aux, weighting=weighting)
    assert result.ok, result.info
    torch.testing.assert_close(result.estimate, truth.counts.double(), rtol=0, atol=1e-6)
    assert torch.equal(result.counts, truth.counts)


@pytest.mark.parametrize("name", ["ce", "ce-tau0.8", "ce-smooth", "ce-smooth-alt", "bce"])
def test_posterior_exact_with_unequal_class_posteriors(name):
    """W = 0, random b: p = softmax(b) differs per class but is shared by all samples; exact for γ = 0."""
    capture, truth, aux = exact_setup(bias="random", protocol=PROTOCOLS[name])
    result = labels.recover(capture, "posterior", aux=aux)
    torch.testing.assert_close(result.estimate, truth.counts.double(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["posterior", "ilrg", "zlg+"])
@pytest.mark.parametrize("name", ["ce", "ce-tau1.2", "ce-smooth-alt", "bce"])
def test_every_exact_method_is_exact_on_the_linear_case(method, name):
    """The methods that claim exactness are exact when their assumptions hold exactly: equal posteriors
    (posterior, iLRG: p̂_i = softmax(W ê_i + b) = softmax(b)) and equal feature sums (ZLG's Ō)."""
    capture, truth, aux = exact_setup(bias="random", protocol=PROTOCOLS[name], seed=3)
    result = labels.recover(capture, method, aux=aux)
    assert result.ok, result.info
    torch.testing.assert_close(result.estimate, truth.counts.double(), rtol=0, atol=1e-6)
    assert torch.equal(result.counts, truth.counts)


def test_class_posteriors_are_positive_and_negative_means():
    gen = torch.Generator().manual_seed(0)
    model = build("mlp", 3, in_shape=(1, 4, 4), seed=0)
    capture, _ = capture_gradients(model, torch.rand(4, 1, 4, 4, generator=gen), torch.tensor([0, 1, 2, 0]),
                                   Protocol(batch_size=4))
    aux = ImageDataset(torch.rand(7, 1, 4, 4, generator=gen), torch.tensor([0, 0, 1, 1, 1, 2, 2]), 3)
    stats = aux_forward(capture, aux, cache=False)
    p_pos, p_neg = class_posteriors(stats)
    for j in range(3):
        assert p_pos[j] == pytest.approx(float(stats.probs[aux.labels == j, j].mean()))
        assert p_neg[j] == pytest.approx(float(stats.probs[aux.labels != j, j].mean()))
    with torch.no_grad():
        direct = capture.model().double()(aux.images.double())
    torch.testing.assert_close(stats.logits, direct)


def test_aux_forward_cache_follows_the_model_state():
    capture, _, aux = exact_setup()
    first = aux_forward(capture, aux)
    again = aux_forward(capture, aux)
    assert again.seconds == 0.0 and again.logits is first.logits
    other = Capture(capture.model_spec, {k: v.clone() + 0.1 for k, v in capture.model_state.items()},
                    capture.protocol, gradients=capture.gradients, meta=capture.meta)
    moved = aux_forward(other, aux)
    assert not torch.allclose(moved.logits, first.logits)


def test_batch_form_matches_single_calls():
    captures = []
    aux = None
    for seed in range(3):
        capture, _, aux_s = exact_setup(bias="random", seed=seed)
        captures.append(capture)
        aux = aux or aux_s
    many = labels.recover_many(captures, "posterior", aux=aux)
    for capture, result in zip(captures, many):
        single = labels.recover(capture, "posterior", aux=aux)
        torch.testing.assert_close(single.estimate, result.estimate)
        assert "solver_seconds" in result.info and "aux_seconds" in result.info


# --------------------------------------------------------------------------- failures and clear errors
def test_no_bias_gives_a_clear_failure():
    capture, _, aux = exact_setup(bias_last=False)
    for method in ("posterior", "ilrg"):
        result = labels.recover(capture, method, aux=aux)
        assert not result.ok and "bias" in result.info["reason"]
        assert result.counts.sum() == 0
    assert labels.recover(capture, "zlg+", aux=aux).ok  # ∇W only


@pytest.mark.parametrize("method", ["posterior", "llg+", "zlg+"])
def test_missing_aux_is_a_clear_error(method):
    capture, _, _ = exact_setup()
    with pytest.raises(ConfigError, match="needs auxiliary data"):
        labels.recover(capture, method)
    with pytest.raises(ConfigError, match="must have tensors"):
        labels.recover(capture, method, aux=[1, 2, 3])


def test_bad_aux_shape_and_labels_raise():
    capture, _, aux = exact_setup()
    with pytest.raises(ConfigError, match="model expects"):
        labels.recover(capture, "posterior", aux=ImageDataset(torch.rand(6, 3, 6, 6), torch.arange(6), C))
    with pytest.raises(ConfigError, match=r"labels must lie in \[0, 6\)"):  # the aux set refuses them itself
        labels.recover(capture, "posterior", aux=ImageDataset(aux.images, aux.labels + C, C))
    bad = ImageDataset(aux.images, aux.labels, C)
    bad.labels = aux.labels + C  # an object that bypassed the constructor still meets the method's own check
    with pytest.raises(ConfigError, match="class ids"):
        labels.recover(capture, "posterior", aux=bad)
    with pytest.raises(ConfigError, match="weighting"):
        labels.recover(capture, "posterior", aux=aux, weighting="bogus")


def test_aux_without_some_class_fails_with_reason_or_uses_the_prior():
    capture, truth, aux = exact_setup()
    keep = aux.labels != 2
    partial = ImageDataset(aux.images[keep], aux.labels[keep], C)
    result = labels.recover(capture, "posterior", aux=partial)
    assert not result.ok and "class(es) [2]" in result.info["reason"]
    for weighting in ("paper", "per-sample"):  # p̂⁺ := p̂⁻ is exact here: every posterior is equal
        result = labels.recover(capture, "posterior", aux=partial, missing="prior", weighting=weighting)
        torch.testing.assert_close(result.estimate[2], truth.counts[2].double(), rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="missing"):
        labels.recover(capture, "posterior", aux=aux, missing="bogus")


def test_mixup_and_unknown_eps_fail_with_reason():
    capture, _, aux = exact_setup()
    for proto in (Protocol(batch_size=23, label_aug="mixup"), Protocol(batch_size=23, label_aug="smoothing")):
        cap = Capture(capture.model_spec, capture.model_state, proto, gradients=capture.gradients, meta=capture.meta)
        result = labels.recover(cap, "posterior", aux=aux)
        assert not result.ok and "label" in result.info["reason"]


def test_multi_step_update_is_refused():
    capture, _, aux = exact_setup()
    proto = Protocol(scheme="fedavg", batch_size=8, local_epochs=2)
    update = {k: -0.01 * v for k, v in capture.gradients.items()}
    cap = Capture(capture.model_spec, capture.model_state, proto, update=update, meta={"num_samples": 23})
    result = labels.recover(cap, "posterior", aux=aux)
    assert not result.ok and "update" in result.info["reason"]


# --------------------------------------------------------------------------- properties
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 40), name=st.sampled_from(sorted(PROTOCOLS)))
def test_posterior_counts_sum_to_batch_and_are_non_negative(seed, batch, name):
    gen = torch.Generator().manual_seed(seed)
    model = build("mlp", C, in_shape=SHAPE, activation="tanh", seed=seed, widths=(8,))
    proto = Protocol(batch_size=batch, **PROTOCOLS[name])
    y = torch.randint(0, C, (batch,), generator=gen)
    capture, _ = capture_gradients(model, torch.rand(batch, *SHAPE, generator=gen), _targets(y, proto).float(), proto)
    aux = ImageDataset(torch.rand(3 * C, *SHAPE, generator=gen), torch.arange(3 * C) % C, C)
    result = labels.recover(capture, "posterior", aux=aux)
    if result.ok:
        assert int(result.counts.sum()) == batch and bool((result.counts >= 0).all())
        assert float(result.proportions.sum()) == pytest.approx(1.0)
        assert result.estimate is not None and result.estimate.dtype == torch.float64


# --------------------------------------------------------------------------- the scenario
def _scenario_setup(**extra):
    setup = {"dataset": "fashion-mnist", "victim_split": "test", "aux_split": "test", "batch_size": 8,
             "model": {"name": "linear"}, "aux": {"per_class": 2}}
    setup.update(extra)
    return setup


def test_fedsgd_batch_scenario_makes_disjoint_honest_trials():
    scenario = get_scenario("fedsgd-batch")
    gen = torch.Generator().manual_seed(0)
    trials = [t for i in range(2) for t in scenario(_scenario_setup(), gen, i)]
    assert trials[0].aux is trials[1].aux  # shared aux → one forward per model
    for t in trials:
        assert int(t.truth.counts.sum()) == 8 and t.capture.protocol.batch_size == 8
        assert t.aux.per_class.tolist() == [2] * 10
        result = labels.recover(t.capture, "posterior", aux=t.aux)
        assert result.ok and int(result.counts.sum()) == 8
    # victim batches never contain an aux image (same split: aux indices are excluded from the pool)
    aux_imgs = trials[0].aux.images.flatten(1)
    for t in trials:
        same = (t.truth.images.flatten(1)[:, None, :] == aux_imgs[None]).all(-1)
        assert not same.any()


def test_fedsgd_batch_scenario_options():
    scenario = get_scenario("fedsgd-batch")
    gen = torch.Generator().manual_seed(0)
    (t,) = scenario(_scenario_setup(imbalance=0.75, size=8, channels=3, shared="last",
                                    protocol={"label_aug": "smoothing-alt", "label_eps": 0.1}), gen, 0)
    assert int(t.truth.counts.max()) == 6  # round(0.75 · 8) in the dominant class
    assert tuple(t.truth.images.shape[1:]) == (3, 8, 8) and set(t.capture.gradients) == {"fc.weight", "fc.bias"}
    assert torch.allclose(t.truth.targets.max(1).values, torch.full((8,), 0.9))
    with pytest.raises(ConfigError, match="unknown key"):
        scenario(_scenario_setup(bogus=1), gen, 0)
    with pytest.raises(ConfigError, match="mixup"):
        scenario(_scenario_setup(protocol={"label_aug": "mixup"}), gen, 0)


def test_fedsgd_batch_scenario_trains_once_per_config():
    scenario = get_scenario("fedsgd-batch")
    gen = torch.Generator().manual_seed(0)
    setup = _scenario_setup(train={"epochs": 1, "samples": 64, "batch_size": 32, "lr": 0.01}, train_split="test")
    a, = scenario(setup, gen, 0)
    b, = scenario(setup, gen, 1)
    assert a.capture.meta["train"]["steps"] == 2
    assert all(torch.equal(a.capture.model_state[k], b.capture.model_state[k]) for k in a.capture.model_state)
    untrained = build("linear", 10, in_shape=(1, 28, 28), seed=0)
    assert not torch.equal(a.capture.model_state["fc.weight"], untrained.state_dict()["fc.weight"])
