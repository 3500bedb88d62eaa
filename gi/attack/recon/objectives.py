"""Matching distances D (registry; one line to add one).

``fn(dummy, target, weights) -> (P,)``: ``dummy`` maps names to the P batched problems' tensors (P, *shape),
``target`` to (1, *shape) (one target shared by all P) or (P, *shape); ``weights`` maps names to w_l. The same
distance serves the gradient (or update) term and the feature term of the soft-label paper's eq. 8.
Problems are independent, so the optimiser minimises the sum over P.

Reductions use matrix products where they can (``g @ t`` for a shared target): for ResNet-18 with R = 8 the
elementwise temporaries of ``(g − t)²`` over 8 × 11M entries cost more than the convolutions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gi.core.registry import registrar

Tensor = torch.Tensor
Grads = dict[str, Tensor]
Objective = Callable[[Grads, Grads, dict[str, float]], Tensor]
OBJECTIVES: dict[str, Objective] = {}
# distances that depend on the layers only through weighted inner products Σ_l w_l ⟨a_l, b_l⟩: the same value on
# one concatenated vector of √w_l-scaled layers (one dot product instead of one per layer; small nets)
FLAT_OBJECTIVES = ("l2", "cosine")


register_objective = registrar(OBJECTIVES, "objective")


def _flat(d: Tensor) -> Tensor:
    return d.reshape(d.shape[0], -1)


def _dot(g: Tensor, t: Tensor) -> Tensor:
    """Row-wise ⟨g_p, t_p⟩ (P,) for flat g (P, n) and t (1 or P, n)."""
    if t.shape[0] == 1:
        return g @ t[0]
    return torch.einsum("pn,pn->p", g, t)


def _sq(g: Tensor) -> Tensor:
    return torch.einsum("pn,pn->p", g, g)


@register_objective("l2")
def l2_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """DLG (Zhu et al. 2019): Σ_l w_l ‖g_l − g_l*‖²."""
    out = 0.0
    for k in dummy:
        diff = _flat(dummy[k]) - _flat(target[k])
        out = out + weights[k] * _sq(diff)
    return out


@register_objective("cosine")
def cosine_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """Inverting Gradients (Geiping et al. 2020): 1 − ⟨g, g*⟩_w / (‖g‖_w ‖g*‖_w), one cosine over all layers."""
    dot, dn, tn = 0.0, 0.0, 0.0
    for k in dummy:
        g, t = _flat(dummy[k]), _flat(target[k])
        dot = dot + weights[k] * _dot(g, t)
        dn = dn + weights[k] * _sq(g)
        tn = tn + weights[k] * _sq(t)
    return 1.0 - dot / (dn.clamp_min(1e-20).sqrt() * torch.as_tensor(tn).clamp_min(1e-20).sqrt())


@register_objective("cosine-layerwise")
def cosine_layerwise(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """inversefed's ``simlocal``: Σ_l w_l (1 − cos(g_l, g_l*)) / Σ_l w_l."""
    total = sum(weights[k] for k in dummy)
    out = 0.0
    for k in dummy:
        g, t = _flat(dummy[k]), _flat(target[k])
        cos = _dot(g, t) / (_sq(g).clamp_min(1e-20).sqrt() * _sq(t).clamp_min(1e-20).sqrt())
        out = out + weights[k] * (1.0 - cos)
    return out / total


@register_objective("l1")
def l1_distance(dummy: Grads, target: Grads, weights: dict[str, float]) -> Tensor:
    """Σ_l w_l ‖g_l − g_l*‖₁."""
    return sum(weights[k] * (_flat(dummy[k]) - _flat(target[k])).abs().sum(1) for k in dummy)
