"""The labels stage (docs/architecture.md "Data flow"): the ``labels`` section (:class:`LabelConfig` for an
attack, :class:`LabelTable` for a table; docs/usage.md, "The labels section"), the label-knowledge modes
(:data:`LABEL_MODES`) and :func:`label_stage`, registered as the first attack stage.

It reads captures and aux data; the oracle mode alone reads truth, by request."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages.base import LABELS, register_stage
from gi.core.errors import ConfigError

if TYPE_CHECKING:
    from gi.attack.stages.base import PreparedAttack
    from gi.capture import Capture, Truth
    from gi.label_result import LabelResult

log = logging.getLogger("gi.attack")


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


@register_stage("labels", LABELS)
def run_label_stage(job: PreparedAttack) -> dict[str, Any]:
    """:func:`label_stage` on the job's captures; sets its label results and kind, and the attack's ``labels``
    (fixed or joint) to that kind."""
    job.label_results, job.label_kind, record = label_stage(job.label_config, job.captures, job.truths, job.aux)
    if job.attack.labels != job.label_kind:
        job.attack = dataclasses.replace(job.attack, labels=job.label_kind)
    return record
