"""The attack side of ``gi run`` and all of ``gi attack``: labels → features → reconstruction (issue 12).

docs/architecture.md, "Data flow": the stage functions here read captures (and aux data), never truth; the oracle
label mode alone reads truth, by request. ``gi run`` (:mod:`gi.experiments.pipeline`) makes captures from real
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gi.core.config import to_dict
from gi.core.errors import ConfigError
from gi.experiments.report import (
    check_run_name,
    save_caption_grid,
    save_line_plot,
    staged_output,
    write_csv,
    write_json,
    write_yaml,
)
from gi.recon.config import ReconConfig
from gi.recon.presets import DEFAULT, apply_preset
from gi.victim_setup import AuxConfig, DataConfig, load_config

if TYPE_CHECKING:
    import torch

    from gi.capture import Capture, Truth
    from gi.label_result import LabelResult
    from gi.recon import Reconstruction

log = logging.getLogger("gi.attack")


# --------------------------------------------------------------------------- label modes
@dataclass
class LabelConfig:
    """``mode`` (a name of :data:`LABEL_MODES`): ``truth`` (oracle), ``recovered`` (``method`` of the label
    registry; soft labels are soft targets, counts become per-slot one-hot labels), ``hard`` (one-hot labels of
    ``hard_method``, iDLG by default), ``joint`` (DLG: labels optimised with the images from a random start),
    ``recovered+joint`` (joint, initialised from ``method``'s labels). ``method: auto`` (the default) picks the
    method from the capture (:mod:`labels.auto`). The attack's ``labels`` (fixed or joint) follows from ``mode``;
    methods that need auxiliary samples get the ``aux`` section's. ``device``: where label recovery runs
    (``cpu``, ``auto``, ``gpu``/``cuda``, ``cuda:N``; a GPU this machine lacks is refused at load)."""

    mode: str = "recovered"
    method: str = "auto"
    hard_method: str = "idlg"
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"

    def __post_init__(self) -> None:
        from gi.core.devices import torch_device

        torch_device(self.device, "labels.device")


def _truth_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    if truth is None:
        raise ConfigError("labels.mode=truth needs the ground truth: gi attack reads it from truth=FILE; or use "
                          "labels.mode=recovered")
    return oracle_labels(truth)


def _recovered_labels(lcfg: LabelConfig, capture: Capture, truth: Truth | None, aux: Any) -> LabelResult | None:
    import labels

    return labels.recover(capture, lcfg.method, aux=aux, device=lcfg.device, **lcfg.options)


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
    """``attack`` with its ``labels`` (fixed or joint) set by ``lcfg.mode`` (a ConfigError for an unknown mode), and
    ``feature_weight`` 0 for a mode without labels (DLG's joint labels from a random start give no f*)."""
    if lcfg.mode not in LABEL_MODES:
        raise ConfigError(f"labels.mode={lcfg.mode!r} is not allowed; valid: {list(LABEL_MODES)}")
    kind = LABEL_MODES[lcfg.mode].kind
    if attack.labels != kind:
        attack = dataclasses.replace(attack, labels=kind)
    if LABEL_MODES[lcfg.mode].labels is _no_labels and attack.feature_weight > 0:
        attack = dataclasses.replace(attack, feature_weight=0.0)  # no labels, no last-layer features to match
    return attack


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


def with_preset(data: Any, default: str | None) -> Any:
    """A config mapping with its ``attack`` section filled from its preset (``attack.preset``, else ``default``)
    under the explicit keys (:func:`gi.recon.presets.apply_preset`; ``auto`` picks by the config's ``model.name``),
    after :func:`check_attack_labels`: the one loading step of every config with ``labels`` and ``attack`` sections
    (gi run, gi attack)."""
    check_attack_labels(data)
    if default is None and not (isinstance(data, dict) and isinstance(data.get("attack"), dict)
                                and "preset" in data["attack"]):
        return data
    data = dict(data or {})
    attack = data.get("attack")
    if attack is not None and not isinstance(attack, dict):
        return data  # the loader's type check names the problem
    model = data.get("model")
    data["attack"] = apply_preset(attack, default, model.get("name") if isinstance(model, dict) else None)
    return data


# --------------------------------------------------------------------------- stages
@dataclass
class AttackOutcome:
    """What the attack stages produced for N captures: the label results (None per capture for joint labels from
    a random start), the label kind, the feature targets used (None when not matched), one Reconstruction per
    capture and the stage records."""

    label_results: list[LabelResult | None]
    label_kind: str
    features: list[torch.Tensor | None]
    reconstructions: list[Reconstruction]
    stages: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def label_stage(lcfg: LabelConfig, captures: Sequence[Capture], truths: Sequence[Truth | None], aux: Any
                ) -> tuple[list[LabelResult | None], str, dict[str, Any]]:
    """The label stage over every capture: its results, the label kind and its stage record (method, why)."""
    start, cpu = time.perf_counter(), time.process_time()
    results, kinds = zip(*(attack_labels(lcfg, c, t, aux) for c, t in zip(captures, truths)))
    seconds = time.perf_counter() - start
    methods = sorted({r.method for r in results if r is not None}) or ["joint"]
    whys = sorted({r.info.get("why") for r in results if r is not None and r.info.get("why")})
    record = {"name": "labels", "mode": lcfg.mode, "method": methods[0] if len(methods) == 1 else methods,
              "picked_by": lcfg.method if lcfg.method == "auto" and lcfg.mode in ("recovered", "recovered+joint")
              else None, "why": whys[0] if len(whys) == 1 else (whys or None),
              "ok": all(r.ok for r in results if r is not None), "seconds": seconds,
              "cpu_seconds": time.process_time() - cpu}
    log.info("labels: %s%s (%.2f s)", record["method"], f" ({record['why']})" if record["why"] else "", seconds)
    return list(results), kinds[0], record


def feature_stage(attack: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None]
                  ) -> tuple[list[torch.Tensor | None], list[Any] | None, dict[str, Any]]:
    """The feature stage: f* of eq. 8 per capture when the labels give it (one sample; a batch with a last-layer
    bias: :func:`gi.recon.problem.feature_targets`), and ``fcn_analytic.invert``'s image wherever it applies
    (one FedSGD sample of a fully-connected net, or of a conv body with invertible activations such as the DLG
    LeNet). Returns the features (None each when not all captures have them), the inversions (None unless every
    capture inverts) and the stage record."""

    from fcn_analytic import invert
    from gi.core.errors import GIError
    from gi.recon.problem import feature_targets, labels_for_slots

    start, cpu = time.perf_counter(), time.process_time()
    features: list[torch.Tensor | None] = []
    for c, lr in zip(captures, label_results):
        if lr is None or c.is_update:
            features.append(None)
            continue
        soft = labels_for_slots(lr, c.num_samples, c.num_classes)
        features.append(feature_targets(c, lr, soft))
    available = bool(features) and all(f is not None for f in features)
    source = None
    if available:
        source = "last_layer_features" if captures[0].num_samples == 1 else "grad_W_c / grad_b_c per slot"
    inversions: list[Any] | None = [] if attack.analytic else None
    for c, lr in zip(captures, label_results):  # joint labels (lr None): the DLG baseline, no analytic stage
        if lr is None or c.num_samples != 1 or c.is_update or inversions is None:
            inversions = None
            break
        try:  # an inversion that breaks the bound is neither answer nor start: the layers below are not solved
            inversions.append(invert(c, lr, stop_above=unusable_above(attack)))
        except GIError:
            inversions = None
    residual = None
    if inversions:
        residual = max(inversion_residual(inv) for inv in inversions)
    record = {"name": "features", "available": available, "source": source,
              "matched": available and attack.feature_weight > 0, "beta": attack.feature_weight,
              "alpha": attack.last_layer_weight, "analytic_inversion": inversions is not None and bool(inversions),
              "analytic_residual": residual, "seconds": time.perf_counter() - start,
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


def reconstruct_stage(attack: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None],
                      features: Sequence[torch.Tensor | None], inversions: list[Any] | None,
                      callbacks: Sequence[Any] = ()) -> tuple[list[Reconstruction], dict[str, Any]]:
    """Reconstruct every capture as one batched problem (:func:`gi.recon.reconstruct_many`); captures whose
    analytic inversion is consistent (largest layer residual below ``attack.analytic_tol``) are answered
    directly, otherwise the optimisation starts from it."""
    from gi.recon import reconstruct_many

    start, cpu = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"name": "reconstruct", "optimizer": attack.optimizer, "objective": attack.objective,
                              "preset": attack.preset, "iterations": attack.iterations, "restarts": attack.restarts,
                              "captures": len(captures)}
    residuals = [inversion_residual(inv) for inv in inversions] if inversions else [None] * len(captures)
    direct = [i for i, r in enumerate(residuals) if r is not None and r < attack.analytic_tol]
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
        cfg = attack
        if features[0] is None and cfg.feature_weight > 0:
            cfg = dataclasses.replace(cfg, feature_weight=0.0)
            record["feature_weight"] = "0 (no features available)"
        warm = [i for i in rest if residuals[i] is not None and residuals[i] < INIT_MAX_RESIDUAL]
        cold = [i for i in rest if i not in warm]
        if warm:
            record["init"] = (f"analytic for {len(warm)} capture(s) (fcn_analytic.invert, residual "
                              f"{min(residuals[i] for i in warm):.1e} or more >= attack.analytic_tol "
                              f"{attack.analytic_tol:g})")
        if cold and inversions:
            record["init_not_analytic"] = (f"{len(cold)} capture(s): residual >= {INIT_MAX_RESIDUAL:g}, the "
                                           f"inversion is no start (attack.init={cfg.init})")
        for group, init in ((warm, "analytic"), (cold, cfg.init)):
            if not group:
                continue
            out = reconstruct_many([captures[i] for i in group], [label_results[i] for i in group],
                                   [features[i] for i in group], dataclasses.replace(cfg, init=init), callbacks,
                                   priors=[inversions[i].image for i in group] if init == "analytic" and inversions
                                   else None, ids=group)
            for i, rec in zip(group, out):
                recs[i] = rec
                if residuals[i] is not None:
                    rec.history.update(answered_by="optimised from the analytic inversion" if init == "analytic"
                                       else "optimisation", analytic_residual=residuals[i])
    used = sorted({r.history["output_error"] for r in recs if "output_error" in r.history})
    if used:  # attack.output_error as resolved (auto: captured where the capture gives ∂L/∂z)
        record["output_error"] = used[0] if len(used) == 1 else used
    record["seconds"] = time.perf_counter() - start
    record["cpu_seconds"] = time.process_time() - cpu  # this process's CPU time: on a loaded machine, the work
    log.info("reconstruct: %s, %d capture(s)%s in %.1f s", record["optimizer"], len(captures),
             f" ({len(direct)} answered by the analytic inversion)" if direct and rest else "", record["seconds"])
    return recs, record


