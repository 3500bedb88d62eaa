"""gi sweep: job expansion, resume after a kill without redoing finished jobs, aggregation, multi-process launch."""

from __future__ import annotations

import csv
import json

import pytest

import gi.experiments.sweep as sweep
from gi.analysis.report import write_json
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.sweep import SweepConfig, expand_jobs
from gi.experiments.outdir import staged_output
from gi.experiments.sweep import run_sweep


def test_jobs_are_the_grid_times_seeds_in_a_fixed_order():
    cfg = SweepConfig(grid={"attack.lr": [0.1, 0.01], "labels.mode": ["truth", "recovered+joint"]}, seeds=[0, 1, 2])
    jobs = expand_jobs(cfg)
    assert len(jobs) == 12 and [j.index for j in jobs] == list(range(12))
    assert jobs[0].name == "lr=0.1_mode=truth_seed=0" and jobs[-1].name == "lr=0.01_mode=recovered-joint_seed=2"
    assert "attack.lr=0.1" in jobs[0].overrides and "seed=2" in jobs[-1].overrides
    assert load(SweepConfig, "configs/sweep/demo-cpu.yaml").devices == 2
    assert len(expand_jobs(load(SweepConfig, "configs/sweep/demo-cpu.yaml"))) == 12


@pytest.mark.parametrize("over, match", [
    (["command=train"], "command"), (["grid={a: []}"], "grid"), (["seeds=[]"], "seeds"),
    (["devices=0"], "devices"), (["accelerator=tpu"], "accelerator"), (["overrides=[nokey]"], "key.sub=value"),
])
def test_bad_sweep_configs_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        load(SweepConfig, "configs/sweep/demo-cpu.yaml", over)


class _Killed(BaseException):
    pass


def _fake_kind(calls: list[str], die_at: int | None = None):
    def job(base: str, overrides: list[str]) -> dict:
        out = next(o.split("=", 1)[1] for o in overrides if o.startswith("out="))
        calls.append(out)
        with staged_output(out, overwrite=True) as tmp:
            if die_at is not None and len(calls) == die_at:
                (tmp / "half-written.txt").write_text("x")
                raise _Killed()  # like SIGKILL halfway through a job
            lr = float(next(o.split("=", 1)[1] for o in overrides if o.startswith("attack.lr=")))
            write_json(tmp / "metrics.json", {"psnr_mean": 10 + lr, "attack": {"seconds": 1.0}})
        return {"psnr_mean": 10 + lr}

    return job


def test_killed_sweep_resumes_without_redoing_finished_jobs_and_aggregates(tmp_path, monkeypatch):
    cfg = SweepConfig(name="t", grid={"attack.lr": [1.0, 2.0, 3.0, 4.0]}, seeds=[0, 1, 2], out=str(tmp_path / "sw"),
                      devices=1, accelerator="cpu", columns=["psnr_mean", "attack.seconds"])
    first: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(first, die_at=7))
    with pytest.raises(_Killed):
        run_sweep(cfg)
    assert len(first) == 7
    assert len(list((tmp_path / "sw" / "jobs").glob("*/metrics.json"))) == 6
    second: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(second))
    run_sweep(cfg)
    assert len(second) == 6 and not set(second) & set(first[:6])  # only the unfinished jobs ran
    assert not list((tmp_path / "sw" / "jobs").glob(".*partial*"))  # the killed job's staging is gone
    with (tmp_path / "sw" / "aggregate.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {float(r["psnr_mean"]) for r in rows} == {11.0, 12.0, 13.0, 14.0}
    summary = (tmp_path / "sw" / "summary.md").read_text()
    assert "| 1.0 | 11.000 | 0.000 | 3 |" in summary
    assert (tmp_path / "sw" / "summary.png").is_file()
    third: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(third))
    run_sweep(cfg)
    assert third == []
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["jobs"][0] == "lr=1.0_seed=0"


