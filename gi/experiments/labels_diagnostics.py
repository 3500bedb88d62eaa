"""The aux diagnostics of ``gi labels`` (its ``diagnostics:`` key): a registry of figures drawn, per grid point,
from the attacker's aux set run through the first trial's global model.

``diagnostics: {NAME: OPTIONS, ...}`` names entries of :data:`DIAGNOSTICS`. Each has an options dataclass (read
when the config loads, before any work), a :class:`Diagnostic` here (whether it needs the aux set, and
``collect(cfg, point, trial, options)``: its data of one grid point, from the point's first trial, before the label
methods run) and a ``plot(out, cfg, collected, options)`` (its files in the output directory, from
``{point: data}``). The entries:

* ``posteriors`` (no options): ``posteriors.png`` / ``posteriors.csv``, the posterior paper's Fig. 2 and the
  premise of its eq. 3: for every class j the box of p_j over the aux samples of class j (positive) and over the
  other classes' (negative).
* ``logit_histograms`` (``pairs``, ``bins``): ``logits.png`` / ``logit-means.json``, RLU (Chen & Vikalo 2024)
  App. B.3, Figs. 4–9: histograms of logit j over the aux samples of true class n, and the class means μ.
* ``label_landscape`` (``kind``, ``lambdas``, ``points``): ``label-landscape.png`` / ``label-landscape.json``,
  the soft-label paper's Figs. 1, 2 and 7: L_label (eq. 5) and the pseudo-label ŷ (eq. 4) along λ for the first
  trial's capture (one sample), with the λ the true label gives and the grid's lowest loss marked; needs no aux.

This module is the data of each grid point (``collect``); the options are read by
:mod:`gi.experiments.config.diagnostics` and the files written by :mod:`gi.experiments.labels_diagnostics_output`.
Add one with its options class in :data:`gi.experiments.config.diagnostics.DIAGNOSTIC_OPTIONS`,
``register_diagnostic("name")(Diagnostic(...))`` here and its ``plot`` in the output module's :data:`PLOTS`.
Neither torch nor matplotlib is imported until a step runs (a config is checked without them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gi.core.errors import ConfigError
from gi.core.registry import registrar
from gi.experiments.config.diagnostics import DIAGNOSTIC_OPTIONS, LabelLandscape, LogitHistograms, PosteriorBoxes

if TYPE_CHECKING:
    from gi.experiments.config.labels import LabelBenchConfig


@dataclass(frozen=True)
class Diagnostic:
    """One entry of :data:`DIAGNOSTICS`: ``collect(cfg, point, trial, options)``, its data of one grid point from
    that point's first trial; ``files``, what its plot writes; ``needs_aux``: the trials must carry the attacker's
    aux set. Its options class is ``DIAGNOSTIC_OPTIONS[name]`` (:mod:`gi.experiments.config.diagnostics`)."""

    collect: Callable[[LabelBenchConfig, str, Any, Any], Any]
    files: tuple[str, ...]
    needs_aux: bool = True


DIAGNOSTICS: dict[str, Diagnostic] = {}
_register = registrar(DIAGNOSTICS, "diagnostic")


def register_diagnostic(name: str) -> Callable[[Diagnostic], Diagnostic]:
    """``register_diagnostic(name)(Diagnostic(...))``: a ConfigError unless ``name`` has its options class in
    :data:`gi.experiments.config.diagnostics.DIAGNOSTIC_OPTIONS`."""
    if name not in DIAGNOSTIC_OPTIONS:
        raise ConfigError(f"diagnostic {name!r} has no options class in DIAGNOSTIC_OPTIONS")
    return _register(name)


def collect_diagnostics(cfg: LabelBenchConfig, point: str, trial: Any, collected: dict[str, dict[str, Any]]) -> None:
    """Every diagnostic of ``cfg`` on grid point ``point``: its data from ``trial`` (the point's first) into
    ``collected[name][point]``; a ConfigError when it needs aux data and the point has none."""
    for name, options in cfg.diagnostics.items():
        entry = DIAGNOSTICS[name]
        if entry.needs_aux and trial.aux is None:
            raise ConfigError(f"diagnostics.{name} needs the attacker's aux data; grid point {point!r} has none "
                              "(set setup.aux.per_class >= 1)")
        collected.setdefault(name, {})[point] = entry.collect(cfg, point, trial, options)


# ----------------------------------------------------------------------------- posteriors (posterior paper Fig. 2)
def posterior_samples(cfg: LabelBenchConfig, point: str, trial: Any, options: PosteriorBoxes) -> list[tuple[Any, Any]]:
    """``[(positive, negative)]`` per class j: p_j of the aux samples of class j and of every other class, the aux
    set run through the trial's global model in the protocol's posterior (posterior paper §3.2, Fig. 2; their
    means are eq. 3's p̂⁺_j and p̂⁻_j, :func:`labels.aux_stats.class_posteriors`)."""
    from labels.aux_stats import aux_forward

    stats = aux_forward(trial.capture, trial.aux, cache=False)
    return [(stats.probs[stats.labels == j, j], stats.probs[stats.labels != j, j]) for j in range(stats.num_classes)]


register_diagnostic("posteriors")(Diagnostic(posterior_samples, ("posteriors.png", "posteriors.csv")))


# ----------------------------------------------------------------------------- logit histograms (RLU App. B.3)
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


register_diagnostic("logit_histograms")(Diagnostic(aux_logits, ("logits.png", "logit-means.json")))


# ----------------------------------------------------------------------------- λ landscape (soft-label Figs. 1, 2, 7)
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


register_diagnostic("label_landscape")(Diagnostic(landscape, ("label-landscape.png", "label-landscape.json"),
                                                  needs_aux=False))