# an inversion whose largest layer residual is at or above this is not used as a start either: rank-deficient
# layers (a ReLU LeNet's dead units) gave residuals of 0.46–40 and 4.7–5.5 dB images, below a random image's 8 dB,
# where gradient noise of 1e-2 of each gradient's std gave 0.11–0.12 and 13–18 dB (scripts/analytic_noise.py)
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


def analytic_reconstruction(inversion: Any, label_result: LabelResult | None, capture: Capture) -> Reconstruction:
    """A :class:`~gi.recon.Reconstruction` holding ``fcn_analytic.invert``'s image (no optimisation)."""
    import torch

    from gi.recon import Reconstruction
    from gi.recon.problem import labels_for_slots

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


def prepare_attack(lcfg: LabelConfig, attack: ReconConfig, captures: Sequence[Capture],
                   truths: Sequence[Truth | None] | None = None, aux: Any = None) -> PreparedAttack:
    """labels → features over ``captures``: everything of :func:`attack_stages` but the reconstruction."""
    truths = list(truths) if truths is not None else [None] * len(captures)
    label_results, kind, lrec = label_stage(lcfg, captures, truths, aux)
    if attack.labels != kind:
        attack = dataclasses.replace(attack, labels=kind)
    features, inversions, frec = feature_stage(attack, captures, label_results)
    matched = features if attack.feature_weight > 0 else [None] * len(captures)
    return PreparedAttack(attack, list(captures), label_results, kind, matched, inversions, [lrec, frec])


