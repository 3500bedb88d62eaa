"""The config schema of ``gi run`` (:class:`RunConfig` on the shared victim setup, :mod:`gi.world.setup`); the
command is :mod:`gi.experiments.run`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.attack.recon.config import ReconConfig
from gi.attack.stages import LabelConfig, derived_attack
from gi.core.config import refuse_renamed, require, to_dict
from gi.core.errors import ConfigError
from gi.experiments.config.attack import with_preset
from gi.experiments.outdir import check_run_name
from gi.world.setup import MAX_CAPTURES, DataConfig, VictimSetup, check_capture_count, check_seed_reaches, client_size

RENAMED = {"data.captures": "trials"}  # one name in every command for the client batches attacked (docs/usage.md)



@dataclass
class RunDataConfig(DataConfig):
    """The shared :class:`~gi.world.setup.DataConfig` plus how ``gi run`` draws the clients' batches.

    ``indices``: dataset indices of the client's batch (length = protocol.batch_size); null draws them
    with the run seed. ``images``: a list of dataset indices, or ``all``, attacked as separate captures of
    ``protocol.batch_size`` consecutive entries each (batch size 1: every image its own capture), packed into one
    batched reconstruction; results are per image plus mean / median / min. When neither is given, the run's
    ``trials`` batches are drawn with the run seed. ``max_captures``: the most captures one run may make
    (:data:`MAX_CAPTURES`; :func:`gi.world.setup.check_capture_count`). ``eps``: label-smoothing ε (null:
    U(0, eps_max) per sample, as the soft-label paper). ``mixup_lam``: mixup λ (null: U(0, 1)).
    """

    indices: list[int] | None = None
    images: list[int] | str | None = None
    max_captures: int = MAX_CAPTURES
    eps: float | None = None
    eps_max: float = 0.5
    mixup_lam: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.indices is None or all(i >= 0 for i in self.indices), "data.indices", self.indices,
                "dataset indices >= 0")
        require(self.images is None or self.images == "all" or (isinstance(self.images, list) and self.images
                and all(i >= 0 for i in self.images)), "data.images", self.images,
                "a non-empty list of dataset indices >= 0, or all")
        require(self.max_captures >= 1, "data.max_captures", self.max_captures, ">= 1")
        if self.images is not None and self.indices is not None:
            raise ConfigError("data.images gives the captures; leave data.indices out with it (data.indices is one "
                              "batch, data.images one capture per protocol.batch_size of its images)")
        for key in ("eps", "eps_max", "mixup_lam"):
            value = getattr(self, key)
            require(value is None or 0 <= value <= 1, f"data.{key}", value, "a number in [0, 1]")


@dataclass
class MetricConfig:
    lpips_vgg: bool = True
    match: bool = True


@dataclass
class RunConfig(VictimSetup):
    """``gi run``: the victim setup (:class:`~gi.world.setup.VictimSetup`: ``data``, ``model``, ``train``,
    ``aux``, ``protocol``), ``trials`` (how many client batches are drawn and attacked, each one capture; the name
    every command gives it), the label stage, the attack and the scores. ``attack.labels`` is derived from
    ``labels.mode`` (an explicit different value is a ConfigError). The ``attack`` section is filled from
    ``attack.preset`` (default ``auto``, as in every command; :mod:`gi.attack.recon.presets`) under its explicit
    keys."""

    LEGACY: ClassVar[dict[str, str]] = {"model.train_epochs": "train.epochs", "model.train_lr": "train.lr",
                                        "labels.aux_per_class": "aux.per_class"}

    name: str = "run"
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    trials: int = 1
    data: RunDataConfig = field(default_factory=RunDataConfig)
    labels: LabelConfig = field(default_factory=LabelConfig)
    attack: ReconConfig = field(default_factory=ReconConfig)
    metrics: MetricConfig = field(default_factory=MetricConfig)

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "") -> Any:
        refuse_renamed(data, RENAMED)
        return super().from_mapping(with_preset(data), where)

    def __post_init__(self) -> None:
        check_run_name(self.name)
        check_seed_reaches(self.seed, self.model.seed, "model.seed", "the model's initialisation")
        require(self.trials >= 1, "trials", self.trials, ">= 1 (client batches, each one capture)")
        if self.trials != 1 and (self.data.images is not None or self.data.indices is not None):
            raise ConfigError(f"trials={self.trials} with data.images or data.indices: they give the captures "
                              "(data.indices one batch, data.images one per protocol.batch_size images); leave "
                              "trials out, or leave them out to draw trials random batches")
        self.attack = derived_attack(self.labels, self.attack)  # the loaders refuse an explicit other value
        size, key = client_size(self.protocol)
        check_capture_count(self.data, self.trials, size, key=key)  # a folder's images=all: once read
        if (self.attack.regularizers.get("aux-span") or self.attack.init == "aux-mean") and self.aux.per_class <= 0:
            raise ConfigError("attack.regularizers aux-span and attack.init=aux-mean use the attacker's aux images: "
                              "set aux.per_class > 0 (the fc-inputs preset needs it)")
        if self.protocol.is_update and self.protocol.label_aug == "mixup":
            raise ConfigError("protocol.label_aug=mixup is FedSGD-only here (gi.world.fl.victim trains with one-hot or "
                              "smoothed labels); use protocol.scheme=fedsgd or another label_aug")

    def written(self) -> dict[str, Any]:
        """The config as its ``config.yaml`` records it: every setting (derived ones as they ran), the run's own
        keys (name, seed, out, overwrite) first."""
        data = to_dict(self)
        return {**{k: data.pop(k) for k in ("name", "seed", "out", "overwrite")}, **data}
