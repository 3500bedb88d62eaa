"""RLG (Dang et al., "Revealing and protecting labels in distributed training", NeurIPS 2021).

The last-layer weight gradient is ``∇W = Σ_n g_n h_nᵀ / B`` with ``g_n = ∂L_n/∂z_n``; for softmax
cross-entropy ``g_n = p_n − e_{c_n}`` is negative exactly at the sample's class and positive elsewhere. So
``span{g_n}`` is the column space of ∇W, read off its SVD (``U_k``, k = numerical rank ≤ B), and class i is
in the batch iff some vector of that space is negative at i and positive at every other class: the LP
feasibility problem ``find a: U_k[i]·a ≤ −1, U_k[j]·a ≥ 1 (j ≠ i)`` (homogeneous, so the margin 1 is free),
solved with ``scipy.optimize.linprog`` (HiGHS) for every class.

RLG recovers the label *set*, not counts: it needs ``B < C − 1`` (for softmax the g_n sum to zero, so with
rank C − 1 every class is separable and the set is not identifiable) and it sees no duplicates. Counts
give one label to each recovered class (the most negative first, at most B) and the rest of the batch
to the most negative class, as the other presence baselines do. (The iLRG re-implementation's
Perceptron pre-filter is a speed heuristic and is not needed: the LP alone decides.)
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gi.capture import Capture
from gi.label_result import LabelResult
from labels.aux_stats import fedsgd_view
from labels.base import register
from labels.hard import presence_counts


def separable_classes(basis: np.ndarray) -> np.ndarray:
    """For rows ``u_i`` of ``basis`` (C, k): is there ``a`` with ``u_i·a < 0`` and ``u_j·a > 0`` for all j ≠ i?"""
    from scipy.optimize import linprog  # here: scipy loads only for the methods that solve with it

    c, k = basis.shape
    present = np.zeros(c, dtype=bool)
    for i in range(c):  # one small LP per class
        a_ub = -basis.copy()
        a_ub[i] = basis[i]
        res = linprog(np.zeros(k), A_ub=a_ub, b_ub=-np.ones(c), bounds=[(None, None)] * k, method="highs")
        present[i] = res.status == 0
    return present


@register("rlg", "RLG (Dang et al. 2021): label set from the SVD of ∇W and one LP feasibility check per class")
def recover_rlg(capture: Capture, aux=None, rtol: float = 1e-6) -> LabelResult:
    """RLG: present classes by SVD + LP (needs B < C − 1; ``rtol`` sets the numerical rank)."""
    c = capture.num_classes
    view = fedsgd_view(capture)
    if isinstance(view, str):
        return LabelResult.failure("rlg", c, view)
    start = time.perf_counter()
    u, s, _ = torch.linalg.svd(view.weight, full_matrices=False)
    if not bool(s.numel()) or float(s[0]) == 0.0:
        return LabelResult.failure("rlg", c, "last-layer gradient is zero")
    rank = int((s > rtol * s[0]).sum())
    k = min(view.batch_size, rank)
    limit = c if capture.protocol.loss == "bce" else c - 1
    if k >= limit:
        return LabelResult.failure("rlg", c, f"∇W has rank {k} >= {limit}: every class is separable, so RLG cannot "
                                   f"identify the label set (it needs batch size B < {limit})", rank=rank)
    present = torch.from_numpy(separable_classes(u[:, :k].numpy()))
    if not present.any():
        return LabelResult.failure("rlg", c, "no class passed the LP feasibility check", rank=rank)
    score = view.bias if view.bias is not None else view.weight.sum(1)
    counts = presence_counts(present, score, view.batch_size)
    return LabelResult.from_counts("rlg", counts, info={"present": present.tolist(), "rank": rank,
                                                        "solver_seconds": time.perf_counter() - start})