def attack_stages(lcfg: LabelConfig, attack: ReconConfig, captures: Sequence[Capture],
                  truths: Sequence[Truth | None] | None = None, aux: Any = None,
                  callbacks: Sequence[Any] = ()) -> AttackOutcome:
    """labels → features → reconstruct over ``captures`` (one global model: one batched problem)."""
    return reconstruct_prepared([prepare_attack(lcfg, attack, captures, truths, aux)], callbacks)[0]


def can_pack(a: PreparedAttack, b: PreparedAttack) -> bool:
    """Whether two prepared attacks can be one reconstruction problem: the same attack config and features
    matched alike, captures of one global model (:func:`gi.recon.problem.same_model`), no analytic answer."""
    from gi.recon.problem import same_model

    return a.attack == b.attack and a.inversions is None and b.inversions is None and \
        (a.matched[0] is None) == (b.matched[0] is None) and same_model(a.captures[0], b.captures[0])


def reconstruct_prepared(prepared: Sequence[PreparedAttack], callbacks: Sequence[Any] = ()) -> list[AttackOutcome]:
    """The reconstruct stage of several prepared attacks that :func:`can_pack` together (several jobs' captures
    as one packed problem, issue 15), split back into one :class:`AttackOutcome` each. The reconstruct record
    is the packed problem's, with ``packed_jobs``."""
    first = prepared[0]
    if any(not can_pack(first, p) for p in prepared[1:]):
        raise ConfigError("reconstruct_prepared: these attacks cannot share one problem (different attack configs, "
                          "models or analytic answers); reconstruct them one by one")
    captures = [c for p in prepared for c in p.captures]
    labels = [lr for p in prepared for lr in p.label_results]
    matched = [f for p in prepared for f in p.matched]
    recs, rrec = reconstruct_stage(first.attack, captures, labels, matched, first.inversions, callbacks)
    if len(prepared) > 1:
        rrec["packed_jobs"] = len(prepared)
    out, start = [], 0
    for p in prepared:
        mine = recs[start:start + len(p.captures)]
        start += len(p.captures)
        warnings = sorted({w for r in mine for w in r.history.get("warnings", [])})
        out.append(AttackOutcome(p.label_results, p.label_kind, p.matched, mine, [*p.stages, dict(rrec)], warnings))
    return out


