"""The attack's stages as a registry, and the job state they share (docs/architecture.md "How to add", "An attack
stage").

A stage is one function of a job's :class:`PreparedAttack` registered with :func:`register_stage` under a name and
an ``order``: it reads and sets the job's fields and returns its record for ``metrics.json``'s ``stages``. The
stages run by ascending order; those below :data:`RECONSTRUCT` run on each job before the reconstruction
(:func:`gi.attack.stages.pipeline.prepare_attack`), those above it on each job's share of the reconstructions
afterwards (:func:`gi.attack.stages.pipeline.reconstruct_prepared`). The reconstruct stage itself is the pivot,
not a registered stage: it packs several jobs' captures into one problem.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.stages.analytic import answers, inversion_residual
from gi.attack.stages.silent import silent_labels, silent_reconstruction
from gi.core.registry import registrar

if TYPE_CHECKING:
    import torch

    from gi.attack.recon import Reconstruction
    from gi.attack.stages.labels import LabelConfig
    from gi.capture import Capture, Truth
    from gi.label_result import LabelResult

LABELS, FEATURES, RECONSTRUCT = 100.0, 200.0, 300.0  # the built-in stages' places in the order


@dataclass
class PreparedAttack:
    """One job's attack state, which the stages read and set (:func:`gi.attack.stages.pipeline.prepare_attack`):
    after the stages below :data:`RECONSTRUCT` the labels and features are done and ``attack`` is the attack
    config with the label kind applied. ``label_config``, ``truths`` (None each unless ``labels.mode`` is
    ``truth``) and ``aux`` are the job's inputs; ``reconstructions`` holds the job's share of the reconstruct
    stage (for the stages after it); ``notes``: what a stage leaves for the stages after it."""

    attack: ReconConfig
    captures: list[Capture]
    label_results: list[LabelResult | None] = field(default_factory=list)
    label_kind: str = "fixed"
    matched: list[torch.Tensor | None] = field(default_factory=list)
    inversions: list[Any] | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)
    silent: dict[int, Capture] = field(default_factory=dict)  # position among the job's captures -> a capture
    # that shares an all-zero gradient (:attr:`gi.capture.Capture.silent`): kept out of every stage
    aux_images: torch.Tensor | None = None  # the attacker's aux images (the aux-span prior's), if any
    label_config: LabelConfig | None = None
    truths: list[Truth | None] = field(default_factory=list)
    aux: Any = None
    reconstructions: list[Reconstruction] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

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


StageRun = Callable[[PreparedAttack], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    """A registered attack stage: ``run(job)`` sets fields of the job's :class:`PreparedAttack` and returns its
    record (``metrics.json``'s ``stages`` entry; ``name`` is put first); ``order``: its place among the stages."""

    name: str
    order: float
    run: StageRun


STAGES: dict[str, Stage] = {}
_register = registrar(STAGES, "attack stage")


def register_stage(name: str, order: float) -> Callable[[StageRun], StageRun]:
    """Decorator: register ``run(job) -> record`` as the attack stage ``name`` at ``order`` (below
    :data:`RECONSTRUCT`: before the reconstruction, above it: after; two stages at one order, or a stage at the
    reconstruct stage's, is an error, as is a name registered twice)."""

    def wrap(run: StageRun) -> StageRun:
        taken = [s.name for s in STAGES.values() if s.order == order]
        if order == RECONSTRUCT or name == "reconstruct" or taken:
            raise ValueError(f"attack stage {name!r} at order {order}: the place is taken by "
                             f"{taken or ['reconstruct']}; pick another order")
        _register(name)(Stage(name, float(order), run))
        return run

    return wrap


def stages_before() -> list[Stage]:
    """The registered stages that run before the reconstruction, in order."""
    return sorted((s for s in STAGES.values() if s.order < RECONSTRUCT), key=lambda s: s.order)


def stages_after() -> list[Stage]:
    """The registered stages that run after the reconstruction, in order."""
    return sorted((s for s in STAGES.values() if s.order > RECONSTRUCT), key=lambda s: s.order)


def run_stages(job: PreparedAttack, stages: Sequence[Stage]) -> list[dict[str, Any]]:
    """Run ``stages`` on ``job`` in turn; their records, each with its stage's ``name`` first."""
    return [{"name": stage.name, **stage.run(job)} for stage in stages]
