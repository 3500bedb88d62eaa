"""Real-valued class estimates → non-negative integer counts summing to a total, by the largest-remainder
(Hamilton) method: the one home of that rounding, used by the victim's class splits of a FedAvg
client (:mod:`gi.world.scenarios.fedavg_client`) and by every count-based label method (:mod:`labels.counts`).
No torch at import (docs/architecture.md, "Layout": gi.core)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def largest_remainder(estimate: Tensor, total: int) -> Tensor:
    """Integer counts ``n ≥ 0`` with ``Σn = total`` closest to the real-valued ``estimate`` (C,).

    Negative entries count as zero; an all-zero (or all-negative) estimate gives a uniform spread.
    Ties break towards the lower class index (deterministic).
    """
    import torch

    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    x = torch.nan_to_num(estimate.double().cpu(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
    c = x.numel()
    if total == 0:
        return torch.zeros(c, dtype=torch.long)
    if float(x.sum()) <= 0:
        x = torch.ones(c, dtype=torch.float64)
    scaled = x * (total / x.sum())
    floor = scaled.floor()
    counts = floor.long()
    short = total - int(counts.sum())
    if short > 0:
        remainder = scaled - floor
        # stable sort: ties go to the lower class index
        order = torch.sort(remainder, descending=True, stable=True).indices
        counts[order[:short]] += 1
    return counts
