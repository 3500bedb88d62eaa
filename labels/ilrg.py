"""iLRG (Ma et al., "Instance-wise batch label restoration via gradients in federated learning", ICLR 2023).

1. Class-wise mean embeddings ``ê_i = ∇W_i / ∇b_i`` (the gradient-weighted mean of the batch's last-layer
   inputs, ≈ the mean embedding of class i's samples).
2. Class-wise mean probabilities ``p̂_i = softmax(W ê_i + b)`` through the global model's last layer.
3. The (C+1)×C linear system in the counts k: ``Σ_j k_j = B`` and, for every class i,
   ``Σ_j k_j (p̂_j[i] − y⁻) − k_i (y⁺ − y⁻) = τ B ∇b_i`` (with one-hot CE: ``Σ_{j≠i} k_j p̂_j[i] + k_i (p̂_i[i] − 1)
   = B ∇b_i``), solved by least squares.

Generalised to the protocol's temperature, smoothed labels and BCE-with-sigmoid (the posterior is the
protocol's); focal loss is read as cross-entropy (iLRG has no focal weight). The public code's
mantissa/exponent splitting is a float32 workaround that float64 makes unnecessary, and its integer
sum fix (``mod_res``, which mishandles a negative surplus) is replaced by the shared largest-remainder
rounding.
"""

from __future__ import annotations

import time

import torch

from gi.capture import Capture
from gi.errors import ConfigError
from gi.losses import posterior
from labels.aux_stats import fedsgd_view, label_embedding, model_last_layer
from labels.base import LabelResult, register
from labels.counts import largest_remainder

Tensor = torch.Tensor
PROBS = ("model", "uniform")


def mean_embeddings(weight_grad: Tensor, bias_grad: Tensor) -> Tensor:
    """``ê_i = ∇W_i / ∇b_i`` (C, D); a class with ``∇b_i = 0`` gets the mean of the others (it carries no count)."""
    zero = bias_grad == 0
    emb = weight_grad / bias_grad.where(~zero, torch.ones_like(bias_grad)).unsqueeze(1)
    if zero.any():
        fill = emb[~zero].mean(0) if (~zero).any() else torch.zeros_like(emb[0])
        emb[zero] = fill
    return emb


@register("ilrg", "iLRG (Ma et al. 2023): mean embeddings ∇W_i/∇b_i through the last layer, (C+1)×C least squares")
def recover_ilrg(capture: Capture, aux=None, probs: str = "model") -> LabelResult:
    """iLRG: solve the (C+1)×C system of step 3 in least squares, then round (needs ∇b and the model's bias).

    ``probs="uniform"`` is iLRG's ``--estimate`` variant (every ``p̂_i = 1/C``).
    """
    if probs not in PROBS:
        raise ConfigError(f"ilrg probs={probs!r} is not allowed; valid: {list(PROBS)}")
    c = capture.num_classes
    view = fedsgd_view(capture)
    if isinstance(view, str):
        return LabelResult.failure("ilrg", c, view)
    if view.bias is None:
        return LabelResult.failure("ilrg", c, "iLRG divides ∇W_i by the last-layer bias gradient ∇b_i; this capture "
                                   "has none (model built with bias_last=False)")
    embedding = label_embedding(capture.protocol, c)
    if isinstance(embedding, str):
        return LabelResult.failure("ilrg", c, embedding)
    y_pos, y_neg = embedding
    start = time.perf_counter()
    total = view.batch_size
    if probs == "model":
        w, b = model_last_layer(capture)
        emb = mean_embeddings(view.weight, view.bias)
        p_hat = posterior(emb @ w.T + (0.0 if b is None else b), capture.protocol.loss, capture.protocol.temperature)
    else:
        p_hat = torch.full((c, c), 1.0 / c, dtype=torch.float64)
    # row i: Σ_j k_j (p̂_j[i] − y⁻) − k_i (y⁺ − y⁻) = τ B ∇b_i ; last row: Σ_j k_j = B
    a = torch.cat([p_hat.T - y_neg - (y_pos - y_neg) * torch.eye(c, dtype=torch.float64),
                   torch.ones(1, c, dtype=torch.float64)])
    rhs = torch.cat([capture.protocol.temperature * total * view.bias, torch.tensor([float(total)])])
    k = torch.linalg.lstsq(a, rhs.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    if not torch.isfinite(k).all():
        return LabelResult.failure("ilrg", c, "the iLRG least-squares system has no finite solution")
    counts = largest_remainder(k, total)
    residual = float(torch.linalg.vector_norm(a @ k - rhs))
    return LabelResult.from_counts("ilrg", counts, estimate=k, info={
        "residual": residual, "solver_seconds": time.perf_counter() - start, "probs": probs})
