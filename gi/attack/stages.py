"""The label-first attack as a library: labels → features → reconstruction (docs/architecture.md "Data flow").

The stage functions read captures (and aux data), never truth; the oracle label mode alone reads truth, by request.
``gi run`` and ``gi attack CAPTURE`` call :func:`attack_stages` (or :func:`prepare_attack` then
:func:`reconstruct_prepared`, to pack several jobs into one problem); :func:`gi.attack.run` is the Python entry.

Every stage returns a record for ``metrics.json``'s ``stages``: ``{"name": "labels", "method": ..., "why": ...,
"seconds": ...}``, ``{"name": "features", ...}``, ``{"name": "reconstruct", "optimizer": ..., ...}``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from gi.analysis.verdict import AttackVerdict
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture, Truth
    from gi.label_result import LabelResult

log = logging.getLogger("gi.attack")


# --------------------------------------------------------------------------- the labels section
# One spelling in every command (docs/usage.md, "The labels section"): ``labels.method`` + ``labels.options`` for
# the one method an attack uses, ``labels.methods`` (+ ``labels.variants``) for the methods a table compares.
LABELS_DOC = 'docs/usage.md, "The labels section"'
RENAMED_LABEL_KEYS = {"methods": "labels.methods", "method_options": "labels.variants.NAME.options",
                      "variants": "labels.variants", "label_methods": "labels.methods"}


@dataclass
class LabelConfig:
    """``mode`` (a name of :data:`LABEL_MODES`): ``truth`` (oracle), ``recovered`` (``method`` of the label
    registry with its ``options``; soft labels are soft targets, counts become per-slot one-hot labels), ``hard``
    (one-hot labels of ``hard_method``, iDLG by default), ``joint`` (DLG: labels optimised with the images from a
    random start), ``recovered+joint`` (joint, initialised from ``method``'s labels). ``method: auto`` (the
    default) picks the method from the capture (:mod:`labels.auto`). The method and its options are checked at
    load (:func:`gi.core.names.check_label_call`). The attack's ``labels`` (fixed or joint) follows from ``mode``;
    methods that need auxiliary samples get the ``aux`` section's. ``device``: where label recovery runs
    (``cpu``, ``auto``, ``gpu``/``cuda``, ``cuda:N``; a GPU this machine lacks is refused at load). ``check``
    (``recovered`` and ``recovered+joint``): a FedSGD batch's counts are checked against the last layer's gradient
    and moved sample by sample where a neighbour explains it clearly better (:mod:`labels.slot_check`)."""

    mode: str = "recovered"
    method: str = "auto"
    hard_method: str = "idlg"
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    check: bool = True

    def __post_init__(self) -> None:
        from gi.core.devices import torch_device
        from gi.core.names import check_label_call

        torch_device(self.device, "labels.device")
        check_label_call(self.method, self.options, "labels.method")
        check_label_call(self.hard_method, {}, "labels.hard_method")


@dataclass
class LabelTable:
    """The label methods a table compares (``gi labels``; ``gi defend``'s label leakage has its own ``methods``):
    ``methods`` lists names of the label registry or of ``variants``; ``variants``: {name: {method: NAME, options:
    {...}}}, a method run with fixed options under its own row name (``method`` defaults to the name: a variant
    named after a method sets that method's options). Every name and option is checked at load."""

    methods: list[str] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError("labels.methods is empty; list label methods to compare, e.g. [idlg, yin]")
        check_table(self.methods, self.variants)

    def call(self, name: str) -> tuple[str, dict[str, Any]]:
        """The label method and options the ``methods`` entry ``name`` runs."""
        return variant_call(self.variants, name)


def variant_call(variants: dict[str, dict[str, Any]], name: str) -> tuple[str, dict[str, Any]]:
    """The label method and options of table entry ``name``: a variant's (method, options), else (name, {})."""
    spec = variants.get(name, {})
    return spec.get("method", name), dict(spec.get("options", {}))


def check_table(methods: list[str], variants: dict[str, dict[str, Any]]) -> None:
    """One-line ConfigErrors, before any work, for ``labels.variants`` specs that are not ``{method, options}`` of
    a known method and the options it takes, a variant named after another method, a ``labels.methods`` entry
    that is neither a method nor a variant, and a variant no entry runs."""
    from gi.core.names import check_label_call, known

    registry = known("label method")
    for name, spec in variants.items():
        where = f"labels.variants.{name}"
        if not isinstance(spec, dict) or set(spec) - {"method", "options"}:
            raise ConfigError(f"{where} must be {{method: NAME, options: {{...}}}}, got {spec!r}")
        method = spec.get("method", name)
        if name in registry and method != name:
            raise ConfigError(f"{where}: {name!r} is a label method; a variant named after a method only sets its "
                              f"options: give this variant another name")
        if name not in registry and "method" not in spec:
            raise ConfigError(f"{where}: {name!r} is not a label method; give the variant's method: {{method: NAME}}")
        check_label_call(method, spec.get("options", {}), f"{where}.method")
    unknown = [m for m in methods if m not in registry and m not in variants]
    if unknown:
        raise ConfigError(f"labels.methods has unknown label method(s) {unknown}; valid: {registry} or a name in "
                          f"labels.variants ({sorted(variants)})")
    unused = sorted(set(variants) - set(methods))
    if unused:
        raise ConfigError(f"labels.variants {unused} are not in labels.methods; list them there or leave them out")


def _truth_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    if truth is None:
        raise ConfigError("labels.mode=truth needs the ground truth: gi attack reads it from truth=FILE; or use "
                          "labels.mode=recovered")
    return oracle_labels(truth)


def _recovered_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    """The method's labels; with ``check``, counts checked against the last layer's gradient and moved sample by
    sample where a neighbour explains it clearly better (:func:`labels.slot_check.check_counts`)."""
    import labels
    from labels.slot_check import check_counts

    result = labels.recover(capture, lcfg.method, aux=aux, device=lcfg.device, **lcfg.options)
    return check_counts(capture, result) if lcfg.check else result


def _hard_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    """iDLG-style one-hot labels: the counts of ``hard_method`` (its soft labels, if any, become their argmax)."""
    import torch

    import labels
    from gi.label_result import LabelResult

    result = labels.recover(capture, lcfg.hard_method, aux=aux, device=lcfg.device)
    counts = result.counts if result.soft is None else torch.bincount(result.soft.argmax(1),
                                                                      minlength=capture.num_classes)
    return LabelResult.from_counts(f"hard:{result.method}", counts, ok=result.ok, info=dict(result.info))


def _no_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    return None


@dataclass(frozen=True)
class LabelMode:
    """A label-knowledge mode: where its labels come from (``labels(lcfg, capture, truth, aux)`` → LabelResult or
    None; only the oracle reads ``truth``) and whether the attack keeps them ``fixed`` or optimises them
    ``joint``ly (DLG)."""

    labels: Callable[[LabelConfig, Capture, Any, Any], Any]
    kind: str


LABEL_MODES: dict[str, LabelMode] = {
    "truth": LabelMode(_truth_labels, "fixed"),
    "recovered": LabelMode(_recovered_labels, "fixed"),
    "hard": LabelMode(_hard_labels, "fixed"),
    "joint": LabelMode(_no_labels, "joint"),
    "recovered+joint": LabelMode(_recovered_labels, "joint"),
}


def oracle_labels(truth: Truth) -> LabelResult:
    """The LabelResult an oracle would return: true soft targets and counts (scoring/ablation only)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts("truth", truth.counts, soft=truth.targets.clone(), info={"oracle": True})


def attack_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None,
                  aux: Any = None) -> tuple[LabelResult | None, str]:
    """The label knowledge of ``lcfg.mode``: ``(LabelResult or None, "fixed" | "joint")``."""
    mode = LABEL_MODES[lcfg.mode]
    return mode.labels(lcfg, capture, truth, aux), mode.kind


def derived_attack(lcfg: LabelConfig, attack: ReconConfig) -> ReconConfig:
    """``attack`` with its ``labels`` (fixed or joint) set by ``lcfg.mode`` (a ConfigError for an unknown mode).
    ``feature_weight`` is kept: :func:`gi.attack.recon.problem.build_problem` drops the term, with a warning, for
    captures without a target f* (DLG's joint labels give one only where it is label-free)."""
    if lcfg.mode not in LABEL_MODES:
        raise ConfigError(f"labels.mode={lcfg.mode!r} is not allowed; valid: {list(LABEL_MODES)}")
    kind = LABEL_MODES[lcfg.mode].kind
    if attack.labels != kind:
        attack = dataclasses.replace(attack, labels=kind)
    return attack


@dataclass
class AttackResult:
    """What the attack stages produced for N captures: the label results (None per capture for joint labels from
    a random start), the label kind, the feature targets used (None when not matched), one Reconstruction per
    capture, the stage records, the warnings and the captures attacked (in the same order). :attr:`verdict` is
    what the attack says of itself without truth (docs/usage.md, "Verdict")."""

    label_results: list[LabelResult | None]
    label_kind: str
    features: list[torch.Tensor | None]
    reconstructions: list[Reconstruction]
    stages: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)

    @property
    def verdict(self) -> AttackVerdict:
        """The verdict without truth (:class:`gi.analysis.verdict.AttackVerdict`): per capture the mismatch
        verdict of each reconstruction's ``history["gradient_mismatch"]`` (the shared update's for update
        captures), the feature record where the features stage measured its target (``target_residual``), and
        the labels each reconstruction slot carries (None for a capture that shares nothing). Its ``record`` is
        ``metrics.json``'s ``verdict`` of ``gi attack`` without truth."""
        from gi.analysis.verdict import AttackVerdict, feature_summary, mismatch_summary

        recs = self.reconstructions
        what = "update" if self.captures and self.captures[0].is_update else "gradient"
        stage = next((s for s in self.stages if s.get("name") == "features" and "target_residual" in s), None)
        features = None if stage is None else feature_summary(
            stage["feature_layer"], stage["target_residual"], [r.history.get("feature_mismatch") for r in recs])
        silent = [bool(self.captures) and self.captures[k].silent for k in range(len(recs))]
        labels = [None if quiet else [int(c) for c in r.labels.argmax(1)] for r, quiet in zip(recs, silent)]
        return AttackVerdict(mismatch_summary([mismatch_of(r) for r in recs], what), features, labels)


def mismatch_of(rec: Reconstruction) -> float:
    """A reconstruction's relative mismatch of the shared tensors, ``history["gradient_mismatch"]`` (NaN when it
    was not computed)."""
    value = rec.history.get("gradient_mismatch")
    return float("nan") if value is None else float(value)


def label_stage(lcfg: LabelConfig, captures: Sequence[Capture], truths: Sequence[Truth | None], aux: Any
                ) -> tuple[list[LabelResult | None], str, dict[str, Any]]:
    """The label stage over every capture: its results, the label kind and its stage record (method, why)."""
    start, cpu = time.perf_counter(), time.process_time()
    results = [attack_labels(lcfg, c, t, aux)[0] for c, t in zip(captures, truths)]
    kind = LABEL_MODES[lcfg.mode].kind
    seconds = time.perf_counter() - start
    methods = sorted({r.method for r in results if r is not None}) or (["joint"] if kind == "joint" else [None])
    whys = sorted({r.info.get("why") for r in results if r is not None and r.info.get("why")})
    record = {"name": "labels", "mode": lcfg.mode, "method": methods[0] if len(methods) == 1 else methods,
              "picked_by": lcfg.method if lcfg.method == "auto" and lcfg.mode in ("recovered", "recovered+joint")
              else None, "why": whys[0] if len(whys) == 1 else (whys or None),
              "ok": all(r.ok for r in results if r is not None), "seconds": seconds,
              "cpu_seconds": time.process_time() - cpu}
    checks = [r.info["gradient_check"] for r in results if r is not None and r.info.get("gradient_check", {}).get(
        "applied")]
    if checks:
        record["gradient_check"] = {"checked": len(checks), "changed": sum(bool(c["moved"]) for c in checks),
                                    "samples_moved": sum(len(c["moved"]) for c in checks),
                                    "cpu_seconds": sum(c["seconds"] for c in checks)}
    log.info("labels: %s%s (%.2f s)", record["method"], f" ({record['why']})" if record["why"] else "", seconds)
    if checks:
        log.info("labels: counts of %d capture(s) checked against the last layer's gradient; %d changed (%d "
                 "sample(s) moved)", len(checks), record["gradient_check"]["changed"],
                 record["gradient_check"]["samples_moved"])
    return results, kind, record


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
        from gi.attack.recon.problem import resolve_feature_layer

        layer = resolve_feature_layer(captures[0], layer)  # first-linear builds the model: resolved once here
        source = (f"inputs of {layer} per slot "
                  "(fcn_analytic.disaggregate.linear_inputs, ordered by their labels)")
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
             "residual": [inv.layers[k].residual if k < len(inv.layers) else None for inv in inversions],
             "forward": [inv.layers[k].forward_error if k < len(inv.layers) else None for inv in inversions]}
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
    None: the last layer). Small is necessary for f* to be the samples' own features (docs/usage.md, "Verdict")."""
    from fcn_analytic.disaggregate import factor_residual

    layer = layer or captures[0].last_layer_name
    residuals: list[float | None] = []
    for capture, target in zip(captures, features):
        gw, gb = capture.shared.get(f"{layer}.weight"), capture.shared.get(f"{layer}.bias")
        fits = target is not None and gw is not None and gw.dim() == 2 and target.shape[-1] == gw.shape[1]
        residuals.append(factor_residual(gw, gb, target.reshape(-1, gw.shape[1])) if fits else None)
    return {"feature_layer": layer, "target_residual": residuals}


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
        warm = [i for i in rest if residuals[i] is not None and residuals[i] < INIT_MAX_RESIDUAL]
        cold = [i for i in rest if i not in warm]
        if warm:
            record["init"] = (f"analytic for {len(warm)} capture(s) (fcn_analytic.invert, residual "
                              f"{min(residuals[i] for i in warm):.1e} or more >= attack.analytic_tol "
                              f"{attack.analytic_tol:g})")
        if cold and inversions:
            record["init_not_analytic"] = (f"{len(cold)} capture(s): residual >= {INIT_MAX_RESIDUAL:g}, the "
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
    matched = attack.feature_weight > 0 and any(f is not None for f in features)
    layer = None
    if matched:
        from gi.attack.recon.problem import resolve_feature_layer

        layer = resolve_feature_layer(captures[0], attack.feature_layer_name)  # once: first-linear builds the model
    record_mismatch(captures, recs, features if matched else None, layer)
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
                    features: Sequence[torch.Tensor | None] | None = None, layer: str | None = None) -> None:
    """Each reconstruction's final relative mismatch of the shared tensors, ``history["gradient_mismatch"]``
    (:func:`gi.attack.recon.mismatch.shared_mismatch`: the final images and labels through the simulator the
    objective uses; for an update capture, the update's): the attack's own verdict signal (docs/usage.md,
    "Verdict"). ``features``: the f* the fit matched (with ``layer``, the resolved module name they are the inputs
    of, None for the last layer), and then also ``history["feature_mismatch"]``
    (:func:`gi.attack.recon.mismatch.feature_mismatch`) where a capture has one.
    The model is rebuilt once per run of captures of one global model."""
    from gi.attack.recon.mismatch import feature_mismatch, shared_mismatch
    from gi.attack.recon.problem import same_model

    owner, model = None, None
    for k, (capture, rec) in enumerate(zip(captures, recs)):
        target = features[k] if features is not None else None
        if "gradient_mismatch" in rec.history and (target is None or "feature_mismatch" in rec.history):
            continue  # measured already (attack.alternatives chose by it)
        if owner is None or not same_model(owner, capture):
            owner, model = capture, capture.model()
        if "gradient_mismatch" not in rec.history:
            rec.history["gradient_mismatch"] = shared_mismatch(capture, rec.images, rec.labels,
                                                               rec.history.get("output_error", "simulated"), model)
        if target is not None:
            rec.history["feature_mismatch"] = feature_mismatch(capture, rec.images, target, layer, model)


