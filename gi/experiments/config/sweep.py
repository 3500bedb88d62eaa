"""The config schema of ``gi sweep`` (:class:`SweepConfig`) and the jobs it names: each job's config
(:func:`job_config`), name and keys (:func:`expand_jobs`, :func:`job_key`, :func:`pack_key`); the command is
:mod:`gi.experiments.sweep`."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.core.config import format_override, from_dict, load, parse_override, to_dict
from gi.core.errors import ConfigError, GIError
from gi.experiments.outdir import check_run_name


@dataclass
class SweepConfig:
    """``command``: ``run`` or ``ablate`` (the job kind); ``base``: its config file (relative paths resolve
    against the working directory); ``overrides``: ``key=value`` applied to every job; ``grid``: {dotted key:
    [values]}; ``seeds``: one job per seed and grid point (sets ``seed``); ``devices``: processes on this node
    (``auto``: one per GPU, else 1); ``accelerator``: ``auto`` | ``cpu`` | ``gpu``; ``num_nodes``: machines;
    ``columns``: metrics of a ``run`` job copied into ``aggregate.csv``; ``metric``: the one summarised;
    ``pack``: up to this many ``run`` jobs of a rank that differ only in what the attack is told or shown
    (:data:`PACK_FREE`: the label stage, the images attacked) run together, their captures reconstructed as one
    packed problem where their attacks allow it (:func:`gi.experiments.run.run_many`; 0: one job at a
    time)."""

    name: str = "sweep"
    KEY_HINTS: ClassVar[dict[str, str]] = {"seed": "seeds=[0,1] runs one job per seed"}
    command: str = "run"
    base: str = "configs/demo.yaml"
    overrides: list[str] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    out: str | None = None
    devices: int | str = "auto"
    accelerator: str = "auto"
    num_nodes: int = 1
    columns: list[str] = field(default_factory=lambda: ["psnr_mean", "ssim_mean", "lpips_alex_mean",
                                                        "final_labels.ins_acc", "attack.seconds"])
    metric: str = "psnr_mean"
    dry_run: bool = False
    pack: int = 0
    shards: int | None = None
    shard: int | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> SweepConfig:
        """The loading step of :func:`gi.core.config.load`: the sweep, then every job's config (:func:`check_jobs`),
        so that a bad job is refused before any job runs."""
        cfg = from_dict(cls, data)
        check_jobs(cfg)
        return cfg

    def __post_init__(self) -> None:
        check_run_name(self.name)
        if (self.shards is None) != (self.shard is None):
            raise ConfigError(f"shards={self.shards!r} and shard={self.shard!r}: give both (this process runs shard "
                              "`shard` of `shards`, e.g. shards=8 shard=$SLURM_ARRAY_TASK_ID) or neither")
        if self.shards is not None and not (self.shards >= 1 and 0 <= self.shard < self.shards):
            raise ConfigError(f"shard={self.shard!r} of shards={self.shards!r}: need shards >= 1 and "
                              "0 <= shard < shards")
        if self.command not in JOB_CONFIGS:
            raise ConfigError(f"command={self.command!r} is not allowed; valid: {sorted(JOB_CONFIGS)}")
        if not isinstance(self.grid, dict) or any(not isinstance(v, list) or not v for v in self.grid.values()):
            raise ConfigError("grid must map dotted keys to non-empty lists of values, e.g. {attack.lr: [0.01, 0.1]}")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        if self.accelerator not in ("auto", "cpu", "gpu", "cuda"):
            raise ConfigError(f"accelerator={self.accelerator!r} is not allowed; valid: ['auto', 'cpu', 'gpu']")
        if self.devices != "auto" and (not isinstance(self.devices, int) or self.devices < 1):
            raise ConfigError(f"devices must be 'auto' or an int >= 1, got {self.devices!r}")
        for text in self.overrides:
            parse_override(text)
        if isinstance(self.pack, bool) or not isinstance(self.pack, int) or self.pack < 0:
            raise ConfigError(f"pack must be an int >= 0 (jobs run as one packed problem; 0: one at a time), got "
                              f"{self.pack!r}")
        if self.pack and self.command != "run":
            raise ConfigError(f"pack={self.pack} needs command=run (gi ablate already reconstructs all its modes as "
                              "one problem); set pack=0")


def _run_config() -> type:
    from gi.experiments.config.run import RunConfig

    return RunConfig


def _ablate_config() -> type:
    from gi.experiments.config.ablate import AblateConfig

    return AblateConfig


# the commands a sweep's jobs can be, with their config class (imported on first use); the runners of the same
# names are gi.experiments.sweep.JOB_KINDS (tests/experiments/test_sweep.py keeps the two tables' names equal)
JOB_CONFIGS: dict[str, Callable[[], type]] = {"run": _run_config, "ablate": _ablate_config}


def job_config(command: str, base: str, overrides: list[str]) -> Any:
    """A job's config: the ``gi run`` (RunConfig) or ``gi ablate`` (AblateConfig) config ``base`` with ``overrides``,
    loaded as those commands load it (:data:`JOB_CONFIGS`)."""
    return load(JOB_CONFIGS[command](), base, overrides)


def check_jobs(cfg: SweepConfig) -> None:
    """Load every job's config (base, overrides, grid point, seed) now: a bad value fails before any job runs."""
    for job in expand_jobs(cfg):
        try:
            job_config(cfg.command, cfg.base, list(job.overrides))
        except ConfigError as exc:
            raise ConfigError(f"job {job.name}: {exc}") from None


