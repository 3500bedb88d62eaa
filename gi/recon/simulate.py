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
from gi.local_optim import LocalOptimizer
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

    def call(params: State, x: Tensor) -> tuple[Tensor | None, Tensor]:
        # buffers read at call time: Lightning moves the module to its device after the simulator is built
        buffers = {f"model.{k}": v for k, v in model.named_buffers()}
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
    # Parameters and buffers are looked up at call time: Lightning moves the module to its device after this.
    call, loss_fn = _caller(model), loss_for(protocol)
    if autograd:
        forward = FeaturesAndLogits(model)
        params = dict(model.named_parameters())
        for n in names:
            params[n].requires_grad_(True)

        def simulate_autograd(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
            live = dict(model.named_parameters())
            with torch.enable_grad():  # also under no_grad (final scoring): the gradient is the output
                f, z = forward(x)
                g = torch.autograd.grad(loss_fn(z, y), [live[n] for n in names], create_graph=True)
            return dict(zip(names, g)), (f if features else None)

        return simulate_autograd

    def simulate(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        def loss(sub: State) -> tuple[Tensor, Tensor | None]:
            f, z = call(sub, x)  # the other parameters: the module's own
            return loss_fn(z, y), f

        live = dict(model.named_parameters())
        g, f = grad(loss, has_aux=True)({n: live[n] for n in names})
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

    m steps of the protocol's optimiser (:mod:`gi.local_optim`: ``sgd``, ``sgdm``, ``nesterov``, ``adadelta``),
    with weight decay and the scheme's gradient term (FedProx, Scaffold, FedDyn, FedDC; the same closed forms
    as :mod:`gi.victim`, RLU App. A.4–A.9) added to every step's mean-loss gradient ``d``. ``trained``: the
    parameters the client trains (default: ``names``); ``features``: also return ``f_{N−1}(x)`` at θ⁰.
    """
    from gi.victim import SCHEME_TERMS, _Ctx

    if protocol.scheme not in SCHEME_TERMS:
        raise ConfigError(f"cannot unroll protocol.scheme={protocol.scheme!r}; valid: {sorted(SCHEME_TERMS)}")
    trained = list(trained or names)
    unknown = sorted(set(trained) - dict(model.named_parameters()).keys())
    if unknown:
        raise ConfigError(f"update_simulator: the model has no parameter(s) {unknown[:3]}")
    call, loss_fn = _caller(model), loss_for(protocol)
    steps = slot_schedule(protocol, num_samples)
    term = SCHEME_TERMS[protocol.scheme]
    history = dict(history or {})
    wd = protocol.weight_decay

    def step_loss(theta: State, x: Tensor, y: Tensor) -> Tensor:
        return loss_fn(call(theta, x)[1], y)

    def simulate(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        every = dict(model.named_parameters())  # at call time: the module may have moved to a GPU
        params = {n: every[n] for n in trained}
        ctx = _Ctx(protocol, params, history, len(steps))
        theta, optimizer = dict(params), LocalOptimizer(protocol)
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
                new[n] = theta[n] - optimizer.displacement(n, d)
            theta = new
        f = call(params, x)[0] if features else None
        return {n: theta[n] - params[n] for n in names}, f

    return simulate


SIMULATORS: dict[str, Callable[..., Simulator]] = {"gradient": gradient_simulator, "update": update_simulator}
