"""LLG, LLG+ and LLG* (Wainakh et al., "User-level label leakage from gradients in federated learning",
PETS 2022; reference code ``tklab-tud/LLG``, ``Code/Predictor.py`` v1/v2/v3).

All three read the row sums ``g_i = Σ_d ∇W_{i,d}`` of the last-layer weight gradient, model them as
``g_i ≈ λ_i m + s_i`` (impact m < 0 per label, offset s_i), and fill the batch greedily:

- **LLG**: every class with ``g_i < 0`` gets one label; ``m = (Σ_{g_i<0} g_i / B)(1 + 1/C)`` is subtracted
  from those classes; the remaining ``B − |S|`` labels go one at a time to ``argmin g`` with ``g_j −= m``.
- **LLG+**: m and s come from the attacker's labelled data: for each class i a batch of B real samples of
  class i gives row sums ``g⁽ⁱ⁾``; ``m = mean_i g⁽ⁱ⁾_i / B · (1 + 1/C)`` and ``s_j = mean_{i≠j} g⁽ⁱ⁾_j``; the set S
  is taken before the offset correction, then ``g ← g − s`` and the greedy fill as above.
- **LLG***: LLG+ with dummy (random) inputs instead of real data.

The last-layer gradient of a batch is the mean of per-sample terms ``∂L_n/∂z_n · h_nᵀ``, so the aux
batches' row sums are exact class means of per-sample values computed from one aux forward: averaging
over repeated random batches (the reference's 10 repeats) converges to these means, which we use directly.
The greedy fill is vectorised (each class's successive "bids" ``g_j − t·m`` are increasing in t, so
the greedy picks are the smallest bids overall); breaching's stale-index fill bug is not reproduced.
"""

from __future__ import annotations

import time

import torch

from gi.capture import Capture
from gi.label_result import LabelResult
from labels.aux_stats import (
    AuxStats,
    aux_forward,
    class_means,
    dummy_forward,
    embedded_targets,
    fedsgd_view,
    label_embedding,
    logit_gradients,
)
from labels.base import register

Tensor = torch.Tensor


def greedy_fill(g: Tensor, impact: float, total: int, preset: Tensor | None = None) -> Tensor:
    """LLG's stage 1 + 2: one label per ``preset`` class (at most ``total``, most negative first), their
    impact removed, then the remaining labels one by one to ``argmin g`` with ``g_j −= impact``."""
    c = g.numel()
    counts = torch.zeros(c, dtype=torch.long)
    if preset is not None and preset.any():
        order = torch.argsort(g.where(preset, torch.full_like(g, torch.inf)), stable=True)
        chosen = order[: min(int(preset.sum()), total)]
        counts[chosen] = 1
    rest = total - int(counts.sum())
    if rest > 0:
        g = g - impact * counts.double()
        bids = g.unsqueeze(1) - impact * torch.arange(rest, dtype=torch.float64).unsqueeze(0)  # (C, rest)
        flat = bids.flatten()
        picks = torch.sort(flat, stable=True).indices[:rest] // rest
        counts += torch.bincount(picks, minlength=c)
    return counts


def _row_sums(capture: Capture, name: str) -> tuple[Tensor, int] | LabelResult:
    view = fedsgd_view(capture)
    if isinstance(view, str):
        return LabelResult.failure(name, capture.num_classes, view)
    return view.weight.sum(1), view.batch_size


@register("llg", "LLG (Wainakh et al. 2022): negative row sums of ∇W, impact from the batch, greedy fill")
def recover_llg(capture: Capture, aux=None) -> LabelResult:
    """Plain LLG: no auxiliary knowledge; assumes non-negative last-layer inputs (it fails with tanh)."""
    got = _row_sums(capture, "llg")
    if isinstance(got, LabelResult):
        return got
    g, total = got
    start = time.perf_counter()
    negative = g < 0
    if not negative.any():
        return LabelResult.failure("llg", capture.num_classes, "no class has a negative ∇W row sum: LLG cannot "
                                   "estimate the impact (non-negative features are assumed)")
    c = g.numel()
    impact = float(g[negative].sum()) / total * (1.0 + 1.0 / c)
    counts = greedy_fill(g, impact, total, negative)
    return LabelResult.from_counts("llg", counts, info={"impact": impact, "row_sums": g.tolist(),
                                                        "solver_seconds": time.perf_counter() - start})


