"""``gi bench [CONFIG]``: speed and quality of a fixed reconstruction, as JSON comparable across versions.

For every model × batch size × device: one fixed reconstruction (real CIFAR-10 samples, FedSGD, oracle labels,
``attack`` settings of the config) gives the median time per iteration, the final PSNR and the peak memory;
for ``restart_batch_sizes`` the time per iteration with R restarts is measured too (short runs of every R,
interleaved ``timing_repeats`` times in one process, medians), with the ratio to R = 1. Every entry runs in a
fresh process, so the peak resident memory (``ru_maxrss``) belongs to it alone: ``peak_rss_mb`` is the process
peak, ``attack_rss_mb`` what the reconstruction added to the peak after the model and capture were set up; on a
GPU ``peak_cuda_mb`` is ``torch.cuda.max_memory_allocated``.

``packed.captures`` > 0 adds the packed-throughput entry: that many captures of one model (one real image
each, FedSGD, oracle labels) reconstructed as one problem (:func:`gi.attack.recon.reconstruct_many`) and one by one
(:func:`gi.reconstruct`), alternated ``packed.rounds`` times in one process. It reports the wall time of each
(Trainer set-up included: it is part of what a user waits for), the images per second, the speed-up,
reconstructions per CPU-core-hour (``threads`` cores) or per GPU-hour, and the PSNR of every image both ways
(a capture packed with others starts from the same image as alone, so the PSNRs agree up to float rounding, which
a long chaotic fit can amplify: docs/architecture.md, "Packing").
``packed.compile``: also time the packed problem with ``attack.compile`` set to it (``true`` or a torch.compile
mode, :data:`gi.attack.recon.config.COMPILE_MODES`; ``reduce-overhead`` replays CUDA graphs on a GPU); the row's
``compiled_speedup_over_packed`` is packed eager over packed compiled, the compilation inside the first round.

A bench config's ``kind`` names an entry of :data:`gi.experiments.bench_kinds.BENCH_KINDS` (default ``throughput``,
the entries above; each kind's module registers it, and this command imports them all):
``time-to-quality`` is :mod:`gi.experiments.ttq` (PSNR against seconds, ours vs breaching), ``suite`` is
:mod:`gi.experiments.suite` (several bench configs as one command, one table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from gi.attack.recon.config import ReconConfig
from gi.core.config import from_dict, to_dict
from gi.core.errors import ConfigError
from gi.core.provenance import git_commit
from gi.experiments.bench_kinds import BenchKind, bench_kind, register_bench_kind
from gi.experiments.config.bench import BENCH_SCHEMA, BenchConfig
from gi.experiments.outdir import check_output_file, publish_file

__all__ = ["bench_kind", "entries", "format_report", "measure", "measure_packed", "measure_restarts", "run_bench"]


class StepTimer:
    """Lightning callback: wall time of every optimisation step."""

    def __new__(cls):  # subclass lazily so importing gi.experiments.bench does not import lightning
        import lightning as L

        class _Timer(L.Callback):
            def __init__(self) -> None:
                self.times: list[float] = []
                self._t = 0.0

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                self._t = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                self.times.append(time.perf_counter() - self._t)

        return _Timer()


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_restarts(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Time per iteration for every R of ``entry['restarts']``: ``repeats`` short runs per R, interleaved in one
    process (so load changes on a shared machine hit every R alike); medians over all steps after 3 warm-up ones."""
    steps: dict[int, list[float]] = {r: [] for r in entry["restarts"]}
    peaks: dict[int, float] = {}
    for _ in range(entry["repeats"]):
        for r in entry["restarts"]:
            res = measure({**entry, "restarts": r, "timing_only": True}, keep_steps=True)
            steps[r] += res["steps"]
            peaks[r] = max(peaks.get(r, 0.0), res["attack_rss_mb"])
    one = statistics.median(steps[1]) if 1 in steps else None
    out = []
    for r, times in steps.items():
        sec = statistics.median(times)
        row = {**{k: entry[k] for k in ("model", "batch", "device", "iterations", "threads")}, "restarts": r,
               "sec_per_iteration": sec, "steps_timed": len(times), "repeats": entry["repeats"],
               "peak_rss_mb": _maxrss_mb(), "attack_rss_mb": peaks[r], "timing_only": True}
        if one is not None and r != 1:
            row["ratio_to_one_restart"] = sec / one
        out.append(row)
    return out


