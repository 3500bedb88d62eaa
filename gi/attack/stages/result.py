"""What the attack stages return (:class:`AttackResult`, with its verdict without truth) and the labels a
reconstruction ended with (docs/architecture.md "Data flow")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from gi.analysis.verdict import AttackVerdict
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture
    from gi.label_result import LabelResult


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
        captures), per slot whether its capture pins it (``history["slot_swap_distance"]``) and the estimate of the
        verdict with truth by the reconstruction's kind of evidence (``history["evidence"]``), the feature
        record where the features stage measured its target (``target_residual``), the prior-filled input values
        where the analytic walk reached the input, and the labels each reconstruction slot carries (None for a
        capture that shares nothing). Its ``record`` is ``metrics.json``'s ``verdict`` of ``gi attack`` without
        truth."""
        from gi.analysis.verdict import AttackVerdict, feature_summary, mismatch_summary, prior_summary

        recs = self.reconstructions
        what = "update" if self.captures and self.captures[0].is_update else "gradient"
        stage = next((s for s in self.stages if s.get("name") == "features" and "target_residual" in s), None)
        features = None if stage is None else feature_summary(
            stage["feature_layer"], stage["target_residual"], [r.history.get("feature_mismatch") for r in recs],
            [r.history.get("slot_feature_mismatch") for r in recs], stage.get("target_sure"),
            [r.history.get("slot_feature_swap") for r in recs])
        silent = [bool(self.captures) and self.captures[k].silent for k in range(len(recs))]
        labels = [None if quiet else [int(c) for c in r.labels.argmax(1)] for r, quiet in zip(recs, silent)]
        walk = next((s.get("analytic_layers") for s in self.stages if s.get("name") == "features"), None)
        entry = walk[-1] if walk else {}  # the input layer (the walk lists the layers last first)
        prior = prior_summary(entry["name"], entry["free"], entry["unknowns"]) if "free" in entry else None
        return AttackVerdict(mismatch_summary([mismatch_of(r) for r in recs], what, self.simulable,
                                              [r.history.get("slot_swap_distance") for r in recs],
                                              [r.history.get("evidence") for r in recs],
                                              [int(r.images.shape[0]) for r in recs]), features, labels, prior)

    @property
    def simulable(self) -> list[bool]:
        """Per capture: whether its share can be re-simulated from images and labels, so that its mismatch judges
        them (:func:`gi.world.fl.local.order_known`: not a round of reshuffled mini-batches); True for a result
        that does not hold its captures."""
        from gi.world.fl.local import order_known

        if not self.captures:
            return [True] * len(self.reconstructions)
        return [order_known(c.protocol, c.num_samples) for c in self.captures]


ANALYTIC_ANSWER = "analytic inversion"  # a reconstruction's history["answered_by"] when the inversion answered it


def no_effect(keys: Iterable[str], reconstructions: Sequence[Reconstruction]) -> list[str]:
    """The attack keys among ``keys`` (names of :class:`~gi.attack.recon.config.ReconConfig` fields, e.g. a user's
    ``attack.iterations`` without its section) that had no effect on this run: those only the optimisation reads
    (:data:`~gi.attack.recon.config.OPTIMISATION_KEYS`), where the analytic inversion answered every
    reconstruction, so no optimisation ran. Empty otherwise."""
    from gi.attack.recon.config import OPTIMISATION_KEYS

    if not reconstructions or any(r.history.get("answered_by") != ANALYTIC_ANSWER for r in reconstructions):
        return []
    return sorted({k.split(".")[0] for k in keys} & OPTIMISATION_KEYS)


def no_effect_notice(keys: Sequence[str], section: str = "attack.") -> str:
    """The one-line notice for :func:`no_effect`'s keys (``section``: how the user spelled their prefix)."""
    names = ", ".join(f"{section}{k}" for k in keys)
    return (f"notice: {names} had no effect on this run: the analytic inversion answered every capture, so no "
            f"optimisation ran ({section}analytic=false runs the optimisation instead)")


def mismatch_of(rec: Reconstruction) -> float:
    """A reconstruction's relative mismatch of the shared tensors, ``history["gradient_mismatch"]`` (NaN when it
    was not computed)."""
    value = rec.history.get("gradient_mismatch")
    return float("nan") if value is None else float(value)


def final_counts(rec: Reconstruction) -> torch.Tensor:
    import torch

    return torch.bincount(rec.labels.argmax(1), minlength=rec.labels.shape[1])


def used_labels(rec: Reconstruction, mode: str) -> LabelResult:
    """The labels the reconstruction ended with, as a LabelResult (soft rows and their argmax counts)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts(mode, final_counts(rec), soft=rec.labels.double())
