"""The config schema of ``gi labels`` (:class:`LabelBenchConfig`) and its grid points (:func:`grid_points`); the
command is :mod:`gi.experiments.labels`."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from gi.attack.stages import LABELS_DOC, RENAMED_LABEL_KEYS, LabelTable
from gi.core.config import from_dict, refuse_renamed, set_dotted
from gi.core.errors import ConfigError
from gi.experiments.outdir import check_run_name
from gi.world.setup import MAX_CAPTURES, deprecated, upgrade

# RLU App. B.3, Figs. 4–9: the (n, j) panels the paper shows, (true class n, logit component j)
PAPER_LOGIT_PAIRS = [[1, 1], [5, 5], [9, 9], [1, 5], [1, 9], [5, 9]]
MAX_LOGIT_PANELS = 100  # logit_histograms.pairs: a config must not ask for unboundedly many panels or bins
MAX_LOGIT_BINS = 10_000


@dataclass
class LogitHistograms:
    """``logit_histograms`` of a ``gi labels`` config: the histograms of RLU's Assumption 3.1 (Chen & Vikalo 2024,
    App. B.3, Figs. 4–9). Per grid point, the first trial's global model θᵗ runs over that trial's aux set; one
    panel per ``pairs`` entry ``[n, j]`` shows logit component j over the aux samples of true class n in ``bins``
    bins, its mean μ_{n,j} marked (the paper: positive and growing for n = j, negative for n ≠ j as θᵗ trains)."""

    pairs: list[list[int]] = field(default_factory=lambda: copy.deepcopy(PAPER_LOGIT_PAIRS))
    bins: int = 100

    def __post_init__(self) -> None:
        bad = [p for p in self.pairs if len(p) != 2 or min(p) < 0]
        if bad or not self.pairs:
            raise ConfigError(f"logit_histograms.pairs={self.pairs}: expected a non-empty list of [n, j] class "
                              f"index pairs >= 0; bad: {bad}")
        if len(self.pairs) > MAX_LOGIT_PANELS:
            raise ConfigError(f"logit_histograms.pairs: {len(self.pairs)} pairs, at most {MAX_LOGIT_PANELS} (one "
                              "panel each per grid point)")
        if not 1 <= self.bins <= MAX_LOGIT_BINS:
            raise ConfigError(f"logit_histograms.bins={self.bins}: expected >= 1 and <= {MAX_LOGIT_BINS}")

    def check_classes(self, num_classes: int) -> None:
        """A :class:`ConfigError` unless every pair names classes of a ``num_classes``-class model."""
        bad = [p for p in self.pairs if max(p) >= num_classes]
        if bad:
            raise ConfigError(f"logit_histograms.pairs: {bad} name classes the model lacks (it has {num_classes})")


MAX_TIMING_REPEATS = 100  # timing_repeats: every repeat re-runs every method on every capture


@dataclass
class LabelBenchConfig:
    """A label-recovery benchmark. ``grid`` maps dotted setup keys to lists of values; ``paper`` maps a grid
    point label (or ``"*"``) to ``{method: value}`` of the paper's reported ``metrics[0]``. ``posterior_plot``:
    also write the per-class posterior box plots of the aux set (posterior paper Fig. 2,
    :mod:`gi.experiments.labels`). ``timing_repeats``: run every method on the same captures that many times and
    report the median wall and CPU seconds per capture (``median_ms`` / ``median_cpu_ms``; the labels are the first
    run's), for timings on a shared machine."""

    name: str = "labels"
    scenario: str = ""
    trials: int = 20
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    setup: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    labels: LabelTable = field(default_factory=LabelTable)
    metrics: list[str] = field(default_factory=lambda: ["ins_acc", "cls_acc"])
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    proportion_class: int | None = None
    posterior_plot: bool = False
    logit_histograms: LogitHistograms | None = None
    timing_repeats: int = 1
    pool: list[str] = field(default_factory=list)
    progress: bool = True

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> LabelBenchConfig:
        """The loading step of :func:`gi.core.config.load`: the old top-level label keys refused, then typed."""
        refuse_renamed(data, RENAMED_LABEL_KEYS, LABELS_DOC)
        return from_dict(cls, data)

    def __post_init__(self) -> None:
        from gi.core.names import LABEL_METRICS, POOLED_METRICS
        from gi.world.scenarios import get_scenario

        check_run_name(self.name)
        scenario = get_scenario(self.scenario)
        stray = [k for k in self.pool if k not in self.grid]
        if stray:
            raise ConfigError(f"pool={self.pool}: {stray} not grid keys; pool names keys of `grid` ({list(self.grid)})")
        if self.proportion_class is not None and self.proportion_class < 0:
            raise ConfigError(f"proportion_class={self.proportion_class} must be a class index >= 0 or null")
        if not 1 <= self.trials <= MAX_CAPTURES:
            raise ConfigError(f"trials={self.trials}: must be >= 1 and at most {MAX_CAPTURES} (every trial of a grid "
                              "point is kept in memory for the vectorised label call); run more as separate seeds")
        if not 1 <= self.timing_repeats <= MAX_TIMING_REPEATS:
            raise ConfigError(f"timing_repeats={self.timing_repeats}: must be >= 1 and at most {MAX_TIMING_REPEATS}")
        valid = [*LABEL_METRICS, *POOLED_METRICS]
        bad = [m for m in self.metrics if m not in valid]
        if bad or not self.metrics:
            raise ConfigError(f"metrics={self.metrics}: unknown {bad}; valid: {valid}")
        for point, setup in grid_points(self):  # every grid point's setup is typed and checked now, not mid-run
            try:
                scenario.resolve(setup)
            except ConfigError as exc:
                raise ConfigError(f"grid point {point!r}: {exc}" if self.grid else str(exc)) from None


def grid_points(cfg: LabelBenchConfig, pooled: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``[(label, setup)]``, one per combination of grid values (the label reads ``key=value, …`` of the grid keys
    as written; old spellings of setup keys are set under their new ones). ``pooled``: labels leave out the keys
    of ``cfg.pool`` (the summary row a point belongs to; ``"all"`` when every key is pooled)."""
    from gi.world.scenarios import get_scenario

    scenario = get_scenario(cfg.scenario)
    base = copy.deepcopy(cfg.setup)
    if scenario.setup is not None:
        upgrade(base, scenario.setup.LEGACY, "setup")
    if not cfg.grid:
        return [("all", base)]
    keys = list(cfg.grid)
    points = []
    for values in itertools.product(*(cfg.grid[k] for k in keys)):
        setup = copy.deepcopy(base)
        for k, v in zip(keys, values):
            if scenario.key(k) != k:
                deprecated("grid", k, scenario.key(k))
            set_dotted(setup, scenario.key(k).split("."), copy.deepcopy(v), scenario.setup, f"grid key {k!r}")
        points.append((point_label({k: v for k, v in zip(keys, values) if not (pooled and k in cfg.pool)}), setup))
    return points


def point_label(values: dict[str, Any]) -> str:
    """The row label of a grid point: ``key=value, …`` (the last part of each dotted key), ``"all"`` for none."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in values.items()) or "all"
