"""The defended gradient of one client step, written once for FedSGD (:func:`gi.capture_gradients`) and local
training (:mod:`gi.world.fl.victim`): the ``batch`` stage, the gradient (per sample under a ``per-example`` defence),
then the ``step`` stage (:mod:`gi.world.fl.defences.base`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gi.world.fl.defences.base import Context, apply, at


def defended_gradient(forward: Callable[[dict[str, Any], Any], Any], params: dict[str, Any], images: Any,
                      targets: Any, loss_fn: Callable[[Any, Any], Any], ctx: Context) -> tuple[Any, Any, Any]:
    """``(loss, clean mean gradient, defended gradient)`` of one step at ``params`` (name → tensor).

    ``forward(params, x)`` gives the logits (e.g. ``functional_call``); ``targets`` are soft (B, C); ``loss_fn``
    is the mean-reduced loss. The clean gradient is the one the truth records (before the step's defences, after
    the batch stage's: it is what the client's training targets)."""
    import torch

    images, targets = apply("batch", (images, targets), ctx)
    names = list(params)
    if at(ctx.protocol, "per-example"):
        from torch.func import grad_and_value, vmap

        def one(p: dict[str, Any], x: Any, y: Any) -> Any:
            return loss_fn(forward(p, x[None]), y[None])

        with torch.enable_grad():
            per, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(
                {k: params[k].detach() for k in names}, images, targets)
        clean = {k: per[k].mean(0) for k in names}
        loss = losses.mean()
        grads = apply("per-example", per, ctx)
    else:
        with torch.enable_grad():
            live = {k: params[k].detach().requires_grad_() for k in names}
            loss = loss_fn(forward(live, images), targets)
            clean = dict(zip(names, torch.autograd.grad(loss, list(live.values()))))
        grads = clean
    return loss.detach(), clean, apply("step", grads, ctx)
