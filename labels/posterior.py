"""Posterior-probability label recovery (anonymous ICLR submission, "Posterior probability-based label
recovery attack in federated learning"; ``shared/papers/posterior-label-recovery-focal-loss.txt``).

From the FedSGD bias gradient ``∇b̄`` (mean over the batch) and auxiliary posterior estimates, Theorem 2
(eq. 3) gives the number of samples of class j in the batch:

    λ_j = B · [(p̂⁻_j − y⁻_j) − ∇b̄_j / φ̂_j] / [(p̂⁻_j − y⁻_j) − (p̂⁺_j − y⁺_j)],   φ̂_j = Φ(α_j, p̂⁺_j, γ)/τ,

with ``p̂⁺_j`` / ``p̂⁻_j`` the mean j-th posterior of aux samples of class j / of the other classes
(Fig. 1, steps ①–③), ``y⁺``/``y⁻`` the protocol's label embedding (one-hot or smoothed) and Φ the focal
weight of Theorem 1 (eq. 2). Cross-entropy and BCE-with-sigmoid are the cases γ = 0, α = 1 (Table 1).
The real-valued λ is kept in ``result.estimate``; counts are its largest-remainder rounding onto
``{n ≥ 0, Σn = B}``.

``weighting="per-sample"`` (our extension, not in the paper) replaces ``φ̂_j (p̂^±_j − y^±_j)`` by the mean
per-sample logit gradient of the aux positives / negatives, computed by autograd on the client's own
loss: it drops the paper's approximation of every sample's focal weight by ``Φ(α_j, p̂⁺_j, γ)`` and
covers focal loss with smoothed targets exactly; for cross-entropy it equals the paper's formula.
"""

from __future__ import annotations

import time

import torch

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from labels.aux_stats import (
    AuxStats,
    aux_forward,
    class_posteriors,
    embedded_targets,
    fedsgd_view,
    focal_weight,
    label_embedding,
    logit_gradients,
    split_means,
)
from labels.base import register
from labels.counts import largest_remainder

Tensor = torch.Tensor
WEIGHTINGS = ("paper", "per-sample")
MISSING = ("fail", "prior")


def posterior_coefficients(stats: AuxStats, capture: Capture, weighting: str = "paper",
                           missing: str = "fail") -> tuple[Tensor, Tensor] | str:
    """``(a⁺, a⁻)`` (C,): the expected bias gradient of one positive / one negative sample of each class.

    ``paper``: ``a^± = φ̂ (p̂^± − y^±)`` (Theorem 2 proof, App. C.2). ``per-sample``: aux means of the exact
    per-sample logit gradients. Classes without aux samples: ``missing="fail"`` returns the reason (a
    string); ``missing="prior"`` (our extension) takes ``p̂⁺_j := p̂⁻_j`` for them, the paper's §3.2
    observation that positives and negatives look alike to an untrained model.
    """
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"posterior weighting={weighting!r} is not allowed; valid: {list(WEIGHTINGS)}")
    if missing not in MISSING:
        raise ConfigError(f"posterior missing={missing!r} is not allowed; valid: {list(MISSING)}")
    c = stats.num_classes
    embedding = label_embedding(capture.protocol, c)
    if isinstance(embedding, str):
        return embedding
    absent = stats.per_class == 0
    if absent.any() and (missing == "fail" or absent.all()):
        return (f"aux set has no samples of class(es) {torch.nonzero(absent).flatten().tolist()[:10]}; the "
                "posterior attack needs π >= 1 labelled samples of every class (or missing='prior')")
    y_pos, y_neg = embedding
    p_pos, p_neg = class_posteriors(stats)
    p_pos = torch.where(absent, p_neg, p_pos)
    phi = focal_weight(p_pos, capture.protocol)
    a_pos, a_neg = phi * (p_pos - y_pos), phi * (p_neg - y_neg)
    if weighting == "per-sample":
        grads = logit_gradients(stats.logits, embedded_targets(stats.labels, c, embedding), capture.protocol)
        s_pos, s_neg = split_means(grads, stats.labels, c)
        a_pos, a_neg = torch.where(absent, a_pos, s_pos), s_neg
    return a_pos, a_neg


def solve_counts(bias_grad: Tensor, a_pos: Tensor, a_neg: Tensor, batch_size: int | Tensor) -> Tensor:
    """Eq. 3 for one or many captures: ``λ = B (a⁻ − ∇b̄) / (a⁻ − a⁺)``; ``bias_grad`` (C,) or (T, C)."""
    return batch_size * (a_neg - bias_grad) / (a_neg - a_pos)


