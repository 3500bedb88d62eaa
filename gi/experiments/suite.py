"""``gi bench`` kind ``suite``: several bench configs (its ``members``, e.g. the realistic-images settings S1..S5)
run one after another as one command, and one table of their results.

Every member was loaded and checked when the suite loaded (:meth:`SuiteConfig.member_configs`). Each selected
member (``only``) then runs through its own kind's runner (:data:`gi.experiments.bench_kinds.BENCH_KINDS`) with its
output in ``<out>/<label>/`` (a kind that writes one file, such as ``throughput``, writes
``<out>/<label>/<its out_file>``); one progress line when a member starts and one when it ends, with its
seconds. A member that fails with a :class:`~gi.core.errors.GIError` (e.g. breaching not installed, a capture
index the job does not make) is recorded with its error and the others still run; the suite then writes its
output and raises :class:`MemberFailed` (``gi bench`` exits non-zero). Any other exception stops the suite.

The suite's directory is staged like every output (:func:`gi.experiments.outdir.staged_output`): nothing
overwrites a result. Finished members are kept meanwhile in ``.<out>.cells/<label>/`` next to it, with a record
of the member's resolved config; the same command with the same ``out=`` after an interruption reuses every
finished member whose resolved config is unchanged (files it names, such as a ``job:``, are not compared) and
runs the rest.

Files (:mod:`gi.experiments.suite_output`): ``suite.json`` (per member: label, config path, overrides, kind,
output path, wall and CPU seconds, status, error, and the member's own summary numbers where its kind writes a
``summary.json``: :func:`member_numbers`), ``summary.md`` (one row per member), ``config.yaml``, ``log.txt`` and
the members' folders.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from gi.core.config import to_dict
from gi.core.errors import ConfigError, GIError
from gi.core.provenance import git_commit
from gi.experiments.bench_kinds import BENCH_KINDS, BenchKind, bench_kind, register_bench_kind
from gi.experiments.config.bench import SET_BY_SUITE, SuiteConfig
from gi.experiments.outdir import cells_dir, load_cell, save_cell, staged_output
from gi.experiments.suite_output import OURS, THEIRS, format_suite, write_suite
from gi.experiments.ttq_output import contender_names

SUITE_SCHEMA = 1  # version of suite.json


class MemberFailed(GIError):
    """Some members of a suite failed; the suite's output (``out``) was written with their errors."""

    def __init__(self, message: str, out: Path) -> None:
        super().__init__(message)
        self.out = out


def stats(values: list[float]) -> dict[str, float] | None:
    """Mean, median and min of ``values`` (None when empty)."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "min": min(values)}


def member_numbers(path: Path) -> dict[str, Any] | None:
    """The summary numbers of a member's output ``path`` when it holds a time-to-quality ``summary.json``
    (:mod:`gi.experiments.ttq_output`): per contender its final PSNR and PSNR at equal time (mean / median / min
    over captures), ours minus breaching's final PSNR per capture (mean / median / min), the time ratios, and the
    trivial guesses (``grey_psnr``, ``mean_colour_psnr``, means over captures) when its rows carry ``trivial``.
    None for an output without one (a throughput report)."""
    summary = Path(path) / "summary.json"
    if not summary.is_file():
        return None
    data = json.loads(summary.read_text())
    rows = data.get("rows") or []
    names = contender_names(data)
    out: dict[str, Any] = {"captures": len(rows), "clock": data.get("clock"), "equal_time": data.get("equal_time"),
                           "contenders": {}}
    for name in names:
        out["contenders"][name] = {
            "final_psnr": stats([r[name]["final_psnr"] for r in rows]),
            "psnr_at_equal_time": stats([r[name]["psnr_at_equal_time"] for r in rows
                                         if r[name].get("psnr_at_equal_time") is not None])}
    if OURS in names and THEIRS in names:
        out[f"gain_over_{THEIRS}_db"] = stats([r[OURS]["final_psnr"] - r[THEIRS]["final_psnr"] for r in rows])
    if data.get("ratios"):
        out["ratios"] = data["ratios"]
    trivial = [r["trivial"] for r in rows if isinstance(r.get("trivial"), dict)]
    if trivial:
        out["trivial"] = {key: statistics.fmean(t[key] for t in trivial)
                          for key in ("grey_psnr", "mean_colour_psnr") if all(key in t for t in trivial)}
    return out


def _fingerprint(cfg: Any) -> dict[str, Any]:
    """A member's resolved config without the keys the suite sets: what a kept member must match to be reused."""
    return json.loads(json.dumps({k: v for k, v in to_dict(cfg).items() if k not in SET_BY_SUITE}))


