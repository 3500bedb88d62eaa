"""The files of ``gi bench``'s ``time-to-quality`` kind: ``config.yaml``, ``curves.json``, ``summary.json``,
``summary.csv`` and the plot ``ttq.png``, written by a run and by :func:`gi.experiments.ttq.merge_runs`; the
generic writers are :mod:`gi.analysis.report`, the measurement :mod:`gi.experiments.ttq`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.html import write_table_report
from gi.analysis.report import write_csv, write_json, write_yaml
from gi.core.config import to_dict
from gi.experiments.config.ttq import TTQConfig

if TYPE_CHECKING:  # the measurement imports this module
    from gi.experiments.ttq_curves import Curve

TTQ_SCHEMA = 2  # version of summary.json: 2 adds the fairness rule's records (runs, cpu_seconds, finished_at,
#                 compared_until, each row's equal_time, n/a ratios); a summary without "schema" is version 1

SPENT_KEYS = ("iterations", "runs", "cpu_seconds", "wall_seconds", "finished_at")  # gi.experiments.ttq.spent


def contender_names(summary: dict[str, Any]) -> list[str]:
    """The contenders of a ``summary.json``'s rows, in their order (a contender's cell has ``final_psnr``)."""
    rows = summary.get("rows") or []
    return [k for k in (rows[0] if rows else {}) if isinstance(rows[0][k], dict) and "final_psnr" in rows[0][k]]


def csv_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``summary.csv``: one row per capture and contender: the compared time (the row's ``equal_time``) and PSNR
    there, the final PSNR, the time to each level (empty: never, censored at ``censored_at``), what it spent
    (iterations actually run, runs, CPU and wall seconds, when it finished before the budget) and, for a
    contender other than ours, the ratio of its time to ours per level with its kind."""
    out = []
    for r in summary.get("rows") or []:
        for name in contender_names(summary):
            cell = r[name]
            row: dict[str, Any] = {"capture": r["capture"], "contender": name,
                                   "equal_time": r.get("equal_time", summary.get("equal_time")),
                                   "psnr_at_equal_time": cell.get("psnr_at_equal_time"),
                                   "final_psnr": cell["final_psnr"], "censored_at": cell.get("seconds")}
            row.update({k: v for k, v in cell.items() if k.startswith("time_to_")})
            row.update({k: cell.get(k) for k in SPENT_KEYS})
            for key, value in r.items():
                if key.startswith(f"ratio_{name}_") and isinstance(value, dict):
                    level = key[len(f"ratio_{name}_"):]
                    row[f"ratio_to_gi_{level}"], row[f"ratio_kind_{level}"] = value["value"], value["kind"]
            out.append(row)
    return out


def psnr_at(seconds: Sequence[float], psnr: Sequence[float], when: float) -> float | None:
    """The PSNR of the last checkpoint at or before ``when`` (None: no checkpoint that early)."""
    best = None
    for t, p in zip(seconds, psnr):
        if t <= when:
            best = float(p)
    return best


def save_plot(path: Path, cfg: TTQConfig, curves: list[Curve], title: str) -> None:
    """PSNR against seconds: a thin line per contender (and variant) per capture, the median over captures bold
    (drawn up to the longest curve; where a shorter curve has ended it holds its last value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    groups = list(dict.fromkeys((c.contender, c.variant) for c in curves
                                if c.contender in cfg.contenders))
    groups.sort(key=lambda g: cfg.contenders.index(g[0]))
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=130)
    for i, (name, variant) in enumerate(groups):
        colour = f"C{i}"
        mine = [c for c in curves if (c.contender, c.variant) == (name, variant)]
        for c in mine:  # a one-point curve (an answer without iterations: the analytic inversion) is a dot
            ax.plot(c.seconds(cfg.clock), c.psnr, color=colour, alpha=0.3, lw=0.8,
                    marker="o" if len(c.psnr) == 1 else None, ms=3)
        ends = max(c.seconds(cfg.clock)[-1] for c in mine)
        starts = min(c.seconds(cfg.clock)[0] for c in mine)
        grid = np.geomspace(max(starts, 1e-2), ends, 200)
        values = [[psnr_at(c.seconds(cfg.clock), c.psnr, t) for c in mine] for t in grid]
        med = [statistics.median(v) if all(x is not None for x in v) else np.nan for v in values]
        label = f"{name} {variant}".strip()
        if np.isfinite(med).sum() < 2:  # every curve a single answer: its median time and PSNR as one marker
            ax.plot([statistics.median(c.seconds(cfg.clock)[-1] for c in mine)],
                    [statistics.median(c.psnr[-1] for c in mine)], color=colour, marker="o", ms=8, ls="",
                    label=f"{label} (median of {len(mine)})")
            continue
        ax.plot(grid, med, color=colour, lw=2.4, label=f"{label} (median of {len(mine)})")
    for lvl in cfg.levels:
        ax.axhline(lvl, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap on a short range
    where = f"{cfg.threads} thread" if cfg.device == "cpu" else f"{cfg.device}"
    ax.set_xlabel(f"attack seconds ({'CPU' if cfg.clock == 'cpu' else 'wall'}, {where})")
    ax.set_ylabel("PSNR [dB]")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_ttq(out: Path, cfg: TTQConfig, curves: list[Curve], summary: dict[str, Any], title: str) -> None:
    """Write a time-to-quality directory's files into ``out``: ``config.yaml`` (``cfg``), ``curves.json`` (every
    checkpoint of ``curves``), ``summary.json`` (``summary`` with ``schema``: :data:`TTQ_SCHEMA`),
    ``summary.csv`` (:func:`csv_rows`), ``ttq.png`` (:func:`save_plot`, ``title``) and ``report.html``
    (:func:`curve_rows` and the plot, :func:`gi.analysis.html.write_table_report`)."""
    write_yaml(out / "config.yaml", to_dict(cfg))
    write_json(out / "curves.json", [dataclasses.asdict(c) for c in curves])
    summary = {"schema": TTQ_SCHEMA, **summary}
    write_json(out / "summary.json", summary)
    write_csv(out / "summary.csv", csv_rows(summary))
    save_plot(out / "ttq.png", cfg, curves, title)
    write_table_report(out, title, curve_rows(cfg, curves), plots=["ttq.png"],
                       notes=["One row per contender and capture: the answer it returned (its last checkpoint). "
                              "summary.json holds the times to each PSNR level and their ratios."])


def curve_rows(cfg: TTQConfig, curves: list[Curve]) -> list[dict[str, Any]]:
    """The page's table: per curve its contender, variant, capture, final PSNR, iterations and seconds."""
    return [{"contender": c.contender, "variant": c.variant, "capture": c.capture,
             "final PSNR [dB]": c.psnr[-1] if c.psnr else None, "iterations": c.iterations[-1] if c.iterations
             else None, f"seconds ({cfg.clock})": c.seconds(cfg.clock)[-1] if c.psnr else None,
             "stopped by budget": c.info.get("stopped_by_budget")} for c in curves]
