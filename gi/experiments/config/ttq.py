"""The config schema of ``gi bench``'s ``time-to-quality`` kind (:class:`TTQConfig`, :class:`BreachingOptions`);
the measurement is :mod:`gi.experiments.ttq`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.core.config import from_dict, load, require
from gi.core.errors import ConfigError
from gi.experiments.outdir import check_run_name


@dataclass
class BreachingOptions:
    """breaching's ``invertinggradients`` attack config with these changes: ``tv`` (total-variation scale; 5e-4 is
    its CIFAR notebook's value, 0.2 its config default), ``max_iterations`` (its step-lr schedule decays at 3/8,
    5/8, 7/8 of it; 24000 is its default), ``seed`` (its randn start)."""

    tv: float = 5.0e-4
    max_iterations: int = 24000
    seed: int = 0
    schedules: list[int] | None = None  # several max_iterations, one curve each (null: max_iterations alone)

    def __post_init__(self) -> None:
        require(self.tv >= 0, "breaching.tv", self.tv, ">= 0")
        require(self.max_iterations >= 1, "breaching.max_iterations", self.max_iterations, ">= 1")
        require(self.schedules is None or (bool(self.schedules) and all(n >= 1 for n in self.schedules)
                                           and len(set(self.schedules)) == len(self.schedules)),
                "breaching.schedules", self.schedules, "distinct max_iterations >= 1 (null: max_iterations)")

    def iteration_counts(self) -> list[int]:
        """The max_iterations breaching runs with: ``schedules``, else ``max_iterations``."""
        return list(self.schedules) if self.schedules else [self.max_iterations]


@dataclass
class TTQConfig:
    """``kind: time-to-quality``. ``job``: the ``gi run`` config whose victim (data, model, protocol, aux) and attack
    (labels, attack) are measured, with ``job_overrides`` (``key=value``); ``select``: which of the job's captures to
    attack (indices; null: all); ``contenders``: names of :data:`gi.experiments.ttq.CONTENDERS`, run in this order on
    even captures and reversed on odd ones; ``budget``: seconds of ``clock`` per contender and capture; ``fill_budget``:
    a contender whose attack ends before ``budget`` is run again from a new random start, its own way, until the budget
    is spent, and keeps its best run by its own objective (false: it stops when its own iterations end, and each
    capture's PSNRs are compared at the time it finished; docs/usage.md, "Against breaching", the fairness rule);
    ``every``: iterations between scored checkpoints; ``levels``: PSNR levels [dB] whose times are reported;
    ``equal_time``: seconds at which both PSNRs are compared (null: ``budget``); ``device``: where every contender
    attacks (``cpu``, or ``gpu``/``cuda``/``cuda:N``: both contenders on that GPU, which needs ``clock: wall``, since a
    process's CPU seconds do not measure GPU work)."""

    kind: str = "time-to-quality"
    KEY_HINTS: ClassVar[dict[str, str]] = {"seed": "the job's seed is job_overrides' seed=N, breaching's start "
                                                   "breaching.seed"}
    name: str = "ttq"
    job: str = "configs/default.yaml"
    job_overrides: list[str] = field(default_factory=list)
    select: list[int] | None = None
    contenders: list[str] = field(default_factory=lambda: ["gi", "breaching"])
    budget: float = 120.0
    fill_budget: bool = True
    every: int = 50
    levels: list[float] = field(default_factory=lambda: [25.0, 30.0])
    equal_time: float | None = None
    clock: str = "cpu"
    threads: int = 1
    device: str = "cpu"
    breaching: BreachingOptions = field(default_factory=BreachingOptions)
    out: str | None = None
    overwrite: bool = False

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> TTQConfig:
        """The loading step of :func:`gi.core.config.load` (``gi bench``): the config, and its ``job`` loaded with
        ``job_overrides`` now (no torch), so that a bad job key or value is refused before any work."""
        from gi.experiments.config.run import RunConfig

        cfg = from_dict(cls, data)
        try:
            load(RunConfig, cfg.job, cfg.job_overrides)
        except ConfigError as exc:
            raise ConfigError(f"job={cfg.job!r} with job_overrides={cfg.job_overrides}: {exc}") from None
        return cfg

    def check_device(self) -> None:
        """That this machine has ``device`` (:func:`gi.core.devices.resolve_device`, no torch import where /dev has no
        GPU); run before the benchmark's work, not at load, so that a GPU run's output can be read anywhere."""
        if self.device == "cpu":
            return
        from gi.core.devices import resolve_device

        resolve_device(self.device, "device", auto_ok=False)

    def __post_init__(self) -> None:
        from gi.core.names import known

        clocks, contenders = known("ttq clock"), known("ttq contender")

        check_run_name(self.name)
        require(self.kind == "time-to-quality", "kind", self.kind, "time-to-quality")
        require(self.select is None or (bool(self.select) and all(i >= 0 for i in self.select)), "select",
                self.select, "a non-empty list of capture indices >= 0 (null: all)")
        require(self.budget > 0, "budget", self.budget, "> 0 seconds")
        require(self.every >= 1, "every", self.every, ">= 1")
        require(self.threads >= 1, "threads", self.threads, ">= 1")
        require(self.clock in clocks, "clock", self.clock, f"one of {clocks}")
        require(self.device == "cpu" or self.clock == "wall", "clock", self.clock,
                f"wall when device={self.device} (CPU seconds do not count GPU work)")
        named = self.device in ("cpu", "gpu", "cuda") or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        require(named,
                "device", self.device, "cpu, gpu, cuda or cuda:N (auto is not allowed: name the device)")
        require(bool(self.levels) and all(v > 0 for v in self.levels), "levels", self.levels, "PSNRs > 0 dB")
        require(self.equal_time is None or self.equal_time > 0, "equal_time", self.equal_time, "> 0 seconds")
        bad = [c for c in self.contenders if c not in contenders]
        if bad or not self.contenders or len(set(self.contenders)) != len(self.contenders):
            raise ConfigError(f"contenders={self.contenders!r}: each once, from {contenders}")