def _member_out(cfg: Any, folder: Path) -> Path:
    """Where a member writes: its folder, or the kind's ``out_file`` inside it for a kind that writes one file."""
    name = BENCH_KINDS[cfg.kind].out_file
    return folder if name is None else folder / name


def _run_member(label: str, cfg: Any, cache: Path, index: str) -> dict[str, Any]:
    """Run one member into ``cache/<label>`` (or reuse it from an interrupted run of the same suite); its record."""
    kind = BENCH_KINDS[cfg.kind]
    folder = cache / label
    finger = _fingerprint(cfg)
    kept = load_cell(cache, label)
    if kept is not None and kept.get("fingerprint") == finger and folder.exists():
        print(f"{index} {label}: kept from an interrupted run of this suite ({kept['seconds']:.1f} s then)",
              flush=True)
        return {**kept["record"], "reused": True}  # a copy: the caller takes its path out
    if folder.is_dir() and not folder.is_symlink():  # an unfinished or changed member: run it again
        shutil.rmtree(folder)
    elif os.path.lexists(folder):
        folder.unlink()
    print(f"{index} {label}: started ({cfg.kind}, {getattr(cfg, 'name', label)})", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"status": "done", "error": None}
    if kind.out_file is not None:  # a kind that writes one file writes it in the member's folder
        folder.mkdir(parents=True)
    try:
        path = kind.run(dataclasses.replace(cfg, out=str(_member_out(cfg, folder)), overwrite=False))
        record["path"] = str(Path(path).relative_to(folder))  # "." when the member wrote the folder itself
    except GIError as exc:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", path=None)
    record.update(seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)
    if record["status"] == "done":
        print(f"{index} {label}: done in {record['seconds']:.1f} s (CPU {record['cpu_seconds']:.1f} s)", flush=True)
        save_cell(cache, label, {"fingerprint": finger, "seconds": record["seconds"], "record": record})
    else:
        print(f"{index} {label}: FAILED after {record['seconds']:.1f} s: {record['error']}", flush=True)
    return record


def run_suite(cfg: SuiteConfig) -> Path:
    """Run the selected members in order (module docstring) and write the suite's directory; returns it. Raises
    :class:`MemberFailed` after writing it when a member failed."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"runs/bench/{cfg.name}-{stamp}")
    configs = cfg.member_configs()
    labels = cfg.selected()
    for label in labels:  # what each member needs beyond its config (breaching, say), before any member runs
        check = bench_kind(configs[label]).check
        if check is not None:
            try:
                check(configs[label])
            except ConfigError as err:
                raise ConfigError(f"suite {cfg.name}, member {label}: {err}") from None
    cache = cells_dir(out)
    entries = []
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        cache.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        for i, label in enumerate(labels):
            member, mcfg = cfg.members[label], configs[label]
            record = _run_member(label, mcfg, cache, f"[{i + 1}/{len(labels)}]")
            where = record.pop("path")  # inside the member's folder ("." : the folder itself)
            entry: dict[str, Any] = {"label": label, "config": member.config, "overrides": list(member.overrides),
                                     "kind": mcfg.kind, "output": None, **record}
            if record["status"] == "done":
                entry["output"] = str(out / label / where) if where != "." else str(out / label)
                entry["summary"] = member_numbers(cache / label / where)
            entries.append(entry)
        for e in entries:  # kept in the cache until every member has run: an interruption loses none
            if e["status"] == "done":
                os.rename(cache / e["label"], tmp / e["label"])
        failed = [e["label"] for e in entries if e["status"] == "failed"]
        data = {"schema": SUITE_SCHEMA, "name": cfg.name, "created": stamp, "git": git_commit(), "only": cfg.only,
                "seconds": time.perf_counter() - start, "failed": failed, "members": entries}
        write_suite(tmp, to_dict(cfg), data)
    shutil.rmtree(cache, ignore_errors=True)
    if failed:
        print(format_suite(out))
        rest = "the others' results are in" if len(failed) < len(entries) else "the record is in"
        raise MemberFailed(f"suite {cfg.name}: {len(failed)} of {len(entries)} member(s) failed ({', '.join(failed)}; "
                           f"their errors are in {out / 'suite.json'}); {rest} {out}", out)
    return out


register_bench_kind("suite")(BenchKind(run_suite, format_suite))
