"""The config schema of ``gi ablate`` (:class:`AblateConfig`, a :class:`~gi.experiments.config.run.RunConfig` plus
the table) and its settings' configs (:func:`setting_config`); the command is :mod:`gi.experiments.ablate`."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.attack.recon.config import ReconConfig
from gi.attack.stages import LABEL_MODES
from gi.core.config import DOTTED_KEYS, from_dict, set_dotted, to_dict
from gi.core.errors import ConfigError
from gi.experiments.config.run import MetricConfig, RunConfig
from gi.world.setup import deprecated, upgrade_key


@dataclass
class AblateConfig(RunConfig):
    """One ablation table: a ``gi run`` config (:class:`~gi.experiments.config.run.RunConfig`: its victim setup,
    ``labels``, ``attack``, ``metrics``) plus the table. ``trials``: captures per setting (each one client batch of
    ``protocol.batch_size``). ``settings``: {name: {dotted.key: value}} overrides of this config per setting
    (default: one setting named ``base``); ``attack_variants``: {name: {attack key: value}} (default: one
    variant ``base``; not the label-method variants of ``labels.variants``, which vary the label stage; the old
    spelling ``variants`` is read with a deprecation notice); ``modes``: label modes (each row's ``attack.labels``
    follows from its mode, so the config gives none); ``paper``: reference numbers {"setting/variant/mode" (any
    part may be ``*``; "setting/mode" too): {psnr, ssim, lpips, L_r}}; ``only``: run just these settings;
    ``mode_attack``: {mode: {attack key: value}} per label mode (e.g. a smaller ``label_lr`` when joint labels
    start from recovered ones)."""

    LEGACY: ClassVar[dict[str, str]] = {**RunConfig.LEGACY, "variants": "attack_variants"}

    name: str = "ablate"
    metrics: MetricConfig = field(default_factory=lambda: MetricConfig(lpips_vgg=False))
    trials: int = 4
    modes: list[str] = field(default_factory=lambda: list(LABEL_MODES))
    settings: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={DOTTED_KEYS: 1})
    attack_variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    only: list[str] | None = None
    mode_attack: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "") -> Any:
        if isinstance(data, dict) and isinstance(data.get("attack"), dict) and "labels" in data["attack"]:
            raise ConfigError(f"attack.labels={data['attack']['labels']!r}: gi ablate derives it from each row's "
                              f"label mode (modes); leave it out")
        if isinstance(data, dict) and isinstance(data.get("settings"), dict):
            data = {**data, "settings": {name: _upgraded_keys(over, f"settings.{name}")
                                         for name, over in data["settings"].items()}}
        return super().from_mapping(data, where)

    def __post_init__(self) -> None:
        if self.data.images is not None:
            raise ConfigError("gi ablate draws `trials` random client batches per setting; data.images would be "
                              "ignored here: leave it out and set trials=N")
        super().__post_init__()
        unknown = sorted(set(self.only or []) - set(self.settings))
        if unknown:
            raise ConfigError(f"only names unknown setting(s) {unknown}; valid: {sorted(self.settings)}")
        bad = [m for m in self.modes if m not in LABEL_MODES]
        if bad or not self.modes:
            raise ConfigError(f"modes has unknown {bad}; valid: {list(LABEL_MODES)}")
        if self.trials < 1:
            raise ConfigError(f"trials must be >= 1, got {self.trials}")
        valid_attack = {f.name for f in dataclasses.fields(ReconConfig)} - {"labels"}  # labels: the row's mode
        for name, over in self.attack_variants.items():
            if not isinstance(over, dict):
                raise ConfigError(f"attack_variants.{name} must map attack keys to values")
            unknown = sorted(set(over) - valid_attack)
            if unknown:
                raise ConfigError(f"attack_variants.{name} has unknown attack key(s) {unknown}; "
                                  f"valid: {sorted(valid_attack)}")
            from_dict(ReconConfig, {**to_dict(self.attack), **over}, f"attack_variants.{name}")  # types and ranges
        for name, over in self.mode_attack.items():
            unknown = sorted(set(over) - valid_attack) if isinstance(over, dict) else ["<not a mapping>"]
            if name not in LABEL_MODES or unknown:
                raise ConfigError(f"mode_attack.{name}: modes {list(LABEL_MODES)}, attack keys {sorted(valid_attack)}")
            from_dict(ReconConfig, {**to_dict(self.attack), **over}, f"mode_attack.{name}")
        for name, over in self.settings.items():
            if not isinstance(over, dict):
                raise ConfigError(f"settings.{name} must map dotted keys to values, e.g. {{protocol.label_aug: mixup}}")
            setting_config(self, name)  # validates the overrides now, not halfway through a table

    def written(self) -> dict[str, Any]:
        """As :meth:`RunConfig.written`, without ``attack.labels``: each row derives it from its mode."""
        data = super().written()
        data["attack"].pop("labels")
        return data


def _upgraded_keys(over: Any, where: str) -> Any:
    """A setting's dotted keys in their new spelling (``model.train_epochs`` → ``train.epochs``)."""
    if not isinstance(over, dict):
        return over
    out = {}
    for key, value in over.items():
        new = upgrade_key(key, AblateConfig.LEGACY)
        if new != key:
            deprecated(where, key, new)
        if new in out and out[new] != value:
            raise ConfigError(f"{where}: {key} and {new} are both given; keep {new} only")
        out[new] = value
    return out


def setting_config(cfg: AblateConfig, name: str) -> AblateConfig:
    """The base config with setting ``name``'s dotted overrides applied (settings/attack_variants/paper dropped)."""
    base = cfg.written()
    for key in ("settings", "attack_variants", "paper", "only", "mode_attack"):
        base.pop(key)
    try:
        for key, value in cfg.settings.get(name, {}).items():
            set_dotted(base, key.split("."), copy.deepcopy(value), AblateConfig, key)
        return AblateConfig.from_mapping(base)
    except ConfigError as exc:
        raise ConfigError(f"settings.{name}: {exc}") from None
