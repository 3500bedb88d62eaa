"""The config schemas of ``gi bench``: the ``throughput`` kind (:class:`BenchConfig`, :class:`PackedConfig`), the
``suite`` kind (:class:`SuiteConfig`, :class:`SuiteMember`: several bench configs run one after another as one
command; the runner is :mod:`gi.experiments.suite`) and the table of every kind's schema (:data:`BENCH_CONFIGS`,
the ``time-to-quality`` kind's being :mod:`gi.experiments.config.ttq`); the command and its runners of the same
kinds are :mod:`gi.experiments.bench` (:data:`gi.experiments.bench_kinds.BENCH_KINDS`).

A suite member's ``config`` path is read the way a time-to-quality config's ``job:`` is: handed unchanged to
:func:`gi.core.config.load`, so a relative path is relative to the current directory (the repository root, where
``gi`` is run and where every shipped config's paths start)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.attack.recon.config import MAX_ITERATIONS, MAX_RESTARTS, ReconConfig, compile_mode
from gi.core.config import from_dict, load, load_yaml, parse_override, require
from gi.core.errors import ConfigError
from gi.experiments.config.ttq import TTQConfig
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
        (a ``kind=`` override wins; default ``throughput``: this class) in :data:`BENCH_CONFIGS`."""
        kind = next((o.split("=", 1)[1] for o in overrides if o.startswith("kind=")), data.get("kind", "throughput"))
        if kind not in BENCH_CONFIGS:
            raise ConfigError(f"kind={kind!r} is not a bench kind; valid: {sorted(BENCH_CONFIGS)}")
        return BENCH_CONFIGS[kind]

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


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # a member's label names its folder in the suite's output
SET_BY_SUITE = ("out", "overwrite")  # member keys the suite sets itself (its output goes to <suite out>/<label>/)


@dataclass
class SuiteMember:
    """One member of a suite: a ``gi bench`` config file (``config``, relative to the current directory) and its
    ``overrides`` (``key=value``, as on the command line)."""

    config: str = ""
    overrides: list[str] = field(default_factory=list)


@dataclass
class SuiteConfig:
    """``kind: suite``. ``members``: {label: {config: PATH, overrides: [key=value, ...]}}, run in this order, each
    through its own kind's runner, its output in ``<out>/<label>/``; ``only``: run just these labels (null: all);
    ``out``: the suite's output directory (default ``runs/bench/<name>-<stamp>``)."""

    kind: str = "suite"
    KEY_HINTS: ClassVar[dict[str, str]] = {"seed": "each member's seed is in its overrides "
                                                   "(members.LABEL.overrides)"}
    name: str = "suite"
    members: dict[str, SuiteMember] = field(default_factory=dict)
    only: list[str] | None = None
    out: str | None = None
    overwrite: bool = False

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> SuiteConfig:
        """The loading step of :func:`gi.core.config.load` (``gi bench``): the suite, then every member loaded with
        its overrides now (no torch, :meth:`member_configs`), so that a bad member is refused before any work."""
        if isinstance(data, dict) and isinstance(data.get("members"), dict):
            data = {**data, "members": {label: from_dict(SuiteMember, member, f"members.{label}")
                                        for label, member in data["members"].items()}}
        cfg = from_dict(cls, data)
        cfg.member_configs()
        return cfg

    def __post_init__(self) -> None:
        check_run_name(self.name)
        require(self.kind == "suite", "kind", self.kind, "suite")
        require(bool(self.members), "members", self.members,
                "at least one member {label: {config: PATH, overrides: [key=value, ...]}}")
        bad = [label for label in self.members if not LABEL.match(label)]
        if bad:
            raise ConfigError(f"members has label(s) {bad}: a label names the member's output folder; use letters, "
                              "digits, '-' and '_' (starting with a letter or digit), e.g. s1")
        require(self.only is None or bool(self.only), "only", self.only,
                "a non-empty list of member labels (null: all)")
        unknown = [label for label in self.only or [] if label not in self.members]
        if unknown:
            raise ConfigError(f"only names unknown member(s) {unknown}; valid: {list(self.members)}")
        for label, member in self.members.items():
            require(bool(member.config), f"members.{label}.config", member.config,
                    "the path of a gi bench config file, e.g. configs/bench/realistic-s1.yaml")
            for text in member.overrides:
                keys, _ = parse_override(text)
                if keys[0] in SET_BY_SUITE:
                    raise ConfigError(f"members.{label}.overrides has {text!r}: the suite writes each member's "
                                      f"output to <suite out>/{label}/; set out= and overwrite= on the suite")

    def selected(self) -> list[str]:
        """The labels to run, in the order of ``members``."""
        return [label for label in self.members if self.only is None or label in self.only]

    def member_configs(self) -> dict[str, Any]:
        """Every member's bench config (all members, ``only`` or not), loaded from its file with its overrides; a
        missing file, a bad key or value, a nested suite or a kind without an ``out`` key is a ConfigError naming
        the member."""
        out = {}
        for label, member in self.members.items():
            where = f"members.{label} (config={member.config!r}, overrides={member.overrides})"
            try:
                cls = BenchConfig.config_class(load_yaml(member.config), list(member.overrides))
                if cls is SuiteConfig:
                    raise ConfigError("a suite cannot be a member of a suite; list its members here instead")
                cfg = load(BenchConfig, member.config, member.overrides)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if not _has_out(type(cfg)):
                raise ConfigError(f"{where}: kind {getattr(cfg, 'kind', '?')!r} has no out/overwrite keys, so the "
                                  f"suite cannot put its output in <suite out>/{label}/; kinds with them: "
                                  f"{sorted(k for k, v in BENCH_CONFIGS.items() if _has_out(v))}")
            out[label] = cfg
        return out


def _has_out(cls: type) -> bool:
    """Whether bench config class ``cls`` has the keys the suite sets (:data:`SET_BY_SUITE`)."""
    return set(SET_BY_SUITE) <= {f.name for f in dataclasses.fields(cls)}


# every bench kind's config schema, by ``kind:`` (gi.experiments.bench_kinds.BENCH_KINDS holds their runners under
# the same names; tests/experiments/test_bench_suite.py keeps the two tables' names equal). A kind added at run time
# adds its schema here and its runner there.
BENCH_CONFIGS: dict[str, type] = {"throughput": BenchConfig, "time-to-quality": TTQConfig, "suite": SuiteConfig}
