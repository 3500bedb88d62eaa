"""Scaffold (Karimireddy et al. 2020; RLU App. A.6): the control-variate correction ``c − c_k`` (eq. 57).

History: the server control ``scaffold.c`` = c⁽ᵗ⁾ and the client control ``scaffold.c_k`` = c_k⁽ᵗ⁾. After its
round the client applies option II, ``c_k ← c_k − c − Δθ/(η m)`` (eq. 58); the server's new control is the
weighted mean of the clients' controls, broadcast to all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.world.fl.schemes.base import History, Scheme, State, register_scheme

if TYPE_CHECKING:
    from torch import Tensor


def _constant(protocol: Any, history: History, num_steps: int) -> Tensor:
    return history("scaffold.c") - history("scaffold.c_k")


def _client_state(protocol: Any, history: State, update: State, num_steps: int) -> State:
    new = {k: v.clone() for k, v in history.items()}
    for name, d in update.items():
        c, ck = history[f"scaffold.c/{name}"], history[f"scaffold.c_k/{name}"]
        new[f"scaffold.c_k/{name}"] = ck - c - d / (protocol.lr * num_steps)
    return new


def _aggregate(protocol: Any, avg: State, weights: list[float], clients: dict[int, State], server: State) -> State:
    for name in avg:
        c_new = sum(float(w) * clients[c][f"scaffold.c_k/{name}"] for c, w in enumerate(weights))
        for c in clients:
            clients[c][f"scaffold.c/{name}"] = c_new.clone()
    return avg


SCAFFOLD = register_scheme(Scheme("scaffold", shares="update", summary="control variates c − c_k (option II)",
                                  history=("scaffold.c", "scaffold.c_k"), constant=_constant,
                                  client_state=_client_state, aggregate=_aggregate))