def class_batch_row_sums(stats: AuxStats, capture: Capture, relabel: bool) -> Tensor | str:
    """``G`` (C, C): row ``i`` is the expected ∇W row-sum vector of a batch whose samples are all labelled i.

    ``relabel=False``: aux samples keep their own class (LLG+, real data of class i). ``relabel=True``: every
    sample is labelled with every class in turn (LLG*, dummy data).
    """
    c = stats.num_classes
    embedding = label_embedding(capture.protocol, c)
    if isinstance(embedding, str):
        return embedding
    s = stats.features.sum(1)  # Σ_d h_nd
    if not relabel:
        missing = torch.nonzero(stats.per_class == 0).flatten().tolist()
        if missing:
            return f"aux set has no samples of class(es) {missing[:10]}; LLG+ needs labelled data of every class"
        grads = logit_gradients(stats.logits, embedded_targets(stats.labels, c, embedding), capture.protocol)
        return class_means(grads * s.unsqueeze(1), stats.labels, c)
    n = stats.logits.shape[0]
    labels = torch.arange(c).repeat_interleave(n)
    grads = logit_gradients(stats.logits.repeat(c, 1), embedded_targets(labels, c, embedding), capture.protocol)
    return (grads.view(c, n, c) * s.view(1, n, 1)).mean(1)


def _llg_plus(capture: Capture, stats: AuxStats, name: str, relabel: bool) -> LabelResult:
    c = capture.num_classes
    got = _row_sums(capture, name)
    if isinstance(got, LabelResult):
        return got
    g, total = got
    start = time.perf_counter()
    table = class_batch_row_sums(stats, capture, relabel)
    if isinstance(table, str):
        return LabelResult.failure(name, c, table)
    off_diag = ~torch.eye(c, dtype=torch.bool)
    impact = float(table.diagonal().mean()) / total * (1.0 + 1.0 / c)
    offset = (table * off_diag).sum(0) / (c - 1)
    if not impact < 0:
        return LabelResult.failure(name, c, f"estimated impact m = {impact:.3g} is not negative: the data does not "
                                   "separate positive from negative row sums (LLG assumes non-negative features)")
    negative = g < 0
    counts = greedy_fill(g - offset, impact, total, negative)
    return LabelResult.from_counts(name, counts, info={
        "impact": impact, "offset": offset.tolist(), "aux_seconds": stats.seconds,
        "solver_seconds": time.perf_counter() - start})


@register("llg+", "LLG+ (Wainakh et al. 2022): impact and offsets from the attacker's labelled aux data")
def recover_llg_plus(capture: Capture, aux=None, dtype: torch.dtype | str = torch.float64) -> LabelResult:
    """LLG+ with the attacker's labelled auxiliary data (required)."""
    stats = aux_forward(capture, aux, dtype=dtype, method="llg+")
    return _llg_plus(capture, stats, "llg+", relabel=False)


@register("llg*", "LLG* (Wainakh et al. 2022): LLG+ with random dummy inputs instead of real data")
def recover_llg_star(capture: Capture, aux=None, dummy: int | None = None, seed: int = 0,
                     dtype: torch.dtype | str = torch.float64) -> LabelResult:
    """LLG* with ``dummy`` random uniform images (default 10·B, at most 1024: ten runs of B dummy samples
    averaged, as the posterior paper runs its LLG baseline; m and s are linear in the dummy means)."""
    total = capture.num_samples
    count = int(dummy) if dummy is not None else min(10 * total, 1024)
    stats = dummy_forward(capture, count, seed=seed, dtype=dtype)
    return _llg_plus(capture, stats, "llg*", relabel=True)
