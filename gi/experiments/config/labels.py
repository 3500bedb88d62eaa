"""The config schema of ``gi labels`` (:class:`LabelBenchConfig`) and its grid points (:func:`grid_points`); the
command is :mod:`gi.experiments.labels`."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from gi.attack.stages import LABELS_DOC, RENAMED_LABEL_KEYS, LabelTable
from gi.core.config import from_dict, refuse_renamed, set_dotted
from gi.core.errors import ConfigError
from gi.experiments.config.diagnostics import diagnostic_options, refuse_replaced_keys
from gi.experiments.outdir import check_run_name
from gi.world.setup import MAX_CAPTURES, check_seed_reaches, deprecated, upgrade

MAX_TIMING_REPEATS = 100  # timing_repeats: every repeat re-runs every method on every capture


@dataclass
class LabelBenchConfig:
    """A label-recovery benchmark. ``grid`` maps dotted setup keys to lists of values; ``paper`` maps a grid
    point label (or ``"*"``) to ``{method: value}`` of the paper's reported ``metrics[0]``. ``diagnostics``:
    ``{name: options}`` of the aux figures to add per grid point (:mod:`gi.experiments.labels_diagnostics`: the
    posterior paper's Fig. 2 box plots, RLU App. B.3's logit histograms; checked at load). ``timing_repeats``: run
    every method on the same captures that many times and report the median wall and CPU seconds per capture
    (``median_ms`` / ``median_cpu_ms``; the labels are the first run's), for timings on a shared machine.
    ``seed``: the run's seed: it seeds the trial generators and, for a scenario whose setup has a ``seed``
    (``fedavg-client``, ``fedsgd-batch``, ``trained-resnet18``), that ``setup.seed`` unless the setup gives it (then
    a ``seed`` other than 0 that differs from it is a ConfigError: it would change nothing)."""

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
    diagnostics: dict[str, Any] = field(default_factory=dict)
    timing_repeats: int = 1
    pool: list[str] = field(default_factory=list)
    progress: bool = True

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> LabelBenchConfig:
        """The loading step of :func:`gi.core.config.load`: the old top-level label and diagnostic keys refused,
        then typed."""
        refuse_renamed(data, RENAMED_LABEL_KEYS, LABELS_DOC)
        refuse_replaced_keys(data)
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
        self.diagnostics = diagnostic_options(self.diagnostics)
        valid = [*LABEL_METRICS, *POOLED_METRICS]
        bad = [m for m in self.metrics if m not in valid]
        if bad or not self.metrics:
            raise ConfigError(f"metrics={self.metrics}: unknown {bad}; valid: {valid}")
        if seeded(scenario) and "seed" not in self.grid:
            check_seed_reaches(self.seed, self.setup.get("seed"), "setup.seed",
                               f"the {self.scenario} scenario's models, partitions and batches")
        for point, setup in grid_points(self):  # every grid point's setup is typed and checked now, not mid-run
            try:
                scenario.resolve(setup)
            except ConfigError as exc:
                raise ConfigError(f"grid point {point!r}: {exc}" if self.grid else str(exc)) from None


def seeded(scenario: Any) -> bool:
    """Whether a scenario's setup has a ``seed`` of its own (``setup.seed``), which the run's ``seed`` sets."""
    return scenario.setup is not None and "seed" in {f.name for f in dataclasses.fields(scenario.setup)}


def grid_points(cfg: LabelBenchConfig, pooled: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``[(label, setup)]``, one per combination of grid values (the label reads ``key=value, …`` of the grid keys
    as written; old spellings of setup keys are set under their new ones). ``pooled``: labels leave out the keys
    of ``cfg.pool`` (the summary row a point belongs to; ``"all"`` when every key is pooled)."""
    from gi.world.scenarios import get_scenario

    scenario = get_scenario(cfg.scenario)
    base = copy.deepcopy(cfg.setup)
    if scenario.setup is not None:
        upgrade(base, scenario.setup.LEGACY, "setup")
        if seeded(scenario):
            base.setdefault("seed", cfg.seed)  # the run's seed= seeds the scenario unless setup.seed says otherwise
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
