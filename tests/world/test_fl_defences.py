"""The client-side defence registry (gi.world.fl.defences): exact math, the per-example clipping bound, Opacus' ε,
every defence through FedSGD and FedAvg clients, secure aggregation, legacy DP fields, clear errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from gi.core.errors import ConfigError
from gi.world.fl.defences import DEFENCES, Context, apply, specs
from gi.world.fl.defences.dpsgd import epsilon
from gi.world.fl.defences.secagg import pool_group
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, run_federation, simulate_client
from gi.world.models import build
from tests.factories import random_batch

C = 4
STRENGTH = {"gaussian": 0.01, "laplace": 0.01, "clip": 0.1, "gaussian-step": 0.1, "dp-sgd": 1.0, "topk": 0.5,
            "quantize": 3, "dropout": 0.5, "oversample": 1.0, "secagg": 2, "label-smoothing": 0.2, "mixup": 0.5}


def _data(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(n, (1, 6, 6), C, seed, torch.float64)


def _mlp(seed: int = 0) -> torch.nn.Module:
    return build("mlp", C, in_shape=(1, 6, 6), seed=seed, norm="none").double()


def _one(name: str, **params) -> list[dict]:
    return [{"name": name, "strength": STRENGTH[name], "params": params}]


def test_every_registered_defence_has_a_test_strength():
    assert set(DEFENCES) == set(STRENGTH)


@pytest.mark.parametrize("name", sorted(STRENGTH))
def test_every_defence_runs_on_fedsgd_and_fedavg_and_is_recorded(name):
    images, labels = _data()
    model = _mlp()
    clean_u, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, lr=0.1),
                                 rng=torch.Generator().manual_seed(1))
    cap, truth = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, lr=0.1,
                                                                   defences=_one(name)),
                                 rng=torch.Generator().manual_seed(1))
    assert cap.meta["defences"][0]["name"] == name and cap.protocol.defences[0]["name"] == name
    assert all(torch.isfinite(t).all() for t in cap.update.values())
    assert int(truth.counts.sum()) <= len(labels)
    clean_g, _ = capture_gradients(model, images[:6], labels[:6], Protocol(batch_size=6))
    cap_g, _ = capture_gradients(model, images[:6], labels[:6], Protocol(batch_size=6, defences=_one(name)),
                                 generator=torch.Generator().manual_seed(1))
    assert cap_g.meta["defences"][0]["name"] == name
    changed_u = any(not torch.equal(cap.update[k], clean_u.update[k]) for k in cap.update)
    changed_g = any(not torch.equal(cap_g.gradients[k], clean_g.gradients[k]) for k in cap_g.gradients)
    if name == "secagg":  # acts between clients only (test_secure_aggregation_*)
        assert not changed_u and not changed_g
    else:
        assert changed_u and (changed_g or name == "oversample")  # a random FedSGD batch may already be balanced


def test_legacy_dp_fields_are_the_registry_defences_with_the_same_numbers():
    images, labels = _data()
    model = _mlp()
    for legacy, entries in (({"dp_clip": 0.05, "dp_sigma": 0.01}, [{"name": "clip", "strength": 0.05},
                                                                  {"name": "gaussian", "strength": 0.01}]),
                            ({"dp_sigma": 0.1, "dp_scale": "gradient"},
                             [{"name": "gaussian", "strength": 0.1, "params": {"on": "gradient"}}]),
                            ({"dp_sigma": 0.5, "dp_scale": "step"}, [{"name": "gaussian-step", "strength": 0.5}])):
        a, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, **legacy),
                               rng=torch.Generator().manual_seed(3))
        b, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, defences=entries),
                               rng=torch.Generator().manual_seed(3))
        assert all(torch.equal(a.update[k], b.update[k]) for k in a.update)
        assert [s.name for s in specs(a.protocol)] == [e["name"] for e in entries]
    # FedSGD: σ on the gradient itself, whatever dp_scale says (one step)
    assert [s.name for s in specs(Protocol(dp_sigma=0.1, dp_scale="step"))] == ["gaussian"]


def _dp_grad(model, images, labels, clip, noise=0.0):
    p = Protocol(batch_size=len(labels), defences=[{"name": "dp-sgd", "strength": noise,
                                                    "params": {"max_grad_norm": clip}}])
    cap, _ = capture_gradients(model, images, labels, p, generator=torch.Generator().manual_seed(0))
    return torch.cat([g.flatten() for g in cap.gradients.values()])


def test_per_example_clipping_bounds_each_samples_contribution():
    """DP-SGD with noise 0: one sample's (clipped) gradient has norm <= C, so changing one sample arbitrarily moves
    the shared mean gradient by at most 2C/B, and removing it (zero contribution) by at most C/B."""
    images, labels = _data(8)
    model, clip, b = _mlp(), 1e-3, 8
    base = _dp_grad(model, images, labels, clip)
    for i in range(b):
        single = _dp_grad(model, images[i:i + 1], labels[i:i + 1], clip)
        assert float(single.norm()) <= clip * (1 + 1e-6)
        for trial in range(3):
            g = torch.Generator().manual_seed(10 * i + trial)
            other = images.clone()
            other[i] = torch.rand(other[i].shape, generator=g, dtype=other.dtype)  # an arbitrary other sample
            moved = _dp_grad(model, other, torch.where(torch.arange(b) == i, (labels + 1 + trial) % C, labels), clip)
            assert float((moved - base).norm()) <= 2 * clip / b * (1 + 1e-6)
        rest = torch.cat([images[:i], images[i + 1:]]), torch.cat([labels[:i], labels[i + 1:]])
        without = _dp_grad(model, *rest, clip) * (b - 1) / b  # the sum over the others, divided by B
        assert float((base - without).norm()) <= clip / b * (1 + 1e-6)
    # an unbounded clip is the plain mean gradient, exactly
    plain, _ = capture_gradients(model, images, labels, Protocol(batch_size=b))
    assert torch.allclose(_dp_grad(model, images, labels, 1e12), torch.cat([g.flatten() for g in
                                                                            plain.gradients.values()]), atol=1e-12)


def test_dp_sgd_epsilon_is_opacus_accountant_and_grows_with_rounds():
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(1.1, 0.25, 12)]
    assert epsilon(1.1, 0.25, 12, 1e-5) == pytest.approx(acc.get_epsilon(delta=1e-5))
    assert epsilon(2.0, 0.25, 12, 1e-5) < epsilon(1.0, 0.25, 12, 1e-5) < epsilon(1.0, 0.25, 24, 1e-5)
    assert epsilon(0.0, 0.25, 12, 1e-5) == math.inf
    assert epsilon(1.0, 0.25, 12, 1e-5, "prv") == pytest.approx(epsilon(1.0, 0.25, 12, 1e-5), rel=0.2)
    images, labels = _data(24)
    p = Protocol(scheme="fedavg", batch_size=6, defences=[{"name": "dp-sgd", "strength": 1.0}])
    fed = run_federation(_mlp(), (images, labels), p, 2, 3, None, rng=torch.Generator().manual_seed(0),
                         partition=[torch.arange(12), torch.arange(12, 24)], capture_rounds=[1, 3])
    recs = {t: cap.meta["defences"][0] for t, c, cap, _ in fed.captures if c == 0}
    assert recs[1]["steps"] == 2 and recs[3]["steps"] == 6 and recs[1]["sample_rate"] == 0.5
    assert recs[3]["epsilon"] == pytest.approx(epsilon(1.0, 0.5, 6, 1e-5)) and recs[3]["delta"] == 1e-5


def test_shared_stage_math_is_exact():
    proto = Protocol()
    t = {"a": torch.tensor([3.0, -0.5, 1.0, -4.0]), "b": torch.tensor([0.25, 2.0])}
    ctx = Context(dataclasses.replace(proto, defences=[{"name": "topk", "strength": 0.5}]))
    assert apply("shared", t, ctx)["a"].tolist() == [3.0, 0.0, 0.0, -4.0]
    ctx = Context(dataclasses.replace(proto, defences=[{"name": "topk", "strength": 0.5,
                                                        "params": {"scope": "global"}}]))
    out = apply("shared", t, ctx)
    assert out["a"].tolist() == [3.0, 0.0, 0.0, -4.0] and out["b"].tolist() == [0.0, 2.0]
    ctx = Context(dataclasses.replace(proto, defences=[{"name": "quantize", "strength": 2}]))  # levels -4, 0, 4
    assert apply("shared", t, ctx)["a"].tolist() == [4.0, 0.0, 0.0, -4.0]
    ctx = Context(dataclasses.replace(proto, defences=[{"name": "clip", "strength": 1.0}]))
    norm = math.sqrt(9 + 0.25 + 1 + 16 + 0.0625 + 4)
    assert torch.allclose(apply("shared", t, ctx)["a"], t["a"] / norm)
    big = {"z": torch.zeros(200_000, dtype=torch.float64)}
    for name in ("gaussian", "laplace"):
        ctx = Context(dataclasses.replace(proto, defences=[{"name": name, "strength": 0.3}]),
                      torch.Generator().manual_seed(0))
        z = apply("shared", big, ctx)["z"]
        assert float(z.std()) == pytest.approx(0.3, rel=0.01) and abs(float(z.mean())) < 0.005
    lap = apply("shared", big, Context(dataclasses.replace(proto, defences=[{"name": "laplace", "strength": 0.3}]),
                                       torch.Generator().manual_seed(0)))["z"]
    assert float(lap.abs().mean()) == pytest.approx(0.3 / math.sqrt(2), rel=0.01)  # E|X| = b for Laplace(b)


def test_batch_stage_targets():
    x, y = torch.rand(5, 1, 2, 2), torch.nn.functional.one_hot(torch.arange(5) % 3, 3).float()
    ctx = Context(Protocol(defences=[{"name": "label-smoothing", "strength": 0.3}]))
    assert torch.allclose(apply("batch", (x, y), ctx)[1], 0.7 * y + 0.1)
    ctx = Context(Protocol(defences=[{"name": "mixup", "strength": 0.5}]), torch.Generator().manual_seed(0))
    mx, my = apply("batch", (x, y), ctx)
    assert torch.allclose(my.sum(1), torch.ones(5)) and float(my.max()) >= 0.5 and not torch.equal(mx, x)


def test_oversampling_balances_the_client_and_keeps_the_true_counts():
    images, labels = _data(30)
    labels = torch.tensor([0] * 20 + [1] * 7 + [2] * 3)
    cap, truth = simulate_client(_mlp(), (images, labels), Protocol(
        scheme="fedavg", batch_size=60, drop_last=False, defences=[{"name": "oversample", "strength": 1.0}]),
        rng=torch.Generator().manual_seed(0))
    assert cap.num_samples == 60 and truth.counts.tolist() == [20, 7, 3, 0]
    assert truth.extra["step_counts"].sum(0).tolist() == [20, 20, 20, 0]
    half, _ = simulate_client(_mlp(), (images, labels), Protocol(
        scheme="fedavg", batch_size=5, defences=[{"name": "oversample", "strength": 0.6}]),
        rng=torch.Generator().manual_seed(0))
    assert half.num_samples == 30 + 8 + 10  # gaps 13 and 17, 60 % filled


def test_secure_aggregation_merges_groups_and_keeps_the_federation():
    images, labels = _data(48)
    parts = [torch.arange(i * 12, (i + 1) * 12) for i in range(4)]
    kw = dict(num_clients=4, rounds=2, alpha=None, partition=parts, capture_rounds=[2], keep_states="all")
    plain = run_federation(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=4), **kw,
                           rng=torch.Generator().manual_seed(0))
    sec = run_federation(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=4,
                                                            defences=[{"name": "secagg", "strength": 2}]),
                         **kw, rng=torch.Generator().manual_seed(0))
    assert all(torch.equal(plain.global_states[3][k], sec.global_states[3][k]) for k in plain.global_states[3])
    assert [c for _, c, _, _ in sec.captures] == [0, 2]
    pairs = [(cap, truth) for _, _, cap, truth in plain.captures]
    for (_, first, cap, truth), group in zip(sec.captures, (pairs[:2], pairs[2:])):
        want, _ = pool_group(group)
        assert cap.num_samples == 24 and cap.meta["clients"] == [first, first + 1]
        assert torch.allclose(cap.update["fc.weight"], (group[0][0].update["fc.weight"] +
                                                        group[1][0].update["fc.weight"]) / 2)
        assert torch.equal(truth.counts, group[0][1].counts + group[1][1].counts)
        assert truth.meta["member_counts"] == [group[0][1].counts.tolist(), group[1][1].counts.tolist()]
        assert torch.equal(want.update["fc.bias"], cap.update["fc.bias"])


def test_dropout_of_rate_zero_is_no_defence():
    images, labels = _data()
    a, _ = simulate_client(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=6),
                           rng=torch.Generator().manual_seed(0))
    b, _ = simulate_client(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=6, defences=[
        {"name": "dropout", "strength": 0.0}]), rng=torch.Generator().manual_seed(0))
    assert all(torch.equal(a.update[k], b.update[k]) for k in a.update)


@pytest.mark.parametrize("entries, match", [
    ([{"name": "noise", "strength": 1.0}], "not a defence"),
    ([{"name": "gaussian", "strength": -1.0}], "must be >= 0"),
    ([{"name": "gaussian", "strength": "big"}], "needs a finite number"),
    ([{"name": "gaussian", "strength": float("inf")}], "needs a finite number"),
    ([{"name": "gaussian", "strength": float("nan")}], "needs a finite number"),
    ([{"name": "dp-sgd", "strength": 1.0, "params": {"max_grad_norm": float("inf")}}], "expected a finite number"),
    ([{"name": "topk", "strength": 1.0}], r"in \[0, 1\)"),
    ([{"name": "quantize", "strength": 2.5}], "integer"),
    ([{"name": "secagg", "strength": 0}], "integer >= 1"),
    ([{"name": "gaussian", "strength": 0.1, "params": {"sigma": 1}}], "unknown option"),
    ([{"name": "dp-sgd", "strength": 1.0, "params": {"max_grad_norm": "1"}}], "expected a float"),
    ([{"name": "gaussian", "strength": 0.1, "level": 2}], "unknown key"),
    ([{"name": "dp-sgd", "strength": 1.0}, {"name": "dp-sgd", "strength": 2.0}], "at most one per-example"),
    ("gaussian", "expected a list"),
])
def test_bad_defences_are_config_errors(entries, match):
    with pytest.raises(ConfigError, match=match):
        Protocol(defences=entries)


def test_defence_errors_name_the_fix():
    with pytest.raises(ConfigError, match="model_mode=eval"):
        Protocol(model_mode="train", defences=[{"name": "dp-sgd", "strength": 1.0}])
    images, labels = _data()
    with pytest.raises(ConfigError, match="not a module"):
        simulate_client(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=6, defences=[
            {"name": "dropout", "strength": 0.5, "params": {"layer": "head"}}]))
    with pytest.raises(ConfigError, match="accountant"):
        simulate_client(_mlp(), (images, labels), Protocol(scheme="fedavg", batch_size=6, defences=[
            {"name": "dp-sgd", "strength": 0.5, "params": {"accountant": "gdp"}}]))
    # a config file spells them as YAML: typed loading, and the capture round-trips them
    p = Protocol.from_dict({"scheme": "fedavg", "defences": [{"name": "topk", "strength": 0.9}]})
    assert Protocol.from_dict(p.to_dict()) == p


def test_the_registry_and_the_protocol_load_no_torch():
    import subprocess
    import sys

    code = ("import sys, gi.world.fl.protocol, gi.world.fl.defences; "
            "gi.world.fl.protocol.Protocol(defences=[{'name': 'topk', "
            "'strength': 0.5}]); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