# an inversion whose largest layer residual is at or above this is not used as a start either: rank-deficient
# layers (a ReLU LeNet's dead units) gave residuals of 0.46–40 and 4.7–5.5 dB images, below a random image's 8 dB,
# where gradient noise of 1e-2 of each gradient's std gave 0.11–0.12 and 13–18 dB (research/analytic_noise.py)
INIT_MAX_RESIDUAL = 0.3


def unusable_above(attack: ReconConfig) -> float:
    """The largest layer residual at or above which an inversion is neither the answer (``attack.analytic_tol``)
    nor the start (:data:`INIT_MAX_RESIDUAL`) of :func:`reconstruct_stage`: the features stage stops its walk there."""
    return max(INIT_MAX_RESIDUAL, attack.analytic_tol)


def inversion_residual(inversion: Any) -> float:
    """The largest relative residual of an ``fcn_analytic.invert`` result over its layers: each layer's gradient
    residual (rank-one for a Linear layer, the weight gradient's for a convolution) and its forward mismatch
    (0 up to rounding when the inversion is exact)."""
    from fcn_analytic import layer_error

    return max(layer_error(r) for r in inversion.layers)


def answers(attack: ReconConfig, residual: float | None) -> bool:
    """Whether an inversion of largest layer residual ``residual`` (None: no inversion) is the capture's answer
    (below ``attack.analytic_tol``): :func:`reconstruct_stage` optimises the other captures."""
    return residual is not None and residual < attack.analytic_tol


