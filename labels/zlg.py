"""ZLG and ZLG+ (Geng et al., "Towards general deep leakage in federated learning", 2021; ZLG+ as adapted
by Chen & Vikalo 2024 with the attacker's auxiliary data).

With cross-entropy, the row sum of the last-layer weight gradient is
``S_j = Σ_d ∇W_{j,d} = (1/B) Σ_n (p_nj − y_nj)/τ · Σ_d h_nd``. Replacing every sample's feature sum by its
mean ``Ō`` and every ``p_nj`` by a mean probability ``p̄_j`` gives the count

    n_j = B (p̄_j − y⁻ − τ S_j / Ō) / (y⁺ − y⁻)        (one-hot, τ = 1: n_j = B (p̄_j − S_j / Ō)).

``Ō`` and ``p̄`` come from random dummy inputs (ZLG, "zero-shot") or from the attacker's aux set (ZLG+).
ZLG+ as coded by Chen & Vikalo averages ``p̄_j`` over the aux samples of class j only (``prob="positive"``);
our default averages over all aux samples (``prob="all"``), the estimate of a batch's mean probability that
the derivation asks for. Needs no bias. Focal loss is read as cross-entropy (ZLG has no focal weight).
"""

from __future__ import annotations

import time

import torch

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from labels.aux_stats import AuxStats, aux_forward, class_posteriors, dummy_forward, fedsgd_view, label_embedding
from labels.base import register
from labels.counts import largest_remainder

Tensor = torch.Tensor
PROB_SOURCES = ("all", "positive")


def _zlg(capture: Capture, stats: AuxStats, name: str, prob: str) -> LabelResult:
    c = capture.num_classes
    view = fedsgd_view(capture)
    if isinstance(view, str):
        return LabelResult.failure(name, c, view)
    embedding = label_embedding(capture.protocol, c)
    if isinstance(embedding, str):
        return LabelResult.failure(name, c, embedding)
    start = time.perf_counter()
    y_pos, y_neg = embedding
    mean_feature_sum = float(stats.features.sum(1).mean())
    if abs(mean_feature_sum) < 1e-12:
        return LabelResult.failure(name, c, "the mean last-layer feature sum Ō is zero: ZLG cannot scale ∇W")
    if prob == "all":
        p_bar = stats.probs.mean(0)
    else:
        p_bar = class_posteriors(stats)[0]
        if torch.isnan(p_bar).any():
            return LabelResult.failure(name, c, "prob='positive' needs aux samples of every class")
    total = view.batch_size
    row_sums = view.weight.sum(1)
    estimate = total * (p_bar - y_neg - capture.protocol.temperature * row_sums / mean_feature_sum) / (y_pos - y_neg)
    counts = largest_remainder(estimate, total)
    return LabelResult.from_counts(name, counts, estimate=estimate, info={
        "mean_feature_sum": mean_feature_sum, "aux_seconds": stats.seconds,
        "solver_seconds": time.perf_counter() - start})


@register("zlg", "ZLG (Geng et al. 2021): n_j = B(p̄_j − S_j/Ō) with p̄, Ō from random dummy inputs")
def recover_zlg(capture: Capture, aux=None, dummy: int = 64, seed: int = 0,
                dtype: torch.dtype | str = torch.float64) -> LabelResult:
    """ZLG with ``dummy`` random uniform images (no auxiliary data)."""
    stats = dummy_forward(capture, dummy, seed=seed, dtype=dtype)
    return _zlg(capture, stats, "zlg", "all")


@register("zlg+", "ZLG+ (Chen & Vikalo 2024): ZLG with p̄ and Ō from the attacker's aux data")
def recover_zlg_plus(capture: Capture, aux=None, prob: str = "all",
                     dtype: torch.dtype | str = torch.float64) -> LabelResult:
    """ZLG+ with the attacker's labelled auxiliary data (required); ``prob`` ∈ {"all", "positive"}."""
    if prob not in PROB_SOURCES:
        raise ConfigError(f"zlg+ prob={prob!r} is not allowed; valid: {list(PROB_SOURCES)}")
    stats = aux_forward(capture, aux, dtype=dtype, method="zlg+")
    return _zlg(capture, stats, "zlg+", prob)
