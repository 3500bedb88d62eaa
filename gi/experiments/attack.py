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
import glob
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.outputs import truth_monitor, write_outputs
from gi.analysis.verdict import verdict_line
from gi.attack.stages import AttackResult, check_models, prepare_attack, reconstruct_prepared
from gi.core.config import to_dict
from gi.core.errors import ConfigError
from gi.experiments.config.attack import AttackConfig
from gi.experiments.outdir import link_latest, staged_output, stamped_out

if TYPE_CHECKING:

    from gi.capture import Capture

log = logging.getLogger("gi.experiments.attack")


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
    directory (its ``capture.safetensors``, or ``captures/*.safetensors``), also through its ``<name>-latest`` link.
    A path that does not exist is an error naming the folders that start with it (``runs/demo``: the stamped
    ``runs/demo-<YYYYmmdd-HHMMSS>`` folders and ``runs/demo-latest``)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        if (path / f"{what}.safetensors").is_file():
            return [path / f"{what}.safetensors"]
        found = sorted((path / f"{what}s").glob("*.safetensors"))
        if found:
            return found
    elif not os.path.lexists(path):
        near = sorted(glob.glob(glob.escape(str(path)) + "*"))
        if near:
            shown = near if len(near) <= 6 else ["...", *near[-6:]]
            raise ConfigError(f"{what}={str(path)!r}: no such {what} file or folder; found {', '.join(shown)}")
    raise ConfigError(f"{what}={str(path)!r}: no such {what} file, nor an output directory holding "
                      f"{what}.safetensors or {what}s/*.safetensors (gi run writes them)")


@dataclass
class AttackRun:
    out: Path
    metrics: dict[str, Any]
    outcome: AttackResult
    latest: Path | None = None  # the runs/<name>-latest link made to ``out`` (without out=), else None


def run_attack(cfg: AttackConfig) -> AttackRun:
    """``gi attack``: load the captures (and truths, when given), run the stages of :func:`attack_stages`
    (:func:`prepare_attack`, then :func:`reconstruct_prepared`; the truth monitor only for a fit), write the output
    directory."""
    import torch

    from gi.capture import Capture, Truth
    from gi.world.build import draw_aux, load_data

    files = capture_files(cfg.capture)
    captures = [in_model_order(Capture.load(f, factory=cfg.model, trust_factory=cfg.trust_factory)) for f in files]
    check_models(captures)  # a user model that does not fit its captures: one line, before aux data or outputs
    truths = None
    if cfg.truth is not None:
        truth_files = capture_files(cfg.truth, "truth")
        if len(truth_files) != len(captures):
            raise ConfigError(f"truth={cfg.truth!r} holds {len(truth_files)} truth file(s) for {len(captures)} "
                              "capture(s)")
        truths = [Truth.load(f).check(c.model_spec["num_classes"], c.model_spec.get("in_shape"), str(f))
                  for f, c in zip(truth_files, captures, strict=True)]
    out = Path(cfg.out) if cfg.out else stamped_out(cfg.name)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        aux = None
        if cfg.aux.per_class > 0 and cfg.aux_data is not None:
            aux = draw_aux(load_data(cfg.aux_data, cfg.aux.split), cfg.aux.per_class, gen, None,
                           *cfg.aux.shift_args)[0]
        prepared = prepare_attack(cfg.labels, cfg.attack, captures, None if cfg.labels.mode != "truth" else truths,
                                  aux)  # labels, features; then the monitor only for a fit (Lightning loads there)
        monitor = truth_monitor(truths, cfg.attack.log_every) if truths is not None and prepared.optimises else None
        (outcome,) = reconstruct_prepared([prepared], callbacks=[monitor] if monitor is not None else [])
        config = {**to_dict(cfg)}
        metrics = write_outputs(tmp, cfg.name, config, captures, truths, outcome, cfg.labels, cfg.seed,
                                {"match": True, "lpips_vgg": cfg.lpips_vgg}, monitor, t0)
        log.info("%s", verdict_line(metrics["verdict"]))
    return AttackRun(out, metrics, outcome, None if cfg.out else link_latest(out, cfg.name))
