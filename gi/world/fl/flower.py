"""Captures from a real Flower federation (``pip install 'gi[flower]'``, flwr 1.42): :class:`CapturingFedAvg`.

:class:`CapturingFedAvg` is Flower's own ``FedAvg`` strategy that, in every round, records what the honest-but-
curious server sees of each client as a :class:`gi.Capture`: ``model_before`` = the round's global parameters
(handed to ``configure_fit``), ``model_after`` = the parameters the client returned in its ``FitRes``,
``num_samples`` = ``FitRes.num_examples``, and the protocol filled from the round's fit config (``lr``,
``local_epochs``, ``local_steps``, ``batch_size``, ... : every key that is a :class:`gi.Protocol` field) over the
strategy's base protocol (:func:`protocol_from_config`). Aggregation is Flower's, unchanged.

Parameters travel as NumPy arrays in the model's ``state_dict()`` order (the convention of Flower's PyTorch
examples: parameters and buffers), see :func:`state_to_ndarrays` / :func:`ndarrays_to_state`.

:func:`run_in_process` drives a federation with Flower's own server loop (``flwr.server.Server.fit``) over clients
that live in this process: no Ray, no network.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from flwr.client import Client, NumPyClient
from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    NDArrays,
    Parameters,
    ReconnectIns,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.history import History
from flwr.server.strategy import FedAvg

from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError, GIError
from gi.world.fl.protocol import Protocol

Tensor = torch.Tensor

log = logging.getLogger("gi.world.fl.flower")


# --------------------------------------------------------------------------- parameters ⇄ state dicts

def state_to_ndarrays(model: torch.nn.Module) -> NDArrays:
    """The model's ``state_dict()`` values as NumPy arrays, in order (what a Flower client sends)."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def ndarrays_to_state(model: torch.nn.Module, arrays: NDArrays) -> dict[str, Tensor]:
    """NumPy arrays in ``state_dict()`` order back into a state dict of ``model``'s names, checked."""
    names = list(model.state_dict())
    if len(arrays) != len(names):
        raise CaptureError(f"Flower parameters hold {len(arrays)} arrays but the model's state_dict has "
                           f"{len(names)} entries; send every state_dict value in order (state_to_ndarrays)")
    state = {}
    for (name, ref), arr in zip(model.state_dict().items(), arrays):
        t = torch.from_numpy(np.asarray(arr).copy())
        if tuple(t.shape) != tuple(ref.shape):
            raise CaptureError(f"Flower array for {name!r} has shape {tuple(t.shape)}, the model's is "
                               f"{tuple(ref.shape)}: parameters are not in state_dict order")
        state[name] = t.to(ref.dtype)
    return state


ROUND_KEYS = ("lr", "batch_size", "local_epochs")  # what sizes a client's round (local_steps may replace local_epochs)


def protocol_from_config(base: Protocol, config: dict[str, Scalar]) -> Protocol:
    """``base`` with every fit-config key that names a :class:`Protocol` field replaced (typed checks apply);
    other keys are the application's own and are ignored. A config that sets none of :data:`ROUND_KEYS` is
    warned about once per strategy by :class:`CapturingFedAvg`, naming the values the attack will assume."""
    names = {f.name for f in dataclasses.fields(Protocol)}
    known = {k: v for k, v in config.items() if k in names}
    return Protocol.from_dict({**base.to_dict(), **known}) if known else base


