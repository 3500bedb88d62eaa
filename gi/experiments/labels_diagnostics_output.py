"""The files of the ``gi labels`` diagnostics (:mod:`gi.experiments.labels_diagnostics` collects their data per
grid point): :data:`PLOTS` maps each diagnostic's name to ``plot(out, cfg, collected, options)``, which writes its
files into the output directory from ``{point: data}``. matplotlib is imported only when a plot runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import write_csv, write_json
from gi.experiments.config.diagnostics import LabelLandscape, LogitHistograms, PosteriorBoxes

if TYPE_CHECKING:
    from gi.experiments.config.labels import LabelBenchConfig


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


def posterior_plot(out: Path, cfg: LabelBenchConfig, posteriors: dict[str, list[tuple[Any, Any]]],
                   options: PosteriorBoxes) -> None:
    """Posterior paper Fig. 2: ``posteriors.csv`` (:func:`posterior_rows`) and ``posteriors.png``, one panel per
    grid point, per class j a box of p_j over the positive aux samples (class j) next to one over the negative
    samples (every other class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_csv(out / "posteriors.csv", posterior_rows(posteriors))
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
    fig.savefig(out / "posteriors.png", dpi=110)
    plt.close(fig)


def logit_means(logits: Any, labels: Any, num_classes: int) -> list[list[float | None]]:
    """μ (C, C): ``μ[n][j]``, the mean of logit component j over the samples of true class n (RLU eq. 6's moments,
    Assumption 3.1); None for a class without samples."""
    return [[float(logits[labels == n, j].mean()) if bool((labels == n).any()) else None
             for j in range(num_classes)] for n in range(num_classes)]


def logit_histogram_plot(out: Path, cfg: LabelBenchConfig, points: dict[str, dict[str, Any]],
                         options: LogitHistograms) -> None:
    """RLU App. B.3, Figs. 4–9: ``logits.png``, one row per grid point, one panel per ``pairs`` entry [n, j]: the
    histogram of logit j over the aux samples of true class n (``bins`` bins) with its mean μ_{n,j} dashed; and
    ``logit-means.json``, every μ_{n,j} per grid point (:func:`logit_means`) with the accuracies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(points), len(options.pairs),
                             figsize=(2.6 * len(options.pairs), 2.3 * len(points)), squeeze=False)
    for row, (point, entry) in zip(axes, points.items()):
        for ax, (n, j) in zip(row, options.pairs):
            values = entry["logits"][entry["labels"] == n, j].numpy()
            ax.hist(values, bins=options.bins, color="tab:blue")
            if values.size:
                ax.axvline(float(values.mean()), color="tab:red", ls="--", lw=1)
            ax.set_title(f"n={n}, j={j}", fontsize=8)
            ax.tick_params(labelsize=6)
        acc = entry["global_acc"]
        row[0].set_ylabel(f"{point}\naux acc {entry['aux_acc']:.2f}"
                          + ("" if acc is None else f", test {acc:.2f}"), fontsize=7)
    fig.suptitle(f"{cfg.name}: logit j on class-n aux samples (mean dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "logits.png", dpi=110)
    plt.close(fig)
    write_json(out / "logit-means.json", [
        {"point": point, "aux_acc": e["aux_acc"], "global_acc": e["global_acc"],
         "mu": logit_means(e["logits"], e["labels"], int(e["logits"].shape[1]))} for point, e in points.items()])


def landscape_plot(out: Path, cfg: LabelBenchConfig, points: dict[str, dict[str, Any]],
                   options: LabelLandscape) -> None:
    """Soft-label Figs. 1, 2 and 7: ``label-landscape.png``, per grid point L_label(λ) (log scale; λ* of the true
    label dashed red, the grid's lowest loss dotted) above ŷ_c(λ) for every class c; ``label-landscape.json``,
    per grid point the loss kind, the grid's lowest loss and its λ, λ* and its fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(points), figsize=(4.2 * len(points), 5.6), squeeze=False)
    for col, (point, e) in enumerate(points.items()):
        lam = e["lambda"].numpy()
        top, bottom = axes[0, col], axes[1, col]
        loss = e["loss"].clamp_min(1e-300)
        top.semilogy(lam, loss.numpy(), lw=0.8)
        finite = loss[loss.isfinite()]
        if finite.numel():  # the pole at λ = 0 (eq. 4's ρ/λ) would flatten the rest of the curve
            top.set_ylim(float(finite.min()) / 10, float(finite.quantile(0.95)) * 10)
        bottom.plot(lam, e["yhat"].numpy(), lw=0.7)
        for ax in (top, bottom):
            ax.axvline(e["true_lambda"], color="tab:red", ls="--", lw=0.8)
            ax.axvline(e["grid_lambda"], color="k", ls=":", lw=0.8)
        top.set_title(f"{point} ({e['kind']}): λ* {e['true_lambda']:.4g}, grid min {e['grid_lambda']:.4g}",
                      fontsize=8)
        top.set_ylabel("L_label (eq. 5 × 1000)")
        bottom.set_ylabel("ŷ_c (eq. 4)")
        bottom.set_ylim(-0.5, 1.5)
        bottom.set_xlabel("λ")
    fig.suptitle(f"{cfg.name}: the λ landscape of the first capture", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "label-landscape.png", dpi=110)
    plt.close(fig)
    write_json(out / "label-landscape.json", [
        {"point": point, "kind": e["kind"], "true_lambda": e["true_lambda"], "true_fit": e["true_fit"],
         "grid_lambda": e["grid_lambda"], "grid_loss": e["grid_loss"]} for point, e in points.items()])


PLOTS: dict[str, Callable[[Path, LabelBenchConfig, dict[str, Any], Any], None]] = {
    "posteriors": posterior_plot, "logit_histograms": logit_histogram_plot, "label_landscape": landscape_plot}


def plot_diagnostics(out: Path, cfg: LabelBenchConfig, collected: dict[str, dict[str, Any]]) -> None:
    """The files of every diagnostic of ``cfg`` with collected data, into directory ``out``."""
    for name, options in cfg.diagnostics.items():
        if collected.get(name):
            PLOTS[name](out, cfg, collected[name], options)