# --------------------------------------------------------------------------- outputs
def truth_monitor(truths: Sequence[Truth], every: int) -> Any:
    """A Lightning callback that logs the PSNR of every capture's current best iterate against its truth every
    ``every`` steps, from outside the attack module: ``.steps`` and ``.psnr`` (the mean over captures at the steps
    every capture was scored at), ``.per_capture``. It follows the captures by ``Problem.capture_ids`` through
    every problem of a split fit (``attack.pack``); a capture's retry (``attack.retries``) is not drawn, its first
    fit is."""
    import lightning as L
    import torch

    class TruthMonitor(L.Callback):
        def __init__(self, curves: dict[int, dict[int, float]] | None = None, ids: list[int] | None = None) -> None:
            self.truth, self.every = [t.images for t in truths], every
            self.ids = list(range(len(truths))) if ids is None else ids
            self.curves: dict[int, dict[int, float]] = {} if curves is None else curves  # capture -> step -> PSNR
            self.fitting: set[int] = set()

        def on_train_start(self, trainer, pl_module) -> None:
            self.fitting = {i for i in pl_module.problem.capture_ids if i not in self.curves}  # first fits only

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx % self.every and batch_idx != trainer.max_steps - 1:
                return
            ids = pl_module.problem.capture_ids
            if not self.fitting or max(ids) >= len(self.truth):
                return
            from gi.metrics import match_images, psnr

            batch_now = pl_module.current_batch().cpu()
            for k, rec in zip(ids, batch_now):
                if k in self.fitting:
                    truth = self.truth[k]
                    perm = match_images(rec, truth) if rec.shape[0] > 1 else [0]
                    self.curves.setdefault(k, {})[batch_idx] = float(psnr(rec[perm], truth).clamp(max=100).mean())

        @property
        def fitted(self) -> list[int]:
            """The captures with a curve: those optimised (an analytically answered capture has none)."""
            return [k for k in self.ids if k in self.curves]

        @property
        def steps(self) -> list[int]:
            fitted = self.fitted
            return sorted(set.intersection(*(set(self.curves[k]) for k in fitted))) if fitted else []

        @property
        def per_capture(self) -> list[list[float]]:
            return [[self.curves[k][step] for k in self.fitted] for step in self.steps]

        @property
        def psnr(self) -> list[float]:
            return [float(torch.tensor(row).mean()) for row in self.per_capture]

        def part(self, lo: int, hi: int) -> Any:
            """The curve of captures ``lo:hi`` alone (a job packed with others: :func:`reconstruct_prepared`)."""
            return TruthMonitor(self.curves, self.ids[lo:hi])

    return TruthMonitor()


