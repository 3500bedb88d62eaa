"""Files and plots of a run's output directory: JSON / YAML / CSV / Markdown writers, image grids with captions,
line, bar and trade-off plots (matplotlib, imported on first use). docs/architecture.md "Layout"."""

from __future__ import annotations

import csv
import json
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import torch


def jsonable(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return str(obj)
    return obj


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(jsonable(data), indent=2, sort_keys=False) + "\n")


def write_yaml(path: Path, data: Any) -> None:
    path.write_text(yaml.safe_dump(jsonable(data), sort_keys=False))


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: jsonable(v) for k, v in row.items()})


def format_cell(v: Any) -> str:
    """A table cell as text (Markdown and HTML tables alike): floats to 4 significant digits, None empty."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def write_markdown_table(path: Path, rows: Sequence[dict[str, Any]], title: str = "") -> str:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    lines = ([f"# {title}", ""] if title else []) + ["| " + " | ".join(keys) + " |",
                                                     "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(format_cell(r.get(k)) for k in keys) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def save_grid(path: Path, rows: Sequence[torch.Tensor], pad: int = 2, scale: int = 1) -> None:
    """Save rows of images (each (B, C, H, W) in [0, 1]) as one PNG grid: e.g. truth over reconstruction."""
    import torch
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


def save_png(path: Path, image: torch.Tensor) -> None:
    """One image (C, H, W) of pixels in [0, 1] as an 8-bit PNG (grey for one channel, RGB for three): each pixel
    rounded to the nearest of 256 levels, values outside [0, 1] clipped."""
    import torch
    from PIL import Image

    pixels = image.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8)
    Image.fromarray((pixels[0] if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).contiguous()).numpy()).save(path)


def save_caption_grid(path: Path, reconstructions: torch.Tensor, truths: torch.Tensor | None = None,
                      captions: Sequence[str] = (), columns: int = 10, title: str = "") -> None:
    """A readable grid: one column per image (``columns`` per band, more bands below), rows truth (when given) and
    reconstruction, each image upscaled and captioned (e.g. its PSNR and recovered / true label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = reconstructions.shape[0]
    cols = min(n, columns)
    bands = -(-n // cols)
    rows_per = 2 if truths is not None else 1
    fig, axes = plt.subplots(bands * rows_per, cols, figsize=(1.5 * cols + 0.6, 2.0 * bands * rows_per + 0.5),
                             squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        band, col = divmod(i, cols)
        shown = [("truth", truths[i])] if truths is not None else []
        shown.append(("reconstruction", reconstructions[i]))
        for r, (label, img) in enumerate(shown):
            ax = axes[band * rows_per + r, col]
            pixels = img.detach().float().cpu().clamp(0, 1)
            pixels = pixels.repeat(3, 1, 1) if pixels.shape[0] == 1 else pixels
            ax.imshow(pixels.permute(1, 2, 0).numpy(), interpolation="nearest")
            if col == 0:
                ax.text(-0.08, 0.5, label, transform=ax.transAxes, rotation=90, ha="right", va="center", fontsize=8)
            if label == "reconstruction" and i < len(captions):
                ax.set_title(captions[i], fontsize=7, y=-0.32)
    if title:  # wrapped to the figure's width (a one-image grid is narrow): never clipped
        fig.suptitle(wrap_title(title, fig.get_figwidth(), 9), fontsize=9)
    fig.tight_layout(h_pad=2.0)
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)


def wrap_title(title: str, width_inches: float, fontsize: float) -> str:
    """``title`` broken into lines that fit ``width_inches`` at ``fontsize`` points (an average character is
    about 0.6 of the font size wide)."""
    chars = max(12, int(width_inches * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(title, chars)) or title


def save_line_plot(path: Path, x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str,
                   ylabel: str, title: str = "", logy: bool = False) -> None:
    """One panel of lines, one per ``series`` entry, over ``x`` (:func:`save_line_panels` with one panel)."""
    save_line_panels(path, x, {title: series}, xlabel, ylabel, logy=logy)


def save_line_panels(path: Path, x: Sequence[float], panels: dict[str, dict[str, Sequence[float]]], xlabel: str,
                     ylabel: str, title: str = "", logy: bool = False) -> None:
    """Panels side by side (``{panel title: {line name: ys}}``), one shared y axis, a legend per panel with more
    than one line; ``title`` over them all when there are several."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.2), dpi=120, sharey=True, squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        for line, ys in series.items():
            ax.plot(list(x)[: len(ys)], list(ys), label=line)
        ax.set_xlabel(xlabel)
        if logy:
            ax.set_yscale("log")
        if name:
            ax.set_title(name, fontsize=9 if len(panels) > 1 else None)
        if len(series) > 1:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    if title and len(panels) > 1:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class Curve:
    """One series of :func:`save_curves`: ``y`` over ``x``, drawn as its ``style`` (:data:`CURVE_STYLES`):
    ``line`` (a colour of its own), ``replaced`` (dashed: a fit the returned one replaced) or ``band`` (filled
    between ``lower`` and ``y``: e.g. the spread of many restarts)."""

    label: str
    x: list[float]
    y: list[float]
    style: str = "line"
    lower: list[float] | None = None


def _draw_line(ax: Any, curve: Curve, colour: Any) -> None:
    ax.plot(curve.x[: len(curve.y)], curve.y, label=curve.label, color=colour, lw=1.4)


def _draw_replaced(ax: Any, curve: Curve, colour: Any) -> None:
    ax.plot(curve.x[: len(curve.y)], curve.y, label=curve.label, color="0.35", ls="--", lw=1.2)


def _draw_band(ax: Any, curve: Curve, colour: Any) -> None:
    ax.fill_between(curve.x[: len(curve.y)], curve.lower or curve.y, curve.y, label=curve.label, color="tab:blue",
                    alpha=0.2, lw=0)


CURVE_STYLES: dict[str, Callable[[Any, Curve, Any], None]] = {"line": _draw_line, "replaced": _draw_replaced,
                                                               "band": _draw_band}
LEGEND_INSIDE = 4  # more legend entries than this go outside the axes, beside them, so no curve is hidden


def save_curves(path: Path, curves: Sequence[Curve], xlabel: str, ylabel: str, title: str = "",
                logy: bool = False) -> None:
    """One panel of :class:`Curve` s: the ``line`` curves in distinct colours (tab10, or a viridis ramp for more
    than ten), ``replaced`` dashed, ``band`` filled; the legend inside for up to :data:`LEGEND_INSIDE` entries,
    else to the right of the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [c for c in curves if c.style == "line"]
    palette = plt.get_cmap("tab10") if len(lines) <= 10 else plt.get_cmap("viridis")
    colours = {id(c): palette(i if len(lines) <= 10 else i / max(len(lines) - 1, 1)) for i, c in enumerate(lines)}
    outside = len(curves) > LEGEND_INSIDE
    fig, ax = plt.subplots(figsize=(6.4 if outside else 5, 3.2), dpi=120)
    for curve in curves:
        CURVE_STYLES[curve.style](ax, curve, colours.get(id(curve)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(wrap_title(title, 4.5, 9), fontsize=9)
    if len(curves) > 1:
        ax.legend(fontsize=7, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0}
                                 if outside else {}))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
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


def save_tradeoff_plot(path: Path, curves: dict[str, tuple[Sequence[float], Sequence[float], Sequence[str]]],
                       xlabel: str, ylabel: str, title: str = "",
                       reference: tuple[float, float] | None = None) -> None:
    """One curve per series through its points ``(xs, ys)``, each point annotated with its label (e.g. a defence
    at its strengths: leakage against accuracy); ``reference``: one starred point (e.g. no defence)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    for name, (xs, ys, labels) in curves.items():
        line, = ax.plot(list(xs), list(ys), marker="o", ms=4, label=name)
        for x, y, text in zip(xs, ys, labels):
            ax.annotate(text, (x, y), fontsize=6, color=line.get_color(), xytext=(2, 2), textcoords="offset points")
    if reference is not None:
        ax.scatter([reference[0]], [reference[1]], marker="*", s=120, color="black", zorder=3, label="no defence")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
