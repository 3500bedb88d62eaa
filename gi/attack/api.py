"""The attack in one call, for Python users: the same stages as ``gi attack`` (docs/architecture.md "Data flow").

``gi.attack.run(capture)`` recovers the labels (``labels.method: auto`` picks the method from the capture), the
last-layer features (and, where the net allows, the whole input analytically), then reconstructs the images with
the attack recipe of ``preset`` (``auto``: the preset registered for the capture's zoo model, else ``default``).
It never reads ground truth. It returns an :class:`Attack`: the :class:`~gi.attack.stages.AttackResult` with its
verdict without truth (``verdict``), which :meth:`Attack.score` scores against your :class:`gi.Truth` and
:meth:`Attack.save` writes as ``gi attack``'s output directory (docs/usage.md, "Python").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.outputs import Summary, summarise, write_outputs
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.presets import AUTO, apply_preset
from gi.attack.stages import AttackResult, LabelConfig, attack_stages, derived_attack
from gi.attack.stages.result import no_effect, no_effect_notice
from gi.core.config import to_dict
from gi.core.errors import ConfigError, OutputError
from gi.experiments.outdir import staged_output

if TYPE_CHECKING:
    from gi.capture import Capture, Truth


@dataclass
class Attack(AttackResult):
    """What :func:`run` returns: the :class:`~gi.attack.stages.AttackResult` (labels, features, one reconstruction
    per capture, the stage records, ``verdict`` without truth) with the label and attack configs it ran with, so
    that it can be scored against truth (:meth:`score`) and written as ``gi attack``'s output directory
    (:meth:`save`). The attack itself never holds a :class:`~gi.capture.Truth`: both take it as an argument."""

    label_config: LabelConfig = field(default_factory=LabelConfig)
    attack: ReconConfig = field(default_factory=ReconConfig)
    name = "attack"  # metrics.json's name and the grid's title (gi attack's default); not a field

    def score(self, truths: Truth | Sequence[Truth], lpips_vgg: bool = False) -> Summary:
        """Every image scored against ``truths`` (one :class:`~gi.capture.Truth` per capture, in order) as
        ``gi attack ... truth=`` scores it (:func:`gi.analysis.outputs.summarise`): ``rows`` per image (PSNR,
        SSIM, LPIPS, the trivial guesses, the per-image ``verdict``), ``verdict`` (metrics.json's: per image against
        the best trivial guess, the mismatch verdict under ``gradient``), ``sentence`` and ``metrics``.
        ``lpips_vgg``: LPIPS-VGG too (its weights must be installed). A truth that does not fit its capture is a
        one-line :class:`~gi.core.errors.CaptureError` (:meth:`gi.capture.Truth.check`)."""
        return summarise(self.name, self.captures, self.checked(truths), self, self.label_config, self.attack.seed,
                         {"match": True, "lpips_vgg": lpips_vgg})

    def save(self, out: str | Path, truths: Truth | Sequence[Truth] | None = None, lpips_vgg: bool = False,
             classes: Sequence[str] | str = ()) -> Path:
        """Write the self-contained output directory ``gi attack`` writes (:func:`gi.analysis.outputs.write_outputs`:
        config.yaml, metrics.json, results.csv, grid.png, the plots, reconstructions.safetensors and images/, the
        captures; with ``truths``, scored as :meth:`score` and the truths beside) to ``out``, staged and moved into
        place (:func:`gi.experiments.outdir.staged_output`). ``out`` must not exist or be an empty directory: an
        existing result is never overwritten. Any failure to write (an existing non-empty ``out``, a file in its
        place, a read-only place, a full disk) is a one-line :class:`~gi.core.errors.OutputError` and nothing is
        left half-written. ``classes``: the class names the captions and report.html show beside each label (a
        list, one per class, or a dataset name of :func:`gi.world.data.class_names`, e.g. ``"cifar10-samples"``);
        names that do not match the captures' class count are not shown. Returns ``out``."""
        out = Path(out)
        if out.is_dir() and not out.is_symlink():
            if any(out.iterdir()):
                raise OutputError(f"{out} exists and is not empty; save to a new or an empty directory (nothing "
                                  "was written)")
            out.rmdir()  # empty: the staged directory takes its place (the rename never replaces a directory)
        checked = self.checked(truths) if truths is not None else None
        config = {"name": self.name, "seed": self.attack.seed, "labels": to_dict(self.label_config),
                  "attack": to_dict(self.attack),
                  **({"data": {"name": classes}} if isinstance(classes, str)
                     else {"class_names": [str(c) for c in classes]} if classes else {})}
        logger = logging.getLogger("gi")
        level = logger.level  # the staged output logs to its log.txt at INFO: the caller's level is put back
        try:
            with staged_output(out) as tmp:
                write_outputs(tmp, self.name, config, self.captures, checked, self, self.label_config,
                              self.attack.seed, {"match": True, "lpips_vgg": lpips_vgg})
        except ConfigError as exc:  # the output directory's own refusals (a file there, no write permission, ...)
            raise OutputError(str(exc)) from None
        finally:
            logger.setLevel(level)
        return out

    def checked(self, truths: Truth | Sequence[Truth]) -> list[Truth]:
        """``truths`` as a list, one per capture, each checked against its capture's classes and input shape."""
        from gi.capture import Truth

        truths = [truths] if isinstance(truths, Truth) else list(truths)
        if len(truths) != len(self.captures):
            raise ConfigError(f"{len(truths)} truth(s) for {len(self.captures)} capture(s): give one gi.Truth per "
                              "capture, in the order the captures were attacked")
        return [t.check(c.model_spec["num_classes"], c.model_spec.get("in_shape"), f"truths[{k}]")
                for k, (t, c) in enumerate(zip(truths, self.captures))]


