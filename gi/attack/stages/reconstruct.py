"""The reconstruct stage (docs/architecture.md "Data flow"): every capture of one or several packed jobs as one
batched problem (:func:`gi.attack.recon.reconstruct_many`), answered by the analytic inversion where it is
consistent and otherwise optimised (from it where it is a start), with ``attack.alternatives`` chosen by the
attack's own mismatch. It is the pipeline's pivot (:func:`gi.attack.stages.pipeline.reconstruct_prepared`), not a
registered per-job stage: registered stages run before it on each job or after it on each job's share."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gi.analysis.verdict import evidence_kind
from gi.attack.recon.config import ReconConfig
from gi.attack.stages import analytic
from gi.attack.stages.analytic import analytic_reconstruction, answers, inversion_residual

if TYPE_CHECKING:
    import torch

    from gi.attack.recon import Reconstruction
    from gi.capture import Capture
    from gi.label_result import LabelResult

log = logging.getLogger("gi.attack")


def reconstruct_stage(attack: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None],
                      features: Sequence[torch.Tensor | None], inversions: list[Any] | None,
                      callbacks: Sequence[Any] = (), aux_images: torch.Tensor | None = None
                      ) -> tuple[list[Reconstruction], dict[str, Any]]:
    """Reconstruct every capture as one batched problem (:func:`gi.attack.recon.reconstruct_many`); captures whose
    analytic inversion is consistent (largest layer residual below ``attack.analytic_tol``) are answered
    directly, otherwise the optimisation starts from it. ``aux_images``: the attacker's aux images, for the
    ``aux-span`` prior."""
    start, cpu = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"name": "reconstruct", "optimizer": attack.optimizer, "objective": attack.objective,
                              "preset": attack.preset, "iterations": attack.iterations, "restarts": attack.restarts,
                              "captures": len(captures)}
    residuals = [inversion_residual(inv) for inv in inversions] if inversions else [None] * len(captures)
    direct = [i for i, r in enumerate(residuals) if answers(attack, r)]
    rest = [i for i in range(len(captures)) if i not in direct]
    recs: list[Any] = [None] * len(captures)
    for i in direct:
        recs[i] = analytic_reconstruction(inversions[i], label_results[i], captures[i])
    if direct:
        worst = max(residuals[i] for i in direct)
        record.update(analytic_captures=len(direct),
                      why=f"analytic inversion of {len(direct)} capture(s), largest layer residual {worst:.1e} < "
                          f"attack.analytic_tol ({attack.analytic_tol:g})")
    if not rest:
        record.update(optimizer="analytic (fcn_analytic.invert)", iterations=0, restarts=0, skipped=True)
    else:
        warm = [i for i in rest if residuals[i] is not None and residuals[i] < analytic.INIT_MAX_RESIDUAL]
        cold = [i for i in rest if i not in warm]
        if warm:
            record["init"] = (f"analytic for {len(warm)} capture(s) (fcn_analytic.invert, residual "
                              f"{min(residuals[i] for i in warm):.1e} or more >= attack.analytic_tol "
                              f"{attack.analytic_tol:g})")
        if cold and inversions:
            record["init_not_analytic"] = (f"{len(cold)} capture(s): residual >= "
                                           f"{analytic.INIT_MAX_RESIDUAL:g}, the "
                                           f"inversion is no start (attack.init={attack.init})")
        chosen = [0] * len(rest)
        for k in range(len(attack.alternatives) + 1):  # the base settings, then each alternative
            if k:
                log.info("reconstruct: alternative %d of %d (%s)", k, len(attack.alternatives),
                         attack.alternatives[k - 1])
            fits = fit_alternative(attack.alternative(k), captures, label_results, features, inversions,
                                   residuals, warm, cold, callbacks, aux_images)
            if attack.alternatives:
                record_mismatch([captures[i] for i in rest], [fits[i] for i in rest])  # chooses by the gradient
            for j, i in enumerate(rest):  # keep the fit that explains the capture best (its own signal)
                if recs[i] is None or lower_mismatch(fits[i], recs[i]):
                    recs[i], chosen[j] = fits[i], k
        if attack.alternatives:
            for j, i in enumerate(rest):
                recs[i].history["alternative"] = chosen[j]
            record["alternatives"] = {"fits": len(attack.alternatives) + 1,
                                      "chosen": [chosen.count(k) for k in range(len(attack.alternatives) + 1)]}
    for i, rec in enumerate(recs):  # what the capture says of it depends on how it was reached (the verdict)
        fit = attack.alternative(rec.history.get("alternative", 0)) if i in rest else attack
        rec.history["evidence"] = evidence_kind(i in direct, fit.match_weight > 0, captures[i].is_update,
                                                fit.objective)
    matched = attack.feature_weight > 0 and any(f is not None for f in features)
    layer = None
    if matched:
        from gi.attack.recon.problem import resolve_feature_layer

        layer = resolve_feature_layer(captures[0], attack.feature_layer_name)  # once: first-linear builds the model
    record_mismatch(captures, recs, features if matched else None, layer, slots=True)
    used = sorted({r.history["output_error"] for r in recs if "output_error" in r.history})
    if used:  # attack.output_error as resolved (auto: captured where the capture gives ∂L/∂z)
        record["output_error"] = used[0] if len(used) == 1 else used
    record["seconds"] = time.perf_counter() - start
    record["cpu_seconds"] = time.process_time() - cpu  # this process's CPU time: on a loaded machine, the work
    log.info("reconstruct: %s, %d capture(s)%s in %.1f s", record["optimizer"], len(captures),
             f" ({len(direct)} answered by the analytic inversion)" if direct and rest else "", record["seconds"])
    return recs, record


def fit_alternative(cfg: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None],
                    features: Sequence[torch.Tensor | None], inversions: list[Any] | None,
                    residuals: Sequence[float | None], warm: Sequence[int], cold: Sequence[int],
                    callbacks: Sequence[Any] = (), aux_images: torch.Tensor | None = None) -> dict[int, Reconstruction]:
    """One fit (:func:`gi.attack.recon.reconstruct_many`) of the captures ``warm`` (started from their analytic
    inversion) and ``cold`` (from ``cfg.init``), by index; each reconstruction's history says how it was answered.
    A feature term without a target is dropped by ``build_problem``, which warns (one rule)."""
    from gi.attack.recon import reconstruct_many  # Lightning loads here, when a capture is optimised

    out: dict[int, Reconstruction] = {}
    for group, init in ((list(warm), "analytic"), (list(cold), cfg.init)):
        if not group:
            continue
        fits = reconstruct_many([captures[i] for i in group], [label_results[i] for i in group],
                                [features[i] for i in group], dataclasses.replace(cfg, init=init), callbacks,
                                priors=[inversions[i].image for i in group] if init == "analytic" and inversions
                                else None, ids=group, aux_images=aux_images)
        for i, rec in zip(group, fits):
            out[i] = rec
            if residuals[i] is not None:
                rec.history.update(answered_by="optimised from the analytic inversion" if init == "analytic"
                                   else "optimisation", analytic_residual=residuals[i])
    return out


def lower_mismatch(a: Reconstruction, b: Reconstruction) -> bool:
    """Whether ``a`` explains its capture strictly better than ``b`` (``history["gradient_mismatch"]``; NaN or a
    missing one counts as +∞, so it never wins)."""
    def value(rec: Reconstruction) -> float:
        m = rec.history.get("gradient_mismatch")
        return float("inf") if m is None or m != m else float(m)

    return value(a) < value(b)


def record_mismatch(captures: Sequence[Capture], recs: Sequence[Reconstruction],
                    features: Sequence[torch.Tensor | None] | None = None, layer: str | None = None,
                    slots: bool = False) -> None:
    """Each reconstruction's final relative mismatch of the shared tensors, ``history["gradient_mismatch"]``
    (:func:`gi.attack.recon.mismatch.shared_mismatch`: the final images and labels through the simulator the
    objective uses; for an update capture, the update's): the attack's own verdict signal (docs/usage.md,
    "Verdict"). ``features``: the f* the fit matched (with ``layer``, the resolved module name they are the inputs
    of, None for the last layer), and then also ``history["feature_mismatch"]`` and, per slot,
    ``history["slot_feature_mismatch"]`` (:func:`gi.attack.recon.mismatch.feature_mismatches`) where a capture has
    one. ``slots`` (the final reconstructions): also ``history["slot_swap_distance"]`` where the capture can be
    re-simulated (:func:`gi.attack.recon.mismatch.slot_swap_distances`: how far the share moves with each slot's
    image replaced by its mean colour; the per-image verdict without truth), and where features were matched
    ``history["slot_feature_swap"]`` (:func:`gi.attack.recon.mismatch.feature_swap_mismatches`: each slot's
    feature mismatch had it held its mean colour).
    The model is rebuilt once per run of captures of one global model."""
    from gi.attack.recon.mismatch import (
        feature_mismatches,
        feature_swap_mismatches,
        shared_mismatch,
        slot_swap_distances,
    )
    from gi.attack.recon.problem import same_model
    from gi.world.fl.local import order_known

    owner, model = None, None
    for k, (capture, rec) in enumerate(zip(captures, recs)):
        target = features[k] if features is not None else None
        swap = slots and "slot_swap_distance" not in rec.history and order_known(capture.protocol,
                                                                               capture.num_samples)
        feature_swap = slots and target is not None and "slot_feature_swap" not in rec.history
        if ("gradient_mismatch" in rec.history and (target is None or "slot_feature_mismatch" in rec.history)
                and not swap and not feature_swap):
            continue  # measured already (attack.alternatives chose by it)
        if owner is None or not same_model(owner, capture):
            owner, model = capture, capture.model()
        if "gradient_mismatch" not in rec.history:
            rec.history["gradient_mismatch"] = shared_mismatch(capture, rec.images, rec.labels,
                                                               rec.history.get("output_error", "simulated"), model)
        if target is not None and "slot_feature_mismatch" not in rec.history:
            rec.history["feature_mismatch"], rec.history["slot_feature_mismatch"] = feature_mismatches(
                capture, rec.images, target, layer, model)
        if feature_swap:
            rec.history["slot_feature_swap"] = feature_swap_mismatches(capture, rec.images, target, layer, model)
        if swap:
            rec.history["slot_swap_distance"] = slot_swap_distances(
                capture, rec.images, rec.labels, rec.history.get("output_error", "simulated"), model)
