"""FedDyn (Acar et al. 2021; RLU App. A.8, eq. 71–73): the term ``−∇L_k^{prev} + α(θ − θᵗ)``.

History: ``feddyn.sum_updates`` = Σ_{r<t} Δθ_k⁽ʳ⁾, so the client state is ``∇L_k^{prev} = −α ·`` that (eq. 73)
and the constant of the term is ``α Σ_{r<t} Δθ_k⁽ʳ⁾``. The server keeps ``h ← h − α·mean Δθ`` and steps to
``mean θ_k − h/α``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.world.fl.schemes.base import History, Scheme, State, register_scheme

if TYPE_CHECKING:
    from torch import Tensor


def _constant(protocol: Any, history: History, num_steps: int) -> Tensor:
    return protocol.feddyn_alpha * history("feddyn.sum_updates")


def _client_state(protocol: Any, history: State, update: State, num_steps: int) -> State:
    new = {k: v.clone() for k, v in history.items()}
    for name, d in update.items():
        new[f"feddyn.sum_updates/{name}"] = history[f"feddyn.sum_updates/{name}"] + d
    return new


def _aggregate(protocol: Any, avg: State, weights: list[float], clients: dict[int, State], server: State) -> State:
    a = protocol.feddyn_alpha
    if a <= 0:
        return avg
    out = {}
    for name, step in avg.items():
        h = server.setdefault(name, step.new_zeros(step.shape))
        h -= a * step
        out[name] = step - h / a
    return out


FEDDYN = register_scheme(Scheme("feddyn", shares="update", summary="dynamic regulariser −∇L_k^prev + α(θ − θᵗ)",
                                history=("feddyn.sum_updates",), pull=lambda p: p.feddyn_alpha,
                                constant=_constant, client_state=_client_state, aggregate=_aggregate))