log = logging.getLogger("gi.attack")

def run(capture: Capture | Sequence[Capture], aux: Any = None, preset: str = AUTO,
        labels: LabelConfig | str = "auto", callbacks: Sequence[Any] = (), progress: bool = True,
        **attack: Any) -> Attack:
    """labels → features → images for one capture or several captures of one global model (one batched problem).

    ``aux``: the attacker's labelled samples ``(images, labels)`` for the label methods that use them (none by
    default). ``labels``: a label method name (``auto``, or any of ``labels.METHODS``: the labels are recovered and
    held fixed) or a full :class:`~gi.attack.stages.LabelConfig` (label mode, hard method, options). ``preset``: a
    name of :data:`gi.attack.recon.presets.PRESETS` or ``auto``; ``attack`` keys (``iterations=``, ``restarts=``,
    … any :class:`~gi.attack.recon.ReconConfig` field) override it. ``progress`` (default on): report progress as
    ``gi attack`` does, on stderr (:func:`progress_log`); false: silent. Returns an :class:`Attack`: the label
    results, the feature targets, one :class:`~gi.attack.recon.Reconstruction` per capture, the stage records and
    the warnings; ``verdict`` (how well each reconstruction explains its capture, docs/usage.md "Verdict"), and
    ``score(truths)`` / ``save(dir)``.
    """
    from gi.capture import Capture

    captures = [capture] if isinstance(capture, Capture) else list(capture)
    lcfg = labels if isinstance(labels, LabelConfig) else LabelConfig(method=labels)
    spec = captures[0].model_spec if captures else {}
    model = spec.get("name") if spec.get("provider", "zoo") == "zoo" else None
    cfg = derived_attack(lcfg, ReconConfig(**apply_preset({**attack, "progress": progress, "preset": preset},
                                                          model=model)))
    with progress_log(progress):
        result = attack_stages(lcfg, cfg, captures, None, aux, callbacks)
    unused = no_effect(attack, result.reconstructions)
    if unused:  # a silent no-op would read as a result of those keys
        notice = no_effect_notice(unused, section="")
        log.warning(notice)
        result.warnings.append(notice)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(AttackResult)}
    return Attack(**fields, label_config=lcfg, attack=cfg)


@contextlib.contextmanager
def progress_log(on: bool) -> Iterator[None]:
    """While open (and ``on``), the ``gi`` loggers' records go to stderr as ``gi attack`` prints them, unless the
    caller's logging already shows their INFO records: the stage lines and the reconstruction's progress
    (:class:`gi.attack.recon.api.ProgressLines`, a line every 5 % of the iterations when stderr is piped or
    redirected, never a carriage-return bar; a terminal gets Lightning's tqdm bar, ``attack.progress``). Meanwhile
    those records do not propagate to the caller's handlers (they would print them twice)."""
    logger = logging.getLogger("gi")
    if not on or (logger.isEnabledFor(logging.INFO) and logger.hasHandlers()):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