def _result(lam: Tensor, total: int, info: dict) -> LabelResult:
    counts = largest_remainder(lam, total)
    return LabelResult.from_counts("posterior", counts, estimate=lam, info=info)


def recover_posterior_many(captures: list[Capture], aux=None, weighting: str = "paper",
                           dtype: torch.dtype | str = torch.float64, missing: str = "fail") -> list[LabelResult]:
    """Vectorised eq. 3 over captures: the aux set is forwarded once per global model (cached), and the
    captures that share a model and protocol are solved in one tensor operation."""
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"posterior weighting={weighting!r} is not allowed; valid: {list(WEIGHTINGS)}")
    if missing not in MISSING:
        raise ConfigError(f"posterior missing={missing!r} is not allowed; valid: {list(MISSING)}")
    results: list[LabelResult | None] = [None] * len(captures)
    groups: dict[tuple, list[int]] = {}
    coefficients: dict[tuple, tuple[Tensor, Tensor, float, Tensor]] = {}  # the logits keep their id unique
    views = {}
    for i, capture in enumerate(captures):
        c = capture.num_classes
        view = fedsgd_view(capture)
        if isinstance(view, str):
            results[i] = LabelResult.failure("posterior", c, view)
            continue
        if view.bias is None:
            results[i] = LabelResult.failure(
                "posterior", c, "the posterior attack reads the last-layer bias gradient ∇b (Theorem 2); this capture "
                "has none (model built with bias_last=False)")
            continue
        stats = aux_forward(capture, aux, dtype=dtype, method="posterior")
        key = (id(stats.logits), repr(capture.protocol.to_dict()))
        if key not in coefficients:
            start = time.perf_counter()
            coef = posterior_coefficients(stats, capture, weighting, missing)
            if isinstance(coef, str):
                results[i] = LabelResult.failure("posterior", c, coef, aux_seconds=stats.seconds)
                continue
            coefficients[key] = (*coef, time.perf_counter() - start, stats.logits)
            aux_seconds = stats.seconds
        else:
            aux_seconds = 0.0
        views[i] = (view, aux_seconds)
        groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        a_pos, a_neg, coef_seconds, _ = coefficients[key]
        start = time.perf_counter()
        denom = a_neg - a_pos
        grads = torch.stack([views[i][0].bias for i in members])
        sizes = torch.tensor([views[i][0].batch_size for i in members], dtype=torch.float64).unsqueeze(1)
        lam = solve_counts(grads, a_pos, a_neg, sizes)
        solve_seconds = (time.perf_counter() - start) / len(members)
        for row, i in enumerate(members):
            c = captures[i].num_classes
            if not torch.all(denom.abs() > 1e-12) or not torch.isfinite(lam[row]).all():
                bad = torch.nonzero(~(denom.abs() > 1e-12)).flatten().tolist()
                results[i] = LabelResult.failure("posterior", c, f"eq. 3 is singular for class(es) {bad[:10]}: the aux "
                                                 "positives and negatives give the same expected gradient")
                continue
            start_round = time.perf_counter()
            info = {"weighting": weighting, "aux_seconds": views[i][1], "a_pos": a_pos.tolist(),
                    "a_neg": a_neg.tolist()}
            result = _result(lam[row], views[i][0].batch_size, info)
            result.info["solver_seconds"] = (coef_seconds / len(members) + solve_seconds
                                             + time.perf_counter() - start_round)
            results[i] = result
    return results  # type: ignore[return-value]


@register("posterior", "Posterior-probability attack (Theorem 2, eq. 3): counts from ∇b and aux posteriors p̂⁺/p̂⁻",
          batch=recover_posterior_many)
def recover_posterior(capture: Capture, aux=None, weighting: str = "paper",
                      dtype: torch.dtype | str = torch.float64, missing: str = "fail") -> LabelResult:
    """Batch label counts by the posterior-probability attack (Theorem 2, eq. 3); needs ``aux`` and ∇b.

    ``weighting``: ``"paper"`` (eq. 3 as published) or ``"per-sample"`` (exact per-sample aux gradients).
    ``dtype``: precision of the aux forward through the model body (the last layer is always float64).
    ``missing``: ``"fail"`` (default) or ``"prior"`` for aux sets that lack some classes (see
    :func:`posterior_coefficients`). ``info`` holds ``aux_seconds`` (model forward of the aux set, 0 when
    cached) apart from ``solver_seconds`` (eq. 3 and rounding).
    """
    return recover_posterior_many([capture], aux, weighting=weighting, dtype=dtype, missing=missing)[0]
