"""The files of ``gi ablate`` (docs/usage.md): the table (Markdown / CSV / JSON), the per-image CSV and the PSNR
plot; the generic writers are :mod:`gi.analysis.report`, the command :mod:`gi.experiments.ablate`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gi.analysis.html import write_table_report
from gi.analysis.report import write_csv, write_json, write_markdown_table


def save_ablation_plot(path: Path, rows: list[dict[str, Any]], key: str = "psnr") -> None:
    """A bar per table row of ``key`` (ours), the paper's value beside it where the config gives one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['setting']}\n" + (f"{r['variant']}/" if r["variant"] != "base" else "") + r["mode"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 0.55 * len(rows)), 3.6), dpi=120)
    ax.bar(range(len(rows)), [r[key] for r in rows], color="tab:blue", label="ours")
    paper = [r.get(f"paper_{key}") for r in rows]
    if any(p is not None for p in paper):
        ax.scatter(range(len(rows)), [p if p is not None else float("nan") for p in paper], color="tab:red",
                   marker="_", s=200, label="paper", zorder=3)
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
    ax.set_ylabel(key.upper() + (" [dB]" if key == "psnr" else ""))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_ablation(out: Path, name: str, table: list[dict[str, Any]], per_image: list[dict[str, Any]],
                   t0: float) -> str:
    """Write the ablation's files into ``out``: ``table.csv``, ``results.csv`` (``per_image``), ``table.md``,
    ``metrics.json`` (with the seconds since ``t0``, a :func:`time.perf_counter` reading), ``psnr.png`` and
    ``report.html`` (the table and the plot on one page, :func:`gi.analysis.html.write_table_report`); returns the
    Markdown table."""
    import torch

    write_csv(out / "table.csv", table)
    write_csv(out / "results.csv", per_image)
    md = write_markdown_table(out / "table.md", table, title=f"gi ablate: {name}")
    write_json(out / "metrics.json", {"name": name, "table": table, "seconds": time.perf_counter() - t0,
                                      "torch": torch.__version__})
    save_ablation_plot(out / "psnr.png", table)
    write_table_report(out, f"gi ablate: {name}", table, plots=["psnr.png"])
    return md