def final_counts(rec: Reconstruction) -> torch.Tensor:
    import torch

    return torch.bincount(rec.labels.argmax(1), minlength=rec.labels.shape[1])


def used_labels(rec: Reconstruction, mode: str) -> LabelResult:
    """The labels the reconstruction ended with, as a LabelResult (soft rows and their argmax counts)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts(mode, final_counts(rec), soft=rec.labels.double())


def _mean_dicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric entries averaged over rows (the single row as it is)."""
    if len(rows) == 1:
        return dict(rows[0])
    keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                      for r in rows)]
    return {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}


def write_outputs(tmp: Path, name: str, config: dict[str, Any], captures: Sequence[Capture],
                  truths: Sequence[Truth] | None, outcome: AttackOutcome, lcfg: LabelConfig, seed: int,
                  metric_options: dict[str, Any], monitor: Any = None, t0: float | None = None) -> dict[str, Any]:
    """Write the self-contained output directory of ``gi run`` / ``gi attack``: config.yaml, metrics.json (with
    ``stages``; scores and their mean/median/min over every image when truths are given), results.csv (one row
    per image), grid.png, plots, the captures (and truths). Returns the metrics."""
    import torch

    from gi.metrics import label_metrics, score, summarize
    from gi.recon.problem import image_slots

    recs = outcome.reconstructions
    metrics: dict[str, Any] = {"name": name, "num_captures": len(captures),
                               "num_images": sum(image_slots(c) for c in captures)}
    rows: list[dict[str, Any]] = []
    shown_rec, shown_truth, captions = [], [], []
    lrs = outcome.label_results
    label_info = {"mode": lcfg.mode,
                  "method": outcome.stages[0]["method"], "why": outcome.stages[0]["why"],
                  "ok": all(lr.ok for lr in lrs if lr is not None),
                  "counts": [(lr.counts if lr is not None else final_counts(r)).tolist() for lr, r in zip(lrs, recs)]}
    if truths is not None:
        per_capture, random_psnr, lab, final = [], [], [], []
        for k, (rec, truth, lr) in enumerate(zip(recs, truths, lrs)):
            s = score(rec.images, truth.images, labels_rec=rec.labels.argmax(1), labels_true=truth.labels,
                      match=metric_options["match"], vgg=metric_options["lpips_vgg"])
            per_capture.append(s)
            rnd = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(seed + 7 + k))
            random_psnr.extend(score(rnd, truth.images, match=metric_options["match"], vgg=False)["psnr"])
            if lr is not None:
                lab.append(label_metrics(lr, truth))
            final.append(label_metrics(used_labels(rec, lcfg.mode), truth))
            perm = torch.as_tensor(s["perm"])
            rec_labels = rec.labels.argmax(1)[perm]
            for i in range(truth.images.shape[0]):
                rows.append({"capture": k, "image": i, "dataset_index": truth.meta.get("indices", [None] * (i + 1))[i],
                             "psnr": s["psnr"][i], "ssim": s["ssim"][i], "lpips_alex": s["lpips_alex"][i],
                             "true_label": int(truth.labels[i]), "recovered_label": int(rec_labels[i]),
                             "matched_reconstruction": s["perm"][i],
                             "answered_by": rec.history.get("answered_by", "optimisation"),
                             "analytic_residual": rec.history.get("analytic_residual")})
                captions.append(f"{s['psnr'][i]:.1f} dB\nlabel {int(rec_labels[i])} / {int(truth.labels[i])}")
            shown_truth.append(truth.images)
            shown_rec.append(rec.images[perm])
        images: dict[str, Any] = {}
        for metric in ("psnr", "ssim", "lpips_alex", "mse") + (("lpips_vgg",) if metric_options["lpips_vgg"] else ()):
            stats = summarize([v for s in per_capture for v in s[metric]])
            images[metric] = stats.pop("values")
            images.update({f"{metric}_{k}": v for k, v in stats.items()})
        if len(per_capture) == 1:
            images = per_capture[0]
        metrics.update({
            "psnr_mean": images["psnr_mean"], "psnr_median": images["psnr_median"], "psnr_min": images["psnr_min"],
            "ssim_mean": images["ssim_mean"], "lpips_alex_mean": images["lpips_alex_mean"],
            "random_image_psnr_mean": float(sum(random_psnr) / len(random_psnr)),
        })
        label_info.update(_mean_dicts(lab) if lab else {})
        label_info["true_counts"] = [t.counts.tolist() for t in truths]
        metrics["final_labels"] = {**_mean_dicts(final), "counts": [final_counts(r).tolist() for r in recs]}
        metrics["final_labels"]["L_r"] = metrics["final_labels"].get("soft_l1")
        metrics["images"] = images
    else:
        for k, rec in enumerate(recs):
            for i in range(rec.images.shape[0]):
                rows.append({"capture": k, "image": i, "recovered_label": int(rec.labels[i].argmax())})
                captions.append(f"label {int(rec.labels[i].argmax())}")
            shown_rec.append(rec.images)
    if len(captures) == 1:  # one capture: its counts as a plain list (as before)
        label_info["counts"] = label_info["counts"][0]
        if "true_counts" in label_info:
            label_info["true_counts"] = label_info["true_counts"][0]
        if "final_labels" in metrics:
            metrics["final_labels"]["counts"] = metrics["final_labels"]["counts"][0]
    metrics["labels"] = label_info
    seconds = sum(r.seconds for r in recs)
    iterations = max(r.iterations for r in recs)
    many = len(recs) > 1
    metrics["attack"] = {"objective": [r.objective.tolist() for r in recs] if many else recs[0].objective.tolist(),
                         "best_restart": [r.best_restart for r in recs] if many else recs[0].best_restart,
                         "seconds": seconds, "seconds_per_image": seconds / max(metrics["num_images"], 1),
                         "iterations": iterations,
                         "seconds_per_100_iterations": 100 * seconds / iterations if iterations else None}
    metrics["stages"] = outcome.stages
    metrics["warnings"] = outcome.warnings
    if t0 is not None:
        metrics["total_seconds"] = time.perf_counter() - t0
    metrics["device"] = "cuda" if torch.cuda.is_available() and config.get("attack", {}).get("device") != "cpu" \
        else "cpu"
    metrics["torch"] = torch.__version__
    write_yaml(tmp / "config.yaml", config)
    write_json(tmp / "metrics.json", metrics)
    write_csv(tmp / "results.csv", rows)
    legend = " (PSNR; recovered / true label)" if truths is not None else " (recovered label)"
    save_caption_grid(tmp / "grid.png", torch.cat(shown_rec), torch.cat(shown_truth) if shown_truth else None,
                      captions, title=name + legend)
    if monitor is not None and monitor.steps:
        answered = len(monitor.ids) - len(monitor.fitted)  # a mixed run: the optimised captures' mean alone
        label = "PSNR (best restart)" + (f", mean of the {len(monitor.fitted)} optimised captures ({answered} "
                                         "answered analytically)" if answered else "")
        save_line_plot(tmp / "psnr.png", monitor.steps, {label: monitor.psnr}, "iteration", "PSNR [dB]", title=name)
    if recs[0].history.get("step"):
        save_line_plot(tmp / "objective.png", recs[0].history["step"],
                       {f"restart {r}": [o[r] for o in recs[0].history["objective"]]
                        for r in range(len(recs[0].objective))}, "iteration", "attack objective", logy=True)
    layers = next((st.get("analytic_layers") for st in outcome.stages if st.get("analytic_layers")), None)
    if layers:  # the analytic inversion's residual per layer, from the last layer down to the input
        solved = [[r for r in la["residual"] if r is not None] for la in layers]  # stopped inversions: fewer
        series = {"gradient residual, largest": [max(rs) for rs in solved],
                  "gradient residual, median": [float(torch.tensor(rs).median()) for rs in solved]}
        if any(f is not None for la in layers for f in la["forward"]):
            series["forward mismatch, largest"] = [max((f for f in la["forward"] if f is not None),
                                                       default=float("nan")) for la in layers]  # fc: none
        floor = 1e-12  # an exact layer (0) still shows on the log axis
        save_line_plot(tmp / "analytic.png", list(range(len(layers))),
                       {k: [max(v, floor) if v == v else v for v in vs] for k, vs in series.items()},
                       "layer (0 = last: " + ", ".join(la["name"] for la in layers) + ")",
                       "relative residual", title=f"{name}: analytic inversion over {len(captures)} capture(s)",
                       logy=True)
    save_captures(tmp, captures, truths)
    return metrics


