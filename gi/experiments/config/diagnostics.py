"""The ``diagnostics:`` key of ``gi labels`` (docs/usage.md, "gi labels"): each diagnostic's options, read into
its dataclass when the config loads, before any work. The figures themselves: :mod:`gi.experiments.labels_diagnostics`
(the data of each grid point) and :mod:`gi.experiments.labels_diagnostics_output` (the files). A new diagnostic adds
its options class to :data:`DIAGNOSTIC_OPTIONS` here, its ``collect`` there and its ``plot`` in the output module.
Neither torch nor matplotlib is imported here (a config is checked without them).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gi.core.config import from_dict, show
from gi.core.errors import ConfigError

DOC = 'docs/usage.md, "gi labels"'


@dataclass
class PosteriorBoxes:
    """``diagnostics.posteriors``: no options (posterior paper §3.2, Fig. 2)."""


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


# every diagnostic's name → the dataclass its options are read into (no fields: it takes none)
DIAGNOSTIC_OPTIONS: dict[str, type] = {"posteriors": PosteriorBoxes, "logit_histograms": LogitHistograms,
                                       "label_landscape": LabelLandscape}

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
                          f"{sorted(DIAGNOSTIC_OPTIONS)}")
    out: dict[str, Any] = {}
    for name, given in data.items():
        if name not in DIAGNOSTIC_OPTIONS:
            raise ConfigError(f"diagnostics.{name}: unknown diagnostic; valid: {sorted(DIAGNOSTIC_OPTIONS)}")
        kind = DIAGNOSTIC_OPTIONS[name]
        if isinstance(given, kind):
            out[name] = given
            continue
        if not dataclasses.fields(kind) and given not in (None, {}):
            raise ConfigError(f"diagnostics.{name}={show(given)}: takes no options; write `{name}: {{}}`")
        out[name] = from_dict(kind, given, f"diagnostics.{name}")
    return out
