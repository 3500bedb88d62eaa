"""The aux diagnostics of ``gi labels`` (its ``diagnostics:`` key): a registry of figures drawn, per grid point,
from the attacker's aux set run through the first trial's global model.

``diagnostics: {NAME: OPTIONS, ...}`` names entries of :data:`DIAGNOSTICS`. Each entry (:class:`Diagnostic`)
declares the dataclass its options are read into (checked when the config loads, before any work), whether it
needs the aux set, ``collect(cfg, point, trial, options)`` (its data of one grid point, from the point's first
trial, before the label methods run) and ``plot(out, cfg, collected, options)`` (its files in the output
directory, from ``{point: data}``). The entries:

* ``posteriors`` (no options): ``posteriors.png`` / ``posteriors.csv``, the posterior paper's Fig. 2 and the
  premise of its eq. 3: for every class j the box of p_j over the aux samples of class j (positive) and over the
  other classes' (negative).
* ``logit_histograms`` (``pairs``, ``bins``): ``logits.png`` / ``logit-means.json``, RLU (Chen & Vikalo 2024)
  App. B.3, Figs. 4–9: histograms of logit j over the aux samples of true class n, and the class means μ.
* ``label_landscape`` (``kind``, ``lambdas``, ``points``): ``label-landscape.png`` / ``label-landscape.json``,
  the soft-label paper's Figs. 1, 2 and 7: L_label (eq. 5) and the pseudo-label ŷ (eq. 4) along λ for the first
  trial's capture (one sample), with the λ the true label gives and the grid's lowest loss marked; needs no aux.

Add one with ``register_diagnostic("name")(Diagnostic(...))``. Neither torch nor matplotlib is imported until a
step runs (a config is checked without them).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import write_csv, write_json
from gi.core.config import from_dict, show
from gi.core.errors import ConfigError
from gi.core.registry import registrar

if TYPE_CHECKING:
    from gi.experiments.config.labels import LabelBenchConfig

DOC = 'docs/usage.md, "gi labels"'


@dataclass(frozen=True)
class Diagnostic:
    """One entry of :data:`DIAGNOSTICS`: ``options``, the dataclass of its options (no fields: it takes none);
    ``collect(cfg, point, trial, options)``, its data of one grid point from that point's first trial;
    ``plot(out, cfg, collected, options)``, its ``files`` in directory ``out`` from ``{point: data}``;
    ``needs_aux``: the trials must carry the attacker's aux set."""

    options: type
    collect: Callable[[LabelBenchConfig, str, Any, Any], Any]
    plot: Callable[[Path, LabelBenchConfig, dict[str, Any], Any], None]
    files: tuple[str, ...]
    needs_aux: bool = True


DIAGNOSTICS: dict[str, Diagnostic] = {}
register_diagnostic = registrar(DIAGNOSTICS, "diagnostic")  # register_diagnostic(name)(Diagnostic(...))

# the keys the diagnostics replaced → the entry that replaced each (refused with the spelling to write instead)
REPLACED_KEYS = {"posterior_plot": "posteriors", "logit_histograms": "logit_histograms"}


def refuse_replaced_keys(data: Any) -> None:
    """A one-line ConfigError for a top-level key of ``data`` that :data:`REPLACED_KEYS` lists, spelling the
    ``diagnostics:`` entry to write instead (its options carried over); a false or null value is refused too."""
    if not isinstance(data, dict):
        return
    for old, name in REPLACED_KEYS.items():
        if old in data:
            value = data[old]
            options = value if isinstance(value, dict) else {}
            new = f"`diagnostics: {{{name}: {show(options, None)}}}`"
            if value is False or value is None:
                new = f"nothing (no diagnostics is the default), or {new} for the figure"
            raise ConfigError(f"{old}={show(value, 40)}: replaced by the diagnostics key; write {new} instead "
                              f"({DOC})")


def diagnostic_options(data: Any) -> dict[str, Any]:
    """``diagnostics`` of a config with every entry's options read into its dataclass (an instance of it is kept;
    null is no options): a ConfigError for an unknown name (listing the valid ones) or bad options."""
    if not isinstance(data, dict):
        raise ConfigError(f"diagnostics={show(data)}: expected a mapping {{name: options}}; valid names: "
                          f"{sorted(DIAGNOSTICS)}")
    out: dict[str, Any] = {}
    for name, given in data.items():
        if name not in DIAGNOSTICS:
            raise ConfigError(f"diagnostics.{name}: unknown diagnostic; valid: {sorted(DIAGNOSTICS)}")
        kind = DIAGNOSTICS[name].options
        if isinstance(given, kind):
            out[name] = given
            continue
        if not dataclasses.fields(kind) and given not in (None, {}):
            raise ConfigError(f"diagnostics.{name}={show(given)}: takes no options; write `{name}: {{}}`")
        out[name] = from_dict(kind, given, f"diagnostics.{name}")
    return out


