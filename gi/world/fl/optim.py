"""The client's local update rules (``protocol.optimizer``), one per registry entry.

Each rule maps a parameter's step direction ``d`` (gradient plus weight decay plus the FL scheme's term) and
that parameter's state to the displacement the step subtracts, ``θ ← θ − rule(d)``. They follow
``torch.optim`` (the tests compare trajectories) and are written out of place, so the reconstruction's
unrolled client (:func:`gi.attack.recon.simulate.update_simulator`) differentiates and vmaps through them:
``sgd`` ``η d``; ``sgdm`` heavy ball ``buf ← γ buf + d`` (``buf = d`` at the first step), ``η buf``;
``nesterov`` ``η (d + γ buf)``; ``adadelta`` (Zeiler 2012, the optimiser of Decaf's clients)
``E[d²] ← ρE[d²] + (1−ρ)d²``,
``δ = √(E[δ²] + ε)/√(E[d²] + ε)·d``, ``E[δ²] ← ρE[δ²] + (1−ρ)δ²``, ``η δ``.

``sgd``, ``sgdm`` and ``nesterov`` are linear in the gradients, which is what RLU's ρ (Table 1) and the
Ramakrishna–Dán normalisation rely on; ``adadelta`` rescales every coordinate by its own history, so only
direction-based attacks (Decaf) read its updates (:data:`LINEAR`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gi.core.registry import registrar

if TYPE_CHECKING:  # the rules use tensor methods only: importing the registry costs no torch import
    from torch import Tensor
Rule = Callable[[Any, dict[str, "Tensor"], "Tensor"], "Tensor"]
RULES: dict[str, Rule] = {}
register_rule = registrar(RULES, "local optimiser")
LINEAR = ("sgd", "sgdm", "nesterov")


@register_rule("sgd")
def _sgd(protocol: Any, state: dict[str, Tensor], d: Tensor) -> Tensor:
    return protocol.lr * d


def _buffer(protocol: Any, state: dict[str, Tensor], d: Tensor) -> Tensor:
    buf = state.get("buf")
    state["buf"] = d if buf is None else protocol.momentum * buf + d
    return state["buf"]


@register_rule("sgdm")
def _sgdm(protocol: Any, state: dict[str, Tensor], d: Tensor) -> Tensor:
    if protocol.momentum <= 0:
        return protocol.lr * d
    return protocol.lr * _buffer(protocol, state, d)


@register_rule("nesterov")
def _nesterov(protocol: Any, state: dict[str, Tensor], d: Tensor) -> Tensor:
    if protocol.momentum <= 0:
        return protocol.lr * d
    return protocol.lr * (d + protocol.momentum * _buffer(protocol, state, d))


@register_rule("adadelta")
def _adadelta(protocol: Any, state: dict[str, Tensor], d: Tensor) -> Tensor:
    rho, eps = protocol.adadelta_rho, protocol.adadelta_eps
    sq = rho * state["square_avg"] + (1 - rho) * d * d if "square_avg" in state else (1 - rho) * d * d
    acc = state.get("acc_delta")
    delta = ((eps if acc is None else acc + eps) / (sq + eps)).sqrt() * d
    state["square_avg"] = sq
    state["acc_delta"] = (1 - rho) * delta * delta if acc is None else rho * acc + (1 - rho) * delta * delta
    return protocol.lr * delta


class LocalOptimizer:
    """The optimiser state of one local run: ``displacement(i, d)`` for parameter ``i`` (any hashable key)."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.rule = RULES[protocol.optimizer]
        self.state: dict[Any, dict[str, Tensor]] = {}

    def displacement(self, key: Any, d: Tensor) -> Tensor:
        return self.rule(self.protocol, self.state.setdefault(key, {}), d)


__all__ = ["LINEAR", "RULES", "LocalOptimizer", "register_rule"]
