"""What the client would have shared for dummy data: the FedSGD gradient or the unrolled FedAvg update.

Both are pure functions of one problem's images ``x`` (B, C, H, W) and soft targets ``y`` (B, C), written with
``torch.func`` so the reconstruction can ``vmap`` them over captures × restarts and differentiate through them.
Each returns ``(shared, features)``: the shared tensors by parameter name and the last-layer input
``f_{N−1}(x)`` (B, D) at the global model when asked for (``features=True``). The model is any ``nn.Module``
(the user's own function, called with ``functional_call``); the last-layer input is read by a forward
pre-hook on its last layer (:func:`gi.world.models.features_and_logits`; the name is the capture's, recorded on
the rebuilt model by :meth:`gi.Capture.model`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from gi.core.errors import ConfigError
from gi.world.fl.local import local_train, slot_schedule
from gi.world.fl.protocol import Protocol
from gi.world.losses import LossFn, loss_for
from gi.world.models import features_and_logits, last_layer_of

Tensor = torch.Tensor
State = dict[str, Tensor]
Simulator = Callable[[Tensor, Tensor], tuple[State, Tensor | None]]


class FeaturesAndLogits(nn.Module):
    """``x ↦ (f_{N−1}(x), logits)`` of any classifier module in one forward pass (the input of its last layer
    ``last_layer``; default: the name recorded on the model, :func:`gi.world.models.last_layer_of`)."""

    def __init__(self, model: nn.Module, last_layer: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.last_layer = last_layer if last_layer is not None else last_layer_of(model)

    def forward(self, x: Tensor) -> tuple[Tensor | None, Tensor]:
        return features_and_logits(self.model, x, self.last_layer)


def _caller(model: nn.Module, feature_layer: str | None = None
            ) -> Callable[[State, Tensor], tuple[Tensor | None, Tensor]]:
    wrapper = FeaturesAndLogits(model, feature_layer)

    def call(params: State, x: Tensor) -> tuple[Tensor | None, Tensor]:
        # buffers read at call time: Lightning moves the module to its device after the simulator is built
        buffers = {f"model.{k}": v for k, v in model.named_buffers()}
        return functional_call(wrapper, ({f"model.{k}": v for k, v in params.items()}, buffers), (x,))

    return call


def _forward_only(model: nn.Module, call: Callable[[State, Tensor], tuple[Tensor | None, Tensor]],
                  features: bool) -> Simulator:
    """No layer is matched: the features alone, one forward pass at the global model and no gradient."""
    def forward_only(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        f, _ = call(dict(model.named_parameters()), x)
        return {}, (f if features else None)

    return forward_only


def gradient_simulator(model: nn.Module, protocol: Protocol, names: list[str], features: bool = False,
                       autograd: bool = False, loss: LossFn | None = None, feature_layer: str | None = None,
                       **_: Any) -> Simulator:
    """FedSGD: ``∇θ L(f_θ(x), y)`` of the mean loss over the batch (docs/architecture.md), only for ``names``;
    ``features``: also return ``f_{N−1}(x)`` (free: the same forward pass). ``loss``: ``(logits, y) -> scalar``
    instead of the protocol's (:func:`gi.world.losses.loss_for`), e.g. :func:`gi.world.losses.output_error_loss` with
    ``y`` the captured output error. ``feature_layer``: the module whose input the features are (None: the last
    layer, ``f_{N−1}``; ``attack.feature_layer``).

    ``autograd=True``: one problem per call with ``torch.autograd.grad(create_graph=True)`` on the model's own
    parameters, which this sets to ``requires_grad`` (so callers must back-propagate with ``inputs=``); no
    ``functional_call``/``torch.func`` overhead, but it cannot be vmapped (the one-problem-at-a-time path).
    """
    # Parameters and buffers are looked up at call time: Lightning moves the module to its device after this.
    call, loss_fn = _caller(model, feature_layer), loss or loss_for(protocol)
    if not names:  # every layer weighs 0: the feature term alone, one forward pass and no gradient
        return _forward_only(model, call, features)
    if autograd:
        forward = FeaturesAndLogits(model, feature_layer)
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


def update_simulator(model: nn.Module, protocol: Protocol, names: list[str], num_samples: int = 1,
                     history: State | None = None, trained: list[str] | None = None, features: bool = False,
                     feature_layer: str | None = None, **_: Any) -> Simulator:
    """Update-sharing schemes: the client's local training unrolled functionally, ``Δθ = θ_m − θ⁰``.

    :func:`gi.world.fl.local.local_train` (the victim's own loop: the protocol's optimiser, weight decay and the
    scheme's
    term, RLU App. A.4–A.9) with every step's gradient ``torch.func.grad`` of the mean loss on the step's dummy
    slots (:func:`gi.world.fl.local.slot_schedule`). ``trained``: the parameters the client trains (default:
    ``names``); ``features``: also return ``f_{N−1}(x)`` at θ⁰ (or the input of ``feature_layer``). No ``names``
    (every layer weighs 0): the features alone, one forward pass, nothing unrolled.
    """
    if not protocol.is_update:
        raise ConfigError(f"cannot unroll protocol.scheme={protocol.scheme!r}: it shares a gradient, not an update")
    trained = list(trained or names)
    unknown = sorted(set(trained) - dict(model.named_parameters()).keys())
    if unknown:
        raise ConfigError(f"update_simulator: the model has no parameter(s) {unknown[:3]}")
    call, loss_fn = _caller(model, feature_layer), loss_for(protocol)
    if not names:
        return _forward_only(model, call, features)
    steps = slot_schedule(protocol, num_samples)
    history = dict(history or {})

    def step_loss(theta: State, x: Tensor, y: Tensor) -> Tensor:
        return loss_fn(call(theta, x)[1], y)

    def simulate(x: Tensor, y: Tensor) -> tuple[State, Tensor | None]:
        every = dict(model.named_parameters())  # at call time: the module may have moved to a GPU
        params = {n: every[n] for n in trained}

        def gradient(theta: State, tau: int) -> State:
            start, size = steps[tau]
            return grad(step_loss)(theta, x[start:start + size], y[start:start + size])

        theta = local_train(params, protocol, len(steps), gradient, history)
        f = call(params, x)[0] if features else None
        return {n: theta[n] - params[n] for n in names}, f

    return simulate


SIMULATORS: dict[str, Callable[..., Simulator]] = {"gradient": gradient_simulator, "update": update_simulator}
