"""What the client would have shared for dummy data: the FedSGD gradient or the unrolled FedAvg update.

Both are pure functions of one problem's images ``x`` (B, C, H, W) and soft targets ``y`` (B, C), written with
``torch.func`` so the reconstruction can ``vmap`` them over captures × restarts and differentiate through them.
Each returns ``(shared, features)``: the shared tensors by parameter name and the last-layer input
``f_{N−1}(x)`` (B, D) at the global model when asked for (``features=True``; the model must be a GIModel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from gi.errors import ConfigError
from gi.losses import loss_for
from gi.protocol import Protocol

Tensor = torch.Tensor
State = dict[str, Tensor]
Simulator = Callable[[Tensor, Tensor], tuple[State, Tensor | None]]


class FeaturesAndLogits(nn.Module):
    """``x ↦ (f_{N−1}(x), logits)`` of a :class:`gi.models.GIModel` in one forward pass."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor | None, Tensor]:
        if hasattr(self.model, "features") and hasattr(self.model, "fc"):
            f = self.model.features(x)
            return f, self.model.fc(f)
        return None, self.model(x)


def _caller(model: nn.Module) -> Callable[[State, Tensor], tuple[Tensor | None, Tensor]]:
    wrapper = FeaturesAndLogits(model)
    buffers = {f"model.{k}": v for k, v in model.named_buffers()}

    def call(params: State, x: Tensor) -> tuple[Tensor | None, Tensor]:
        return functional_call(wrapper, ({f"model.{k}": v for k, v in params.items()}, buffers), (x,))

    return call


def gradient_simulator(model: nn.Module, protocol: Protocol, names: list[str], features: bool = False,
                       autograd: bool = False, **_: Any) -> Simulator:
    """FedSGD: ``∇θ L(f_θ(x), y)`` of the mean loss over the batch (DESIGN.md §2), only for ``names``;
    ``features``: also return ``f_{N−1}(x)`` (free: the same forward pass).

    ``autograd=True``: one problem per call with ``torch.autograd.grad(create_graph=True)`` on the model's own
    parameters, which this sets to ``requires_grad`` (so callers must back-propagate with ``inputs=``); no
    ``functional_call``/``torch.func`` overhead, but it cannot be vmapped (the one-problem-at-a-time path).
    """
    params = {n: p for n, p in model.named_parameters()}
    call, loss_fn = _caller(model), loss_for(protocol)
    if autograd:
        forward, chosen = FeaturesAndLogits(model), [params[n] for n in names]
        for p in chosen:
            p.requires_grad_(True)

        def simulate_autograd(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
            with torch.enable_grad():  # also under no_grad (final scoring): the gradient is the output
                f, z = forward(x)
                g = torch.autograd.grad(loss_fn(z, y), chosen, create_graph=True)
            return dict(zip(names, g)), (f if features else None)

        return simulate_autograd

    def simulate(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        def loss(sub: State) -> tuple[Tensor, Tensor | None]:
            f, z = call({**params, **sub}, x)
            return loss_fn(z, y), f

        g, f = grad(loss, has_aux=True)({n: params[n] for n in names})
        return g, (f if features else None)

    return simulate


def slot_schedule(protocol: Protocol, num_samples: int) -> list[tuple[int, int]]:
    """``(start, size)`` of every local step over the B dummy slots, from the protocol alone.

    The client reshuffles every epoch and the server cannot know its order, so every epoch walks the slots in
    the same order (as inversefed's ``FedAvgReconstructor`` does); within one epoch this is exact up to a
    permutation of the slots, which the batch metric undoes.
    """
    from gi.victim import local_schedule

    out, pos = [], 0
    for size in local_schedule(protocol, num_samples):
        if pos + size > num_samples:
            pos = 0
        out.append((pos, size))
        pos += size
    return out


def update_simulator(model: nn.Module, protocol: Protocol, names: list[str], num_samples: int = 1,
                     history: State | None = None, trained: list[str] | None = None, features: bool = False,
                     **_: Any) -> Simulator:
    """FedAvg-style schemes: the client's local training unrolled functionally, ``Δθ = θ_m − θ⁰``.

    m steps of the protocol's optimiser (``sgd``; ``sgdm`` v ← γv + d, θ ← θ − ηv; ``nesterov`` θ ← θ − η(d + γv)),
    with weight decay and the scheme's gradient term (FedProx, Scaffold, FedDyn, FedDC; the same closed forms
    as :mod:`gi.victim`, RLU App. A.4–A.9) added to every step's mean-loss gradient ``d``. ``trained``: the
    parameters the client trains (default: ``names``); ``features``: also return ``f_{N−1}(x)`` at θ⁰.
    """
    from gi.victim import SCHEME_TERMS, _Ctx

    if protocol.scheme not in SCHEME_TERMS:
        raise ConfigError(f"cannot unroll protocol.scheme={protocol.scheme!r}; valid: {sorted(SCHEME_TERMS)}")
    every = dict(model.named_parameters())
    trained = list(trained or names)
    params = {n: every[n] for n in trained}
    call, loss_fn = _caller(model), loss_for(protocol)
    steps = slot_schedule(protocol, num_samples)
    term = SCHEME_TERMS[protocol.scheme]
    ctx = _Ctx(protocol, dict(params), dict(history or {}), len(steps))
    lr, gamma, wd = protocol.lr, protocol.momentum, protocol.weight_decay
    momentum = protocol.optimizer in ("sgdm", "nesterov") and gamma > 0

    def step_loss(theta: State, x: Tensor, y: Tensor) -> Tensor:
        return loss_fn(call(theta, x)[1], y)

    def simulate(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        theta, bufs = dict(params), {}
        for start, size in steps:
            g = grad(step_loss)(theta, x[start:start + size], y[start:start + size])
            new = {}
            for n in trained:
                d = g[n]
                if wd:
                    d = d + wd * theta[n]
                if term is not None:
                    extra = term(ctx, n, theta[n])
                    if extra is not None:
                        d = d + extra
                if momentum:
                    bufs[n] = d if n not in bufs else gamma * bufs[n] + d
                    d = d + gamma * bufs[n] if protocol.optimizer == "nesterov" else bufs[n]
                new[n] = theta[n] - lr * d
            theta = new
        f = call(params, x)[0] if features else None
        return {n: theta[n] - params[n] for n in names}, f

    return simulate


SIMULATORS: dict[str, Callable[..., Simulator]] = {"gradient": gradient_simulator, "update": update_simulator}