# --------------------------------------------------------------------------- the strategy
def unusable_result(res: FitRes, shapes: Sequence[tuple[int, ...]] | None = None) -> str | None:
    """Why a client's ``FitRes`` cannot enter FedAvg's weighted mean (None when it can): no examples, parameters
    that are not finite, or (with ``shapes``, the model's ``state_dict()`` shapes in order) arrays missing, extra or
    of another shape, which would make the mean itself fail and end the round."""
    try:
        n = int(res.num_examples)
    except (TypeError, ValueError):
        return f"num_examples={res.num_examples!r} is not an integer"
    if n <= 0:
        return f"num_examples={n}: a client that trained on no sample has no weight in the mean"
    try:
        arrays = parameters_to_ndarrays(res.parameters)
    except Exception as exc:  # noqa: BLE001  (any decoding failure of a peer's message)
        return f"parameters cannot be decoded ({type(exc).__name__})"
    if shapes is not None:
        if len(arrays) != len(shapes):
            return f"its parameters hold {len(arrays)} arrays, the model's state_dict {len(shapes)}"
        bad = next((i for i, (a, s) in enumerate(zip(arrays, shapes)) if tuple(a.shape) != tuple(s)), None)
        if bad is not None:
            return f"its array {bad} has shape {tuple(arrays[bad].shape)}, the model's is {tuple(shapes[bad])}"
    if any(not np.all(np.isfinite(a)) for a in arrays if np.issubdtype(a.dtype, np.number)):
        return "its parameters hold NaN or Inf"
    return None


class CapturingFedAvg(FedAvg):
    """Flower's FedAvg that records every client's update as a :class:`gi.Capture` (module docstring).

    ``model``: the architecture (any ``nn.Module``; its provenance is recorded, e.g. a
    :func:`gi.world.models.from_factory` model); ``protocol``: the base protocol (``scheme`` an update scheme, FedAvg by
    default) that the fit config refines; ``capture_rounds`` / ``capture_clients``: which rounds and client ids to
    record (None: all); ``last_layer`` / ``in_shape``: as in :meth:`gi.Capture.from_update`. Other keyword
    arguments are FedAvg's (``on_fit_config_fn``, ``evaluate_fn``, ``fraction_fit``, ...). ``initial_parameters``
    defaults to ``model``'s. ``captures`` lists ``(round, client id, Capture)``.
    """

    def __init__(self, model: torch.nn.Module, protocol: Protocol | None = None,
                 capture_rounds: Sequence[int] | None = None, capture_clients: Sequence[str] | None = None,
                 last_layer: str | None = None, in_shape: Sequence[int] | None = None, **fedavg: Any) -> None:
        protocol = protocol if protocol is not None else Protocol(scheme="fedavg")
        if not protocol.is_update:
            raise ConfigError(f"CapturingFedAvg records updates; protocol.scheme={protocol.scheme!r} shares gradients")
        fedavg.setdefault("initial_parameters", ndarrays_to_parameters(state_to_ndarrays(model)))
        super().__init__(**fedavg)
        self.model, self.protocol = model, protocol
        self.capture_rounds = None if capture_rounds is None else {int(r) for r in capture_rounds}
        self.capture_clients = None if capture_clients is None else {str(c) for c in capture_clients}
        self.last_layer, self.in_shape = last_layer, in_shape
        self.shapes = [tuple(v.shape) for v in model.state_dict().values()]
        self.warned = False  # the fit config's missing round keys: said once
        self.captures: list[tuple[int, str, Capture]] = []
        self.skipped: list[tuple[int, str, str]] = []  # (round, client id, why): left out of the round or not captured
        self._round: dict[int, tuple[NDArrays, dict[str, Scalar]]] = {}

    def __repr__(self) -> str:
        return f"CapturingFedAvg(accept_failures={self.accept_failures}, captures={len(self.captures)})"

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        """FedAvg's, remembering the round's global parameters θᵗ and fit config."""
        instructions = super().configure_fit(server_round, parameters, client_manager)
        config = dict(instructions[0][1].config) if instructions else {}
        self._round[server_round] = (parameters_to_ndarrays(parameters), config)
        return instructions

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]) -> tuple[Parameters | None,
                                                                                         dict[str, Scalar]]:
        """Record the captures of this round's results, then aggregate as FedAvg does."""
        kept, failures = [], list(failures)
        for proxy, res in results:
            reason = unusable_result(res, self.shapes)
            if reason is not None:  # a bad client is left out of the round, which goes on without it
                log.warning("round %d: client %s skipped: %s", server_round, proxy.cid, reason)
                self.skipped.append((server_round, str(proxy.cid), reason))
                failures.append((proxy, res))
                continue
            kept.append((proxy, res))
            if (self.capture_rounds is None or server_round in self.capture_rounds) and \
                    (self.capture_clients is None or str(proxy.cid) in self.capture_clients):
                try:
                    self.captures.append((server_round, str(proxy.cid), self.capture_of(server_round, res)))
                except (GIError, ValueError, TypeError) as exc:  # its update still counts; only the capture is lost
                    log.warning("round %d: client %s not captured: %s", server_round, proxy.cid, exc)
                    self.skipped.append((server_round, str(proxy.cid), f"not captured: {exc}"))
        self._round.pop(server_round - 1, None)
        return super().aggregate_fit(server_round, kept, failures)

    def capture_of(self, server_round: int, res: FitRes) -> Capture:
        """The capture of one client's ``FitRes`` in ``server_round``."""
        if server_round not in self._round:
            raise CaptureError(f"round {server_round} was not configured by this strategy (configure_fit)")
        arrays, config = self._round[server_round]
        missing = [k for k in ROUND_KEYS if k not in config and not (k == "local_epochs" and "local_steps" in config)]
        if missing and not self.warned:
            self.warned = True
            assumed = ", ".join(f"{k}={getattr(self.protocol, k)!r}" for k in missing)
            log.warning("round %d: the fit config sets none of %s; the captures assume the strategy's protocol: %s "
                        "(set them in on_fit_config_fn, or pass protocol=gi.Protocol(...))", server_round, missing,
                        assumed)
        before = ndarrays_to_state(self.model, arrays)
        after = ndarrays_to_state(self.model, parameters_to_ndarrays(res.parameters))
        protocol = protocol_from_config(self.protocol, config)
        capture = Capture.from_update(before, after, protocol, int(res.num_examples), last_layer=self.last_layer,
                                      in_shape=self.in_shape, model=self.model)
        capture.meta.update(round=int(server_round), flower_config={k: v for k, v in config.items()
                                                                    if isinstance(v, int | float | str | bool)})
        return capture


