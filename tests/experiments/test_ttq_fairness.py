"""gi bench time-to-quality's fairness rule (docs/usage.md, "Against breaching"): a contender that ends before its
budget is run again until the budget is spent and holds its best run by its own objective; with
``fill_budget=false`` the row is compared at the time it finished; a run that stopped after two iterations prints
two iterations and gives no "0.0x" ratio. Fake contenders on a fake clock (no attack runs), then the real wiring
of both contenders on a tiny budget."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest
import torch

import gi.experiments.ttq as ttq
import gi.experiments.ttq_curves as ttq_curves
from gi.core.config import load
from gi.experiments.config.ttq import TTQConfig
from gi.experiments.ttq import AttackClock, Contender, attack_until_budget, format_ttq, run_ttq
from gi.experiments.ttq_curves import Curve
from gi.experiments.ttq_output import TTQ_SCHEMA

LENET = "configs/bench/ttq-lenet.yaml"
# the fast contender's runs: its own objective (lower is better) and its answer's PSNR. Run 3 is best by its
# objective; run 4 has the highest PSNR, which the attacker cannot see.
OBJECTIVES = [5.0, 2.0, 7.0, 1.0, 9.0, 3.0, 8.0, 6.0, 4.0, 2.5]
PSNRS = [14.0, 16.0, 15.0, 18.0, 27.0, 17.0, 12.0, 13.0, 19.0, 11.0]


@pytest.fixture
def now(monkeypatch):
    """A fake clock the fake contenders advance: CPU and wall seconds."""
    t = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(ttq, "CLOCKS", {k: (lambda k=k: t[k]) for k in t})
    return t


def _fake(name: str, now: dict[str, float], iterations: int, step_s: float, objective, psnr,
          stop_after: int | None = None) -> Contender:
    """A contender whose run is ``iterations`` steps of ``step_s`` fake seconds each (stopping on its own after
    ``stop_after``), scored every ``cfg.every`` steps; ``objective(restart)`` and ``psnr(restart, it)``."""

    def run(cfg, victim, k, clock, score, restart):
        clock.resume()
        curve, done, stopped = Curve(name, k), 0, False
        for it in range(1, iterations + 1):
            now["wall"] += step_s
            now["cpu"] += step_s
            done = it
            if it % cfg.every == 0:
                clock.pause()
                curve.add(it, clock.read(), psnr(restart, it))
                clock.resume()
            if clock.read()[cfg.clock] >= cfg.budget:
                stopped = True
                break
            if stop_after is not None and it >= stop_after:
                break
        clock.pause()
        curve.add(done, clock.read(), psnr(restart, done))
        curve.info = {"objective": objective(restart), "stopped_by_budget": stopped}
        return curve

    return Contender(lambda cfg: None, run, f"fake {name}")


@pytest.fixture
def fakes(monkeypatch, now):
    """'fast' finishes its 10-step schedule at 10 % of a 100 s budget; 'gi' (ours, faked) runs 1000 steps of 1 s,
    so the budget stops it; 'stub' stops on its own after 2 steps of 0.01 s and has no objective."""
    fast = _fake("fast", now, 10, 1.0, lambda r: OBJECTIVES[r % len(OBJECTIVES)],
                 lambda r, it: PSNRS[r % len(PSNRS)] * it / 10)
    ours = _fake("gi", now, 1000, 1.0, lambda r: 0.5, lambda r, it: min(10.0 + it / 2, 40.0))
    stub = _fake("stub", now, 4000, 0.01, lambda r: None, lambda r, it: 8.0, stop_after=2)
    monkeypatch.setitem(ttq.CONTENDERS, "fast", fast)
    monkeypatch.setitem(ttq.CONTENDERS, "gi", ours)
    monkeypatch.setitem(ttq.CONTENDERS, "stub", Contender(stub.check, stub.run, stub.summary,
                                                          lambda cfg: [("4000 it", cfg)]))
    return now


def _cfg(*over: str) -> TTQConfig:
    return load(TTQConfig, LENET, ["budget=100", "every=5", "levels=[25, 30]", "equal_time=null", *over])


def test_a_fast_contender_is_restarted_until_the_budget_and_keeps_its_best_run_by_its_own_objective(fakes):
    cfg = _cfg("contenders=[gi, fast]")
    curve = attack_until_budget("fast", cfg, None, 0, AttackClock(), lambda images: 0.0)
    info = curve.info
    assert info["runs"] == 10 and info["stopped_by_budget"] is True and "not_restarted" not in info
    assert curve.iterations[-1] == 100 and sum(r["iterations"] for r in info["run_records"]) == 100
    assert curve.cpu[-1] == pytest.approx(100.0)  # the whole budget, scoring left out
    assert info["best_run"] == 3 and curve.psnr[-1] == PSNRS[3]  # by its objective 1.0, not run 4's 27 dB
    assert max(curve.psnr) < PSNRS[4]  # run 4's answer was never held: its objective 9.0 loses
    assert [r["objective"] for r in info["run_records"]] == OBJECTIVES
    # the answer held during a run is the best ended run's: run 1 (objective 2.0) replaced run 0 (5.0) when it
    # ended, and run 2 (7.0) never replaced it
    at = dict(zip(curve.iterations, curve.psnr))
    assert at[10] == PSNRS[0] and at[15] == PSNRS[0] and at[20] == PSNRS[1] and at[25] == PSNRS[1]
    assert at[30] == PSNRS[1] and at[40] == PSNRS[3]
    assert all(b >= a for a, b in zip(curve.iterations, curve.iterations[1:])) and curve.iterations[0] == 5


def test_the_run_records_reach_the_summary_table_csv_and_json(fakes, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ttq, "build_victim_side", lambda cfg: ttq.Victim(
        None, [None], [SimpleNamespace(images=torch.rand(1, 3, 16, 16))], None))
    out = run_ttq(_cfg("contenders=[gi, fast]", f"out={tmp_path / 'o'}"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == TTQ_SCHEMA == 2
    row = summary["rows"][0]
    assert row["equal_time"] == 100 and row["fast"]["runs"] == 10 and row["fast"]["iterations"] == 100
    assert row["fast"]["cpu_seconds"] == pytest.approx(100.0) and row["fast"]["finished_at"] is None
    assert row["gi"]["runs"] == 1 and row["gi"]["iterations"] == 100 and row["gi"]["finished_at"] is None
    assert row["fast"]["psnr_at_equal_time"] == PSNRS[3]
    printed = capsys.readouterr().out
    assert "(100 it in 10 runs, budget spent;" in printed
    table = format_ttq(out)
    assert "| fast runs / it / CPU s |" in table and "10 / 100 / 100.0" in table and "| budget |" in table
    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["contender"], r["runs"], r["iterations"]) for r in rows] == [("gi", "1", "100"), ("fast", "10", "100")]
    assert rows[1]["ratio_kind_25"] in ("exact", ">=", "<=", "neither") and rows[1]["cpu_seconds"] == "100.0"


def test_without_fill_budget_the_row_says_finished_at_and_compares_at_that_time(fakes, tmp_path, monkeypatch):
    monkeypatch.setattr(ttq, "build_victim_side", lambda cfg: ttq.Victim(
        None, [None], [SimpleNamespace(images=torch.rand(1, 3, 16, 16))], None))
    out = run_ttq(_cfg("contenders=[gi, fast]", "fill_budget=false", f"out={tmp_path / 'o'}"))
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["fast"]["runs"] == 1 and row["fast"]["finished_at"] == pytest.approx(10.0)
    assert row["equal_time"] == pytest.approx(10.0)  # both compared when the fast one finished
    assert row["gi"]["psnr_at_equal_time"] == pytest.approx(15.0)  # ours at 10 s (10 + 10/2), not at 100 s
    assert row["fast"]["psnr_at_equal_time"] == PSNRS[0]
    assert row["gain_over_fast_db"] == pytest.approx(15.0 - PSNRS[0])
    table = format_ttq(out)
    assert "finished at 10.0 s" in table and "| 10.0 |" in table  # the row's equal time
    (fast,) = [c for c in json.loads((out / "curves.json").read_text()) if c["contender"] == "fast"]
    assert fast["info"]["not_restarted"] == "fill_budget is false"


def test_a_contender_stopped_after_two_iterations_prints_them_and_gives_no_zero_ratio(fakes, tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.setattr(ttq, "build_victim_side", lambda cfg: ttq.Victim(
        None, [None], [SimpleNamespace(images=torch.rand(1, 3, 16, 16))], None))
    out = run_ttq(_cfg("contenders=[gi, stub]", "every=1000", f"out={tmp_path / 'o'}"))
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "stub" in x)
    assert "[4000 it schedule]" in line and "(2 it in 1 run, finished at 0.02 s;" in line and "0.0 s" not in line
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["stub"]["iterations"] == 2 and row["stub"]["finished_at"] == pytest.approx(0.02)
    ratio = row["ratio_stub_25"]
    assert ratio["value"] is None and ratio["kind"] == "n/a" and "0.02 s, below 0.05 s" in ratio["why"]
    table = format_ttq(out)
    assert "0.0x" not in table and "ratio stub_25 dB: n/a (theirs time when it stopped without reaching it is " \
                                   "0.02 s, below 0.05 s)" in table
    # it has no objective to rank a new run by, so it was not restarted; fill_budget stays on, so the row is
    # compared at the budget (nothing to gain from more of it): ours at 100 s
    (stub,) = [c for c in json.loads((out / "curves.json").read_text()) if c["contender"] == "stub"]
    assert stub["info"]["not_restarted"] == "its run cannot be ranked by its own objective"
    assert row["equal_time"] == 100


def test_ratio_of_a_near_zero_time_is_not_applicable():
    assert ttq_curves.ratio(0.01, 30.0, 10.0, 100.0) == (None, "n/a")  # ours 0.01 s: no division by it
    assert ttq_curves.ratio(2.0, None, 10.0, 0.02) == (None, "n/a")  # theirs censored at 0.02 s: no "0.0x" bound
    assert "ours time to the level is 0.01 s" in ttq_curves.ratio_not_applicable(0.01, 30.0, 10.0, 100.0)
    assert ttq_curves.ratio(2.0, None, 10.0, 100.0) == (50.0, ">=")
    assert ttq_curves.ratio_not_applicable(None, None, 0, 0) is None
    assert ttq_curves.seconds_text(0.0213) == "0.0213" and ttq_curves.seconds_text(12.34) == "12.3"
    assert ttq_curves.ratio_text(0.004) == "0.004" and ttq_curves.ratio_text(12.0) == "12.0"


def test_merging_a_part_written_before_fill_budget_reads_it_as_false(tmp_path):
    """A part without fill_budget (it never restarted) merges with a fill_budget=false part, not with a true one."""
    import yaml

    from gi.analysis.report import write_json, write_yaml
    from gi.core.config import to_dict

    def part(name, contender, fill):
        d = tmp_path / name
        d.mkdir()
        config = to_dict(TTQConfig(contenders=[contender], select=[0]))
        if fill is None:
            config.pop("fill_budget")
        else:
            config["fill_budget"] = fill
        write_yaml(d / "config.yaml", config)
        c = Curve(contender, 0, info={"stopped_by_budget": True})
        c.add(10, {"wall": 5.0, "cpu": 5.0}, 31.0)
        write_json(d / "curves.json", [dict(c.__dict__)])
        write_json(d / "summary.json", {"git": "x"})
        return d

    old = part("old", "breaching", None)
    out = ttq.merge_runs([part("gi", "gi", False), old], tmp_path / "m")
    assert yaml.safe_load((out / "config.yaml").read_text())["fill_budget"] is False
    with pytest.raises(ttq.ConfigError, match="different configs"):
        ttq.merge_runs([part("gi2", "gi", True), old], tmp_path / "m2")


def test_breaching_is_restarted_as_its_own_trials_until_the_budget(tmp_path):
    """Real breaching on a LeNet capture: a 40-iteration schedule inside a 1 CPU s budget runs again, each run
    one trial of its restarts, and the answer held is the trial with the lowest restart score."""
    pytest.importorskip("breaching", reason="breaching is not installed (docs/usage.md names the command)")
    over = ["contenders=[breaching]", "select=[0]", "every=10", "breaching.max_iterations=40",
            "breaching.schedules=null", "budget=1", f"out={tmp_path / 'b'}"]
    (c,) = json.loads((run_ttq(load(TTQConfig, LENET, over)) / "curves.json").read_text())
    info, records = c["info"], c["info"]["run_records"]
    assert info["runs"] > 1 and info["runs"] == len(records) and info["stopped_by_budget"] is True
    assert c["iterations"][-1] == sum(r["iterations"] for r in records)
    assert all(r["iterations"] == 40 for r in records[:-1]) and 1 <= records[-1]["iterations"] <= 40
    scores = [r["objective"] for r in records]
    assert info["best_run"] == scores.index(min(scores)) and c["psnr"][-1] == records[info["best_run"]]["psnr"]
    assert "cosine-similarity" in info["objective_name"] and c["cpu"][-1] >= 1.0


def test_ours_is_restarted_with_new_seeds_until_the_budget(tmp_path):
    over = ["contenders=[gi]", "select=[3]", "every=5", "budget=2",
            "job_overrides=[attack.iterations=10,attack.retries=0,attack.analytic=false]", f"out={tmp_path / 'a'}"]
    (c,) = json.loads((run_ttq(load(TTQConfig, LENET, over)) / "curves.json").read_text())
    records = c["info"]["run_records"]
    assert c["info"]["runs"] == len(records) > 1 and c["iterations"][-1] == sum(r["iterations"] for r in records)
    mismatches = [r["objective"] for r in records]
    assert c["psnr"][-1] == records[mismatches.index(min(mismatches))]["psnr"]
    assert c["info"]["seed"] == ttq.restart_seed(SimpleNamespace(seed=0, retries=0), c["info"]["best_run"])
