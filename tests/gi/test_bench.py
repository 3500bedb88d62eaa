"""gi bench: the entry grid, one real measurement in-process, the JSON report, clear config errors."""

from __future__ import annotations

import json

import pytest

import gi.bench as bench
from gi.bench import BenchConfig, entries, format_report, load_bench_config, measure, run_bench
from gi.errors import ConfigError
from gi.recon.config import ReconConfig


def test_entries_cover_models_batches_and_restart_timings():
    cfg = BenchConfig(devices=["cpu"])
    es = entries(cfg)
    full = [(e["model"], e["batch"]) for e in es if not e.get("timing_only")]
    assert full == [("lenet", 1), ("lenet", 8), ("resnet18", 1), ("resnet18", 8)]
    timing = [(e["model"], e["batch"], e["restarts"]) for e in es if e.get("timing_only")]
    assert timing == [("lenet", 1, 1), ("lenet", 1, 8), ("resnet18", 1, 1), ("resnet18", 1, 8)]
    assert {e["iterations"] for e in es if e["model"] == "lenet" and not e.get("timing_only")} == {1000}


def test_one_measurement_reports_time_memory_and_psnr():
    entry = dict(model="lenet", batch=2, restarts=1, device="cpu", iterations=6, threads=1, seed=0,
                 dataset="cifar10-samples", attack={"lr": 0.01, "regularizers": {"tv": 2e-3}})
    out = measure(entry)
    assert 0 < out["sec_per_iteration"] < 5 and out["peak_rss_mb"] > 100 and out["attack_rss_mb"] >= 0
    assert 3 < out["psnr"] < 40


def test_report_is_json_with_restart_ratios(tmp_path, monkeypatch):
    fake = {1: 0.01, 8: 0.02}
    monkeypatch.setattr(bench, "_in_process", lambda e: {
        **{k: e[k] for k in ("model", "batch", "restarts", "device", "iterations", "threads")},
        "sec_per_iteration": fake[e["restarts"]], "peak_rss_mb": 500.0, "attack_rss_mb": 10.0,
        **({} if e.get("timing_only") else {"psnr": 20.0})})
    cfg = BenchConfig(models=["lenet"], batch_sizes=[1], devices=["cpu"], out=str(tmp_path / "b.json"),
                      attack=ReconConfig(progress=False))
    path = run_bench(cfg)
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["torch"] and len(data["results"]) == 3
    ratio = [r for r in data["results"] if r["restarts"] == 8][0]["ratio_to_one_restart"]
    assert ratio == pytest.approx(2.0)
    assert "| lenet | 1 | 8 | cpu | 20.0 |" in format_report(path)


@pytest.mark.parametrize("over, match", [(["models=[lenet7]"], "models"), (["devices=[tpu]"], "devices"),
                                         (["batch_sizes=[0]"], "batch sizes")])
def test_bad_bench_configs_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        load_bench_config(None, over)
