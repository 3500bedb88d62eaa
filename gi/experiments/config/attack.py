"""The config schema of ``gi attack`` (:class:`AttackConfig`) and the loading step every config with ``labels`` and
``attack`` sections shares (:func:`with_preset`); the command is :mod:`gi.experiments.attack`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gi.attack.recon.config import ReconConfig
from gi.attack.recon.presets import DEFAULT, apply_preset
from gi.attack.stages import LABEL_MODES, LabelConfig, derived_attack
from gi.core.config import format_override, load
from gi.core.errors import ConfigError
from gi.experiments.outdir import check_run_name
from gi.world.setup import AuxConfig, DataConfig


def check_attack_labels(data: Any) -> None:
    """``attack.labels`` follows from ``labels.mode`` (fixed or joint labels); an explicit other value is refused
    instead of being replaced silently."""
    if not isinstance(data, dict) or not isinstance(data.get("attack"), dict) or "labels" not in data["attack"]:
        return
    labels = data.get("labels")
    mode = labels.get("mode", LabelConfig.mode) if isinstance(labels, dict) else LabelConfig.mode
    given = data["attack"]["labels"]
    if mode in LABEL_MODES and given != LABEL_MODES[mode].kind:
        raise ConfigError(f"attack.labels={given!r} contradicts labels.mode={mode!r} (its labels are "
                          f"{LABEL_MODES[mode].kind!r}); attack.labels follows from labels.mode: leave it out")


def with_preset(data: Any) -> Any:
    """A config mapping with its ``attack`` section filled from its preset (``attack.preset``, else
    :data:`gi.attack.recon.presets.DEFAULT`, ``auto``, in every command) under the explicit keys
    (:func:`gi.attack.recon.presets.apply_preset`; ``auto`` picks by the config's ``model.name``), after
    :func:`check_attack_labels`: the one loading step of every config with ``labels`` and ``attack`` sections
    (gi run, gi attack, gi ablate, gi defend)."""
    check_attack_labels(data)
    data = dict(data or {})
    attack = data.get("attack")
    if attack is not None and not isinstance(attack, dict):
        return data  # the loader's type check names the problem
    model = data.get("model")
    data["attack"] = apply_preset(attack, DEFAULT, model.get("name") if isinstance(model, dict) else None)
    return data


@dataclass
class AttackConfig:
    """``gi attack CAPTURE``: the label-first attack on saved captures, without truth.

    ``capture``: a capture file or a ``gi run`` output directory; ``truth``: the matching truth file or directory
    (optional: only then are images scored); ``labels`` and ``attack`` as in ``gi run`` (``attack.preset``
    defaults to ``auto``); ``aux_data`` + ``aux``: the attacker's labelled samples (``aux.per_class`` per class
    of the dataset ``aux_data``; none by default).

    A capture of a ``factory`` model (your own ``nn.Module``) names its factory in the file; it is never imported
    on the file's word. ``model``: the import string of your factory (``pkg.mod:fn``), called with the file's
    keyword arguments; or register it in your code (:func:`gi.world.models.register_factory`); or ``trust_factory:
    true``, which imports and calls whatever factory the file names, with the file's arguments: arbitrary code
    from the file, only for captures from a trusted source (:meth:`gi.Capture.load`)."""

    capture: str = ""
    truth: str | None = None
    name: str = "attack"
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    labels: LabelConfig = field(default_factory=LabelConfig)
    attack: ReconConfig = field(default_factory=ReconConfig)
    aux: AuxConfig = field(default_factory=AuxConfig)
    aux_data: DataConfig | None = None
    lpips_vgg: bool = False
    model: str | None = None
    trust_factory: bool = False

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "") -> Any:
        from gi.core.config import from_dict

        return from_dict(cls, with_preset(data))

    def __post_init__(self) -> None:
        check_run_name(self.name)
        if not self.capture:
            raise ConfigError("gi attack needs a capture: gi attack CAPTURE [key=value ...], CAPTURE a "
                              ".safetensors file or a gi run output directory")
        self.attack = derived_attack(self.labels, self.attack)
        if self.aux.per_class > 0 and self.aux_data is None:
            raise ConfigError("aux.per_class > 0 needs aux_data.name (the dataset the aux samples come from)")
        if self.model is not None and (self.model.count(":") != 1 or self.model.startswith(":")
                                       or self.model.endswith(":")):
            raise ConfigError(f"model={self.model!r}: expected the import string of your model factory, "
                              "'package.module:callable' (it rebuilds a factory capture's model)")


def load_attack_config(capture: str, overrides: list[str] | None = None, path: str | Path | None = None
                       ) -> AttackConfig:
    """The config of ``gi attack``: :func:`gi.core.config.load` of ``path`` (optional) with ``capture`` first."""
    return load(AttackConfig, path, [format_override("capture", capture), *(overrides or [])])
