"""The attack objective as one weighted table of terms (registry; one decorated function adds a term).

The soft-label paper's eq. 8 plus priors::

    L = match + β · features + Σ_k λ_k R_k(x)

Every term is ``fn(images (P, B, C, H, W), ev: Evaluation) -> (P,)`` over the P batched rows (captures ×
restarts). ``match`` compares the shared message (gradients or update; per-layer weights w_l and α are inside,
its weight is 1), ``features`` the last-layer features (weight ``attack.feature_weight`` = β); every other term
is weighted by ``attack.regularizers[name]`` (λ_k; the image priors of :mod:`gi.attack.recon.regularizers`). The
weights of one run are :attr:`gi.attack.recon.problem.Problem.terms`, summed in their order.

The table itself is :mod:`gi.attack.recon.term_table` (below the image priors, which register into it); this
module names it too, with the two terms every objective has, so that importing it gives every shipped term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gi.attack.recon import regularizers  # noqa: F401  (the image priors register into the table)
from gi.attack.recon.objectives import Objective
from gi.attack.recon.term_table import OWN_WEIGHT, REGULARIZERS, TERMS, Term, register_regularizer, register_term

if TYPE_CHECKING:
    from gi.attack.recon.problem import Problem

__all__ = ["OWN_WEIGHT", "REGULARIZERS", "TERMS", "Evaluation", "Term", "features", "match", "register_regularizer",
           "register_term", "term_weights"]

Tensor = torch.Tensor


@dataclass
class Evaluation:
    """What the terms of one objective evaluation see: the problem (``model``, ``bn_targets``, …), the distance D,
    and the P rows' simulated shared message and features next to their targets.

    ``shared`` / ``shared_target`` / ``shared_weights``: the matched tensors (P, …), targets (1 or P, …) and w_l,
    per layer, or (one row at a time, l2/cosine on small nets) one √w-scaled vector ``all`` of weight 1, which
    gives D the same value.
    """

    problem: Problem | None = None
    distance: Objective | None = None
    shared: dict[str, Tensor] = field(default_factory=dict)
    shared_target: dict[str, Tensor] = field(default_factory=dict)
    shared_weights: dict[str, float] = field(default_factory=dict)
    features: Tensor | None = None
    feature_target: Tensor | None = None
    device_bn_targets: dict[str, tuple[Tensor, Tensor]] | None = None  # the module's copies, on its device
    device_aux_span: tuple[Tensor, Tensor] | None = None

    @property
    def model(self) -> torch.nn.Module | None:
        return None if self.problem is None else self.problem.model

    @property
    def bn_targets(self) -> dict[str, tuple[Tensor, Tensor]] | None:
        if self.device_bn_targets is not None:
            return self.device_bn_targets
        return None if self.problem is None else self.problem.bn_targets

    @property
    def aux_span(self) -> tuple[Tensor, Tensor] | None:
        """The aux-span prior's ``(μ, P)`` (:func:`gi.attack.recon.problem.aux_span`), on the module's device."""
        if self.device_aux_span is not None:
            return self.device_aux_span
        return None if self.problem is None else self.problem.aux_span


@register_term("match")
def match(images: Tensor, ev: Evaluation) -> Tensor:
    """D(g, g*) over the matched layers with their weights w_l (α for the last layer): gradient or update."""
    return ev.distance(ev.shared, ev.shared_target, ev.shared_weights)


@register_term("features")
def features(images: Tensor, ev: Evaluation) -> Tensor:
    """D(f_{N−1}(x), f*_{N−1}): the last-layer input of the dummy images against the recovered features (eq. 8)."""
    return ev.distance({"f": ev.features}, {"f": ev.feature_target}, {"f": 1.0})


def term_weights(cfg: Any, matched: bool = True) -> dict[str, float]:
    """{term: weight} of a config, in summation order: ``match`` (1; absent when every layer weighs 0),
    ``features`` (``feature_weight`` when > 0), then ``regularizers`` with a nonzero weight."""
    out = {"match": 1.0} if matched else {}
    if cfg.feature_weight > 0:
        out["features"] = cfg.feature_weight
    out.update((name, weight) for name, weight in cfg.regularizers.items() if weight)
    return out

