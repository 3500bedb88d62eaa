"""The decoupled BatchNorm train-mode attack: the client's batch statistics fixed in the forward pass, its
train-mode input gradient in the backward pass (docs/architecture.md, "BatchNorm in train mode";
docs/results/batchnorm.md).

A client whose BatchNorm runs in train mode normalises every layer's input x (values x_i, i over the n = B·H·W
entries of a channel) with its batch's own mean μ_B and biased variance σ²_B, so each sample's output depends on
every other sample's. The gradient-matching landscape is then a needle (docs/results/realistic.md, "Why nothing
moves"). A one-step FedAvg update's buffers give μ_B and σ²_B exactly (:func:`fcn_analytic.batchnorm.
batch_statistics`). This module builds the attack's simulated model with them (LeakPro's BatchNorm example):

    forward:   y = γ x̂ + β,   x̂ = (x − μ) / σ,   σ = √(σ² + ε),   μ, σ² FIXED (the recovered batch statistics),

so each image's forward is eval-mode-like and samples do not interact, and the backward is the train-mode one
(Ioffe & Szegedy 2015, §3, the chain rule through μ_B(x) and σ²_B(x)):

    ∂L/∂x = (1 / σ) (g − mean(g) − x̂ · mean(g x̂)),   g = ∂L/∂x̂ = γ ∂L/∂y,
    ∂L/∂γ = Σ ∂L/∂y · x̂,   ∂L/∂β = Σ ∂L/∂y,

with the means over the batch and spatial dimensions of the current (simulated) batch. Where the fixed statistics
are the batch's own (the truth), the forward values equal the client's and so does every parameter gradient, also
of the layers before a BatchNorm (1e-14 relative in float64 on the zoo's ResNet-32, docs/results/batchnorm.md). A
plain fixed-statistics (eval-mode) backward would give (γ/σ)·g there instead. Off the truth, on S2's untrained
ResNet-32, the decoupled objective is as steep as the train-mode one (docs/results/batchnorm.md, "The landscape").

The backward is written with differentiable torch ops, so the attack's objective, which differentiates the
simulated gradient with respect to the images, gets its second derivatives (``create_graph``, ``torch.func.grad``
and ``vmap``; :func:`torch.autograd.gradgradcheck` in the tests).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from gi.core.errors import CaptureError

Tensor = torch.Tensor
BatchStats = dict[str, tuple[Tensor, Tensor]]


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    """A per-channel vector (C,) shaped to broadcast against a BatchNorm input of ``ndim`` dims (N, C, ...)."""
    return t.reshape(1, -1, *(1,) * (ndim - 2))


def _reduced(ndim: int) -> tuple[int, ...]:
    """The dimensions BatchNorm averages over: the batch and every spatial one, all but the channels."""
    return (0, *range(2, ndim))


class TrainModeBatchNorm(torch.autograd.Function):
    """BatchNorm with fixed statistics in the forward pass and the train-mode input gradient in the backward pass
    (module docstring). Inputs: ``x`` (N, C, ...), ``mean`` and ``var`` (C,) fixed, ``weight`` and ``bias`` (C,)
    or None, ``eps``. The statistics get no gradient."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None,
                eps: float) -> Tensor:
        xhat = (x - _channel_view(mean, x.ndim)) * _channel_view(torch.rsqrt(var + eps), x.ndim)
        y = xhat * _channel_view(weight, x.ndim) if weight is not None else xhat
        return y + _channel_view(bias, x.ndim) if bias is not None else y

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, mean, var, weight, _, eps = inputs
        ctx.save_for_backward(x, mean, var, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, mean, var, weight = ctx.saved_tensors
        dims, nd = _reduced(x.ndim), x.ndim
        rstd = _channel_view(torch.rsqrt(var + ctx.eps), nd)
        xhat = (x - _channel_view(mean, nd)) * rstd
        g = grad_out * _channel_view(weight, nd) if weight is not None else grad_out
        dx = None
        if ctx.needs_input_grad[0]:
            dx = rstd * (g - g.mean(dims, keepdim=True) - xhat * (g * xhat).mean(dims, keepdim=True))
        dw = (grad_out * xhat).sum(dims) if weight is not None and ctx.needs_input_grad[3] else None
        db = grad_out.sum(dims) if ctx.needs_input_grad[4] else None
        return dx, None, None, dw, db, None


def train_mode_batch_norm(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None = None,
                          bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``γ (x − μ)/√(σ² + ε) + β`` with fixed ``mean`` μ and biased ``var`` σ² (C,), differentiated as train-mode
    BatchNorm (:class:`TrainModeBatchNorm`, module docstring)."""
    return TrainModeBatchNorm.apply(x, mean, var, weight, bias, eps)


class DecoupledBatchNorm(nn.Module):
    """A BatchNorm layer of the attack's simulated model: the parameters ``weight`` / ``bias`` of the layer it
    replaces (same names, so the capture's parameter names still apply), the recovered batch statistics as the
    buffers ``batch_mean`` / ``batch_var``, and :func:`train_mode_batch_norm` whatever the module's mode."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, mean: Tensor, var: Tensor) -> None:
        super().__init__()
        if tuple(mean.shape) != (layer.num_features,) or tuple(var.shape) != (layer.num_features,):
            raise CaptureError(f"batch statistics of shapes {tuple(mean.shape)} / {tuple(var.shape)} for a BatchNorm "
                               f"layer of {layer.num_features} channels")
        self.weight, self.bias, self.eps = layer.weight, layer.bias, float(layer.eps)
        dtype = layer.weight.dtype if layer.weight is not None else torch.get_default_dtype()
        device = layer.weight.device if layer.weight is not None else mean.device
        self.register_buffer("batch_mean", mean.detach().to(device=device, dtype=dtype).clone())
        self.register_buffer("batch_var", var.detach().to(device=device, dtype=dtype).clone())

    def forward(self, x: Tensor) -> Tensor:
        return train_mode_batch_norm(x, self.batch_mean, self.batch_var, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.batch_mean.numel()}, eps={self.eps}, fixed batch statistics, train-mode backward"


def batch_norm_layers(model: nn.Module) -> list[str]:
    """The names of the model's BatchNorm modules (every ``_BatchNorm``: 1d, 2d, 3d), in registration order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def decoupled_model(model: nn.Module, stats: BatchStats) -> nn.Module:
    """A copy of ``model`` whose every BatchNorm layer is a :class:`DecoupledBatchNorm` with the batch statistics
    ``stats`` ({module name: (mean, biased var)}, e.g. :func:`fcn_analytic.batchnorm.batch_statistics`); ``model``
    itself, its parameters and buffers, is left as it was. A BatchNorm layer without statistics, or statistics of a
    module that is none, is a :class:`CaptureError` naming it."""
    layers = batch_norm_layers(model)
    if not layers:
        raise CaptureError("the decoupled BatchNorm attack needs a model with BatchNorm layers; this one has none")
    missing, unknown = sorted(set(layers) - set(stats)), sorted(set(stats) - set(layers))
    if missing:
        raise CaptureError(f"no batch statistics for the model's BatchNorm layer(s) {missing[:3]} (a layer without "
                           "running statistics has no buffers to give them)")
    if unknown:
        raise CaptureError(f"batch statistics for {unknown[:3]}, which are not BatchNorm layers of the model")
    out = copy.deepcopy(model)
    for name in layers:
        parent, _, child = name.rpartition(".")
        owner = out.get_submodule(parent) if parent else out
        setattr(owner, child, DecoupledBatchNorm(out.get_submodule(name), *stats[name]))
    return out


__all__ = ["DecoupledBatchNorm", "TrainModeBatchNorm", "batch_norm_layers", "decoupled_model",
           "train_mode_batch_norm"]