@pytest.mark.slow
def test_two_cpu_processes_share_the_jobs_through_lightning(tmp_path):
    """Real `gi run` jobs on two Fabric worker processes (ddp_spawn on CPU), then aggregation by rank 0."""
    cfg = SweepConfig(name="two", base="configs/demo.yaml", grid={"labels.mode": ["truth", "recovered"]}, seeds=[0],
                      overrides=["attack.iterations=3", "metrics.lpips_vgg=false"], out=str(tmp_path / "sw"),
                      devices=2, accelerator="cpu")
    run_sweep(cfg)
    with (tmp_path / "sw" / "aggregate.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["labels.mode"] for r in rows) == ["recovered", "truth"]
    assert all(float(r["psnr_mean"]) > 0 for r in rows)


def test_dry_run_prints_launch_lines_and_every_job_once_on_its_rank(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(calls))
    cfg = load(SweepConfig, "configs/sweep/demo-cpu.yaml", [f"out={tmp_path / 'sw'}", "dry_run=true",
                                                              "devices=4", "num_nodes=2", "accelerator=gpu"])
    text = sweep.dry_run(cfg, "configs/sweep/demo-cpu.yaml", ["dry_run=true"])
    assert calls == [] and not (tmp_path / "sw").exists()  # nothing runs, nothing is written
    assert "torchrun --nnodes 2 --nproc-per-node 4" in text and "devices=4 num_nodes=2" in text
    assert "srun --nodes 2 --ntasks-per-node 4 --gpus-per-node 4" in text
    assert "sbatch --array=0-7 --gpus 1" in text and "shards=8 shard=" in text
    jobs = expand_jobs(cfg)
    for job in jobs:
        rank = job.index % 8
        block = text.split(f"[rank {rank}/8]")[1].split("[rank")[0]
        assert f"  job {job.index}: gi run configs/demo.yaml" in block
        assert f"attack.device=cuda:{rank % 4}" in block and job.dirname in block
        assert text.count(job.dirname) == 1


def test_a_shard_runs_only_its_jobs_and_a_plain_run_aggregates_them_all(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(calls))
    base = dict(name="t", grid={"attack.lr": [1.0, 2.0, 3.0]}, seeds=[0, 1], out=str(tmp_path / "sw"), devices=1,
                accelerator="cpu", columns=["psnr_mean"])
    jobs = expand_jobs(SweepConfig(**base))
    for shard in range(3):
        run_sweep(SweepConfig(**base, shards=3, shard=shard))
        assert len(calls) == 2 * (shard + 1)
        assert all(f"jobs/{j.dirname}" in " ".join(calls) for j in jobs if j.index % 3 <= shard)
    assert not (tmp_path / "sw" / "aggregate.csv").exists()
    run_sweep(SweepConfig(**base))
    assert len(calls) == 6  # every job already finished
    with (tmp_path / "sw" / "aggregate.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 6


@pytest.mark.parametrize("over, match", [(["shards=4"], "give both"), (["shard=1"], "give both"),
                                         (["shards=2", "shard=2"], "0 <= shard < shards")])
def test_bad_shards_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        load(SweepConfig, "configs/sweep/demo-cpu.yaml", over)


def test_cli_dry_run_prints_the_plan(capsys):
    from gi.cli import main

    assert main(["sweep", "configs/sweep/demo-cpu.yaml", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "[rank 1/2] 6 job(s)" in out and "launch (torchrun)" in out and "wrote" not in out


def test_a_sweep_into_a_read_only_place_is_one_line_output_error_before_any_job(tmp_path, monkeypatch):
    import errno
    import os
    from pathlib import Path

    from gi.core.errors import OutputError

    real = Path.mkdir

    def read_only(self, *args, **kwargs):  # a read-only mount refuses even root
        if self.is_relative_to(tmp_path / "ro"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    ran: list[str] = []
    monkeypatch.setitem(sweep.JOB_KINDS, "run", _fake_kind(ran))
    cfg = SweepConfig(name="t", grid={"attack.lr": [1.0]}, out=str(tmp_path / "ro" / "sw"), devices=1,
                      accelerator="cpu")
    with pytest.raises(OutputError, match=r"out=.*ro/sw: cannot write .*Read-only file system.*pass another out=") \
            as exc:
        run_sweep(cfg)
    assert "\n" not in str(exc.value) and ran == []


def test_the_job_kinds_are_the_job_configs():
    """The commands a sweep's config accepts (the schema's table) are the ones the sweep can run (its runners)."""
    from gi.experiments.config.sweep import JOB_CONFIGS

    assert set(sweep.JOB_KINDS) == set(JOB_CONFIGS)