def measure(entry: dict[str, Any], keep_steps: bool = False) -> dict[str, Any]:
    """One benchmark entry, in the current process: model, batch, restarts, device, iterations, attack config."""
    import torch

    from gi.analysis.metrics import psnr
    from gi.attack.recon import reconstruct
    from gi.attack.stages import oracle_labels

    torch.set_num_threads(entry["threads"])
    b = entry["batch"]
    (capture,), (truth,) = _victim(entry, 1, b)
    oracle = oracle_labels(truth)
    attack = from_dict(ReconConfig, {**entry["attack"], "iterations": entry["iterations"],
                                     "restarts": entry["restarts"], "threads": entry["threads"],
                                     "device": entry["device"], "progress": False})
    cuda = entry["device"] == "gpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = _maxrss_mb()
    timer = StepTimer()
    start = time.perf_counter()
    rec = reconstruct(capture, oracle, config=attack, callbacks=[timer])
    wall = time.perf_counter() - start
    steps = timer.times[3:] or timer.times
    out = {**{k: entry[k] for k in ("model", "batch", "restarts", "device", "iterations", "threads")},
           "sec_per_iteration": statistics.median(steps), "sec_per_iteration_mean": statistics.fmean(steps),
           "wall_seconds": wall, "peak_rss_mb": _maxrss_mb(), "attack_rss_mb": max(_maxrss_mb() - before, 0.0)}
    if keep_steps:
        out["steps"] = steps
    if cuda:
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["gpu"] = torch.cuda.get_device_name()
    if not entry.get("timing_only"):
        from gi.analysis.metrics import match_images

        perm = match_images(rec.images, truth.images) if b > 1 else [0]
        out["psnr"] = float(psnr(rec.images[perm], truth.images).mean())
    return out


def _victim(entry: dict[str, Any], count: int, batch: int) -> tuple[list, list]:
    """The entry's clients (:func:`gi.world.build.consecutive_captures`): ``count`` FedSGD captures of ``batch``
    consecutive images each of ``dataset`` through one zoo ``model`` (the DLG LeNet with its U(−0.5, 0.5) init)
    built with ``seed``; their truths."""
    from gi.world.build import build_model, consecutive_captures, load_data
    from gi.world.setup import DataConfig, ModelConfig

    ds = load_data(DataConfig(name=entry["dataset"]))
    model = build_model(ModelConfig(name=entry["model"], init="uniform" if entry["model"] == "lenet" else None), ds,
                        entry["seed"])
    return consecutive_captures(model, ds, count, batch)


