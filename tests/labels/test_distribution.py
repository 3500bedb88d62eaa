"""Ramakrishna & Dán label-distribution estimators: exact case (Proposition 2 / Corollary 2), simplex projection."""

from __future__ import annotations

import dataclasses

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
from labels.distribution import init_bias_over_rounds, path_points, path_softmax, project_simplex

C = 5


def _data(n: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels_ = torch.randint(C, (n,), generator=g)
    means = torch.linspace(0.2, 0.8, C)
    images = (means[labels_].view(-1, 1, 1, 1) + 0.1 * torch.randn(n, 1, 6, 6, generator=g)).clamp(0, 1)
    return images.to(dtype), labels_


def _aux(dtype=torch.float64) -> ImageDataset:
    images, labels_ = _data(60, 99, dtype)
    return ImageDataset(images, labels_, C)


def _model(init: str | None = None, dtype=torch.float64):
    return build("cnn", C, in_shape=(1, 6, 6), seed=0, init=init).to(dtype)


EXACT = ["dist-exact", "dist-init-bias", "dist-soft-label", "dist-aux-bias-grad", "dist-soft-label-path"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("method", EXACT)
def test_corollary2_exact_inference(method, dtype):
    """W⁰ = 0, E = 1, full batch: init-bias, soft-label and aux-bias-grad are exact (eq. 39; paper Table 2 ~1e-11)."""
    model = _model("zero-last", dtype)
    aux = _aux(dtype)
    protocol = Protocol(scheme="fedavg", batch_size=10_000, lr=0.01, local_epochs=1)
    for seed in range(3):
        images, labels_ = _data(37 + 11 * seed, seed, dtype)
        capture, truth = simulate_client(model, (images, labels_), protocol, torch.Generator().manual_seed(seed))
        result = labels.recover(capture, method, aux=aux)
        assert result.ok, result.info
        mse = float(((result.proportions - truth.proportions) ** 2).mean())
        assert mse <= (1e-20 if dtype == torch.float64 else 1e-9), (method, mse)
        assert int(result.counts.sum()) == len(labels_)
        assert torch.equal(result.counts, truth.counts)


def test_aux_weight_grad_is_not_exact_but_valid():
    capture, truth = simulate_client(_model("zero-last"), _data(40, 1), Protocol(scheme="fedavg", batch_size=10_000),
                                     torch.Generator().manual_seed(0))
    result = labels.recover(capture, "dist-aux-weight-grad", aux=_aux())
    assert result.ok
    assert float(result.proportions.sum()) == pytest.approx(1.0) and (result.proportions >= 0).all()
    with_bias = labels.recover(capture, "dist-aux-weight-grad", aux=_aux(), include_bias=True)
    assert not torch.equal(with_bias.proportions, result.proportions)


@pytest.mark.parametrize("method,options", [("dist-soft-label-path", {}), ("dist-soft-label", {"aux_steps": 1})])
def test_one_step_with_the_clients_own_data_as_aux_is_exact(method, options):
    """One full-batch step from a trained W⁰ ≠ 0: eq. 23 reads Δb/η = p − Σ_c p_c σ̄_c(θᵗ), so when the aux set
    is the client's own data both Σ_aux (at θᵗ) are the client's class means and eq. 34 is exact."""
    images, labels_ = _data(45, 8)
    capture, truth = simulate_client(_model(), (images, labels_), Protocol(scheme="fedavg", batch_size=10_000),
                                     torch.Generator().manual_seed(0))
    result = labels.recover(capture, method, aux=ImageDataset(images, labels_, C), **options)
    assert result.ok
    assert float(((result.proportions - truth.proportions) ** 2).mean()) < 1e-24
    other = labels.recover(capture, method, aux=_aux(), **options)  # someone else's samples: no longer exact
    assert float(((other.proportions - truth.proportions) ** 2).mean()) > 1e-12


def test_path_points_place_the_clients_steps_on_the_straight_path():
    assert path_points(1, 8) == [0.0]
    assert path_points(4, 8) == [0.0, 0.25, 0.5, 0.75]
    assert path_points(100, 4) == [0.12, 0.37, 0.62, 0.87]
    with pytest.raises(ConfigError, match="points"):
        path_points(10, 0)


def test_path_softmax_averages_the_interpolated_models():
    images, labels_ = _data(30, 2)
    capture, _ = simulate_client(_model(), (images, labels_), Protocol(scheme="fedavg", batch_size=8),
                                 torch.Generator().manual_seed(0))
    aux = _aux()
    got = path_softmax(capture, aux, [0.0, 0.5, 1.0])
    expected = torch.zeros(C, C, dtype=torch.float64)
    for s in (0.0, 0.5, 1.0):
        model = _model()
        model.load_state_dict({k: v + s * capture.update[k] if k in capture.update else v
                               for k, v in capture.model_state.items()})
        probs = torch.softmax(model(aux.images), 1)
        for c in range(C):
            expected[:, c] += probs[aux.labels == c].mean(0) / 3
    assert torch.allclose(got, expected, atol=1e-12)
    assert torch.allclose(got.sum(0), torch.ones(C, dtype=torch.float64))
    assert not torch.allclose(path_softmax(capture, aux, [0.0]), got)  # the update moves the softmax


def test_exact_conditions_are_checked():
    aux = _aux()
    images, labels_ = _data(40, 3)
    trained_last, _ = simulate_client(_model(), (images, labels_), Protocol(scheme="fedavg", batch_size=10_000),
                                      torch.Generator().manual_seed(0))
    result = labels.recover(trained_last, "dist-exact", aux=aux)
    assert not result.ok and "W⁰" in result.info["reason"]
    assert labels.recover(trained_last, "dist-exact", aux=aux, strict=False).ok
    multi, _ = simulate_client(_model("zero-last"), (images, labels_), Protocol(scheme="fedavg", batch_size=8),
                               torch.Generator().manual_seed(0))
    result = labels.recover(multi, "dist-exact", aux=aux)
    assert not result.ok and "full-batch" in result.info["reason"]


def test_normalisation_by_steps_matches_paper_when_one_step_per_epoch():
    """ηΣρ (our default) equals the paper's ηE when every epoch is one full-batch step; with J mini-batches
    per epoch the update is ~J times larger and only the step normalisation keeps init-bias sane."""
    images, labels_ = _data(48, 4)
    full = Protocol(scheme="fedavg", batch_size=10_000, local_epochs=3, lr=0.01)
    cap, _ = simulate_client(_model("zero-last"), (images, labels_), full, torch.Generator().manual_seed(0))
    a = labels.recover(cap, "dist-init-bias").info["raw"]
    b = labels.recover(cap, "dist-init-bias", normalize="epochs").info["raw"]
    assert a == pytest.approx(b, abs=1e-12)
    mini = dataclasses.replace(full, batch_size=8)
    cap, truth = simulate_client(_model("zero-last"), (images, labels_), mini, torch.Generator().manual_seed(0))
    steps = labels.recover(cap, "dist-init-bias")
    epochs = labels.recover(cap, "dist-init-bias", normalize="epochs")
    err = lambda r: float(((r.proportions - truth.proportions) ** 2).sum())  # noqa: E731
    assert err(steps) < err(epochs)


def test_init_bias_over_rounds_averages_eq26():
    images, labels_ = _data(40, 5)
    protocol = Protocol(scheme="fedavg", batch_size=10_000)
    caps = [simulate_client(_model("zero-last"), (images, labels_), protocol, torch.Generator().manual_seed(s))[0]
            for s in range(2)]
    avg = init_bias_over_rounds(caps)
    raws = torch.stack([torch.tensor(labels.recover(c, "dist-init-bias").info["raw"]) for c in caps])
    assert torch.allclose(avg, project_simplex(raws.mean(0)))
    with pytest.raises(ConfigError):
        init_bias_over_rounds([])


def test_clear_errors():
    model = _model()
    images, labels_ = _data(8, 0)
    # gradient instead of update, NaN, wrong shape: tests/labels/test_update_inputs.py (every update method)
    update, _ = simulate_client(model, (images, labels_), Protocol(scheme="fedavg", batch_size=8),
                                torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="aux"):
        labels.recover(update, "dist-soft-label", aux=None)
    with pytest.raises(ConfigError, match="solver"):
        labels.recover(update, "dist-aux-bias-grad", aux=_aux(), solver="magic")
    with pytest.raises(ConfigError, match="normalize"):
        labels.recover(update, "dist-init-bias", normalize="rounds")
    with pytest.raises(ConfigError, match="aux"):
        labels.recover(update, "dist-soft-label-path", aux=None)
    with pytest.raises(ConfigError, match="every class"):
        labels.recover(update, "dist-soft-label-path", aux=ImageDataset(images[labels_ != 0], labels_[labels_ != 0], C))
    with pytest.raises(ConfigError, match="points"):
        labels.recover(update, "dist-soft-label-path", aux=_aux(), points=0)
    no_bias = build("cnn", C, in_shape=(1, 6, 6), seed=0, bias_last=False)
    cap, _ = simulate_client(no_bias.double(), (images, labels_), Protocol(scheme="fedavg", batch_size=8),
                             torch.Generator().manual_seed(0))
    result = labels.recover(cap, "dist-init-bias")
    assert not result.ok and "bias" in result.info["reason"]


# --------------------------------------------------------------------------- simplex projection (eq. 43)
vectors = st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(vectors)
def test_projection_lands_on_simplex_and_is_idempotent(values):
    v = torch.tensor(values, dtype=torch.float64)
    p = project_simplex(v)
    assert (p >= 0).all()
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)
    assert torch.allclose(project_simplex(p), p, atol=1e-12)
    assert torch.allclose(project_simplex(v + 3.5), p, atol=1e-9)  # shifts along 1 do not matter
    perm = torch.randperm(len(values), generator=torch.Generator().manual_seed(len(values)))
    assert torch.allclose(project_simplex(v[perm]), p[perm], atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(vectors, st.integers(0, 2**31 - 1))
def test_projection_is_the_closest_simplex_point(values, seed):
    v = torch.tensor(values, dtype=torch.float64)
    p = project_simplex(v)
    q = torch.distributions.Dirichlet(torch.ones(len(values), dtype=torch.float64)).sample((64,))
    assert float((v - p).norm()) <= float((v.unsqueeze(0) - q).norm(dim=1).min()) + 1e-9
    # KKT: p = max(v − θ, 0) for one θ
    support = p > 0
    theta = (v - p)[support]
    assert torch.allclose(theta, theta[0].expand_as(theta), atol=1e-9)
    assert (v[~support] <= theta[0] + 1e-9).all()


def test_projection_batches_and_bad_values():
    rows = torch.tensor([[0.2, 0.3, 0.5], [2.0, -1.0, 0.0], [float("nan"), 1.0, 0.0]])
    out = project_simplex(rows)
    assert torch.allclose(out[0], rows[0].double())
    assert torch.allclose(out[1], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(out.sum(1), torch.ones(3, dtype=torch.float64))


def test_aux_runs_are_shared_by_clients_of_one_round():
    """The per-class aux runs depend on θᵗ and the protocol's rules, not on a client's sample count."""
    from labels.distribution import aux_runs

    model, aux = _model(), _aux()
    protocol = Protocol(scheme="fedavg", batch_size=8, local_epochs=2)
    caps = [simulate_client(model, _data(n, n), protocol, torch.Generator().manual_seed(0))[0] for n in (20, 33)]
    assert caps[0].protocol.num_samples != caps[1].protocol.num_samples
    assert aux_runs(caps[0], aux, 2) is aux_runs(caps[1], aux, 2)
    other = dataclasses.replace(caps[1], protocol=dataclasses.replace(caps[1].protocol, lr=0.5))
    assert aux_runs(other, aux, 2) is not aux_runs(caps[0], aux, 2)
