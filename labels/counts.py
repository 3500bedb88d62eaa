"""Real-valued class estimates → non-negative integer counts that sum to B.

Every count-based label method ends here, so rounding is done once and done right: the estimate is
clipped at zero, scaled onto the simplex ``{n ≥ 0, Σn = B}``, and rounded by the largest-remainder
(Hamilton) method, which is the integer point of that simplex closest to the scaled estimate in
L1 and L∞ among points that keep ``⌊·⌋``.
"""

from __future__ import annotations

import torch

from gi.core.counts import largest_remainder  # one home, below the victim, whose scenarios split classes with it

Tensor = torch.Tensor


def round_counts(estimate: Tensor, total: int, rescale: bool = True) -> Tensor:
    """Counts summing to ``total`` from ``estimate``.

    ``rescale=True`` scales the clipped estimate to sum ``total`` first (largest remainder).
    ``rescale=False`` keeps the estimate's own scale: round to nearest integers, then fix the sum by
    adding to (or taking from) the classes with the largest (smallest) rounding residual.
    """
    if rescale:
        return largest_remainder(estimate, total)
    x = torch.nan_to_num(estimate.double().cpu(), nan=0.0).clamp(0, total)
    counts = x.round().long()
    diff = total - int(counts.sum())
    residual = x - counts.double()
    while diff != 0:
        if diff > 0:
            i = int(torch.argmax(residual))
            counts[i] += 1
            residual[i] -= 1
            diff -= 1
        else:
            residual_pos = torch.where(counts > 0, residual, torch.full_like(residual, float("inf")))
            i = int(torch.argmin(residual_pos))
            counts[i] -= 1
            residual[i] += 1
            diff += 1
    return counts
