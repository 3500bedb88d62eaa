"""Client losses, in one place.

Every loss takes logits ``(B, C)`` and targets that are either class ids ``(B,)`` or soft labels
``(B, C)`` (rows on the simplex), and reduces by the mean over the batch, which is the FedSGD
convention of docs/architecture.md, "Data flow" (``gradients`` are ∇θ of the mean-reduced loss).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from gi.core.errors import ConfigError

Tensor = torch.Tensor


def as_soft_targets(targets: Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Class ids ``(B,)`` become one-hot rows; soft targets ``(B, C)`` pass through."""
    if targets.ndim == 1:
        return F.one_hot(targets.long(), num_classes).to(dtype)
    if targets.ndim == 2 and targets.shape[1] == num_classes:
        return targets.to(dtype)
    why = (f": the data has {targets.shape[1]} classes, the model {num_classes} logits" if targets.ndim == 2 else "")
    raise ConfigError(
        f"targets must be class ids (B,) or soft labels (B, {num_classes}); got shape {tuple(targets.shape)}{why}"
    )


def check_class_ids(labels: Tensor, num_classes: int, data_classes: int | None = None) -> None:
    """Class ids ``(B,)`` checked against a model's ``num_classes`` logits before any work: ids below 0, or at or
    above the number of logits, are a :class:`ConfigError` naming the number of classes in the data
    (``data_classes``, else the largest id + 1) and the model's logits. Soft targets pass (their width is checked
    by :func:`as_soft_targets`)."""
    if labels.ndim != 1 or labels.numel() == 0 or labels.is_floating_point():
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise ConfigError(f"labels must be class ids >= 0; got {low}")
    if high >= num_classes:
        data = data_classes if data_classes is not None and data_classes > high else high + 1
        raise ConfigError(f"the data has {data} classes (labels up to {high}) but the model has {num_classes} "
                          f"logits; build the model with num_classes >= {data} (model.num_classes, or the "
                          "factory's own option)")


def soft_cross_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over the batch of ``-Σ_c y_c log softmax(z/τ)_c``; ∇z = (p − y)/(τB) (posterior paper, Table 1)."""
    y = as_soft_targets(targets, logits.shape[1], logits.dtype)
    return -(y * F.log_softmax(logits / temperature, dim=1)).sum(1).mean()


def focal_loss(
    logits: Tensor,
    targets: Tensor,
    alpha: float | Tensor | None = None,
    gamma: float = 0.0,
    temperature: float = 1.0,
) -> Tensor:
    """Multi-class focal loss, posterior-probability paper eq. 1 (Lin et al. 2017, extended).

    ``L = -Σ_t y_t α_t (1 − p_t)^γ log p_t`` with ``p = softmax(z/τ)``; for one-hot ``y`` this is
    ``-α_c (1 − p_c)^γ log p_c``. With γ = 0 and α = 1 it is cross-entropy. ``alpha`` is a scalar or a
    per-class vector ``(C,)``.
    """
    y = as_soft_targets(targets, logits.shape[1], logits.dtype)
    logp = F.log_softmax(logits / temperature, dim=1)
    p = logp.exp()
    a = torch.ones(logits.shape[1], dtype=logits.dtype, device=logits.device) if alpha is None else alpha
    a = torch.as_tensor(a, dtype=logits.dtype, device=logits.device)
    weight = a * (1.0 - p).clamp_min(0).pow(gamma)
    return -(y * weight * logp).sum(1).mean()


def binary_cross_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Sigmoid BCE summed over classes, mean over the batch; ∇z = (σ(z/τ) − y)/(τB) (Table 1, last row)."""
    y = as_soft_targets(targets, logits.shape[1], logits.dtype)
    per = F.binary_cross_entropy_with_logits(logits / temperature, y, reduction="none")
    return per.sum(1).mean()


def output_error_loss(logits: Tensor, output_error: Tensor) -> Tensor:
    """``(1/B) Σ_i ⟨z_i, δ_i⟩``: a loss whose gradient in z is the given output error ``δ_i/B``, frozen.

    Its ∇θ is ``(1/B) Σ_i δ_iᵀ ∂z_i/∂θ``. With ``δ_i = B ∂L/∂z_i`` read at the client's point, this is the client's
    ∇θL for any loss L (cross-entropy, focal, BCE, any temperature): the chain rule ∂L/∂θ = (∂L/∂z)ᵀ ∂z/∂θ. For one
    sample with a last-layer bias, ``z = W f + b`` gives ``∂L/∂b = ∂L/∂z``, so δ is the shared bias gradient
    (iDLG's observation, Zhao et al. 2020, read as a vector instead of a sign). Matching with δ frozen takes the
    softmax out of the attack objective: for a ReLU net the dummy gradient is then piecewise affine in the image
    (docs/results/time-to-quality-resnet18.md: "The captured output error").
    """
    return (logits * output_error).sum(1).mean()


LossFn = Callable[[Tensor, Tensor], Tensor]

LOSSES: dict[str, Callable[..., LossFn]] = {
    "ce": lambda p: (lambda z, y: soft_cross_entropy(z, y, p.temperature)),
    "focal": lambda p: (lambda z, y: focal_loss(z, y, p.focal_alpha, p.focal_gamma, p.temperature)),
    "bce": lambda p: (lambda z, y: binary_cross_entropy(z, y, p.temperature)),
}


def loss_for(protocol) -> LossFn:
    """The client's loss ``(logits, targets) -> scalar`` as its protocol names it."""
    try:
        return LOSSES[protocol.loss](protocol)
    except KeyError:
        raise ConfigError(f"unknown loss {protocol.loss!r}; valid: {sorted(LOSSES)}") from None


def posterior(logits: Tensor, loss: str, temperature: float = 1.0) -> Tensor:
    """The output activation that goes with ``loss``: softmax(z/τ), or sigmoid(z/τ) for BCE."""
    if loss == "bce":
        return torch.sigmoid(logits / temperature)
    return torch.softmax(logits / temperature, dim=-1)
