"""The config schema of ``gi bench``'s ``throughput`` kind (:class:`BenchConfig`, :class:`PackedConfig`); the
command and its registry of kinds are :mod:`gi.experiments.bench`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gi.attack.recon.config import MAX_ITERATIONS, MAX_RESTARTS, ReconConfig, compile_mode
from gi.core.config import require
from gi.core.errors import ConfigError
from gi.experiments.outdir import check_run_name

BENCH_SCHEMA = 1  # version of the throughput bench's JSON report
MAX_BENCH_BATCH = 4096  # images in one timed batch: the bench times a step, not a data set


@dataclass
class PackedConfig:
    """The packed-throughput entry: ``captures`` (0: off) one-image captures of ``model`` on ``dataset`` images
    0..captures-1, ``iterations`` per reconstruction, ``rounds`` alternations of packed and one-by-one;
    ``compile``: also time the packed problem compiled (``attack.compile``'s values; false: not timed)."""

    captures: int = 0
    model: str = "lenet"
    iterations: int = 1000
    rounds: int = 2
    compile: bool | str = False

    def __post_init__(self) -> None:
        require(self.captures >= 0, "packed.captures", self.captures, ">= 0 (0: off)")
        require(4 <= self.iterations <= MAX_ITERATIONS, "packed.iterations", self.iterations,
                f"in [4, {MAX_ITERATIONS}]")
        require(self.rounds >= 1, "packed.rounds", self.rounds, ">= 1")
        compile_mode(self.compile, "packed.compile")


@dataclass
class BenchConfig:
    """``iterations``: iterations of the fixed reconstruction per model (its final PSNR is reported);
    ``timing_iterations``, ``timing_repeats``: steps and interleaved repeats of the restart-timing runs;
    ``devices``: ``cpu``/``gpu`` (``auto``: cpu, plus gpu
    when one is available); ``threads``: torch CPU threads (1 on shared machines)."""

    kind: str = "throughput"
    name: str = "bench"
    models: list[str] = field(default_factory=lambda: ["lenet", "resnet18"])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    iterations: dict[str, int] = field(default_factory=lambda: {"lenet": 1000, "resnet18": 100})
    restarts: list[int] = field(default_factory=lambda: [8])
    restart_batch_sizes: list[int] = field(default_factory=lambda: [1])
    timing_iterations: int = 12
    timing_repeats: int = 3
    devices: list[str] = field(default_factory=lambda: ["auto"])
    threads: int = 1
    seed: int = 0
    dataset: str = "cifar10-samples"
    attack: ReconConfig = field(default_factory=lambda: ReconConfig(lr=0.01, regularizers={"tv": 2e-3},
                                                                    progress=False, log_every=1000))
    packed: PackedConfig = field(default_factory=PackedConfig)
    out: str | None = None
    overwrite: bool = False

    @classmethod
    def config_class(cls, data: dict[str, Any], overrides: list[str]) -> type:
        """The config class of a ``gi bench`` file (:func:`gi.core.config.load` asks it first): that of its ``kind``
        (a ``kind=`` override wins; default ``throughput``: this class) in :data:`BENCH_KINDS`."""
        from gi.experiments.bench import BENCH_KINDS  # the registry of kinds (it imports this module)

        kind = next((o.split("=", 1)[1] for o in overrides if o.startswith("kind=")), data.get("kind", "throughput"))
        if kind not in BENCH_KINDS:
            raise ConfigError(f"kind={kind!r} is not a bench kind; valid: {sorted(BENCH_KINDS)}")
        return BENCH_KINDS[kind].config()

    def __post_init__(self) -> None:
        from gi.core.names import known

        check_run_name(self.name)
        require(self.kind == "throughput", "kind", self.kind, "throughput")
        zoo = known("model")
        bad = [m for m in self.models + ([self.packed.model] if self.packed.captures else []) if m not in zoo]
        if bad:
            raise ConfigError(f"models has unknown {bad}; valid: {zoo}")
        counts = {"batch_sizes": (self.batch_sizes, MAX_BENCH_BATCH),
                  "restart_batch_sizes": (self.restart_batch_sizes, MAX_BENCH_BATCH),
                  "restarts": (self.restarts, MAX_RESTARTS),
                  "iterations": (list(self.iterations.values()), MAX_ITERATIONS),
                  "timing_iterations": ([self.timing_iterations], MAX_ITERATIONS),
                  "timing_repeats": ([self.timing_repeats], 1000), "threads": ([self.threads], 1024)}
        for key, (values, most) in counts.items():  # at load, before torch: bounds like every command's
            require(all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most for v in values), key,
                    getattr(self, key), f"ints in [1, {most}]")
        require(self.timing_iterations >= 4, "timing_iterations", self.timing_iterations, ">= 4")
        for d in self.devices:
            if d not in ("auto", "cpu", "gpu"):
                raise ConfigError(f"devices has {d!r}; valid: auto, cpu, gpu")
