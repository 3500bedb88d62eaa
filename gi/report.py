"""Writing a run's output directory: staged in a hidden folder and renamed into place at the end,
so an interrupted or failed run never leaves a half-written directory (DESIGN.md §4)."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from gi.errors import ConfigError


@contextlib.contextmanager
def staged_output(final: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it becomes ``final``; on error it is removed."""
    final = Path(final)
    if final.exists() and not overwrite:
        raise ConfigError(f"output directory {final} exists; choose another `out=` or pass overwrite=true")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.partial-"))
    handler = logging.FileHandler(tmp / "log.txt")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("gi")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield tmp
    except BaseException:
        root.removeHandler(handler)
        handler.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    root.removeHandler(handler)
    handler.close()
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return str(obj)
    return obj


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")


def write_yaml(path: Path, data: Any) -> None:
    path.write_text(yaml.safe_dump(_jsonable(data), sort_keys=False))


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _jsonable(v) for k, v in row.items()})


def write_markdown_table(path: Path, rows: Sequence[dict[str, Any]], title: str = "") -> str:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ([f"# {title}", ""] if title else []) + ["| " + " | ".join(keys) + " |",
                                                     "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def save_grid(path: Path, rows: Sequence[torch.Tensor], pad: int = 2, scale: int = 1) -> None:
    """Save rows of images (each (B, C, H, W) in [0, 1]) as one PNG grid: e.g. truth over reconstruction."""
    import torchvision.utils as vutils

    batch = max(r.shape[0] for r in rows)
    tiles = []
    for r in rows:
        r = r.detach().float().cpu().clamp(0, 1)
        if r.shape[1] == 1:
            r = r.repeat(1, 3, 1, 1)
        if r.shape[0] < batch:
            r = torch.cat([r, torch.ones(batch - r.shape[0], *r.shape[1:])])
        tiles.append(r)
    grid = vutils.make_grid(torch.cat(tiles), nrow=batch, padding=pad, pad_value=1.0)
    if scale > 1:
        grid = torch.nn.functional.interpolate(grid[None], scale_factor=scale, mode="nearest")[0]
    vutils.save_image(grid, str(path))


def save_line_plot(path: Path, x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str,
                   ylabel: str, title: str = "", logy: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    for name, ys in series.items():
        ax.plot(list(x)[: len(ys)], list(ys), label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_bar_plot(path: Path, groups: Sequence[str], series: dict[str, Sequence[float]], ylabel: str,
                  title: str = "") -> None:
    """Grouped bars: one group per table row group (e.g. grid point), one bar per series (e.g. method)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = max(len(series), 1)
    width = 0.8 / n
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(groups) * max(1, n / 3) + 2), 3.6), dpi=120)
    for i, (name, ys) in enumerate(series.items()):
        ax.bar(x + (i - (n - 1) / 2) * width, list(ys), width, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(list(groups), rotation=30 if len(groups) > 3 else 0, ha="right" if len(groups) > 3 else "center",
                       fontsize=7)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7, ncol=min(n, 4))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
