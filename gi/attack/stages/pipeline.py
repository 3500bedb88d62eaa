"""The attack pipeline (docs/architecture.md "Data flow"): the registered stages before the reconstruction on each
job (:func:`prepare_attack`), the reconstruct stage over jobs that can share one problem (:func:`can_pack`,
:func:`reconstruct_prepared`), the registered stages after it, and :func:`attack_stages`, all three chained.

``gi run`` and ``gi attack CAPTURE`` call :func:`attack_stages` (or :func:`prepare_attack` then
:func:`reconstruct_prepared`, to pack several jobs into one problem); :func:`gi.attack.run` is the Python entry.
Every stage returns a record for ``metrics.json``'s ``stages``: ``{"name": "labels", "method": ..., "why": ...,
"seconds": ...}``, ``{"name": "features", ...}``, ``{"name": "reconstruct", "optimizer": ..., ...}``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages.base import PreparedAttack, run_stages, stages_after, stages_before
from gi.attack.stages.reconstruct import reconstruct_stage
from gi.attack.stages.result import AttackResult
from gi.attack.stages.silent import silent_warning
from gi.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from gi.attack.stages.labels import LabelConfig
    from gi.capture import Capture, Truth

log = logging.getLogger("gi.attack")


def check_models(captures: Sequence[Capture]) -> None:
    """Rebuild each distinct user (``factory``) model of ``captures`` once, before any stage runs, so that a model
    that does not take the capture's images or does not return logits (a tuple, a dict) is a one-line
    :class:`gi.core.errors.CaptureError` at the door (:meth:`gi.capture.Capture.model`,
    :func:`gi.world.models.check_forward`; docs/guarantees.md). Captures without an ``in_shape`` and zoo
    models are left to the stages (a zoo model is built for its spec's shape)."""
    import json

    from gi.world.models import provider_of

    seen: set[tuple[str, int, bool]] = set()
    for c in captures:
        spec = c.model_spec
        if provider_of(spec) != "factory" or spec.get("in_shape") is None:
            continue
        key = (json.dumps(spec, sort_keys=True, default=str), id(c.factory), bool(c.trust_factory))
        if key not in seen:
            seen.add(key)
            c.model()


def prepare_attack(lcfg: LabelConfig, attack: ReconConfig, captures: Sequence[Capture],
                   truths: Sequence[Truth | None] | None = None, aux: Any = None) -> PreparedAttack:
    """The registered stages before the reconstruction (labels → features) over ``captures``: everything of
    :func:`attack_stages` but the reconstruction and the stages after it. A capture whose shared tensors are all
    zero (:attr:`gi.capture.Capture.silent`) goes through no stage: it is answered by
    :func:`gi.attack.stages.silent.silent_reconstruction` (a flat grey guess, scored as such) instead of stopping
    the job."""
    truths = list(truths) if truths is not None else [None] * len(captures)
    silent = {i: c for i, c in enumerate(captures) if c.silent}
    live = [i for i in range(len(captures)) if i not in silent]
    captures, truths = [captures[i] for i in live], [truths[i] for i in live]
    check_models(captures)
    job = PreparedAttack(attack, captures, silent=silent, aux_images=getattr(aux, "images", None), label_config=lcfg,
                         truths=truths, aux=aux)
    job.stages.extend(run_stages(job, stages_before()))
    if silent:
        for record in job.stages:
            if record["name"] == "labels":
                record["silent_captures"] = sorted(silent)
        log.warning("%s", silent_warning(sorted(silent), len(live) + len(silent)))
    return job


def attack_stages(lcfg: LabelConfig, attack: ReconConfig, captures: Sequence[Capture],
                  truths: Sequence[Truth | None] | None = None, aux: Any = None,
                  callbacks: Sequence[Any] = ()) -> AttackResult:
    """labels → features → reconstruct over ``captures`` (one global model: one batched problem)."""
    return reconstruct_prepared([prepare_attack(lcfg, attack, captures, truths, aux)], callbacks)[0]


def can_pack(a: PreparedAttack, b: PreparedAttack) -> bool:
    """Whether two prepared attacks can be one reconstruction problem: the same attack config and features
    matched alike, captures of one global model (:func:`gi.attack.recon.problem.same_model`), no analytic answer."""
    from gi.attack.recon.problem import same_model

    return bool(a.captures) and bool(b.captures) and a.attack == b.attack and a.inversions is None and \
        b.inversions is None and (a.matched[0] is None) == (b.matched[0] is None) and \
        same_model(a.captures[0], b.captures[0], a.attack.decoupled_bn) and _same_aux(a.aux_images, b.aux_images)


def _same_aux(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    import torch

    return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape and torch.equal(a, b))


def reconstruct_prepared(prepared: Sequence[PreparedAttack], callbacks: Sequence[Any] = ()) -> list[AttackResult]:
    """The reconstruct stage of several prepared attacks that :func:`can_pack` together (several jobs' captures
    as one packed problem), split back into one :class:`AttackResult` each after the registered stages after the
    reconstruction ran on each job's share. The reconstruct record is the packed problem's, with
    ``packed_jobs``."""
    first = prepared[0]
    if any(not can_pack(first, p) for p in prepared[1:]):
        raise ConfigError("reconstruct_prepared: these attacks cannot share one problem (different attack configs, "
                          "models or analytic answers); reconstruct them one by one")
    captures = [c for p in prepared for c in p.captures]
    label_results = [result for p in prepared for result in p.label_results]
    matched = [f for p in prepared for f in p.matched]
    if captures:
        recs, rrec = reconstruct_stage(first.attack, captures, label_results, matched, first.inversions, callbacks,
                                       first.aux_images)
    else:  # every capture is silent
        recs, rrec = [], {"name": "reconstruct", "captures": 0, "skipped": True, "iterations": 0,
                          "why": "no capture shares a gradient", "seconds": 0.0, "cpu_seconds": 0.0}
    if len(prepared) > 1:
        rrec["packed_jobs"] = len(prepared)
    out, start = [], 0
    for p in prepared:
        p.reconstructions = list(recs[start:start + len(p.captures)])
        start += len(p.captures)
        after = run_stages(p, stages_after())
        warnings = sorted({w for r in p.reconstructions for w in r.history.get("warnings", [])})
        if p.silent:
            warnings.append(silent_warning(sorted(p.silent), len(p.captures) + len(p.silent)))
        label_results, features, mine = p.splice(p.reconstructions)
        out.append(AttackResult(label_results, p.label_kind, features, mine, [*p.stages, dict(rrec), *after],
                                warnings, p.job_captures))
    return out
