"""The files of ``gi bench``'s ``time-to-quality`` kind: ``config.yaml``, ``curves.json``, ``summary.json`` and the
plot ``ttq.png``, written by a run and by :func:`gi.experiments.ttq.merge_runs`; the generic writers are
:mod:`gi.analysis.report`, the measurement :mod:`gi.experiments.ttq`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import write_json, write_yaml
from gi.core.config import to_dict
from gi.experiments.config.ttq import TTQConfig

if TYPE_CHECKING:  # the measurement imports this module
    from gi.experiments.ttq import Curve


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
    checkpoint of ``curves``), ``summary.json`` (``summary``) and ``ttq.png`` (:func:`save_plot`, ``title``)."""
    write_yaml(out / "config.yaml", to_dict(cfg))
    write_json(out / "curves.json", [dataclasses.asdict(c) for c in curves])
    write_json(out / "summary.json", summary)
    save_plot(out / "ttq.png", cfg, curves, title)
