"""The features stage (docs/architecture.md "Data flow"): the last-layer (or a named layer's) feature targets f*
of eq. 8 and, where it covers the net, ``fcn_analytic.invert``'s analytic inversion; registered after the labels."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages.analytic import inversion_residual, unusable_above
from gi.attack.stages.base import FEATURES, register_stage

if TYPE_CHECKING:
    import torch

    from gi.attack.stages.base import PreparedAttack
    from gi.capture import Capture
    from gi.label_result import LabelResult

log = logging.getLogger("gi.attack")


def feature_stage(attack: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None]
                  ) -> tuple[list[torch.Tensor | None], list[Any] | None, dict[str, Any]]:
    """The feature stage: f* of eq. 8 per capture when the labels give it (one sample; a batch with a last-layer
    bias: :func:`gi.attack.recon.problem.feature_targets`), and ``fcn_analytic.invert``'s image wherever it applies
    (one FedSGD sample of a fully-connected net, or of a conv body with invertible activations such as the DLG
    LeNet). Returns the features (None each when not all captures have them), the inversions (None unless every
    capture inverts) and the stage record."""

    from fcn_analytic import invert
    from gi.attack.recon.problem import capture_features
    from gi.core.errors import GIError

    start, cpu = time.perf_counter(), time.process_time()
    features = capture_features(attack, captures, label_results)
    layer = attack.feature_layer_name if attack.feature_weight > 0 else None
    available = bool(features) and all(f is not None for f in features)
    source = None
    if available and layer is not None:
        from gi.attack.recon.problem import drifting_layer, input_search, resolve_feature_layer

        layer = resolve_feature_layer(captures[0], layer)  # first-linear builds the model: resolved once here
        refresh = (f"refreshed from the images' zeros every {attack.feature_refresh} steps" if attack.feature_refresh
                   else "not refreshed: attack.feature_refresh=0")
        searched = input_search(captures[0], layer) or ("linear_inputs", None)
        how = (f"drifting_inputs: approximate over several local epochs, {refresh}"
               if drifting_layer(captures[0], layer) is not None
               else searched[0] + ("" if searched[1] is None else f", sure of {searched[1]} of "
                                                                    f"{features[0].shape[0]} rows"))
        source = f"inputs of {layer} per slot (fcn_analytic.disaggregate.{how}, ordered by their labels)"

    elif available:
        from gi.attack.recon.problem import last_layer_source

        source = last_layer_source(attack, captures, label_results)
    evidence = feature_evidence(captures, features, layer) if available and attack.feature_weight > 0 else {}
    inversions: list[Any] | None = [] if attack.analytic else None
    for c, label_result in zip(captures, label_results):  # joint labels (None): the DLG baseline, no analytic stage
        if label_result is None or c.num_samples != 1 or c.is_update or inversions is None:
            inversions = None
            break
        try:  # an inversion that breaks the bound is neither answer nor start: the layers below are not solved
            inversions.append(invert(c, label_result, stop_above=unusable_above(attack)))
        except GIError:
            inversions = None
    residual = None
    if inversions:
        residual = max(inversion_residual(inv) for inv in inversions)
    record = {"name": "features", "available": available, "source": source,
              "matched": available and attack.feature_weight > 0, "beta": attack.feature_weight,
              "alpha": attack.last_layer_weight, "analytic_inversion": inversions is not None and bool(inversions),
              "analytic_residual": residual, **evidence, "seconds": time.perf_counter() - start,
              "cpu_seconds": time.process_time() - cpu}
    if inversions:  # per layer (last first), per capture: how it was solved and how consistent it came out
        deepest = max(inversions, key=lambda inv: len(inv.layers))  # a stopped inversion reports fewer layers
        record["analytic_layers"] = [
            {"name": layer.name, "route": layer.route,
             "routes": [inv.layers[k].route if k < len(inv.layers) else None for inv in inversions],
             "residual": [inv.layers[k].residual if k < len(inv.layers) else None for inv in inversions],
             "forward": [inv.layers[k].forward_error if k < len(inv.layers) else None for inv in inversions],
             "prior_filled": [inv.layers[k].prior_filled if k < len(inv.layers) else None for inv in inversions],
             "free": [inv.layers[k].free if k < len(inv.layers) else None for inv in inversions],
             "unknowns": [inv.layers[k].rows if k < len(inv.layers) and inv.layers[k].prior_filled else None
                          for inv in inversions]}
            for k, layer in enumerate(deepest.layers)]
        stopped = [inv.info["stopped_at"] for inv in inversions if not inv.complete]
        if stopped:
            record["analytic_stopped"] = (f"{len(stopped)} capture(s) stopped at layer(s) "
                                          f"{', '.join(sorted(set(stopped)))}: residual >= "
                                          f"{unusable_above(attack):g}, neither answer nor "
                                          "start, so the layers below were not solved")
    if not attack.analytic:
        record["analytic_why_not"] = "attack.analytic=false"
    if not available:
        record["why_not"] = ("joint labels from a random start, an update, or a bias-free batch: no analytic "
                             "last-layer feature")
    log.info("features: %s%s%s (%.2f s)", source or "not available",
             f"; analytic inversion, residual {residual:.2e}" if residual is not None else "",
             f" ({record['analytic_stopped']})" if "analytic_stopped" in record else "", record["seconds"])
    return (features if available else [None] * len(captures)), (inversions or None), record


def feature_evidence(captures: Sequence[Capture], features: Sequence[torch.Tensor | None], layer: str | None
                     ) -> dict[str, Any]:
    """How well the matched feature targets f* explain the gradient of the layer they are the inputs of, per
    capture (:func:`fcn_analytic.disaggregate.factor_residual`: ∇W = Δᵀ f*, ∇b = Δᵀ 1 with the least-squares
    errors Δ; None where that layer's weight gradient is not shared): ``feature_layer`` (the module name) and
    ``target_residual``. ``layer``: the resolved module name (:func:`gi.attack.recon.problem.resolve_feature_layer`;
    None: the last layer). Small is necessary for f* to be the samples' own features (docs/usage.md, "Verdict"),
    not sufficient: any basis of the layer's row space explains its gradient, so ``target_sure`` says per capture
    ``[sure, rows]`` where the input search is sure of fewer than all its rows
    (:func:`gi.attack.recon.problem.input_search`; None: all, or not counted)."""
    from fcn_analytic.disaggregate import factor_residual
    from gi.attack.recon.problem import input_search

    layer = layer or captures[0].last_layer_name
    residuals: list[float | None] = []
    sure: list[list[int] | None] = []
    for capture, target in zip(captures, features):
        gw, gb = capture.shared.get(f"{layer}.weight"), capture.shared.get(f"{layer}.bias")
        fits = target is not None and gw is not None and gw.dim() == 2 and target.shape[-1] == gw.shape[1]
        residuals.append(factor_residual(gw, gb, target.reshape(-1, gw.shape[1])) if fits else None)
        searched = input_search(capture, layer) if fits and layer != capture.last_layer_name else None
        rows = 0 if target is None else target.reshape(-1, target.shape[-1]).shape[0]
        sure.append(None if searched is None or searched[1] is None or searched[1] >= rows else [searched[1], rows])
    return {"feature_layer": layer, "target_residual": residuals, "target_sure": sure}


@register_stage("features", FEATURES)
def run_feature_stage(job: PreparedAttack) -> dict[str, Any]:
    """:func:`feature_stage` on the job's captures and labels; sets the inversions and the features the
    reconstruction matches (``matched``: none when ``attack.feature_weight`` is 0)."""
    features, job.inversions, record = feature_stage(job.attack, job.captures, job.label_results)
    job.matched = features if job.attack.feature_weight > 0 else [None] * len(job.captures)
    return record
