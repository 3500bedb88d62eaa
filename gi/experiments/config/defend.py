"""The config schema of ``gi defend`` (:class:`DefendConfig`: the federation, the attacks, the swept defences) and
the protocol of each cell (:func:`cell_protocol`); the command is :mod:`gi.experiments.defend`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages import (
    LABELS_DOC,
    RENAMED_LABEL_KEYS,
    LabelConfig,
    check_table,
    derived_attack,
)
from gi.core.config import refuse_renamed, require
from gi.core.errors import ConfigError
from gi.experiments.config.attack import with_preset
from gi.experiments.config.run import MetricConfig
from gi.experiments.outdir import check_run_name
from gi.world.fl.protocol import Protocol
from gi.world.setup import AuxConfig, DataConfig, ModelConfig, VictimSetup, check_seed_reaches, section

BASELINE = "none"


@dataclass
class FederationConfig:
    """The federation every cell trains: ``num_clients`` Dirichlet(``alpha``) clients over ``samples`` images of
    ``data.split`` (a seeded draw; null: all), each at least ``min_size`` (default the batch size); utility after
    ``rounds`` rounds on ``eval_samples`` images of ``aux.split``; captures of round ``capture_round`` from
    ``capture_clients`` (default all)."""

    num_clients: int = 10
    samples: int | None = 1000
    alpha: float = 0.5
    min_size: int | None = None
    rounds: int = 10
    capture_round: int = 2
    capture_clients: list[int] | None = None
    eval_samples: int = 1000

    def __post_init__(self) -> None:
        require(self.num_clients >= 1, "federation.num_clients", self.num_clients, ">= 1")
        require(self.samples is None or self.samples >= self.num_clients, "federation.samples", self.samples,
                ">= num_clients or null")
        require(self.alpha > 0, "federation.alpha", self.alpha, "> 0")
        require(self.rounds >= 1, "federation.rounds", self.rounds, ">= 1")
        require(1 <= self.capture_round <= self.rounds, "federation.capture_round", self.capture_round,
                f"in [1, rounds={self.rounds}]")
        require(self.eval_samples >= 1, "federation.eval_samples", self.eval_samples, ">= 1")
        bad = [c for c in self.capture_clients or [] if not 0 <= c < self.num_clients]
        require(not bad, "federation.capture_clients", self.capture_clients, f"client ids in [0, {self.num_clients})")


@dataclass
class ImageConfig:
    """Image leakage: ``count`` images reconstructed, shared as FedSGD gradients of ``batch_size`` images each;
    ``oracle``: also reconstruct them with the true labels (columns ``psnr_mean:oracle`` ...). ``count: 0``: no
    image leakage (labels and utility only, e.g. a second seed of the label columns)."""

    count: int = 4
    batch_size: int = 1
    oracle: bool = False

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "images.batch_size", self.batch_size, ">= 1")
        require(self.count >= 0 and self.count % self.batch_size == 0, "images.count", self.count,
                f"0 (no image leakage) or a positive multiple of images.batch_size={self.batch_size}")


@dataclass
class DefendLabels(LabelConfig):
    """``gi defend``'s ``labels`` section: the reconstruction's label stage (:class:`LabelConfig`: ``mode``,
    ``method``, ``options``) and the label-leakage attacks, spelled as in ``gi labels`` (docs/usage.md, "The labels
    section"): ``methods``: {method or variant name: ``update`` or ``gradient``, what it reads}; ``variants``: {name:
    {method, options}} (a variant named after a method sets that method's options)."""

    methods: dict[str, str] = field(default_factory=lambda: {"rlu": "update", "posterior": "gradient"})
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.methods:
            raise ConfigError("labels.methods is empty; give {method: update or gradient}, e.g. {rlu: update}")
        check_table(list(self.methods), self.variants)
        bad = {m: v for m, v in self.methods.items() if v not in ("update", "gradient")}
        if bad:
            raise ConfigError(f"labels.methods {bad}: say what each method reads, 'update' or 'gradient'")


@dataclass
class DefendConfig(VictimSetup):
    """``gi defend``: the victim setup (``data``, ``model``, ``aux``, ``protocol``: the clients' protocol without the
    swept defence; its own ``defences`` apply in every cell), the ``federation``, the attacks (``labels``:
    :class:`DefendLabels`, the label-leakage methods and the reconstruction's label mode; ``label_batch``: samples
    per FedSGD label capture, default ``protocol.batch_size``; ``images`` and ``attack`` for the reconstruction)
    and ``defences``: a list of ``{name, strengths: [...], params: {...}, label}`` (``label`` names the curve;
    default ``name``). ``only``: run just these labels; ``workers``: cells computed at once, each in its own
    process (the same numbers as one at a time: every cell reseeds). The baseline (no extra defence) is always the
    first row. ``attack.preset`` (default ``auto``, :mod:`gi.attack.recon.presets`) fills the attack keys the
    config leaves out, as in ``gi run``."""

    name: str = "defend"
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    data: DataConfig = section(DataConfig, name="fashion-mnist", split="train")
    model: ModelConfig = section(ModelConfig, name="lenet5")
    aux: AuxConfig = section(AuxConfig, per_class=20, split="test")
    protocol: Protocol = section(Protocol, scheme="fedavg", batch_size=32, lr=0.05)
    federation: FederationConfig = field(default_factory=FederationConfig)
    label_batch: int | None = None
    images: ImageConfig = field(default_factory=ImageConfig)
    labels: DefendLabels = field(default_factory=lambda: DefendLabels(mode="truth"))
    attack: ReconConfig = field(default_factory=ReconConfig)
    metrics: MetricConfig = field(default_factory=lambda: MetricConfig(lpips_vgg=False))
    defences: list[dict[str, Any]] = field(default_factory=list)
    only: list[str] | None = None
    workers: int = 1

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "") -> Any:
        refuse_renamed(data, {k: RENAMED_LABEL_KEYS[k] for k in ("label_methods", "method_options")}, LABELS_DOC)
        return super().from_mapping(with_preset(data), where)

    def __post_init__(self) -> None:
        check_run_name(self.name)
        check_seed_reaches(self.seed, self.model.seed, "model.seed", "the federation's initial model")
        if not self.protocol.is_update:
            raise ConfigError(f"protocol.scheme={self.protocol.scheme!r}: gi defend trains a federation; use an "
                              "update scheme (fedavg, fedprox, ...); image leakage is measured on FedSGD gradients")
        if self.train.epochs > 0:
            raise ConfigError("train: gi defend's federation starts from the initial model; leave train out")
        self.attack = derived_attack(self.labels, self.attack)  # attack.labels from labels.mode, as in gi run
        require(self.workers >= 1, "workers", self.workers, ">= 1 (processes computing cells at once)")
        require(self.label_batch is None or self.label_batch >= 1, "label_batch", self.label_batch, ">= 1 or null")
        seen = set()
        for i, entry in enumerate(self.defences):
            sweep = defence_sweep(entry, f"defences[{i}]")
            if sweep["label"] in seen or sweep["label"] == BASELINE:
                raise ConfigError(f"defences[{i}]: label {sweep['label']!r} is used twice (or is {BASELINE!r}); give "
                                  "each entry its own label")
            seen.add(sweep["label"])
            for s in sweep["strengths"]:  # every cell's protocol is valid before any work
                cell_protocol(self.protocol, sweep, s)
        unknown = sorted(set(self.only or []) - seen - {BASELINE})
        if unknown:
            raise ConfigError(f"only names unknown defence label(s) {unknown}; valid: {sorted(seen | {BASELINE})}")


def defence_sweep(entry: Any, where: str) -> dict[str, Any]:
    """A ``defences`` entry checked: ``{name, strengths, params, label}``."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}={entry!r}: expected a mapping {{name, strengths, params, label}}")
    unknown = sorted(set(entry) - {"name", "strengths", "params", "label"})
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}; valid: ['label', 'name', 'params', 'strengths']")
    strengths = entry.get("strengths")
    if not isinstance(strengths, list) or not strengths:
        raise ConfigError(f"{where}.strengths={strengths!r}: expected a non-empty list of numbers")
    return {"name": entry.get("name"), "strengths": strengths, "params": entry.get("params") or {},
            "label": str(entry.get("label") or entry.get("name"))}


def cell_protocol(base: Protocol, sweep: dict[str, Any] | None, strength: float | None) -> Protocol:
    """The clients' protocol of one cell: ``base`` with the swept defence appended (none for the baseline)."""
    if sweep is None:
        return base
    extra = {"name": sweep["name"], "strength": strength, "params": sweep["params"]}
    try:
        return dataclasses.replace(base, defences=[*base.defences, extra])
    except ConfigError as exc:
        raise ConfigError(f"defences {sweep['label']!r} at strength {strength!r}: {exc}") from None