def save_captures(tmp: Path, captures: Sequence[Capture], truths: Sequence[Truth] | None) -> None:
    """One capture: ``capture.safetensors`` (+ ``truth.safetensors``); several: ``captures/NNN.safetensors``
    (+ ``truths/NNN.safetensors``)."""
    if len(captures) == 1:
        captures[0].save(tmp / "capture.safetensors")
        if truths is not None:
            truths[0].save(tmp / "truth.safetensors")
        return
    for sub, items in (("captures", captures), ("truths", truths)):
        if items is None:
            continue
        (tmp / sub).mkdir()
        for k, item in enumerate(items):
            item.save(tmp / sub / f"{k:03d}.safetensors")


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


# --------------------------------------------------------------------------- gi attack
@dataclass
class AttackConfig:
    """``gi attack CAPTURE``: the label-first attack on saved captures, without truth.

    ``capture``: a capture file or a ``gi run`` output directory; ``truth``: the matching truth file or directory
    (optional: only then are images scored); ``labels`` and ``attack`` as in ``gi run`` (``attack.preset``
    defaults to ``default``); ``aux_data`` + ``aux``: the attacker's labelled samples (``aux.per_class`` per class
    of the dataset ``aux_data``; none by default).

    A capture of a ``factory`` model (your own ``nn.Module``) names its factory in the file; it is never imported
    on the file's word. ``model``: the import string of your factory (``pkg.mod:fn``), called with the file's
    keyword arguments; or register it in your code (:func:`gi.models.register_factory`); or ``trust_factory:
    true``, which imports and calls whatever factory the file names, with the file's arguments: arbitrary code
    from the file, only for captures from a trusted source (:meth:`gi.Capture.load`)."""

    ATTACK_PRESET: ClassVar[str | None] = DEFAULT

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

        return from_dict(cls, with_preset(data, cls.ATTACK_PRESET))

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
    """The config of ``gi attack``: ``path`` (a YAML file, optional) with ``capture`` and the overrides."""
    import tempfile

    if path is None:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            fh.write("{}\n")
            path = fh.name
        try:
            return load_config(AttackConfig, path, [f"capture={capture}", *(overrides or [])])
        finally:
            Path(path).unlink()
    return load_config(AttackConfig, path, [f"capture={capture}", *(overrides or [])])


@dataclass
class AttackRun:
    out: Path
    metrics: dict[str, Any]
    outcome: AttackOutcome


def run_attack(cfg: AttackConfig) -> AttackRun:
    """``gi attack``: load the captures (and truths, when given), run :func:`attack_stages`, write the output
    directory."""
    import torch

    from gi.capture import Capture, Truth
    from gi.victim_setup import draw_aux, load_data

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
        monitor = truth_monitor(truths, cfg.attack.log_every) if truths is not None else None
        outcome = attack_stages(cfg.labels, cfg.attack, captures, None if cfg.labels.mode != "truth" else truths,
                                aux, callbacks=[monitor] if monitor is not None else [])
        config = {**to_dict(cfg)}
        metrics = write_outputs(tmp, cfg.name, config, captures, truths, outcome, cfg.labels, cfg.seed,
                                {"match": True, "lpips_vgg": cfg.lpips_vgg}, monitor, t0)
    return AttackRun(out, metrics, outcome)
