"""What the analytic inversion needs to know of an activation ``a = σ(z)``, read from its output ``a``.

``ACTIVATION_DERIVATIVES``: σ'(z) as a function of ``a`` (soft-label paper §4.2, eq. 6: δ = ∂L/∂a ⊙ σ'(z)).
``ACTIVATION_INVERSES``: ``z = σ⁻¹(a)`` and where it is defined (a ReLU's zero output hides its pre-activation),
which the convolution route needs for its forward constraint (:mod:`fcn_analytic.conv`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Tensor = torch.Tensor
_SELU_SCALE, _SELU_ALPHA = 1.0507009873554805, 1.6732632423543772
_EDGE = 1e-12  # a sigmoid / tanh output this close to its bound is saturated: its z is not recoverable


def _selu_derivative(a: Tensor, m: nn.Module) -> Tensor:
    return torch.where(a > 0, torch.full_like(a, _SELU_SCALE), a + _SELU_SCALE * _SELU_ALPHA)


# activation class → σ'(z) written as a function of the output a = σ(z) (and the module, for its parameters)
ACTIVATION_DERIVATIVES: dict[type, Callable[[Tensor, nn.Module], Tensor]] = {
    nn.ReLU: lambda a, m: (a > 0).to(a.dtype),
    nn.Sigmoid: lambda a, m: a * (1 - a),
    nn.Tanh: lambda a, m: 1 - a * a,
    nn.Identity: lambda a, m: torch.ones_like(a),
    nn.LeakyReLU: lambda a, m: torch.where(a > 0, torch.ones_like(a), torch.full_like(a, m.negative_slope)),
    nn.ELU: lambda a, m: torch.where(a > 0, torch.ones_like(a), a + m.alpha),
    nn.SELU: _selu_derivative,
}


def _sigmoid_inverse(a: Tensor, m: nn.Module) -> tuple[Tensor, Tensor]:
    valid = (a > _EDGE) & (a < 1 - _EDGE)
    c = a.clamp(_EDGE, 1 - _EDGE)
    return torch.log(c) - torch.log1p(-c), valid


def _tanh_inverse(a: Tensor, m: nn.Module) -> tuple[Tensor, Tensor]:
    valid = a.abs() < 1 - _EDGE
    return torch.atanh(a.clamp(-1 + _EDGE, 1 - _EDGE)), valid


def _relu_inverse(a: Tensor, m: nn.Module) -> tuple[Tensor, Tensor]:
    return a, a > 0


def _leaky_inverse(a: Tensor, m: nn.Module) -> tuple[Tensor, Tensor]:
    if m.negative_slope == 0:
        return _relu_inverse(a, m)
    return torch.where(a > 0, a, a / m.negative_slope), torch.ones_like(a, dtype=torch.bool)


def _elu_inverse(a: Tensor, m: nn.Module, scale: float = 1.0, alpha: float | None = None) -> tuple[Tensor, Tensor]:
    alpha = m.alpha if alpha is None else alpha
    floor = -scale * alpha
    valid = a > floor * (1 - _EDGE)
    neg = torch.log1p((a / (scale * alpha)).clamp_min(-1 + _EDGE))
    return torch.where(a > 0, a / scale, neg), valid


# activation class → (z, valid) with z = σ⁻¹(a) wherever ``valid``
ACTIVATION_INVERSES: dict[type, Callable[[Tensor, nn.Module], tuple[Tensor, Tensor]]] = {
    nn.ReLU: _relu_inverse,
    nn.Sigmoid: _sigmoid_inverse,
    nn.Tanh: _tanh_inverse,
    nn.Identity: lambda a, m: (a, torch.ones_like(a, dtype=torch.bool)),
    nn.LeakyReLU: _leaky_inverse,
    nn.ELU: _elu_inverse,
    nn.SELU: lambda a, m: _elu_inverse(a, m, _SELU_SCALE, _SELU_ALPHA),
}
