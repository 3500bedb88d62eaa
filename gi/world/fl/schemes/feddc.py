"""FedDC (Gao et al. 2022; RLU App. A.9, eq. 81–82): ``α(θ − θᵗ + d_k) + (Δθ_k^{(t−1)} − Δθ^{(t−1)})/(ηm)``.

History: the drift ``feddc.drift`` = d_k⁽ᵗ⁾, the client's previous update ``feddc.prev_local`` and the global
one ``feddc.prev_global``. After a round the client adds its update to its drift; the server adds the mean
drift to the mean update and broadcasts the mean update as everyone's ``prev_global``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.world.fl.schemes.base import History, Scheme, State, register_scheme

if TYPE_CHECKING:
    from torch import Tensor


def _constant(protocol: Any, history: History, num_steps: int) -> Tensor:
    correction = (history("feddc.prev_local") - history("feddc.prev_global")) / (protocol.lr * num_steps)
    return protocol.feddc_alpha * history("feddc.drift") + correction


def _client_state(protocol: Any, history: State, update: State, num_steps: int) -> State:
    new = {k: v.clone() for k, v in history.items()}
    for name, d in update.items():
        new[f"feddc.drift/{name}"] = history[f"feddc.drift/{name}"] + d
        new[f"feddc.prev_local/{name}"] = d.clone()
    return new


def _aggregate(protocol: Any, avg: State, weights: list[float], clients: dict[int, State], server: State) -> State:
    out = {name: step + sum(float(w) * clients[c][f"feddc.drift/{name}"] for c, w in enumerate(weights))
           for name, step in avg.items()}
    for c in clients:
        for name in avg:
            clients[c][f"feddc.prev_global/{name}"] = avg[name].clone()
    return out


FEDDC = register_scheme(Scheme("feddc", shares="update", summary="drift-decoupled α(θ − θᵗ + d_k) + correction",
                               history=("feddc.drift", "feddc.prev_local", "feddc.prev_global"),
                               pull=lambda p: p.feddc_alpha, constant=_constant, client_state=_client_state,
                               aggregate=_aggregate))
