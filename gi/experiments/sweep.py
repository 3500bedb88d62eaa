r"""``gi sweep CONFIG``: a grid of jobs (configs × seeds) over the available devices, resumable.

Jobs are the product of ``grid`` (dotted overrides of a ``gi run`` or ``gi ablate`` base config) and ``seeds``.
Processes are launched by Lightning Fabric: one process per device on this machine (``devices``; on a CPU
machine, ``devices`` worker processes), and across machines through Lightning's cluster environments:

- torchrun:  ``torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 -m gi.cli sweep CONFIG devices=4
  num_nodes=2``
- SLURM:     ``srun --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 gi sweep CONFIG devices=4 num_nodes=2``
- SLURM array (no rendezvous; each task runs one shard alone): ``sbatch --array=0-7 --gpus 1 --wrap "gi sweep CONFIG
  devices=1 shards=8 shard=\$SLURM_ARRAY_TASK_ID"``, then ``gi sweep CONFIG`` once more to aggregate (it skips every
  finished job).

Job i runs on global rank ``i mod world_size`` (with ``shards``: on shard ``i mod shards``). With ``pack: N`` a rank
runs up to N of its ``gi run`` jobs together when they differ only in
:data:`~gi.experiments.config.sweep.PACK_FREE` keys (the label stage, the images attacked): their captures are
reconstructed as one packed problem (:func:`pack_batches`). ``dry_run=true`` runs
nothing and writes nothing: it prints these launch lines for the config's ``devices`` × ``num_nodes`` and, per rank,
the ``gi run`` / ``gi ablate`` command line of every job that rank would run (``done`` marks finished ones).

A job is identified by its name (grid values and seed) and a hash
of its fully resolved config (the base file's content with every override applied; not ``out``, ``overwrite``,
``attack.progress`` or the device): its directory is ``jobs/<name>-<hash>``. Every job writes that directory
atomically (:func:`gi.experiments.outdir.staged_output`): a killed sweep leaves no half-written job, a re-run skips
every job whose directory holds ``metrics.json``, and other overrides or an edited base config run the jobs again
instead of reusing stale results. A job that raises (anything, not only a ``GIError``) is recorded in
``failed/<name>-<hash>.txt`` (message or traceback) and the sweep goes on; at the end the sweep fails with
"N of M jobs failed, see <dir>/failed/". After a barrier, rank 0 writes ``aggregate.csv`` (one row per job of the
current config, or per table row for ablation jobs), ``summary.md`` and ``summary.png`` (mean ± std over seeds
per configuration).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gi.core.errors import GIError
from gi.experiments.config.sweep import Job, SweepConfig, expand_jobs, job_config, pack_key
from gi.experiments.outdir import write_error
from gi.experiments.sweep_output import write_aggregate, write_failure, write_sweep_record

log = logging.getLogger("gi.experiments.sweep")
DONE = "metrics.json"


# ----------------------------------------------------------------------------- jobs
def pack_batches(cfg: SweepConfig, jobs: list[Job]) -> list[list[Job]]:
    """``jobs`` in batches run together: up to ``cfg.pack`` jobs of one :func:`pack_key`, in job order (one job
    each when ``pack`` is 0)."""
    if not cfg.pack:
        return [[j] for j in jobs]
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(pack_key(cfg.command, cfg.base, list(job.overrides)), []).append(job)
    batches = [g[i:i + cfg.pack] for g in groups.values() for i in range(0, len(g), cfg.pack)]
    return sorted(batches, key=lambda b: b[0].index)


def _run_job(base: str, overrides: list[str]) -> dict[str, Any]:
    from gi.experiments.run import run

    return run(job_config("run", base, overrides)).metrics


def _ablate_job(base: str, overrides: list[str]) -> dict[str, Any]:
    from gi.experiments.ablate import run_ablation

    out = run_ablation(job_config("ablate", base, overrides))
    return json.loads((out / DONE).read_text())


JOB_KINDS: dict[str, Callable[[str, list[str]], dict[str, Any]]] = {"run": _run_job, "ablate": _ablate_job}


def job_dir(root: Path, job: Job) -> Path:
    return root / "jobs" / job.dirname


def failure_record(root: Path, job: Job) -> Path:
    return root / "failed" / f"{job.dirname}.txt"


def is_done(root: Path, job: Job) -> bool:
    return (job_dir(root, job) / DONE).is_file()


def _device_overrides(cfg: SweepConfig, accelerator: str, local_rank: int) -> list[str]:
    if accelerator == "gpu":
        return [f"attack.device=cuda:{local_rank}"]
    return ["attack.device=cpu"]


def _run_many(base: str, overrides: list[list[str]]) -> list[dict[str, Any]]:
    from gi.experiments.run import run_many

    return [r.metrics for r in run_many([job_config("run", base, o) for o in overrides])]


def run_jobs(cfg: SweepConfig, root: Path, jobs: list[Job], rank: int, world: int, accelerator: str,
             local_rank: int = 0) -> list[dict[str, Any]]:
    """Run this rank's share of the jobs (job i on rank i mod world), skipping finished ones; with ``pack``, in
    batches of :func:`pack_batches` (a batch that fails runs again job by job, so each failure is its own)."""
    mine = [j for j in jobs if j.index % world == rank]
    done = sum(is_done(root, j) for j in mine)
    print(f"[rank {rank}/{world}] {len(mine)} job(s), {done} already finished", flush=True)
    report: list[dict[str, Any]] = []

    def overrides(job: Job) -> list[str]:
        return list(job.overrides) + _device_overrides(cfg, accelerator, local_rank) + \
            [f"out={job_dir(root, job)}", "overwrite=true", "attack.progress=false"]

    def finish(job: Job, status: str, seconds: float) -> None:
        print(f"[rank {rank}/{world}] {mine.index(job) + 1}/{len(mine)} {job.name}: {status} ({seconds:.0f} s)",
              flush=True)
        report.append({"job": job.name, "status": status, "seconds": seconds})

    def status_of(metrics: dict[str, Any]) -> str:
        value = _get(metrics, cfg.metric)
        return f"{cfg.metric} {value}" if value is not None else "ok"

    for batch in pack_batches(cfg, [j for j in mine if not is_done(root, j)]):
        if len(batch) > 1:
            start = time.perf_counter()
            try:
                results = _run_many(cfg.base, [overrides(j) for j in batch])
            except Exception as exc:  # the batch runs again job by job below: each failure is recorded alone
                print(f"[rank {rank}/{world}] packed batch of {len(batch)} failed ({type(exc).__name__}: {exc}); "
                      "running its jobs one by one", flush=True)
            else:
                seconds = (time.perf_counter() - start) / len(batch)
                for job, metrics in zip(batch, results):
                    failure_record(root, job).unlink(missing_ok=True)
                    finish(job, status_of(metrics) + f" (packed with {len(batch) - 1} other job(s))", seconds)
                continue
        for job in batch:
            start = time.perf_counter()
            record = failure_record(root, job)
            try:
                status = status_of(JOB_KINDS[cfg.command](cfg.base, overrides(job)))
                record.unlink(missing_ok=True)
            except Exception as exc:  # a failed job is recorded, the sweep goes on; the exit status reports it
                status = f"FAILED: {exc}" if isinstance(exc, GIError) else f"FAILED ({type(exc).__name__}): {exc}"
                write_failure(record, exc)
            finish(job, status, time.perf_counter() - start)
    return report


# ----------------------------------------------------------------------------- aggregation
def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def aggregate(cfg: SweepConfig, root: Path, jobs: list[Job]) -> list[dict[str, Any]]:
    """One row per finished job (per table row for ``ablate`` jobs); writes aggregate.csv, summary.md/png
    (:func:`gi.experiments.sweep_output.write_aggregate`)."""
    rows: list[dict[str, Any]] = []
    for job in jobs:
        path = job_dir(root, job) / DONE
        if not path.is_file():
            continue
        metrics = json.loads(path.read_text())
        base = {"job": job.name, **{k: v for k, v in job.params}}
        if cfg.command == "ablate":
            rows += [{**base, **r} for r in metrics.get("table", [])]
        else:
            rows.append({**base, **{c: _get(metrics, c) for c in cfg.columns}})
    write_aggregate(cfg, root, rows, len(jobs))
    return rows


# ----------------------------------------------------------------------------- launch
def _accelerator(cfg: SweepConfig) -> str:
    import torch

    if cfg.accelerator in ("gpu", "cuda"):
        return "gpu"
    if cfg.accelerator == "cpu":
        return "cpu"
    return "gpu" if torch.cuda.is_available() else "cpu"


def _devices(cfg: SweepConfig, accelerator: str) -> int:
    import torch

    if cfg.devices != "auto":
        return int(cfg.devices)
    return max(torch.cuda.device_count(), 1) if accelerator == "gpu" else 1


def _worker(fabric: Any, cfg: SweepConfig, root: Path, jobs: list[Job], accelerator: str) -> None:
    import torch

    if accelerator == "cpu":
        torch.set_num_threads(1)  # one process per core; more threads oversubscribe the CPU
        os.environ["GI_THREADS"] = "1"  # the jobs' reconstructions too (they follow $GI_THREADS)
    run_jobs(cfg, root, jobs, fabric.global_rank, fabric.world_size, accelerator, fabric.local_rank)
    fabric.barrier()
    if fabric.global_rank == 0:
        rows = aggregate(cfg, root, jobs)
        print(f"aggregated {len(rows)} row(s) into {root / 'aggregate.csv'}", flush=True)


def _cluster_launched() -> bool:
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return TorchElasticEnvironment.detect() or SLURMEnvironment.detect()


class JobsFailed(GIError):
    """Some jobs of a sweep failed (the others finished and were aggregated)."""


def check_failures(root: Path, jobs: list[Job]) -> None:
    """Raise :class:`JobsFailed` ("N of M jobs failed, see <dir>/failed/") when any job has not finished."""
    failed = [j for j in jobs if not is_done(root, j)]
    if failed:
        raise JobsFailed(f"{len(failed)} of {len(jobs)} jobs failed, see {root / 'failed'}/ (re-run the same command "
                         "to retry them; finished jobs are kept)")


def launch_lines(cfg: SweepConfig, config: str = "CONFIG", overrides: list[str] | None = None) -> dict[str, str]:
    """How to launch this sweep: on one machine, with ``torchrun``, with ``srun`` and as a SLURM array
    (``devices`` processes per node × ``num_nodes``; ``devices=auto`` is written as 1)."""
    d = cfg.devices if isinstance(cfg.devices, int) else 1
    n = cfg.num_nodes
    rest = " ".join([config] + [o for o in overrides or [] if not o.startswith(("dry_run", "shard", "devices",
                                                                                  "num_nodes"))])
    gpus = f" --gpus-per-node {d}" if cfg.accelerator in ("gpu", "cuda") else ""
    return {
        "local": f"gi sweep {rest} devices={d}",
        "torchrun": f"torchrun --nnodes {n} --nproc-per-node {d} --rdzv-backend c10d --rdzv-endpoint HOST:29500 "
                    f"-m gi.cli sweep {rest} devices={d} num_nodes={n}",
        "srun": f"srun --nodes {n} --ntasks-per-node {d}{gpus} python -m gi.cli sweep {rest} devices={d} "
                f"num_nodes={n}",
        "slurm-array": f"sbatch --array=0-{d * n - 1}{' --gpus 1' if gpus else ''} --wrap \"python -m gi.cli sweep "
                       f"{rest} devices=1 shards={d * n} shard=\\$SLURM_ARRAY_TASK_ID\"; then: gi sweep {rest}",
    }


def dry_run(cfg: SweepConfig, config: str = "CONFIG", overrides: list[str] | None = None) -> str:
    """The plan of ``dry_run=true`` (module docstring): launch lines, then every rank's jobs as command lines."""
    root = Path(cfg.out or f"runs/sweep-{cfg.name}")
    jobs = expand_jobs(cfg)
    accelerator = "gpu" if cfg.accelerator in ("gpu", "cuda") else ("cpu" if cfg.accelerator == "cpu" else "auto")
    d = cfg.devices if isinstance(cfg.devices, int) else 1
    world = cfg.shards if cfg.shards is not None else d * cfg.num_nodes
    ranks = [cfg.shard] if cfg.shard is not None else list(range(world))
    lines = [f"gi sweep {cfg.name}: {len(jobs)} job(s) of `gi {cfg.command} {cfg.base}`, "
             f"{'shards' if cfg.shards else 'world size'} {world} (devices={cfg.devices} x num_nodes={cfg.num_nodes}, "
             f"accelerator {accelerator}); dry run: nothing runs, nothing is written", ""]
    lines += [f"launch ({kind}): {line}" for kind, line in launch_lines(cfg, config, overrides).items()]
    for rank in ranks:
        mine = [j for j in jobs if j.index % world == rank]
        local = rank % d if cfg.shards is None else 0
        device = _device_overrides(cfg, "gpu", local) if accelerator == "gpu" else \
            (["attack.device=cpu"] if accelerator == "cpu" else [f"attack.device=<cuda:{local} or cpu>"])
        lines += ["", f"[rank {rank}/{world}] {len(mine)} job(s)"]
        for job in mine:
            over = list(job.overrides) + device + [f"out={job_dir(root, job)}", "overwrite=true",
                                                   "attack.progress=false"]
            mark = " (done)" if is_done(root, job) else ""
            lines.append(f"  job {job.index}{mark}: gi {cfg.command} {cfg.base} " + " ".join(_quoted(o) for o in over))
        for batch in pack_batches(cfg, [j for j in mine if not is_done(root, j)]) if cfg.pack else []:
            if len(batch) > 1:
                lines.append(f"  packed into one problem where their attacks allow: jobs "
                             f"{', '.join(str(j.index) for j in batch)}")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)


