"""Gradient-matching objectives (registry; one line to add one).

Each objective compares the dummy gradients of R restarts with the shared target and returns one
value per restart, shape (R,): ``fn(dummy: {name: (R, *shape)}, target: {name: shape}, weights)``.
Restarts are independent problems, so the optimiser minimises the sum over restarts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
Grads = dict[str, Tensor]
Objective = Callable[[Grads, Grads, dict[str, float]], Tensor]
OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str) -> Callable[[Objective], Objective]:
    def wrap(fn: Objective) -> Objective:
        OBJECTIVES[name] = fn
        return fn

    return wrap


def _flat(d: Tensor) -> Tensor:
    return d.reshape(d.shape[0], -1)


@register_objective("l2")
def l2_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """DLG (Zhu et al. 2019): Σ_l w_l ‖∇θ_l(x) − ∇θ_l*‖²."""
    return sum(weights[k] * (_flat(dummy[k]) - target[k].reshape(1, -1)).pow(2).sum(1) for k in dummy)


@register_objective("cosine")
def cosine_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """Inverting Gradients (Geiping et al. 2020): 1 − ⟨g, g*⟩ / (‖g‖ ‖g*‖), one global cosine over layers."""
    dot = sum(weights[k] * (_flat(dummy[k]) * target[k].reshape(1, -1)).sum(1) for k in dummy)
    dn = sum(weights[k] * _flat(dummy[k]).pow(2).sum(1) for k in dummy)
    tn = sum(weights[k] * target[k].pow(2).sum() for k in dummy)
    return 1.0 - dot / (dn.clamp_min(1e-20).sqrt() * tn.clamp_min(1e-20).sqrt())


@register_objective("cosine-layerwise")
def cosine_layerwise(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """inversefed's ``simlocal``: Σ_l w_l (1 − cos(∇θ_l(x), ∇θ_l*)) / Σ_l w_l."""
    total = sum(weights[k] for k in dummy)
    out = 0.0
    for k in dummy:
        g, t = _flat(dummy[k]), target[k].reshape(1, -1)
        cos = (g * t).sum(1) / (g.norm(dim=1).clamp_min(1e-20) * t.norm().clamp_min(1e-20))
        out = out + weights[k] * (1.0 - cos)
    return out / total


@register_objective("l1")
def l1_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """Σ_l w_l ‖∇θ_l(x) − ∇θ_l*‖₁."""
    return sum(weights[k] * (_flat(dummy[k]) - target[k].reshape(1, -1)).abs().sum(1) for k in dummy)
