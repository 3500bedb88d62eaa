"""The attack side of ``gi run`` and all of ``gi attack``: labels → features → reconstruction.

docs/architecture.md, "Data flow": the stage functions here read captures (and aux data), never truth; the oracle
label mode alone reads truth, by request. ``gi run`` (:mod:`gi.experiments.run`) makes captures from real
data and calls :func:`attack_stages`, then :func:`write_outputs`; ``gi attack CAPTURE`` loads saved captures and
calls the same two functions, scoring only when a truth file is given.

Every stage appends a record to ``metrics.json``'s ``stages``: ``{"name": "labels", "method": ..., "why": ...,
"seconds": ...}``, ``{"name": "features", ...}``, ``{"name": "reconstruct", "optimizer": ..., ...}``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.outputs import truth_monitor, verdict_line, write_outputs
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.presets import DEFAULT, apply_preset
from gi.attack.stages import (
    LABEL_MODES,
    AttackResult,
    LabelConfig,
    derived_attack,
    prepare_attack,
    reconstruct_prepared,
)
from gi.core.config import format_override, load, to_dict
from gi.core.errors import ConfigError
from gi.experiments.outdir import check_run_name, staged_output
from gi.world.setup import AuxConfig, DataConfig

if TYPE_CHECKING:

    from gi.capture import Capture

log = logging.getLogger("gi.experiments.attack")


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


def in_model_order(capture: Capture) -> Capture:
    """``capture`` with its tensor dicts in the model's parameter order. A safetensors file stores its tensors by
    name, so a loaded capture lists them sorted; the matching objective sums its layers in dict order, and
    float32 sums in another order round differently, which a chaotic attack amplifies. In the model's order a
    loaded capture reconstructs exactly as the capture gi run held in memory."""
    import torch

    with torch.device("meta"):
        order = list(capture.architecture().state_dict())

    def ordered(d: dict[str, Any] | None) -> dict[str, Any] | None:
        if d is None:
            return None
        rank = {k: i for i, k in enumerate(order)}
        return {k: d[k] for k in sorted(d, key=lambda k: (rank.get(k, len(rank)), k))}

    return dataclasses.replace(capture, model_state=ordered(capture.model_state), gradients=ordered(capture.gradients),
                               update=ordered(capture.update))


def capture_files(path: str | Path, what: str = "capture") -> list[Path]:
    """The capture (or truth) files of ``path``: a ``.safetensors`` file, or a ``gi run`` / ``gi attack`` output
    directory (its ``capture.safetensors``, or ``captures/*.safetensors``)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        if (path / f"{what}.safetensors").is_file():
            return [path / f"{what}.safetensors"]
        found = sorted((path / f"{what}s").glob("*.safetensors"))
        if found:
            return found
    raise ConfigError(f"{what}={str(path)!r}: no such {what} file, nor an output directory holding "
                      f"{what}.safetensors or {what}s/*.safetensors (gi run writes them)")


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


@dataclass
class AttackRun:
    out: Path
    metrics: dict[str, Any]
    outcome: AttackResult


def run_attack(cfg: AttackConfig) -> AttackRun:
    """``gi attack``: load the captures (and truths, when given), run the stages of :func:`attack_stages`
    (:func:`prepare_attack`, then :func:`reconstruct_prepared`; the truth monitor only for a fit), write the output
    directory."""
    import torch

    from gi.capture import Capture, Truth
    from gi.world.build import draw_aux, load_data

    files = capture_files(cfg.capture)
    captures = [in_model_order(Capture.load(f, factory=cfg.model, trust_factory=cfg.trust_factory)) for f in files]
    truths = None
    if cfg.truth is not None:
        truth_files = capture_files(cfg.truth, "truth")
        if len(truth_files) != len(captures):
            raise ConfigError(f"truth={cfg.truth!r} holds {len(truth_files)} truth file(s) for {len(captures)} "
                              "capture(s)")
        truths = [Truth.load(f) for f in truth_files]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"runs/{cfg.name}-{stamp}")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        aux = None
        if cfg.aux.per_class > 0 and cfg.aux_data is not None:
            aux = draw_aux(load_data(cfg.aux_data, cfg.aux.split), cfg.aux.per_class, gen)[0]
        prepared = prepare_attack(cfg.labels, cfg.attack, captures, None if cfg.labels.mode != "truth" else truths,
                                  aux)  # labels, features; then the monitor only for a fit (Lightning loads there)
        monitor = truth_monitor(truths, cfg.attack.log_every) if truths is not None and prepared.optimises else None
        (outcome,) = reconstruct_prepared([prepared], callbacks=[monitor] if monitor is not None else [])
        config = {**to_dict(cfg)}
        metrics = write_outputs(tmp, cfg.name, config, captures, truths, outcome, cfg.labels, cfg.seed,
                                {"match": True, "lpips_vgg": cfg.lpips_vgg}, monitor, t0)
        log.info("%s", verdict_line(metrics))
    return AttackRun(out, metrics, outcome)