def analytic_reconstruction(inversion: Any, label_result: LabelResult | None, capture: Capture) -> Reconstruction:
    """A :class:`~gi.attack.recon.Reconstruction` holding ``fcn_analytic.invert``'s image (no optimisation)."""
    import torch

    from gi.attack.recon import Reconstruction
    from gi.attack.recon.problem import labels_for_slots

    image = inversion.image.float()
    soft = labels_for_slots(label_result, capture.num_samples, capture.num_classes)
    residual = inversion_residual(inversion)
    return Reconstruction(images=image, all_images=image[None], labels=soft,
                          objective=torch.tensor([residual]), best_restart=0,
                          history={"step": [], "objective": [], "warnings": [], "answered_by": "analytic inversion",
                                   "analytic_residual": residual},
                          seconds=float(inversion.info["seconds"]), iterations=0, all_labels=soft[None])


@dataclass
class PreparedAttack:
    """The attack stages of N captures up to the reconstruction: the labels and features are done, ``attack`` is
    the attack config with the label kind applied (:func:`prepare_attack`)."""

    attack: ReconConfig
    captures: list[Capture]
    label_results: list[LabelResult | None]
    label_kind: str
    matched: list[torch.Tensor | None]
    inversions: list[Any] | None
    stages: list[dict[str, Any]]
    silent: dict[int, Capture] = field(default_factory=dict)  # position among the job's captures -> a capture
    # that shares an all-zero gradient (:attr:`gi.capture.Capture.silent`): kept out of every stage
    aux_images: torch.Tensor | None = None  # the attacker's aux images (the aux-span prior's), if any

    def splice(self, recs: Sequence[Reconstruction]) -> tuple[list[LabelResult | None], list[torch.Tensor | None],
                                                               list[Reconstruction]]:
        """The label results, matched features and reconstructions of every capture in the job's order: the
        stages' (``recs`` for :attr:`captures`) with :func:`silent_labels` / :func:`silent_reconstruction` at the
        :attr:`silent` positions."""
        label_results, matched, out = list(self.label_results), list(self.matched), list(recs)
        for i in sorted(self.silent):
            label_results.insert(i, silent_labels(self.silent[i]))
            matched.insert(i, None)
            out.insert(i, silent_reconstruction(self.silent[i]))
        return label_results, matched, out

    @property
    def job_captures(self) -> list[Capture]:
        """Every capture of the job in its order: :attr:`captures` with the :attr:`silent` ones put back."""
        out = list(self.captures)
        for i in sorted(self.silent):
            out.insert(i, self.silent[i])
        return out

    @property
    def optimises(self) -> bool:
        """Whether its reconstruct stage optimises a capture (one that its analytic inversion does not answer,
        :func:`answers`); otherwise the stage runs no fit (and needs no Lightning)."""
        if not self.inversions:
            return bool(self.captures)
        return not all(answers(self.attack, inversion_residual(inv)) for inv in self.inversions)


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
    """labels → features over ``captures``: everything of :func:`attack_stages` but the reconstruction. A capture
    whose shared tensors are all zero (:attr:`gi.capture.Capture.silent`) goes through no stage: it is answered
    by :func:`silent_reconstruction` (a flat grey guess, scored as such) instead of stopping the job."""
    truths = list(truths) if truths is not None else [None] * len(captures)
    silent = {i: c for i, c in enumerate(captures) if c.silent}
    live = [i for i in range(len(captures)) if i not in silent]
    captures, truths = [captures[i] for i in live], [truths[i] for i in live]
    check_models(captures)
    label_results, kind, lrec = label_stage(lcfg, captures, truths, aux)
    if attack.labels != kind:
        attack = dataclasses.replace(attack, labels=kind)
    features, inversions, frec = feature_stage(attack, captures, label_results)
    matched = features if attack.feature_weight > 0 else [None] * len(captures)
    if silent:
        lrec["silent_captures"] = sorted(silent)
        log.warning("%s", silent_warning(sorted(silent), len(live) + len(silent)))
    return PreparedAttack(attack, captures, label_results, kind, matched, inversions, [lrec, frec], silent,
                          getattr(aux, "images", None))