@dataclass
class Job:  # not frozen: Lightning's launcher copies dataclass arguments field by field
    index: int
    name: str
    overrides: tuple[str, ...]
    params: tuple[tuple[str, Any], ...]
    key: str = ""  # hash of the fully resolved job config (see job_key)

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.key}" if self.key else self.name


def _slug(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text).strip("-") or "x"


def expand_jobs(cfg: SweepConfig) -> list[Job]:
    """Every grid point × seed, in a fixed order (grid keys in config order, seeds innermost)."""
    keys = list(cfg.grid)
    jobs = []
    for values in itertools.product(*(cfg.grid[k] for k in keys)):
        for seed in cfg.seeds:
            params = tuple(zip(keys, values)) + (("seed", seed),)
            name = "_".join(f"{k.split('.')[-1]}={_slug(v)}" for k, v in params)
            over = tuple(cfg.overrides) + tuple(format_override(k, v) for k, v in params)
            jobs.append(Job(len(jobs), name, over, params, job_key(cfg.command, cfg.base, list(over))))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError("two jobs of the sweep map to the same directory name; make grid values distinct")
    return jobs


def _resolved(command: str, base: str, overrides: list[str], drop: tuple[str, ...]) -> dict[str, Any]:
    """The job's fully resolved config as a dict without the dotted keys ``drop`` (a config that does not load:
    its text)."""
    try:
        data = to_dict(job_config(command, base, overrides))
    except GIError as exc:
        return {"invalid": str(exc), "base": base, "overrides": overrides}
    for dotted in drop:
        *path, last = dotted.split(".")
        node = data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return data


def _hash(data: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:10]


WHERE_AND_HOW = ("out", "overwrite", "attack.progress", "attack.device")


# what may differ between jobs packed into one problem: what the attack is told (the label stage) and shown (the
# images attacked), and how results are named and scored
PACK_FREE = ("labels", "data.images", "data.indices", "name", "metrics")


def job_key(command: str, base: str, overrides: list[str]) -> str:
    """Hash of the job's fully resolved config (what determines its results; not where or how verbosely it is
    written). A config that does not load hashes its text: the job then fails when it runs and is reported."""
    return _hash(_resolved(command, base, overrides, WHERE_AND_HOW))


def pack_key(command: str, base: str, overrides: list[str]) -> str:
    """Jobs with the same pack key differ only in :data:`PACK_FREE` keys: ``pack`` runs them together."""
    return _hash(_resolved(command, base, overrides, WHERE_AND_HOW + PACK_FREE))
