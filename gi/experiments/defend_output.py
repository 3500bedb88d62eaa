"""The files of ``gi defend`` (docs/usage.md): the table (Markdown / CSV / JSON), the per-image and per-client CSVs
and the privacy–utility plots; the generic writers are :mod:`gi.analysis.report`, the command
:mod:`gi.experiments.defend`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gi.analysis.html import write_table_report
from gi.analysis.report import save_tradeoff_plot, write_csv, write_json, write_markdown_table
from gi.experiments.config.defend import BASELINE, DefendConfig
from gi.experiments.outdir import file_slug


def tradeoff_plots(out: Path, cfg: DefendConfig, table: list[dict[str, Any]]) -> list[str]:
    """Privacy–utility plots: one per leakage metric, accuracy against leakage, one curve per defence."""
    metrics = [f"label_acc:{m}" for m in cfg.labels.methods]
    if cfg.images.count:
        metrics += ["psnr_mean"] + (["psnr_mean:oracle"] if cfg.images.oracle else [])
    base = next((r for r in table if r["defence"] == BASELINE), None)
    names = []
    for metric in metrics:
        curves: dict[str, tuple[list[float], list[float], list[str]]] = {}
        for r in table:
            if r["defence"] == BASELINE:
                continue
            xs, ys, texts = curves.setdefault(r["defence"], ([], [], []))
            xs.append(r[metric])
            ys.append(r["accuracy"])
            texts.append(f"{r['strength']:g}")
        name = f"tradeoff-{file_slug(metric.replace(':', '-'))}.png"
        xlabel = f"image leakage: PSNR [dB]{' (true labels)' if metric.endswith('oracle') else ''}" \
            if metric.startswith("psnr_mean") else f"label leakage: {metric}"
        save_tradeoff_plot(out / name, curves, xlabel, f"test accuracy after {cfg.federation.rounds} rounds",
                           title=f"gi defend {cfg.name}: {metric}",
                           reference=None if base is None else (base[metric], base["accuracy"]))
        names.append(name)
    return names


def write_defend(out: Path, cfg: DefendConfig, records: list[dict[str, Any]], t0: float) -> str:
    """Write the table of the cells' ``records`` into ``out``: ``table.csv``, ``results.csv`` (per image),
    ``clients.csv`` (per client and label method), ``table.md``, the :func:`tradeoff_plots`, ``metrics.json``
    (with the seconds since ``t0``, a :func:`time.perf_counter` reading) and ``report.html`` (the table and the
    plots on one page, :func:`gi.analysis.html.write_table_report`); returns the Markdown table."""
    import torch

    table = [r["summary"] for r in records]
    write_csv(out / "table.csv", table)
    write_csv(out / "results.csv", [row for r in records for row in r["per_image"]])
    write_csv(out / "clients.csv", [row for r in records for row in r["per_client"]])
    md = write_markdown_table(out / "table.md", table, title=f"gi defend: {cfg.name}")
    plots = tradeoff_plots(out, cfg, table)
    write_json(out / "metrics.json", {"name": cfg.name, "table": table, "plots": plots,
                                      "seconds": time.perf_counter() - t0, "torch": torch.__version__})
    write_table_report(out, f"gi defend: {cfg.name}", table, plots=plots)
    return md
