"""The files of ``gi labels`` (docs/usage.md): the per-trial and summary tables (CSV / Markdown / JSON), the plot of
the first metric and the proportion scatter; the aux diagnostics' figures are
:mod:`gi.experiments.labels_diagnostics`, the generic writers :mod:`gi.analysis.report`, the command
:mod:`gi.experiments.labels`."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from gi.analysis.report import (
    save_bar_plot,
    save_line_panels,
    save_line_plot,
    write_csv,
    write_json,
    write_markdown_table,
    write_yaml,
)
from gi.core.config import to_dict
from gi.experiments.config.labels import LabelBenchConfig, point_label
from gi.experiments.labels_diagnostics_output import plot_diagnostics


def line_axis(cfg: LabelBenchConfig) -> str | None:
    """The grid key that ``plot.png`` puts on its x axis: the last unpooled key with >= 3 values, all numbers
    (rounds, aux sizes, widths); None when there is none (then the plot is a bar chart of the rows)."""
    for key in reversed([k for k in cfg.grid if k not in cfg.pool]):
        vals = cfg.grid[key]
        if len(vals) >= 3 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            return key
    return None


def summary_plot(path: Path, cfg: LabelBenchConfig, summary: list[dict[str, Any]], points: list[str]) -> None:
    """``metrics[0]`` per row: a line per method (and per value of the other unpooled grid keys) against the
    :func:`line_axis` key when the grid has one, with one panel per value of the first other key when there are
    two or more other keys (so a 3-key grid is not one tangle of lines); else bars per row and method."""
    metric = cfg.metrics[0]

    def value(point: str, method: str) -> float:
        return next((float("nan") if r[metric] is None else r[metric] for r in summary
                     if r["point"] == point and r["method"] == method), float("nan"))

    axis = line_axis(cfg)
    if axis is None:
        bars = {m: [value(p, m) for p in points] for m in cfg.labels.methods}
        save_bar_plot(path, points, bars, metric, title=cfg.name)
        return
    keys = [k for k in cfg.grid if k not in cfg.pool]
    others = [k for k in keys if k != axis]
    facet = others[0] if len(others) >= 2 else None  # 2+ other keys: one panel per value of the first
    panels: dict[str, dict[str, list[float]]] = {}
    for combo in itertools.product(*(cfg.grid[k] for k in others)):
        fixed = dict(zip(others, combo))
        panel = "" if facet is None else f"{facet.split('.')[-1]}={fixed[facet]}"
        for method in cfg.labels.methods:
            name = " ".join([method, *(f"{k.split('.')[-1]}={v}" for k, v in fixed.items() if k != facet)])
            panels.setdefault(panel, {})[name] = [value(point_label({k: fixed.get(k, x) for k in keys}), method)
                                                  for x in cfg.grid[axis]]
    if facet is None:
        save_line_plot(path, cfg.grid[axis], panels[""], axis.split(".")[-1], metric, title=cfg.name)
    else:
        save_line_panels(path, cfg.grid[axis], panels, axis.split(".")[-1], metric, title=cfg.name)


def proportion_plot(path: Path, cfg: LabelBenchConfig, rows: list[dict[str, Any]],
                     points: list[str]) -> None:
    """Ramakrishna & Dán Figs. 5–6: estimated against true proportion of ``cfg.proportion_class``, one panel per
    grid point, one marker series per method, the diagonal for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 4.0), squeeze=False)
    for ax, point in zip(axes[0], points):
        top = 0.0
        for method in cfg.labels.methods:
            rs = [r for r in rows if r["point"] == point and r["method"] == method]
            xs, ys = [r["p_true"] for r in rs], [r["p_hat"] for r in rs]
            top = max([top, *xs, *ys])
            ax.scatter(xs, ys, s=14, label=method, alpha=0.8)
        ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--")
        ax.set_title(point, fontsize=9)
        ax.set_xlabel(f"true proportion of class {cfg.proportion_class}")
        ax.set_ylabel("estimate")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(cfg.name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_label_bench(out: Path, cfg: LabelBenchConfig, rows: list[dict[str, Any]], summary: list[dict[str, Any]],
                      points: list[str], t0: float, diagnostics: dict[str, dict[str, Any]] | None = None) -> str:
    """Write the benchmark into ``out``: ``config.yaml``, ``trials.csv`` (``rows``), ``summary.csv`` / ``.md`` /
    ``.json`` (with the seconds since ``t0``, a :func:`time.perf_counter` reading), ``plot.png`` over the summary
    rows ``points`` (in order), with ``proportion_class`` ``proportions.png``, and the files of every entry of
    ``cfg.diagnostics`` from its collected data (``diagnostics``: name → grid point → data,
    :func:`gi.experiments.labels_diagnostics.plot_diagnostics`); returns the Markdown table."""
    import torch

    write_yaml(out / "config.yaml", to_dict(cfg))
    write_csv(out / "trials.csv", rows)
    write_csv(out / "summary.csv", summary)
    text = write_markdown_table(out / "summary.md", summary, title=f"{cfg.name} ({cfg.trials} trials per point)")
    write_json(out / "summary.json", {"name": cfg.name, "trials": cfg.trials, "rows": summary,
                                      "seconds": time.perf_counter() - t0, "torch": torch.__version__})
    summary_plot(out / "plot.png", cfg, summary, points)
    if cfg.proportion_class is not None:
        proportion_plot(out / "proportions.png", cfg, rows, points)
    plot_diagnostics(out, cfg, diagnostics or {})
    return text