def collect_diagnostics(cfg: LabelBenchConfig, point: str, trial: Any, collected: dict[str, dict[str, Any]]) -> None:
    """Every diagnostic of ``cfg`` on grid point ``point``: its data from ``trial`` (the point's first) into
    ``collected[name][point]``; a ConfigError when it needs aux data and the point has none."""
    for name, options in cfg.diagnostics.items():
        entry = DIAGNOSTICS[name]
        if entry.needs_aux and trial.aux is None:
            raise ConfigError(f"diagnostics.{name} needs the attacker's aux data; grid point {point!r} has none "
                              "(set setup.aux.per_class >= 1)")
        collected.setdefault(name, {})[point] = entry.collect(cfg, point, trial, options)


def plot_diagnostics(out: Path, cfg: LabelBenchConfig, collected: dict[str, dict[str, Any]]) -> None:
    """The files of every diagnostic of ``cfg`` with collected data, into directory ``out``."""
    for name, options in cfg.diagnostics.items():
        if collected.get(name):
            DIAGNOSTICS[name].plot(out, cfg, collected[name], options)


# ----------------------------------------------------------------------------- posteriors (posterior paper Fig. 2)
@dataclass
class PosteriorBoxes:
    """``diagnostics.posteriors``: no options (posterior paper §3.2, Fig. 2)."""


def posterior_samples(cfg: LabelBenchConfig, point: str, trial: Any, options: PosteriorBoxes) -> list[tuple[Any, Any]]:
    """``[(positive, negative)]`` per class j: p_j of the aux samples of class j and of every other class, the aux
    set run through the trial's global model in the protocol's posterior (posterior paper §3.2, Fig. 2; their
    means are eq. 3's p̂⁺_j and p̂⁻_j, :func:`labels.aux_stats.class_posteriors`)."""
    from labels.aux_stats import aux_forward

    stats = aux_forward(trial.capture, trial.aux, cache=False)
    return [(stats.probs[stats.labels == j, j], stats.probs[stats.labels != j, j]) for j in range(stats.num_classes)]


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


register_diagnostic("posteriors")(Diagnostic(PosteriorBoxes, posterior_samples, posterior_plot,
                                             ("posteriors.png", "posteriors.csv")))


# ----------------------------------------------------------------------------- logit histograms (RLU App. B.3)
# RLU App. B.3, Figs. 4–9: the (n, j) panels the paper shows, (true class n, logit component j)
PAPER_LOGIT_PAIRS = [[1, 1], [5, 5], [9, 9], [1, 5], [1, 9], [5, 9]]
MAX_LOGIT_PANELS = 100  # logit_histograms.pairs: a config must not ask for unboundedly many panels or bins
MAX_LOGIT_BINS = 10_000


@dataclass
class LogitHistograms:
    """``diagnostics.logit_histograms``: the histograms of RLU's Assumption 3.1 (Chen & Vikalo 2024, App. B.3,
    Figs. 4–9). Per grid point, the first trial's global model θᵗ runs over that trial's aux set; one panel per
    ``pairs`` entry ``[n, j]`` shows logit component j over the aux samples of true class n in ``bins`` bins, its
    mean μ_{n,j} marked (the paper: positive and growing for n = j, negative for n ≠ j as θᵗ trains)."""

    pairs: list[list[int]] = field(default_factory=lambda: copy.deepcopy(PAPER_LOGIT_PAIRS))
    bins: int = 100

    def __post_init__(self) -> None:
        bad = [p for p in self.pairs if len(p) != 2 or min(p) < 0]
        if bad or not self.pairs:
            raise ConfigError(f"diagnostics.logit_histograms.pairs={self.pairs}: expected a non-empty list of [n, j] "
                              f"class index pairs >= 0; bad: {bad}")
        if len(self.pairs) > MAX_LOGIT_PANELS:
            raise ConfigError(f"diagnostics.logit_histograms.pairs: {len(self.pairs)} pairs, at most "
                              f"{MAX_LOGIT_PANELS} (one panel each per grid point)")
        if not 1 <= self.bins <= MAX_LOGIT_BINS:
            raise ConfigError(f"diagnostics.logit_histograms.bins={self.bins}: expected >= 1 and <= {MAX_LOGIT_BINS}")

    def check_classes(self, num_classes: int) -> None:
        """A :class:`ConfigError` unless every pair names classes of a ``num_classes``-class model."""
        bad = [p for p in self.pairs if max(p) >= num_classes]
        if bad:
            raise ConfigError(f"diagnostics.logit_histograms.pairs: {bad} name classes the model lacks (it has "
                              f"{num_classes})")


