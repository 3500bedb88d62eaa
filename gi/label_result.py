"""The label stage's result, :class:`LabelResult`: the contract between label recovery and every later stage.

It sits beside :class:`gi.Capture` at the bottom of the import graph, so the feature stage (:mod:`fcn_analytic`),
the reconstruction (:mod:`gi.attack.recon`) and the reports read it as a typed value; the methods that produce it live
in :mod:`labels`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass
class LabelResult:
    """Output of every label method.

    ``counts`` (C,) long, sums to the number of labelled samples; ``proportions`` (C,) on the simplex;
    ``soft`` (B, C) soft labels when the method recovers them; ``estimate`` the real-valued counts
    before rounding, when the method has them; ``features`` (B, D) last-layer features when the method
    recovers them (soft-label λ·g_r); ``info`` timings, solver state and the reason of a failure.
    """

    method: str
    ok: bool
    counts: Tensor
    proportions: Tensor
    soft: Tensor | None = None
    estimate: Tensor | None = None
    features: Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> Tensor:
        """Per-slot hard labels: class ``c`` repeated ``counts[c]`` times (slot order is irrelevant)."""
        return torch.repeat_interleave(torch.arange(len(self.counts)), self.counts.cpu())

    @classmethod
    def failure(cls, method: str, num_classes: int, reason: str, **info: Any) -> LabelResult:
        """An ``ok=False`` result: zero counts, uniform proportions, the reason in ``info``."""
        return cls(method=method, ok=False, counts=torch.zeros(num_classes, dtype=torch.long),
                   proportions=torch.full((num_classes,), 1.0 / num_classes, dtype=torch.float64),
                   info={"reason": reason, **info})

    @classmethod
    def from_counts(cls, method: str, counts: Tensor, **kwargs: Any) -> LabelResult:
        counts = counts.long().cpu()
        total = int(counts.sum())
        props = counts.double() / total if total > 0 else torch.full(counts.shape, 1.0 / len(counts),
                                                                      dtype=torch.float64)
        kwargs.setdefault("ok", True)
        return cls(method=method, counts=counts, proportions=props, **kwargs)