# --------------------------------------------------------------------------- an in-process federation
class InProcessClientProxy(ClientProxy):
    """A :class:`ClientProxy` that calls a client living in this process (no gRPC, no Ray)."""

    def __init__(self, cid: str, client: Client | NumPyClient) -> None:
        super().__init__(cid)
        self.client = client.to_client() if isinstance(client, NumPyClient) else client

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None,
                       group_id: int | None) -> GetPropertiesRes:
        return self.client.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns, timeout: float | None,
                       group_id: int | None) -> GetParametersRes:
        return self.client.get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        return self.client.fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
        return self.client.evaluate(ins)

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        return DisconnectRes(reason="in-process")


def run_in_process(strategy: FedAvg, clients: Sequence[Client | NumPyClient], num_rounds: int,
                   client_ids: Sequence[str] | None = None,
                   manager: Callable[[], ClientManager] = SimpleClientManager) -> History:
    """Flower's server loop (``flwr.server.Server.fit``) over ``clients`` in this process, one at a time."""
    if num_rounds < 1:
        raise ConfigError(f"num_rounds must be >= 1, got {num_rounds}")
    ids = [str(i) for i in range(len(clients))] if client_ids is None else [str(c) for c in client_ids]
    client_manager = manager()
    for cid, client in zip(ids, clients):
        client_manager.register(InProcessClientProxy(cid, client))
    server = Server(client_manager=client_manager, strategy=strategy)
    server.set_max_workers(1)  # sequential: reproducible, and torch keeps its threads
    history, _ = server.fit(num_rounds=num_rounds, timeout=None)
    return history
