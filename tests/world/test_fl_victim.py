"""The FL victim: local training matches RLU Appendix A in closed form; federation bookkeeping; clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gi
from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl import SCHEMES, local_schedule
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import run_federation, simulate_client
from gi.world.models import build
from labels.rlu import history_offset, impulse_rho, scheme_rho
from tests.factories import random_batch

C = 4


def _data(n: int = 48, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(n, (1, 4, 4), C, seed, torch.float64)


def _linear(seed: int = 0):
    return build("linear", C, in_shape=(1, 4, 4), seed=seed, norm="none").double()


def _random_history(protocol: Protocol, model, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"{term}/{name}": 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype)
            for term in SCHEMES[protocol.scheme].history for name, p in model.named_parameters()}


CASES = [
    dict(scheme="fedavg"),
    dict(scheme="fedavg", optimizer="sgdm", momentum=0.9),
    dict(scheme="fedavg", optimizer="nesterov", momentum=0.9),
    dict(scheme="fedprox", prox_mu=5.0),
    dict(scheme="scaffold"),
    dict(scheme="feddyn", feddyn_alpha=0.5),
    dict(scheme="feddc", feddc_alpha=0.5),
    # beyond Table 1: combinations and weight decay go through the exact impulse response
    dict(scheme="fedprox", prox_mu=2.0, optimizer="sgdm", momentum=0.5, weight_decay=1e-2),
    dict(scheme="feddyn", feddyn_alpha=0.5, optimizer="nesterov", momentum=0.3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_bias_update_matches_rlu_closed_form(case):
    """Δb = −η Σ_τ ρ^(τ) g_τ − h (RLU eq. 16, Table 1) on a linear model, to 1e-6 (float64: ~1e-15)."""
    images, labels = _data()
    model = _linear()
    protocol = Protocol(batch_size=8, lr=0.1, local_steps=7, **case)
    history = _random_history(protocol, model)
    capture, truth = simulate_client(model, (images, labels), protocol, torch.Generator().manual_seed(3),
                                     history=history)
    steps = truth.extra["step_bias_grad"]
    assert steps.shape == (7, C)
    rho = scheme_rho(capture.protocol, 7)
    h = history_offset(capture, "fc.bias", rho)
    predicted = -protocol.lr * (rho.unsqueeze(1) * steps).sum(0) - h
    assert torch.allclose(capture.update["fc.bias"], predicted, atol=1e-6, rtol=0)
    assert torch.allclose(capture.update["fc.bias"], predicted, atol=1e-12, rtol=0)


@pytest.mark.parametrize("case", CASES[:7], ids=lambda c: c["scheme"] + "-" + c.get("optimizer", "sgd"))
def test_table1_closed_forms_equal_impulse_response(case):
    protocol = Protocol(lr=0.05, **case)
    assert torch.allclose(scheme_rho(protocol, 11), impulse_rho(protocol, 11), atol=1e-12)


def test_table1_rho_values():
    sgdm = Protocol(scheme="fedavg", optimizer="sgdm", momentum=0.5)
    assert scheme_rho(sgdm, 3).tolist() == pytest.approx([1.75, 1.5, 1.0])  # (1 − γ^{m+1−τ})/(1 − γ)
    nag = Protocol(scheme="fedavg", optimizer="nesterov", momentum=0.5)
    assert scheme_rho(nag, 2).tolist() == pytest.approx([1.75, 1.5])  # (1 − γ^{m+2−τ})/(1 − γ)
    prox = Protocol(scheme="fedprox", prox_mu=2.0, lr=0.1)
    assert scheme_rho(prox, 3).tolist() == pytest.approx([0.64, 0.8, 1.0])  # (1 − λη)^{m−τ}


def test_local_schedule():
    p = Protocol(scheme="fedavg", batch_size=4, num_samples=10, local_epochs=2)
    assert local_schedule(p) == [4, 4, 4, 4]
    assert local_schedule(dataclasses.replace(p, drop_last=False)) == [4, 4, 2, 4, 4, 2]
    assert local_schedule(dataclasses.replace(p, local_steps=5)) == [4, 4, 4, 4, 4]
    assert local_schedule(p, num_samples=3) == [3, 3]  # fewer samples than B: one full batch per epoch
    with pytest.raises(CaptureError, match="num_samples"):
        local_schedule(Protocol(scheme="fedavg"))


def test_a_client_whose_epochs_leave_samples_out_is_told_once(caplog):
    """drop_last with B = 4 over N = 10 never trains on 2 samples an epoch: one notice naming the fix, logged once
    for two clients of one (N, B) (N = 11 here, which no other test trains); none where B divides N or drop_last is
    off."""
    from gi.world.fl.victim import dropped_notice

    p = Protocol(scheme="fedavg", batch_size=4, lr=0.1)
    assert "leaves 2 out" in dropped_notice(p, 10) and "drop_last=false" in dropped_notice(p, 10)
    assert dropped_notice(p, 12) is None and dropped_notice(p, 3) is None
    assert dropped_notice(dataclasses.replace(p, drop_last=False), 10) is None
    images, labels = _data(11)
    with caplog.at_level("WARNING", logger="gi.world.fl.victim"):
        for seed in (0, 1):
            simulate_client(_linear(), (images, labels), p, rng=torch.Generator().manual_seed(seed))
    assert sum("leaves 3 out" in r.getMessage() for r in caplog.records) == 1


def test_truth_counts_steps_and_epochs():
    images, labels = _data(20)
    protocol = Protocol(scheme="fedavg", batch_size=5, local_epochs=3, lr=0.1)
    capture, truth = simulate_client(_linear(), (images, labels), protocol, torch.Generator().manual_seed(0))
    assert truth.extra["step_counts"].shape == (12, C)
    assert truth.extra["step_counts"].sum(1).tolist() == [5] * 12
    assert torch.equal(truth.extra["epoch_counts"], torch.bincount(labels, minlength=C).repeat(3, 1))
    assert torch.equal(truth.counts, torch.bincount(labels, minlength=C))
    assert capture.protocol.num_samples == 20 and capture.meta["num_steps"] == 12
    assert capture.meta["labelled_samples"] == 60
    # the capture reads back the same: gradient-like view is −Δθ/η
    w, b = capture.last_layer()
    assert torch.allclose(b, -capture.update["fc.bias"] / protocol.lr)


def test_capped_steps_use_distinct_samples_only():
    images, labels = _data(40)
    protocol = Protocol(scheme="fedavg", batch_size=4, lr=0.1, local_steps=3)
    _, truth = simulate_client(_linear(), (images, labels), protocol, torch.Generator().manual_seed(0))
    assert int(truth.counts.sum()) == 12 and truth.images.shape[0] == 12
    assert torch.equal(truth.counts, truth.extra["step_counts"].sum(0))
    assert torch.equal(labels[truth.extra["indices"]], truth.labels)


def test_same_seed_same_update_and_model_untouched():
    images, labels = _data()
    model = _linear()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    protocol = Protocol(scheme="fedprox", prox_mu=0.1, batch_size=8, lr=0.1, local_epochs=2)
    c1, _ = simulate_client(model, (images, labels), protocol, torch.Generator().manual_seed(5))
    c2, _ = simulate_client(model, (images, labels), protocol, torch.Generator().manual_seed(5))
    assert all(torch.equal(c1.update[k], c2.update[k]) for k in c1.update)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert gi.simulate_client is simulate_client


def test_dp_clip_and_noise():
    images, labels = _data()
    base = Protocol(scheme="fedavg", batch_size=8, lr=0.5, local_epochs=2)
    clean, _ = simulate_client(_linear(), (images, labels), base, torch.Generator().manual_seed(1))
    clipped, _ = simulate_client(_linear(), (images, labels), dataclasses.replace(base, dp_clip=1e-3),
                                 torch.Generator().manual_seed(1))
    norm = torch.sqrt(sum((t ** 2).sum() for t in clipped.update.values()))
    assert float(norm) == pytest.approx(1e-3, rel=1e-6)
    noisy, _ = simulate_client(_linear(), (images, labels),
                               dataclasses.replace(base, dp_sigma=0.1, dp_scale="gradient"),
                               torch.Generator().manual_seed(1))
    diff = noisy.update["fc.weight"] - clean.update["fc.weight"]
    assert 0.5 * 0.1 * base.lr < float(diff.std()) < 2 * 0.1 * base.lr  # σ on −Δθ/η means η·σ on Δθ
    # DP-SGD style: σ on each step's batch-summed gradient; a linear model's Δθ then carries η σ √m / B
    step = dataclasses.replace(base, dp_sigma=1.0, lr=1e-4, local_epochs=1, dp_scale="step")
    clean, _ = simulate_client(_linear(), (images, labels), dataclasses.replace(step, dp_sigma=0.0),
                               torch.Generator().manual_seed(1))
    noisy, truth = simulate_client(_linear(), (images, labels), step, torch.Generator().manual_seed(1))
    expected = step.lr * 1.0 * (truth.extra["step_counts"].shape[0] ** 0.5) / step.batch_size
    diff = noisy.update["fc.weight"] - clean.update["fc.weight"]
    assert 0.6 * expected < float(diff.std()) < 1.5 * expected
    with pytest.raises(ConfigError, match="dp_scale"):
        simulate_client(_linear(), (images, labels), dataclasses.replace(base, dp_scale="x"))


def test_federation_fedavg_aggregation_and_captures():
    images, labels = _data(60)
    partition = [torch.arange(0, 10), torch.arange(10, 40), torch.arange(40, 60)]
    protocol = Protocol(scheme="fedavg", batch_size=5, lr=0.2)
    model = _linear()
    fed = run_federation(model, (images, labels), protocol, 3, 3, None, torch.Generator().manual_seed(0),
                         partition=partition, capture_rounds=[1, 2, 3], keep_states="all")
    assert sorted(fed.global_states) == [1, 2, 3, 4]
    weights = torch.tensor([10, 30, 20], dtype=torch.float64) / 60
    for t in (1, 2, 3):
        ups = [cap.update for (r, _, cap, _) in fed.captures if r == t]
        assert len(ups) == 3
        for name in ("fc.weight", "fc.bias"):
            expected = fed.global_states[t][name] + sum(w * u[name] for w, u in zip(weights, ups))
            assert torch.allclose(fed.global_states[t + 1][name], expected, atol=1e-12)
        cap = next(c for (r, k, c, _) in fed.captures if r == t and k == 0)
        assert torch.equal(cap.model_state["fc.bias"], fed.global_states[t]["fc.bias"])
    assert torch.equal(fed.model(model, 2).state_dict()["fc.bias"], fed.global_states[2]["fc.bias"])


def _federate(scheme: str, rounds: int = 4, **kw):
    images, labels = _data(60)
    partition = [torch.arange(0, 25), torch.arange(25, 60)]
    protocol = Protocol(scheme=scheme, batch_size=5, lr=0.2, **kw)
    fed = run_federation(_linear(), (images, labels), protocol, 2, rounds, None, torch.Generator().manual_seed(0),
                         partition=partition, capture_rounds=range(1, rounds + 1))
    by = {(r, k): cap for (r, k, cap, _) in fed.captures}
    return protocol, by


def test_scaffold_history_equals_table1_form():
    """η m (c − c_k) = η m Σ_{r=2}^t c^(r) + Σ_{r<t} Δb_k^(r) (RLU eq. 59–63) with full participation."""
    protocol, by = _federate("scaffold")
    steps = by[(1, 0)].meta["num_steps"]
    for t in (2, 3, 4):
        cap = by[(t, 0)]
        direct = protocol.lr * steps * (cap.history["scaffold.c/fc.bias"] - cap.history["scaffold.c_k/fc.bias"])
        table1 = protocol.lr * steps * sum(by[(r, 0)].history["scaffold.c/fc.bias"] for r in range(2, t + 1)) \
            + sum(by[(r, 0)].update["fc.bias"] for r in range(1, t))
        assert torch.allclose(direct, table1, atol=1e-12)


def test_feddyn_and_feddc_history_bookkeeping():
    _, by = _federate("feddyn", feddyn_alpha=0.3)
    for t in (2, 3, 4):
        past = sum(by[(r, 1)].update["fc.weight"] for r in range(1, t))
        assert torch.allclose(by[(t, 1)].history["feddyn.sum_updates/fc.weight"], past, atol=1e-12)
    _, by = _federate("feddc", feddc_alpha=0.3)
    w = torch.tensor([25, 35], dtype=torch.float64) / 60
    for t in (2, 3, 4):
        h = by[(t, 0)].history
        assert torch.allclose(h["feddc.drift/fc.bias"], sum(by[(r, 0)].update["fc.bias"] for r in range(1, t)))
        assert torch.allclose(h["feddc.prev_local/fc.bias"], by[(t - 1, 0)].update["fc.bias"])
        avg = w[0] * by[(t - 1, 0)].update["fc.bias"] + w[1] * by[(t - 1, 1)].update["fc.bias"]
        assert torch.allclose(h["feddc.prev_global/fc.bias"], avg, atol=1e-12)


def test_clear_errors():
    images, labels = _data()
    model = _linear()
    with pytest.raises(ConfigError, match="capture_gradients"):
        simulate_client(model, (images, labels), Protocol(scheme="fedsgd"))
    with pytest.raises(CaptureError, match=r"\[0, 1\]"):
        simulate_client(model, (images * 3, labels), Protocol(scheme="fedavg"))
    with pytest.raises(CaptureError, match="empty"):
        simulate_client(model, (images, labels), Protocol(scheme="fedavg"), indices=[])
    with pytest.raises(ConfigError, match="images and .labels"):
        simulate_client(model, images, Protocol(scheme="fedavg"))
    with pytest.raises(ConfigError, match="label_aug"):
        simulate_client(model, (images, labels), Protocol(scheme="fedavg", label_aug="mixup", label_eps=0.2))
    with pytest.raises(ConfigError, match="alpha"):
        run_federation(model, (images, labels), Protocol(scheme="fedavg"), 2, 1, None)


def test_bad_updates_fail_validation():
    images, labels = _data()
    capture, _ = simulate_client(_linear(), (images, labels), Protocol(scheme="fedavg", batch_size=8),
                                 torch.Generator().manual_seed(0))
    capture.validate()
    nan = {**capture.update, "fc.bias": capture.update["fc.bias"].clone().fill_(float("nan"))}
    with pytest.raises(CaptureError, match="NaN"):
        dataclasses.replace(capture, update=nan).validate()
    wrong = {**capture.update, "fc.weight": torch.zeros(C + 1, 16, dtype=torch.float64)}
    with pytest.raises(CaptureError, match="shape"):
        dataclasses.replace(capture, update=wrong).validate()
    with pytest.raises(CaptureError, match="exactly one"):
        Capture(capture.model_spec, capture.model_state, capture.protocol, gradients=capture.update,
                update=capture.update).validate()


def test_capture_roundtrip(tmp_path):
    images, labels = _data()
    protocol = Protocol(scheme="scaffold", batch_size=8, local_steps=2)
    capture, truth = simulate_client(_linear(), (images, labels), protocol, torch.Generator().manual_seed(0))
    capture.save(tmp_path / "c.safetensors")
    loaded = Capture.load(tmp_path / "c.safetensors")
    assert loaded.protocol == capture.protocol and loaded.meta["num_steps"] == 2
    assert set(loaded.history) == set(capture.history)
    loaded.validate()


def test_fedavg_client_scenario_smoke():
    """The `gi labels` scenario: one cached federation, one trial per captured client, aux disjoint."""
    pytest.importorskip("gi.world.data")
    from gi.world.scenarios import get_scenario

    scenario = get_scenario("fedavg-client")
    setup = {"partition": "table", "num_clients": 2, "client_size": 20,
             "compositions": [[1, 1, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1, 3]],
             "model": {"name": "cnn", "options": {"channels": [4], "hidden": 8}},
             "protocol": {"batch_size": 10, "lr": 0.05}, "round": 2, "federation_rounds": 2,
             "aux_per_class": 3, "eval_samples": 50, "clients": [1]}
    try:
        trials = scenario(dict(setup), torch.Generator(), 0)
    except gi.AssetError:
        pytest.skip("Fashion-MNIST is not installed")
    assert len(trials) == 1 and trials[0].group == "round 2"
    trial = trials[0]
    trial.capture.validate()
    assert trial.capture.meta["round"] == 2 and trial.capture.meta["client"] == 1
    assert trial.truth.counts.tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 5, 15]
    assert "global_acc" in trial.capture.meta and trial.aux.images.shape[0] == 30
    again = scenario(dict(setup, round=1), torch.Generator(), 0)  # same federation, other round
    assert torch.equal(again[0].truth.counts, trial.truth.counts)
    with pytest.raises(ConfigError, match="unknown key"):
        scenario({"rounds": 3}, torch.Generator(), 0)


def test_local_training_with_smoothing_and_no_eps_is_an_error_not_one_hot():
    import gi
    from gi.core.errors import ConfigError

    data = gi.data.load("cifar10-samples")
    model = gi.models.build("lenet", 10, seed=0)
    protocol = gi.Protocol(scheme="fedavg", batch_size=2, label_aug="smoothing")
    with pytest.raises(ConfigError, match="label_eps"):
        gi.simulate_client(model, (data.images[:2], data.labels[:2]), protocol)