SILENT_WHY = ("its shared tensors are all zero (the client's loss had no gradient, e.g. the net already predicts "
              "the true class with softmax 1.0): it carries no label or image information")


def silent_warning(positions: Sequence[int], total: int) -> str:
    """The warning of a run with captures that share nothing (:attr:`gi.capture.Capture.silent`)."""
    which = ", ".join(str(i) for i in positions)
    return (f"{len(positions)} of {total} capture(s) ({which}) not attacked: {SILENT_WHY}; each is answered by a "
            "flat grey image and uniform labels, scored as not recovered")


def silent_labels(capture: Capture) -> LabelResult:
    """The label result of a capture that shares nothing: no counts, ``ok=False``, the reason in ``info``."""
    import torch

    from gi.label_result import LabelResult

    return LabelResult.from_counts("none", torch.zeros(capture.num_classes, dtype=torch.long), ok=False,
                                   info={"reason": SILENT_WHY})


def silent_reconstruction(capture: Capture) -> Reconstruction:
    """The answer for a capture that shares nothing: a flat grey image (0.5) per image slot and uniform soft labels,
    what one knows without a capture; its ``gradient_mismatch`` is NaN (there is no gradient to explain)."""
    import torch

    from gi.attack.recon import Reconstruction
    from gi.attack.recon.problem import image_slots

    shape = (image_slots(capture), *(int(s) for s in capture.model_spec["in_shape"]))
    image = torch.full(shape, 0.5)
    soft = torch.full((shape[0], capture.num_classes), 1.0 / capture.num_classes)
    return Reconstruction(images=image, all_images=image[None], labels=soft, objective=torch.tensor([float("nan")]),
                          best_restart=0, history={"step": [], "objective": [], "warnings": [],
                                                   "answered_by": "nothing (all-zero gradient)",
                                                   "gradient_mismatch": float("nan")},
                          seconds=0.0, iterations=0, all_labels=soft[None])


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
    as one packed problem), split back into one :class:`AttackResult` each. The reconstruct record
    is the packed problem's, with ``packed_jobs``."""
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
        mine = recs[start:start + len(p.captures)]
        start += len(p.captures)
        warnings = sorted({w for r in mine for w in r.history.get("warnings", [])})
        if p.silent:
            warnings.append(silent_warning(sorted(p.silent), len(p.captures) + len(p.silent)))
        label_results, features, mine = p.splice(mine)
        out.append(AttackResult(label_results, p.label_kind, features, mine, [*p.stages, dict(rrec)], warnings,
                                p.job_captures))
    return out


def final_counts(rec: Reconstruction) -> torch.Tensor:
    import torch

    return torch.bincount(rec.labels.argmax(1), minlength=rec.labels.shape[1])


def used_labels(rec: Reconstruction, mode: str) -> LabelResult:
    """The labels the reconstruction ended with, as a LabelResult (soft rows and their argmax counts)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts(mode, final_counts(rec), soft=rec.labels.double())
