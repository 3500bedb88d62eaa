"""The files of ``gi sweep``: ``sweep.json`` (its jobs), ``failed/<job>.txt`` (a failed job's error), and of its
aggregation: ``aggregate.csv`` (one row per job, or per table row of ablation jobs),
``summary.md`` and ``summary.png`` (mean ± std over seeds per configuration); the command is
:mod:`gi.experiments.sweep`."""

from __future__ import annotations

import csv
import json
import os
import traceback
from pathlib import Path
from typing import Any

from gi.core.errors import GIError
from gi.experiments.config.sweep import Job, SweepConfig


def write_aggregate(cfg: SweepConfig, root: Path, rows: list[dict[str, Any]], total: int) -> None:
    """Write ``aggregate.csv`` (``rows``, atomically) and the summary of ``cfg.metric`` into the sweep's ``root``."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    tmp = root / ".aggregate.csv.tmp"
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, root / "aggregate.csv")
    write_summary(cfg, root, rows, total)


def write_summary(cfg: SweepConfig, root: Path, rows: list[dict[str, Any]], total: int) -> None:
    """``summary.md`` and ``summary.png``: mean ± std over seeds of ``cfg.metric`` (``psnr`` for ablation jobs) per
    configuration (grid point, and table row of ablation jobs); ``total``: the sweep's jobs."""
    import numpy as np

    metric = "psnr" if cfg.command == "ablate" else cfg.metric
    group_keys = [k for k in cfg.grid] + (["setting", "variant", "mode"] if cfg.command == "ablate" else [])
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        value = row.get(metric)
        if isinstance(value, int | float):
            key = tuple(json.dumps(v) if isinstance(v, list | dict) else v for v in (row.get(k) for k in group_keys))
            groups.setdefault(key, []).append(float(value))  # a list-valued grid (data.indices) keys as its text
    lines = [f"# gi sweep: {cfg.name}", "", f"{len(rows)} result row(s) from {total} job(s); {metric}: mean ± std "
             "over seeds", "", "| " + " | ".join(group_keys + [metric, "std", "n"]) + " |",
             "|" + "---|" * (len(group_keys) + 3)]
    for key, vals in groups.items():
        lines.append("| " + " | ".join(str(k) for k in key) + f" | {np.mean(vals):.3f} | {np.std(vals):.3f} | "
                     f"{len(vals)} |")
    (root / "summary.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [", ".join(str(k) for k in key) or "all" for key in groups]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(groups)), 3.4), dpi=120)
    ax.bar(range(len(groups)), [np.mean(v) for v in groups.values()], yerr=[np.std(v) for v in groups.values()],
           capsize=3, color="tab:blue")
    ax.set_xticks(range(len(groups)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(cfg.name, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(root / "summary.png")
    plt.close(fig)


def write_sweep_record(root: Path, cfg: SweepConfig, jobs: list[Job]) -> None:
    """``sweep.json`` in the sweep's ``root``: its name, command, base config and every job's name and directory."""
    (root / "sweep.json").write_text(json.dumps({"name": cfg.name, "command": cfg.command, "base": cfg.base,
                                                 "jobs": [j.name for j in jobs],
                                                 "dirs": [j.dirname for j in jobs]}, indent=1) + "\n")


def write_failure(record: Path, exc: BaseException) -> None:
    """A failed job's ``record`` (``failed/<job>.txt``): the message of a ``GIError``, else the traceback (call it
    while ``exc`` is being handled)."""
    record.parent.mkdir(exist_ok=True)
    record.write_text(f"{exc}\n" if isinstance(exc, GIError) else traceback.format_exc())