def aux_logits(cfg: LabelBenchConfig, point: str, trial: Any, options: LogitHistograms) -> dict[str, Any]:
    """The data of one grid point (RLU App. B.3, Figs. 4–9): the aux set of ``trial`` through its capture's global
    model θᵗ: ``logits`` (N, C), ``labels`` (N,), the model's accuracy on them (and the scenario's ``global_acc``
    where it measured one). Not cached: the label methods' own aux forward pass is timed as before."""
    from labels.aux_stats import aux_forward

    options.check_classes(trial.capture.num_classes)
    stats = aux_forward(trial.capture, trial.aux, cache=False)
    acc = float((stats.logits.argmax(dim=1) == stats.labels).double().mean())
    return {"logits": stats.logits, "labels": stats.labels, "aux_acc": acc,
            "global_acc": trial.capture.meta.get("global_acc")}


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


register_diagnostic("logit_histograms")(Diagnostic(LogitHistograms, aux_logits, logit_histogram_plot,
                                                   ("logits.png", "logit-means.json")))


# ----------------------------------------------------------------------------- λ landscape (soft-label Figs. 1, 2, 7)
MAX_LANDSCAPE_POINTS = 100_000  # label_landscape.points: a config must not ask for unboundedly many evaluations
LANDSCAPE_KINDS = ("onehot", "smoothing", "mixup")  # labels.soft_label.KINDS, named here without importing torch


@dataclass
class LabelLandscape:
    """``diagnostics.label_landscape``: the soft-label paper's Figs. 1 and 7 (L_label of eq. 5 along λ: a
    gradient-based search may stop in the first local minimum, not the global one) and Fig. 2 (the pseudo-label
    ŷ(λ) of eq. 4: many λ give valid labels, so the loss must pick one). ``kind``: the loss form (``onehot``,
    ``smoothing``, ``mixup``; ``auto``: the one the capture's label augmentation implies); ``lambdas``: the range
    [lo, hi] of λ; ``points``: evaluations, evenly spaced (at most :data:`MAX_LANDSCAPE_POINTS`)."""

    kind: str = "auto"
    lambdas: list[float] = field(default_factory=lambda: [-10.0, 10.0])
    points: int = 4001

    def __post_init__(self) -> None:
        if self.kind != "auto" and self.kind not in LANDSCAPE_KINDS:
            raise ConfigError(f"diagnostics.label_landscape.kind={self.kind!r}: expected auto or one of "
                              f"{list(LANDSCAPE_KINDS)}")
        if len(self.lambdas) != 2 or not self.lambdas[0] < self.lambdas[1]:
            raise ConfigError(f"diagnostics.label_landscape.lambdas={self.lambdas}: expected [lo, hi] with lo < hi")
        if not 2 <= self.points <= MAX_LANDSCAPE_POINTS:
            raise ConfigError(f"diagnostics.label_landscape.points={self.points}: expected >= 2 and <= "
                              f"{MAX_LANDSCAPE_POINTS}")


def landscape(cfg: LabelBenchConfig, point: str, trial: Any, options: LabelLandscape) -> dict[str, Any]:
    """The data of one grid point: λ, L_label(λ) and ŷ(λ) for the trial's capture
    (:func:`labels.soft_label.label_landscape`), and λ* the true label gives (:func:`labels.soft_label.fit_lambda`,
    the truth only marks the plot). A ConfigError where the capture holds more than one sample."""
    import torch

    from labels.soft_label import PROTOCOL_KINDS, fit_lambda, label_landscape

    capture = trial.capture
    if capture.num_samples != 1:
        raise ConfigError(f"diagnostics.label_landscape reads one sample per capture (soft-label eq. 4); grid point "
                          f"{point!r} has {capture.num_samples}")
    kind = options.kind if options.kind != "auto" else PROTOCOL_KINDS.get(capture.protocol.label_aug, "smoothing")
    lam = torch.linspace(options.lambdas[0], options.lambdas[1], options.points, dtype=torch.float64)
    loss, yhat = label_landscape(capture, lam, kind)
    true_lambda, true_loss = fit_lambda(capture, trial.truth.targets.reshape(-1))
    best = int(torch.nan_to_num(loss, nan=float("inf")).argmin())
    return {"kind": kind, "lambda": lam, "loss": loss, "yhat": yhat, "true_lambda": true_lambda,
            "true_fit": true_loss, "grid_lambda": float(lam[best]), "grid_loss": float(loss[best])}


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


register_diagnostic("label_landscape")(Diagnostic(LabelLandscape, landscape, landscape_plot,
                                                  ("label-landscape.png", "label-landscape.json"), needs_aux=False))
