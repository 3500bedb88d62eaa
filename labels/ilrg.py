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

**Conditioning (method ``ilrg-robust`` = ``ilrg`` with ``robust=True``; ``ilrg`` itself is the paper's step 1 as
published, the faithful baseline).**
Write ``τB ∇W_i = Σ_{n∉i} (p_ni − y⁻) e_n − Σ_{n∈i} (y⁺ − p_ni) e_n ≈ Q_i μ_{−i} − R_i ē_i`` (μ_{−i}: the
non-members' mean embedding, Q_i their mass on class i, R_i = n_i (y⁺ − p̂_i[i]) the members' mass) and
``τB ∇b_i = Q_i − R_i``. Step 1's ratio ``(Q_i μ_{−i} − R_i ē_i)/(Q_i − R_i)`` is the class mean only when
``Q_i ≪ R_i`` (non-members put little mass on i: trained nets, or C = 1000 as in the paper's ImageNet runs).
With few classes and an untrained net (C = 10, B = 32: every sample gives class i about 1/C) a present
class with ``n_i ≈ Σ_n p_ni`` has ``∇b_i ≈ 0`` and ``ê_i`` is a ratio of two near-zero numbers: in the
posterior-table2 configs (LeNet-5 / ResNet-50, ReLU, B = 32) every missed trial had such rows, with
``‖ê_i − ē_i‖/‖ē_i‖`` of 10–400 (|∇b_i| ≤ 2e-3, ``p̂_i[i] → 0``) and, on ResNet-50 (peaked posteriors),
0.2–1 for classes whose ∇b_i is partly cancelled. The robust estimator (our addition, not in the paper)
adds candidates with well-conditioned denominators:

a. a common embedding ``μ = argmin_μ Σ_i ‖∇W_i − ∇b_i μ‖² = Σ_i ∇b_i ∇W_i / Σ_i ∇b_i²`` (the batch mean when
   all samples share one posterior and class means differ little; the ∇b_i² weighting silences the
   ill-conditioned rows), giving the common-posterior candidate ``p̂_i = posterior(W μ + b)`` for every class;
b. from the previous candidate's counts n and p̂, for every present class (n_i ≥ ½) the member /
   non-member split solved for ē_i with ``μ_{−i} = (B μ − n_i ē_i)/(B − n_i)`` and ``q_i = Q_i/(B − n_i)``:
   ``ē_i = (q_i B μ − τB ∇W_i) / (n_i (y⁺ − p̂_i[i] + q_i))`` (denominator bounded away from 0 for a present
   class; step 1's ratio when q_i = 0, the exact class mean when all samples share one posterior and μ
   is the batch mean); absent classes keep step 1's ratio (their row needs exactly that weighted mean).
   ``iterations`` rounds of (b) give further candidates;
c. the paper's own step-1 candidate is kept as well, and the candidate whose *rounded* counts leave the
   smallest residual of its own (C+1)×C system wins (ranked by the attack objective, never by truth).

The iLRG paper's equation numbers are not in the offline notes; steps 1–3 follow its §3 as summarised in
shared/notes/reference-code.md (iLRG section).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from gi.world.losses import posterior
from labels.aux_stats import fedsgd_view, label_embedding, model_last_layer
from labels.base import register
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


def common_embedding(weight_grad: Tensor, bias_grad: Tensor) -> Tensor:
    """``μ = Σ_i ∇b_i ∇W_i / Σ_i ∇b_i²`` (D,): the least-squares common embedding of ``∇W_i ≈ ∇b_i μ`` (step a)."""
    den = (bias_grad ** 2).sum()
    if den == 0:
        return torch.zeros_like(weight_grad[0])
    return bias_grad @ weight_grad / den


def split_embeddings(weight_grad: Tensor, bias_grad: Tensor, mu: Tensor, counts: Tensor, p_self: Tensor,
                     total: int, tau: float, y_pos: float, fallback: Tensor) -> Tensor:
    """Step (b): ``ē_i = (q_i B μ − τB ∇W_i) / (n_i (y⁺ − p̂_i[i] + q_i))`` for present classes (``n_i ≥ ½``),
    ``fallback`` (step 1's ratio) elsewhere.

    Members contribute ``n_i (p̂_i[i] − y⁺) ē_i`` to ``τB ∇W_i``, non-members ``Q_i μ_{−i}`` with their mass
    ``Q_i = τB ∇b_i + n_i (y⁺ − p̂_i[i])``, mean weight ``q_i = Q_i / (B − n_i)`` and mean embedding
    ``μ_{−i} = (B μ − n_i ē_i) / (B − n_i)``; solving for ē_i gives the formula, exact when members share the
    posterior p̂_i and non-members share q_i (e.g. one common posterior) and μ is the batch mean.
    """
    n = counts.clamp_min(0)
    scaled = tau * total * bias_grad
    q = (scaled + n * (y_pos - p_self)) / (total - n).clamp_min(1.0)
    den = n * (y_pos - p_self + q)
    use = (counts >= 0.5) & (den > 1e-9)
    safe = den.where(use, torch.ones_like(den)).unsqueeze(1)
    split = (q.unsqueeze(1) * total * mu - tau * total * weight_grad) / safe
    return torch.where(use.unsqueeze(1), split, fallback)


def _system(p_hat: Tensor, y_pos: float, y_neg: float) -> Tensor:
    """Step 3's (C+1)×C matrix: rows ``Σ_j k_j (p̂_j[i] − y⁻) − k_i (y⁺ − y⁻)``, last row ``Σ_j k_j``."""
    c = p_hat.shape[0]
    return torch.cat([p_hat.T - y_neg - (y_pos - y_neg) * torch.eye(c, dtype=torch.float64),
                      torch.ones(1, c, dtype=torch.float64)])


def _solve(p_hat: Tensor, rhs: Tensor, y_pos: float, y_neg: float,
           total: int) -> tuple[Tensor, Tensor, float, float] | None:
    """Least squares of step 3: ``(k, rounded counts, residual of the rounded counts, residual of k)``, or None
    when p̂ or k is not finite."""
    if not torch.isfinite(p_hat).all():
        return None
    a = _system(p_hat, y_pos, y_neg)
    k = torch.linalg.lstsq(a, rhs.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    if not torch.isfinite(k).all():
        return None
    counts = largest_remainder(k, total)
    return (k, counts, float(torch.linalg.vector_norm(a @ counts.double() - rhs)),
            float(torch.linalg.vector_norm(a @ k - rhs)))


@register("ilrg", "iLRG (Ma et al. 2023): mean embeddings ∇W_i/∇b_i through the last layer, (C+1)×C least squares")
def recover_ilrg(capture: Capture, aux=None, probs: str = "model", robust: bool = False,
                 iterations: int = 3) -> LabelResult:
    """iLRG: solve the (C+1)×C system of step 3 in least squares, then round (needs ∇b and the model's bias).

    ``probs="uniform"`` is iLRG's ``--estimate`` variant (every ``p̂_i = 1/C``). ``robust=True`` (method
    ``ilrg-robust``) adds the well-conditioned candidates (a)–(b) of the module docstring and keeps the
    candidate, the paper's step 1 included, with the smallest rounded residual (c; ties keep the paper's);
    ``robust=False`` (default) is the paper's step 1 alone. ``iterations``: rounds of step (b). ``robust``
    does not apply to ``probs="uniform"``.
    ``info["candidate"]`` names the winner (paper, common, split1, …), ``info["candidates"]`` their residuals.
    """
    if probs not in PROBS:
        raise ConfigError(f"ilrg probs={probs!r} is not allowed; valid: {list(PROBS)}")
    if int(iterations) < 0:
        raise ConfigError(f"ilrg iterations must be >= 0, got {iterations!r}")
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
    loss, tau = capture.protocol.loss, capture.protocol.temperature
    # row i: Σ_j k_j (p̂_j[i] − y⁻) − k_i (y⁺ − y⁻) = τ B ∇b_i ; last row: Σ_j k_j = B
    rhs = torch.cat([tau * total * view.bias, torch.tensor([float(total)], dtype=torch.float64)])
    candidates: list[tuple[str, Tensor, Tensor, float, float]] = []
    if probs == "uniform":
        p_hat = torch.full((c, c), 1.0 / c, dtype=torch.float64)
        solved = _solve(p_hat, rhs, y_pos, y_neg, total)
        if solved is not None:
            candidates.append(("uniform", *solved))
    else:
        w, b = model_last_layer(capture)

        def probs_of(emb: Tensor) -> Tensor:
            return posterior(emb @ w.T + (0.0 if b is None else b), loss, tau)

        paper = mean_embeddings(view.weight, view.bias)
        p_hat = probs_of(paper)
        solved = _solve(p_hat, rhs, y_pos, y_neg, total)
        if solved is not None:
            candidates.append(("paper", *solved))
        if robust:
            mu = common_embedding(view.weight, view.bias)
            p_hat = probs_of(mu).expand(c, c)
            solved = _solve(p_hat, rhs, y_pos, y_neg, total)
            if solved is not None:
                candidates.append(("common", *solved))
            for it in range(int(iterations)):
                if solved is None:
                    break
                emb = split_embeddings(view.weight, view.bias, mu, solved[0], p_hat.diagonal(), total, tau, y_pos,
                                       paper)
                p_hat = probs_of(emb)
                solved = _solve(p_hat, rhs, y_pos, y_neg, total)
                if solved is not None:
                    candidates.append((f"split{it + 1}", *solved))
    if not candidates:
        return LabelResult.failure("ilrg", c, "the iLRG least-squares system has no finite solution")
    name, k, counts, rounded, residual = min(candidates, key=lambda cand: cand[3])
    return LabelResult.from_counts("ilrg", counts, estimate=k, info={
        "residual": residual, "rounded_residual": rounded, "solver_seconds": time.perf_counter() - start,
        "probs": probs, "robust": bool(robust), "candidate": name,
        "candidates": {cand[0]: cand[3] for cand in candidates}})


@register("ilrg-robust", "iLRG with conditioned class embeddings (ours): common-posterior and member/non-member "
          "candidates for classes with ∇b_i ≈ 0, smallest rounded residual wins")
def recover_ilrg_robust(capture: Capture, aux=None, probs: str = "model", iterations: int = 3) -> LabelResult:
    """:func:`recover_ilrg` with ``robust=True`` (steps a–c of the module docstring; not in the iLRG paper)."""
    result = recover_ilrg(capture, aux, probs=probs, robust=True, iterations=iterations)
    return dataclasses.replace(result, method="ilrg-robust")
