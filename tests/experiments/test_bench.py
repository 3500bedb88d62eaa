"""gi bench: the entry grid, one real measurement in-process, the JSON report, clear config errors."""

from __future__ import annotations

import json

import pytest

import gi.experiments.bench as bench
from gi.attack.recon.config import ReconConfig
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.bench import entries, format_report, measure, measure_restarts, run_bench
from gi.experiments.config.bench import BenchConfig


def test_entries_cover_models_batches_and_restart_timings():
    cfg = BenchConfig(devices=["cpu"])
    es = entries(cfg)
    full = [(e["model"], e["batch"]) for e in es if e.get("kind") != "restarts"]
    assert full == [("lenet", 1), ("lenet", 8), ("resnet18", 1), ("resnet18", 8)]
    timing = [(e["model"], e["batch"], e["restarts"], e["repeats"]) for e in es if e.get("kind") == "restarts"]
    assert timing == [("lenet", 1, [1, 8], 3), ("resnet18", 1, [1, 8], 3)]
    assert {e["iterations"] for e in es if e["model"] == "lenet" and e.get("kind") != "restarts"} == {1000}


def test_one_measurement_reports_time_memory_and_psnr():
    entry = dict(model="lenet", batch=2, restarts=1, device="cpu", iterations=6, threads=1, seed=0,
                 dataset="cifar10-samples", attack={"lr": 0.01, "regularizers": {"tv": 2e-3}})
    out = measure(entry)
    assert 0 < out["sec_per_iteration"] <= out["wall_seconds"]  # a step of the fit it timed, in seconds
    assert out["peak_rss_mb"] > 100 and out["attack_rss_mb"] >= 0
    assert 3 < out["psnr"] < 40
    rows = measure_restarts({**entry, "restarts": [1, 2], "repeats": 2, "batch": 1})
    assert [r["restarts"] for r in rows] == [1, 2] and rows[1]["steps_timed"] == 6
    assert rows[1]["ratio_to_one_restart"] == pytest.approx(rows[1]["sec_per_iteration"] / rows[0]["sec_per_iteration"])


def test_report_is_json_with_restart_ratios(tmp_path, monkeypatch):
    fake = {1: 0.01, 8: 0.02}
    def fake_entry(e):
        if e.get("kind") == "restarts":
            return [{**{k: e[k] for k in ("model", "batch", "device", "iterations", "threads")}, "restarts": r,
                     "sec_per_iteration": fake[r], "peak_rss_mb": 500.0, "attack_rss_mb": 10.0, "timing_only": True,
                     **({"ratio_to_one_restart": fake[r] / fake[1]} if r != 1 else {})} for r in e["restarts"]]
        return [{**{k: e[k] for k in ("model", "batch", "restarts", "device", "iterations", "threads")},
                 "sec_per_iteration": 0.01, "peak_rss_mb": 500.0, "attack_rss_mb": 10.0, "psnr": 20.0}]

    monkeypatch.setattr(bench, "_in_process", fake_entry)
    cfg = BenchConfig(models=["lenet"], batch_sizes=[1], devices=["cpu"], out=str(tmp_path / "b.json"),
                      attack=ReconConfig(progress=False))
    path = run_bench(cfg)
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["torch"] and len(data["results"]) == 3
    ratio = [r for r in data["results"] if r["restarts"] == 8][0]["ratio_to_one_restart"]
    assert ratio == pytest.approx(2.0)
    assert "| lenet | 1 | 8 | cpu | 20.0 |" in format_report(path)
    page = (tmp_path / "b.html").read_text()  # the same table on a page beside the JSON
    assert page.count("<tr><td>lenet</td><td>1</td>") == 3 and "<td>20.0</td>" in page


@pytest.mark.parametrize("over, match", [(["models=[lenet7]"], "models"), (["devices=[tpu]"], "devices"),
                                         (["batch_sizes=[0]"], r"batch_sizes.*ints in \[1, 4096\]")])
def test_bad_bench_configs_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        load(BenchConfig, None, over)


def test_a_failed_bench_leaves_no_empty_folder_of_its_own(tmp_path, monkeypatch):
    def broken(entry):
        raise RuntimeError("entry failed")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "_in_process", broken)
    cfg = BenchConfig(models=["lenet"], batch_sizes=[1], devices=["cpu"], attack=ReconConfig(progress=False))
    with pytest.raises(RuntimeError, match="entry failed"):
        run_bench(cfg)
    assert list(tmp_path.iterdir()) == []  # no runs/bench/ left behind
    (tmp_path / "runs").mkdir()
    with pytest.raises(RuntimeError):
        run_bench(cfg)
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and list((tmp_path / "runs").iterdir()) == []
