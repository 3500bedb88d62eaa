"""The multi-round attack (Decaf §IV-B, Fig. 6 d): labels.average_rounds / recover_rounds, the fedavg-client
scenario's ``average_from`` history and ``gi labels`` running it."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from labels.counts import largest_remainder


def _result(props: list[float], n: int = 10, ok: bool = True, seconds: float = 0.5) -> LabelResult:
    p = torch.tensor(props, dtype=torch.float64)
    return LabelResult(method="decaf", ok=ok, counts=largest_remainder(p / p.sum(), n), proportions=p,
                       info={"seconds": seconds})


def test_average_is_the_normalised_mean_of_the_rounds():
    """Exact: mean([.5 .5 0], [.1 .3 .6]) = [.3 .4 .3]; counts its largest remainder at the latest n."""
    got = labels.average_rounds([_result([0.5, 0.5, 0.0]), _result([0.1, 0.3, 0.6])])
    assert got.ok and got.method == "decaf@2rounds"
    assert torch.allclose(got.proportions, torch.tensor([0.3, 0.4, 0.3], dtype=torch.float64), atol=1e-15)
    assert got.counts.tolist() == [3, 4, 3]
    assert got.info["rounds"] == 2 and got.info["seconds"] == pytest.approx(1.0)


def test_unnormalised_rounds_are_normalised_after_the_mean():
    """Decaf normalises the average ("so the total proportion is exactly 1.0"): mean [.2 .2 .2] → 1/3 each."""
    got = labels.average_rounds([_result([0.2, 0.2, 0.0], n=9), _result([0.2, 0.2, 0.4], n=9)])
    assert torch.allclose(got.proportions, torch.full((3,), 1 / 3, dtype=torch.float64), atol=1e-15)
    assert got.counts.tolist() == [3, 3, 3]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4).filter(lambda v: sum(v) > 1e-3),
                min_size=1, max_size=6), st.randoms())
def test_average_is_on_the_simplex_and_ignores_round_order(rows, rnd):
    results = [_result(r, n=17) for r in rows]
    got = labels.average_rounds(results)
    assert float(got.proportions.sum()) == pytest.approx(1.0, abs=1e-12) and bool((got.proportions >= 0).all())
    assert int(got.counts.sum()) == 17
    shuffled = results[:]
    rnd.shuffle(shuffled)
    assert torch.allclose(labels.average_rounds(shuffled).proportions, got.proportions, atol=1e-12)
    if len(rows) == 1:  # one round: the single-round estimate itself
        p = torch.tensor(rows[0], dtype=torch.float64)
        assert torch.allclose(got.proportions, p / p.sum(), atol=1e-12)


def test_failed_rounds_are_left_out_and_all_failed_is_a_failure():
    failed = LabelResult.failure("decaf", 3, "no update")
    got = labels.average_rounds([failed, _result([0.2, 0.3, 0.5])])
    assert got.ok and got.info["failed_rounds"] == [0]
    assert torch.allclose(got.proportions, torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64))
    none = labels.average_rounds([failed, failed])
    assert not none.ok and "all 2 rounds failed" in none.info["reason"]


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ConfigError, match="at least one round"):
        labels.average_rounds([])
    with pytest.raises(ConfigError, match="different class counts"):
        labels.average_rounds([_result([0.5, 0.5]), _result([0.2, 0.3, 0.5])])
    with pytest.raises(ConfigError, match="at least one round"):
        labels.recover_rounds([], "decaf")
    with pytest.raises(ConfigError, match="same clients"):
        labels.recover_rounds([[object()], [object(), object()]], "decaf")


SETUP = {"data": {"name": "fashion-mnist"}, "partition": "table", "num_clients": 3, "client_size": 40,
         "compositions": [[10] * 10, [0, 0, 30, 5, 0, 0, 25, 5, 0, 35], [0] * 7 + [100, 0, 0]],
         "model": {"name": "cnn", "activation": "relu", "options": {"hidden": 32}},
         "protocol": {"batch_size": 8, "lr": 0.01, "local_epochs": 1}, "federation_rounds": 3, "eval_samples": 0,
         "aux": {"per_class": 10}}


def test_scenario_attaches_the_same_clients_earlier_rounds():
    from gi.world.scenarios import get_scenario

    scenario = get_scenario("fedavg-client")
    trials = scenario({**SETUP, "round": 3, "average_from": 1}, torch.Generator(), 0)
    assert len(trials) == 3
    for t in trials:
        assert [h.meta["round"] for h in t.history] == [1, 2]
        assert {h.meta["client"] for h in t.history} == {t.capture.meta["client"]}
    single = scenario({**SETUP, "round": 3}, torch.Generator(), 0)
    assert all(t.history == [] for t in single)
    # recover_rounds = average_rounds of the per-round recoveries, client by client
    rounds = [[t.history[i] for t in trials] for i in range(2)] + [[t.capture for t in trials]]
    got = labels.recover_rounds(rounds, "decaf", aux=trials[0].aux)
    for j, t in enumerate(trials):
        per = [labels.recover(rounds[i][j], "decaf", aux=t.aux) for i in range(3)]
        assert torch.allclose(got[j].proportions, labels.average_rounds(per).proportions, atol=1e-12)
    with pytest.raises(ConfigError, match="average_from"):
        scenario({**SETUP, "round": 2, "average_from": 3}, torch.Generator(), 0)


def test_gi_labels_runs_the_multi_round_attack(tmp_path):
    """k = 1 equals the single-round attack; the grid rows of average_from differ from round 2 on."""
    from gi.attack.stages import LabelTable
    from gi.experiments.config.labels import LabelBenchConfig
    from gi.experiments.labels import run_label_bench

    cfg = LabelBenchConfig(name="mr", scenario="fedavg-client", trials=1, setup=SETUP, out=str(tmp_path / "mr"),
                           grid={"average_from": [1, None], "round": [1, 3]}, labels=LabelTable(["decaf"]),
                           metrics=["linf", "l1"], progress=False)
    rows = {r["point"]: r for r in json.loads((run_label_bench(cfg) / "summary.json").read_text())["rows"]}
    assert rows["average_from=1, round=1"]["l1"] == rows["average_from=None, round=1"]["l1"]
    assert rows["average_from=1, round=3"]["l1"] != rows["average_from=None, round=3"]["l1"]
