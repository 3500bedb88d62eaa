"""RLU (Chen & Vikalo 2024) and the baselines on updates: exact cases, the least squares, schemes, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.core.errors import CaptureError, ConfigError
from gi.world.data import ImageDataset
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build
from labels.rlu import (
    as_gradient_capture,
    coefficient_matrix,
    logit_model,
    simplex_least_squares,
    update_view,
)
from tests.factories import patterned_batch

C = 4


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-structured synthetic grey images: a class-specific pattern plus noise, in [0, 1]."""
    return patterned_batch(n, C, seed, pattern_seed=1234)


def _aux() -> ImageDataset:
    images, labels_ = _data(200, 77)
    return ImageDataset(images, labels_, C)


def _cnn(init: str | None = None, activation: str = "relu"):
    return build("cnn", C, activation=activation, in_shape=(1, 6, 6), seed=0, init=init)


def _ins_acc(result, counts) -> float:
    return float(torch.minimum(result.counts, counts).sum()) / float(counts.sum())


def test_single_step_zero_weights_is_exact():
    """W = 0: every logit is b, so S_{n,j} = softmax(b)_j exactly and eq. 9 holds without error."""
    images, labels_ = _data(64, 0)
    protocol = Protocol(scheme="fedavg", batch_size=32, lr=0.05, local_steps=1)
    for seed in range(3):
        cap, truth = simulate_client(_cnn("zero-last"), (images, labels_), protocol,
                                     torch.Generator().manual_seed(seed))
        result = labels.recover(cap, "rlu", aux=_aux(), samples=500)
        assert result.ok
        assert torch.equal(result.counts, truth.counts)
        z = torch.tensor(result.info["z"], dtype=torch.float64)
        assert torch.allclose(z, truth.counts.double() / 32, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 10])
def test_untrained_cnn_recovers_counts(steps):
    images, labels_ = _data(400, 1)
    protocol = Protocol(scheme="fedavg", batch_size=16, lr=0.01, local_steps=steps)
    accs = []
    for seed in range(4):
        idx = torch.randperm(400, generator=torch.Generator().manual_seed(seed))[:200]
        cap, truth = simulate_client(_cnn(), (images, labels_), protocol, torch.Generator().manual_seed(seed),
                                     indices=idx)
        result = labels.recover(cap, "rlu", aux=_aux(), samples=2000)
        assert int(result.counts.sum()) == 16 * steps == int(truth.counts.sum())
        assert sum(result.info["labelled_counts"]) == 16 * steps
        accs.append(_ins_acc(result, truth.counts))
    assert sum(accs) / len(accs) >= 0.95


SCHEMES = [
    dict(scheme="fedprox", prox_mu=5.0),
    dict(scheme="fedavg", optimizer="sgdm", momentum=0.9),
    dict(scheme="fedavg", optimizer="nesterov", momentum=0.5),
    dict(scheme="scaffold"),
    dict(scheme="feddyn", feddyn_alpha=0.5),
    dict(scheme="feddc", feddc_alpha=0.5),
]


@pytest.mark.parametrize("case", SCHEMES, ids=lambda c: c["scheme"] + "-" + c.get("optimizer", "sgd"))
def test_schemes_with_history(case):
    """ρ and h of Table 1 make RLU work on every scheme, including non-zero history terms."""
    images, labels_ = _data(400, 2)
    protocol = Protocol(batch_size=16, lr=0.01, local_steps=5, **case)
    model = _cnn()
    g = torch.Generator().manual_seed(9)
    history = {f"{t}/{n}": 0.05 * torch.randn(p.shape, generator=g) for t in
               {"scaffold": ("scaffold.c", "scaffold.c_k"), "feddyn": ("feddyn.sum_updates",),
                "feddc": ("feddc.drift", "feddc.prev_local", "feddc.prev_global")}.get(case["scheme"], ())
               for n, p in model.named_parameters()}
    cap, truth = simulate_client(model, (images, labels_), protocol, torch.Generator().manual_seed(0),
                                 history=history)
    result = labels.recover(cap, "rlu", aux=_aux(), samples=2000)
    assert _ins_acc(result, truth.counts) >= 0.9
    if history:  # ignoring the history term breaks it
        blind = dataclasses.replace(cap, history={})
        assert _ins_acc(labels.recover(blind, "rlu", aux=_aux(), samples=2000), truth.counts) < \
            _ins_acc(result, truth.counts)


@pytest.mark.parametrize("search", ["paper", "refit"])
def test_posterior_searches_run_and_keep_the_total(search):
    images, labels_ = _data(300, 3)
    protocol = Protocol(scheme="fedavg", batch_size=16, lr=0.01, local_steps=4)
    cap, truth = simulate_client(_cnn(), (images, labels_), protocol, torch.Generator().manual_seed(0))
    result = labels.recover(cap, "rlu", aux=_aux(), samples=500, search=search, iterations=3)
    assert result.ok and sum(result.info["labelled_counts"]) == 64
    assert ("gaps" in result.info) if search == "paper" else ("changes" in result.info)


def test_seeded_monte_carlo_is_reproducible():
    images, labels_ = _data(100, 4)
    cap, _ = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=32,
                                                                  local_steps=2),
                             torch.Generator().manual_seed(0))
    a = labels.recover(cap, "rlu", aux=_aux(), samples=300, seed=1)
    b = labels.recover(cap, "rlu", aux=_aux(), samples=300, seed=1)
    assert a.info["z"] == b.info["z"]