def measure_packed(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The packed-throughput entry (module docstring): packed vs one by one (and packed compiled), alternated."""
    import torch

    from gi.analysis.metrics import psnr
    from gi.attack.recon import reconstruct, reconstruct_many
    from gi.attack.stages import oracle_labels

    torch.set_num_threads(entry["threads"])
    n = entry["captures"]
    captures, truths = _victim(entry, n, 1)
    label_results = [oracle_labels(t) for t in truths]
    torch.manual_seed(entry["seed"])
    attack = from_dict(ReconConfig, {**entry["attack"], "iterations": entry["iterations"], "restarts": 1,
                                     "threads": entry["threads"], "device": entry["device"], "progress": False})
    cuda = entry["device"] == "gpu"

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        recs = fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, recs

    ways = {"packed": lambda: reconstruct_many(captures, label_results, config=attack),
            "single": lambda: [reconstruct(c, result, config=attack) for c, result in zip(captures, label_results)]}
    if entry.get("compile"):
        compiled = dataclasses.replace(attack, compile=entry["compile"])
        ways["packed_compiled"] = lambda: reconstruct_many(captures, label_results, config=compiled)
    seconds: dict[str, list[float]] = {k: [] for k in ways}
    scores: dict[str, list[float]] = {}
    for _ in range(entry["rounds"]):
        for way, fn in ways.items():
            sec, recs = timed(fn)
            seconds[way].append(sec)
            scores[way] = [float(psnr(r.images, t.images).mean()) for r, t in zip(recs, truths)]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    unit = "gpu_hour" if cuda else "cpu_core_hour"
    per_hour = 3600.0 / (1 if cuda else entry["threads"])
    row = {"model": entry["model"], "batch": 1, "restarts": 1, "device": entry["device"],
           "iterations": entry["iterations"], "threads": entry["threads"], "kind": "packed", "captures": n,
           "rounds": entry["rounds"], "sec_per_iteration": med["packed"] / entry["iterations"],
           "peak_rss_mb": _maxrss_mb(), "attack_rss_mb": 0.0, "timing_only": False}
    for way, sec in med.items():
        row[f"{way}_seconds"] = sec
        row[f"{way}_seconds_all"] = seconds[way]
        row[f"{way}_images_per_second"] = n / sec
        row[f"{way}_per_{unit}"] = n / sec * per_hour
        row[f"{way}_psnr"] = scores[way]
        row[f"{way}_psnr_mean"] = statistics.fmean(scores[way])
    row["speedup"] = med["single"] / med["packed"]
    row["psnr_max_abs_diff"] = max(abs(a - b) for a, b in zip(scores["packed"], scores["single"]))
    if "packed_compiled" in med:
        row["compiled_speedup_over_packed"] = med["packed"] / med["packed_compiled"]
        row["compile"] = entry["compile"]
    row["psnr"] = row["packed_psnr_mean"]
    if cuda:
        row["gpu"] = torch.cuda.get_device_name()
    return [row]


def _run_entry(entry: dict[str, Any]) -> list[dict[str, Any]]:
    kind = entry.get("kind")
    if kind == "packed":
        return measure_packed(entry)
    return measure_restarts(entry) if kind == "restarts" else [measure(entry)]


def _in_process(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Run an entry in a fresh interpreter, so its peak memory is its own."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_run_entry, (entry,))


def entries(cfg: BenchConfig) -> list[dict[str, Any]]:
    import torch

    devices = []
    for d in cfg.devices:
        if d == "auto":
            devices += ["cpu"] + (["gpu"] if torch.cuda.is_available() else [])
        elif d == "gpu" and not torch.cuda.is_available():
            raise ConfigError("devices lists gpu but no CUDA device is available; use devices=[auto] or [cpu]")
        else:
            devices.append(d)
    attack = to_dict(cfg.attack)
    out = []
    for device in dict.fromkeys(devices):
        for model in cfg.models:
            its = int(cfg.iterations.get(model, 100))
            for b in cfg.batch_sizes:
                out.append(dict(model=model, batch=b, restarts=1, device=device, iterations=its, threads=cfg.threads,
                                seed=cfg.seed, dataset=cfg.dataset, attack=attack))
            for b in cfg.restart_batch_sizes:
                rs = [1] + [r for r in cfg.restarts if r != 1]
                out.append(dict(kind="restarts", model=model, batch=b, restarts=rs,
                                repeats=cfg.timing_repeats, device=device, iterations=cfg.timing_iterations,
                                threads=cfg.threads, seed=cfg.seed, dataset=cfg.dataset, attack=attack))
        if cfg.packed.captures:
            p = cfg.packed
            out.append(dict(kind="packed", model=p.model, captures=p.captures, rounds=p.rounds, device=device,
                            iterations=p.iterations, threads=cfg.threads, seed=cfg.seed, dataset=cfg.dataset,
                            attack=attack, compile=p.compile))
    return out


def report_path(cfg: BenchConfig, stamp: str = "") -> Path:
    """The report's path: ``out``, else ``runs/bench/<name>-<stamp>.json``."""
    return Path(cfg.out or f"runs/bench/{cfg.name}-{stamp}.json")


def check_report_path(cfg: BenchConfig, stamp: str = "") -> Path:
    """:func:`report_path`, refused before any work when it (or its page, :func:`html_path`) is a directory, cannot
    be written, or exists without ``overwrite``."""
    check_output_file(html_path(report_path(cfg, stamp)), cfg.overwrite)
    return check_output_file(report_path(cfg, stamp), cfg.overwrite)


def run_bench(cfg: BenchConfig) -> Path:
    """Run every entry (one fresh process each) and write the JSON report and its page (:func:`html_path`, the
    table of :func:`report_rows`); returns the report's path."""
    import torch

    from gi.analysis.html import write_table_report
    from gi.analysis.report import write_json

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = report_path(cfg, stamp).absolute()
    fresh = [p for p in (target.parent, *target.parent.parents) if not p.exists()]  # folders the check creates
    path = check_report_path(cfg, stamp)
    try:
        results = _run_entries(cfg)
    except BaseException:  # a failed or stopped bench leaves no empty folder of its own behind
        for folder in fresh:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    report = {"schema": BENCH_SCHEMA, "name": cfg.name, "created": stamp, "git": git_commit(),
              "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "load_average": list(os.getloadavg()),
              "config": to_dict(dataclasses.replace(cfg)), "results": results}
    publish_file(path, lambda tmp: write_json(tmp, report), cfg.overwrite)
    publish_file(html_path(path), lambda tmp: write_table_report(
        tmp.parent, f"gi bench: {cfg.name}", report_rows(results), name=tmp.name,
        notes=[f"{report['created']}, git {report['git']}, torch {report['torch']}, {report['cpus']} CPUs; "
               f"{path.name} holds every measurement."]), cfg.overwrite)
    return path


def _run_entries(cfg: BenchConfig) -> list[dict[str, Any]]:
    """Every entry of the bench, one fresh process each, a line printed per result."""
    results = []
    for entry in entries(cfg):
        for res in _in_process(entry):
            res["timing_only"] = bool(res.get("timing_only"))
            results.append(res)
            extra = f"  PSNR {res['psnr']:.2f} dB" if "psnr" in res else ""
            if "ratio_to_one_restart" in res:
                extra += f"  ({res['ratio_to_one_restart']:.2f}x one restart)"
            if res.get("kind") == "packed":
                extra += (f"  {res['captures']} packed: {res['packed_seconds']:.1f} s vs one by one "
                          f"{res['single_seconds']:.1f} s = {res['speedup']:.2f}x images/s; PSNR "
                          f"{res['packed_psnr_mean']:.2f} vs {res['single_psnr_mean']:.2f} dB (max |diff| "
                          f"{res['psnr_max_abs_diff']:.3f})")
            print(f"{res['model']:>9s} B={res['batch']:<2d} R={res['restarts']:<2d} {res['device']:>3s}: "
                  f"{1000 * res['sec_per_iteration']:8.1f} ms/it  peak {res['peak_rss_mb']:.0f} MB "
                  f"(+{res['attack_rss_mb']:.0f}){extra}", flush=True)
    return results


def report_rows(results: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The table of a throughput report, one row per result: the Markdown ``gi bench`` prints
    (:func:`format_report`) and the page beside the JSON (:func:`html_path`)."""
    return [{"model": r["model"], "B": str(r["batch"]), "R": str(r["restarts"]), "device": r["device"],
             "ms/it": f"{1000 * r['sec_per_iteration']:.1f}", "PSNR": f"{r.get('psnr', float('nan')):.2f}",
             "peak RSS MB": f"{r['peak_rss_mb']:.0f}", "R-ratio": f"{r.get('ratio_to_one_restart', float('nan')):.2f}"}
            for r in results]


def format_report(path: Path) -> str:
    rows = report_rows(json.loads(Path(path).read_text())["results"])
    head = ["model", "B", "R", "device", "ms/it", "PSNR", "peak RSS MB", "R-ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r[k] for k in head) + " |" for r in rows])


def html_path(path: Path) -> Path:
    """The page of a throughput report: ``path`` with ``.html`` for its suffix, beside it (``bench.html``)."""
    return path.with_suffix(".html")


register_bench_kind("throughput")(BenchKind(run_bench, format_report, out_file="bench.json"))

# the other kinds register themselves (gi.experiments.bench_kinds): the command knows them all
from gi.experiments import suite, ttq  # noqa: E402, F401
