"""Sweeps: a job is identified by its fully resolved config (other overrides re-run it), and every failed job,
whatever it raised, is recorded and makes the sweep exit non-zero with a summary line."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

import gi.experiments.sweep as sweep
from gi.analysis.report import write_json
from gi.cli import main
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.sweep import SweepConfig, expand_jobs
from gi.experiments.outdir import staged_output


def _kind(calls: list[str], fail: dict[str, BaseException] | None = None):
    def job(base: str, overrides: list[str]) -> dict:
        out = next(o.split("=", 1)[1] for o in overrides if o.startswith("out="))
        calls.append(out)
        for key, exc in (fail or {}).items():
            if key in overrides:
                raise exc
        with staged_output(out, overwrite=True) as tmp:
            write_json(tmp / "metrics.json", {"psnr_mean": 10.0, "attack": {"seconds": 1.0}})
        return {"psnr_mean": 10.0}

    return job


def _config(tmp_path: Path, **extra) -> Path:
    data = {"name": "g", "base": "configs/demo.yaml", "grid": {"attack.lr": [1.0, 2.0]}, "seeds": [0, 1],
            "out": str(tmp_path / "sw"), "devices": 1, "accelerator": "cpu",
            "columns": ["psnr_mean"], **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_other_overrides_or_an_edited_base_rerun_the_jobs(tmp_path, monkeypatch):
    base = tmp_path / "base.yaml"
    base.write_text(Path("configs/demo.yaml").read_text())
    cfg = load(SweepConfig, _config(tmp_path, base=str(base), overrides=["attack.iterations=3"]))
    calls: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _kind(calls))
    sweep.run_sweep(cfg)
    assert len(calls) == 4
    calls.clear()
    sweep.run_sweep(cfg)
    assert calls == []  # same config: finished jobs are reused
    sweep.run_sweep(load(SweepConfig, _config(tmp_path, base=str(base), overrides=["attack.iterations=4"])))
    assert len(calls) == 4  # other overrides: re-run, not the stale results
    calls.clear()
    base.write_text(base.read_text().replace("preset: default", "preset: fast"))
    sweep.run_sweep(cfg)
    assert len(calls) == 4  # the base file changed under the same overrides: re-run
    calls.clear()
    sweep.run_sweep(cfg)
    assert calls == []
    with (tmp_path / "sw" / "aggregate.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4  # only the current config's jobs are aggregated


def test_job_identity_ignores_where_and_how_it_is_written():
    cfg = SweepConfig(grid={"attack.lr": [0.1]}, overrides=["attack.iterations=3"])
    a = expand_jobs(cfg)[0]
    b = expand_jobs(SweepConfig(grid={"attack.lr": [0.1]},
                                            overrides=["attack.iterations=3", "attack.progress=false",
                                                       "out=elsewhere", "overwrite=true"]))[0]
    c = expand_jobs(SweepConfig(grid={"attack.lr": [0.1]}, overrides=["attack.iterations=4"]))[0]
    assert a.key == b.key != c.key and len(a.key) >= 10
    assert a.name == c.name == "lr=0.1_seed=0"


def test_failed_jobs_are_recorded_and_the_sweep_exits_non_zero(tmp_path, monkeypatch, capsys):
    calls: list[str] = []
    fail = {"attack.lr=2.0": RuntimeError("boom in the job"), "seed=1": ConfigError("a bad value")}
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _kind(calls, fail))
    code = main(["sweep", str(_config(tmp_path))])
    assert code != 0 and len(calls) == 4  # the sweep went on after the failures
    err = capsys.readouterr().err.strip().splitlines()[-1]
    root = tmp_path / "sw"
    assert f"3 of 4 jobs failed, see {root / 'failed'}/" in err
    texts = {p.name: p.read_text() for p in (root / "failed").iterdir()}
    assert len(texts) == 3
    boom = next(t for t in texts.values() if "boom" in t)
    assert "Traceback (most recent call last)" in boom and "RuntimeError: boom in the job" in boom
    assert any("a bad value" in t for t in texts.values())
    with (root / "aggregate.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 1  # the one finished job is aggregated
    # fixed: the failed jobs run again, their failure records go, the sweep succeeds
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _kind(calls))
    calls.clear()
    assert main(["sweep", str(_config(tmp_path))]) == 0
    assert len(calls) == 3 and not list((root / "failed").iterdir())