def test_confidence_model():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 3, generator=g, dtype=torch.float64)
    lab = torch.arange(40) % 3
    lm = logit_model(logits, lab, 3, 1000, g)
    s = lm.confidence()
    assert torch.allclose(s.sum(1), torch.ones(3, dtype=torch.float64))
    a = coefficient_matrix(s)
    assert torch.allclose(a.sum(0), torch.zeros(3, dtype=torch.float64), atol=1e-12)  # 1ᵀA = 0
    point = logit_model(logits[:3].repeat(5, 1), torch.arange(3).repeat(5), 3, 10, g)  # zero covariance
    assert torch.allclose(point.confidence(), torch.softmax(logits[:3], 1), atol=1e-6)
    with pytest.raises(ConfigError, match="every class"):
        logit_model(logits, torch.zeros(40, dtype=torch.long), 3, 10, g)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2**31 - 1))
def test_simplex_least_squares_exact_when_consistent(c, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.eye(c, dtype=torch.float64) + 0.3 * torch.randn(c, c, generator=g, dtype=torch.float64)
    z = torch.distributions.Dirichlet(torch.ones(c, dtype=torch.float64)).sample()
    for solver in ("nnls", "slsqp"):
        est = simplex_least_squares(a, a @ z, solver)
        assert float(est.sum()) == pytest.approx(1.0) and (est >= 0).all()
        assert torch.allclose(est, z, atol=1e-5)


def test_update_read_as_gradient_equals_fedsgd_for_one_step():
    images, labels_ = _data(32, 5)
    model = _cnn()
    cap, _ = simulate_client(model, (images, labels_), Protocol(scheme="fedavg", batch_size=32, lr=0.1),
                             torch.Generator().manual_seed(0))
    grad_cap, _ = capture_gradients(model, images, labels_, Protocol(scheme="fedsgd", batch_size=32))
    view = as_gradient_capture(cap)
    assert view.meta["num_samples"] == 32 and not view.is_update
    for name in ("fc.weight", "fc.bias"):
        assert torch.allclose(view.gradients[name].float(), grad_cap.gradients[name], atol=1e-5)


@pytest.mark.parametrize("method", ["llg+-update", "zlg+-update", "ilrg-update"])
def test_baselines_on_updates(method):
    images, labels_ = _data(200, 6)
    cap, truth = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=16, lr=0.01,
                                                                      local_steps=3),
                                 torch.Generator().manual_seed(0))
    result = labels.recover(cap, method, aux=_aux())
    assert result.ok and result.method == method
    assert int(result.counts.sum()) == int(truth.counts.sum()) == 48
    assert _ins_acc(result, truth.counts) > 0.5


def test_clear_errors():
    images, labels_ = _data(32, 7)
    model = _cnn()
    # gradient instead of update, NaN, wrong shape: tests/labels/test_update_inputs.py (every update method)
    cap, _ = simulate_client(model, (images, labels_), Protocol(scheme="fedavg", batch_size=16),
                             torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="aux"):
        labels.recover(cap, "rlu", aux=None)
    with pytest.raises(ConfigError, match="search"):
        labels.recover(cap, "rlu", aux=_aux(), search="magic")
    no_steps = dataclasses.replace(cap, protocol=dataclasses.replace(cap.protocol, num_samples=None), meta={})
    with pytest.raises(CaptureError, match="num_samples"):
        labels.recover(no_steps, "rlu", aux=_aux())
    no_bias = build("cnn", C, in_shape=(1, 6, 6), seed=0, bias_last=False)
    cap, _ = simulate_client(no_bias, (images, labels_), Protocol(scheme="fedavg", batch_size=16),
                             torch.Generator().manual_seed(0))
    result = labels.recover(cap, "rlu", aux=_aux())
    assert not result.ok and "bias" in result.info["reason"]
    assert update_view(cap).bias is None


def test_baseline_view_naive_or_scheme_aware():
    """Baselines read −Δθ/(η m) like the paper's (plain SGD assumed); scheme_aware divides by Σρ instead."""
    images, labels_ = _data(100, 8)
    plain, _ = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=16,
                                                                    local_steps=3),
                               torch.Generator().manual_seed(0))
    a, b = as_gradient_capture(plain), as_gradient_capture(plain, scheme_aware=True)
    assert torch.allclose(a.gradients["fc.bias"], b.gradients["fc.bias"])
    mom, _ = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", optimizer="sgdm", momentum=0.9,
                                                                  batch_size=16, local_steps=3),
                             torch.Generator().manual_seed(0))
    rho = update_view(mom).rho
    a, b = as_gradient_capture(mom), as_gradient_capture(mom, scheme_aware=True)
    assert torch.allclose(a.gradients["fc.bias"] * 3 / float(rho.sum()), b.gradients["fc.bias"])


def test_an_update_whose_local_model_overflows_is_a_failure_not_a_crash():
    """DP noise of σ 0.5 on −Δθ/η of 10 steps gave a local model θᵗ + Δθ with non-finite logits on the aux set;
    RLU's eq. 10 then has nothing to read: ok=False with the reason, never a raw NaN error from the solver."""
    images, labels_ = _data(64, 0)
    cap, _ = simulate_client(_cnn(), (images, labels_), Protocol(scheme="fedavg", batch_size=16, lr=0.01,
                                                                 local_steps=2), torch.Generator().manual_seed(0))
    huge = {k: (v if k.endswith("fc.bias") else v * 1e36) for k, v in cap.shared.items()}
    result = labels.recover(dataclasses.replace(cap, update=huge), "rlu", aux=_aux(), samples=200)
    assert not result.ok and "non-finite logits" in result.info["reason"]
