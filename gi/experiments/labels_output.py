"""The files of ``gi labels`` (docs/usage.md): the per-trial and summary tables (CSV / Markdown / JSON), the plot of
the first metric, the proportion scatter and the per-class posterior box plots; the generic writers are
:mod:`gi.analysis.report`, the command :mod:`gi.experiments.labels`."""

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


def posterior_rows(posteriors: dict[str, list[tuple[Any, Any]]]) -> list[dict[str, Any]]:
    """One row per (grid point, class, side): n, mean and quartiles of p_j over that side's aux samples."""
    import torch

    rows = []
    for point, classes in posteriors.items():
        for j, sides in enumerate(classes):
            for side, values in zip(("positive", "negative"), sides):
                v = values.double()
                q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=v.dtype)).tolist() if v.numel() \
                    else [float("nan")] * 3
                rows.append({"point": point, "class": j, "side": side, "n": int(v.numel()),
                             "mean": float(v.mean()) if v.numel() else float("nan"),
                             "q1": q[0], "median": q[1], "q3": q[2]})
    return rows


def posterior_plot(path: Path, cfg: LabelBenchConfig, posteriors: dict[str, list[tuple[Any, Any]]]) -> None:
    """Posterior paper Fig. 2: one panel per grid point, per class j a box of p_j over the positive aux samples
    (class j) next to one over the negative samples (every other class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(posteriors), 1, figsize=(10.0, 3.2 * len(posteriors)), squeeze=False)
    for ax, (point, classes) in zip(axes[:, 0], posteriors.items()):
        for side, (shift, colour) in enumerate(((-0.18, "tab:red"), (0.18, "tab:blue"))):
            data = [sides[side].double().numpy() for sides in classes]
            box = ax.boxplot(data, positions=[j + shift for j in range(len(classes))], widths=0.3, sym=".",
                             patch_artist=True, manage_ticks=False)
            for patch in box["boxes"]:
                patch.set_facecolor(colour)
                patch.set_alpha(0.5)
        ax.set_xticks(range(len(classes)))
        ax.set_xlabel("class j")
        ax.set_ylabel("posterior p_j")
        ax.set_title(f"{point}: positive (red) / negative (blue) aux samples", fontsize=9)
    fig.suptitle(cfg.name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



def logit_means(logits: Any, labels: Any, num_classes: int) -> list[list[float | None]]:
    """μ (C, C): ``μ[n][j]``, the mean of logit component j over the samples of true class n (RLU eq. 6's moments,
    Assumption 3.1); None for a class without samples."""
    return [[float(logits[labels == n, j].mean()) if bool((labels == n).any()) else None
             for j in range(num_classes)] for n in range(num_classes)]


def logit_histogram_plot(path: Path, cfg: LabelBenchConfig, points: list[dict[str, Any]]) -> None:
    """RLU App. B.3, Figs. 4–9: one row per grid point, one panel per ``logit_histograms.pairs`` entry [n, j]: the
    histogram of logit j over the aux samples of true class n (``bins`` bins) with its mean μ_{n,j} dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = cfg.logit_histograms
    assert spec is not None
    fig, axes = plt.subplots(len(points), len(spec.pairs), figsize=(2.6 * len(spec.pairs), 2.3 * len(points)),
                             squeeze=False)
    for row, entry in zip(axes, points):
        for ax, (n, j) in zip(row, spec.pairs):
            values = entry["logits"][entry["labels"] == n, j].numpy()
            ax.hist(values, bins=spec.bins, color="tab:blue")
            if values.size:
                ax.axvline(float(values.mean()), color="tab:red", ls="--", lw=1)
            ax.set_title(f"n={n}, j={j}", fontsize=8)
            ax.tick_params(labelsize=6)
        acc = entry["global_acc"]
        row[0].set_ylabel(f"{entry['point']}\naux acc {entry['aux_acc']:.2f}"
                          + ("" if acc is None else f", test {acc:.2f}"), fontsize=7)
    fig.suptitle(f"{cfg.name}: logit j on class-n aux samples (mean dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_label_bench(out: Path, cfg: LabelBenchConfig, rows: list[dict[str, Any]], summary: list[dict[str, Any]],
                      points: list[str], t0: float,
                      posteriors: dict[str, list[tuple[Any, Any]]] | None = None,
                      logits: list[dict[str, Any]] | None = None) -> str:
    """Write the benchmark into ``out``: ``config.yaml``, ``trials.csv`` (``rows``), ``summary.csv`` / ``.md`` /
    ``.json`` (with the seconds since ``t0``, a :func:`time.perf_counter` reading), ``plot.png`` over the summary
    rows ``points`` (in order), with ``proportion_class`` ``proportions.png``, with ``posteriors`` (per grid
    point, per class the positive and negative posteriors) ``posteriors.png`` / ``posteriors.csv``, and with
    ``logit_histograms`` (``logits``: one entry per grid point, :func:`gi.experiments.labels.aux_logits`)
    ``logits.png`` and ``logit-means.json``; returns the Markdown table."""
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
    if posteriors:
        write_csv(out / "posteriors.csv", posterior_rows(posteriors))
        posterior_plot(out / "posteriors.png", cfg, posteriors)
    if logits:
        logit_histogram_plot(out / "logits.png", cfg, logits)
        write_json(out / "logit-means.json", [
            {"point": e["point"], "aux_acc": e["aux_acc"], "global_acc": e["global_acc"],
             "mu": logit_means(e["logits"], e["labels"], int(e["logits"].shape[1]))} for e in logits])
    return text