def run_sweep(cfg: SweepConfig) -> Path:
    """Run (or resume) the sweep and aggregate it; returns the sweep directory. Raises :class:`JobsFailed` after
    the aggregation when any job failed."""
    root = Path(cfg.out or f"runs/sweep-{cfg.name}")
    jobs = expand_jobs(cfg)
    accelerator = _accelerator(cfg)
    devices = _devices(cfg, accelerator)
    try:  # a read-only mount or a full disk: the one-line OutputError of every command (docs/guarantees.md)
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        write_sweep_record(root, cfg, jobs)
    except OSError as exc:
        error = write_error(exc, root, root)
        if error is None:
            raise
        raise error from None
    if cfg.shards is not None:  # one shard of an array: alone, no rendezvous; a later plain run aggregates all
        if accelerator == "cpu":
            os.environ.setdefault("GI_THREADS", "1")
        run_jobs(cfg, root, jobs, int(cfg.shard), int(cfg.shards), accelerator)
        check_failures(root, [j for j in jobs if j.index % cfg.shards == cfg.shard])
        return root
    if devices * cfg.num_nodes == 1 and not _cluster_launched():
        run_jobs(cfg, root, jobs, 0, 1, accelerator)
        rows = aggregate(cfg, root, jobs)
        print(f"aggregated {len(rows)} row(s) into {root / 'aggregate.csv'}", flush=True)
        check_failures(root, jobs)
        return root
    from lightning.fabric import Fabric

    from gi.attack.recon.api import quiet_lightning

    quiet_lightning()
    strategy = "ddp" if _cluster_launched() else "ddp_spawn"
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=cfg.num_nodes, strategy=strategy)
    fabric.launch(_worker, cfg, root, jobs, accelerator)
    check_failures(root, jobs)
    return root
