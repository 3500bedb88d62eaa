"""Hard-label baselines from the last-layer gradient: iDLG and its batch extension, GradInversion (Yin).

All read the shared last layer through :meth:`gi.Capture.last_layer` (updates are turned into
gradient-like ``−Δθ/η`` there).
"""

from __future__ import annotations

import torch

from gi.capture import Capture
from gi.label_result import LabelResult
from labels.base import register


@register("idlg", "iDLG (Zhao et al. 2020): B=1, the class whose bias gradient / weight-row sum is most negative")
def recover_idlg(capture: Capture, aux=None) -> LabelResult:
    """iDLG: for one sample with cross-entropy, only the true class has ∂L/∂z_c = p_c − 1 < 0.

    With a last-layer bias the sign is read from ∇b; without one from the row sums of ∇W (valid for
    non-negative features such as ReLU/sigmoid outputs).
    """
    w, b = capture.last_layer()
    n = capture.num_samples
    if n != 1:
        return LabelResult.failure("idlg", capture.num_classes, f"iDLG reads one sample; this capture has {n} "
                                   "(use a batch method, e.g. idlg-batch, ilrg or posterior)")
    score = b if b is not None else w.sum(1)
    if not torch.any(score != 0):
        return LabelResult.failure("idlg", capture.num_classes, "last-layer gradient is zero")
    label = int(torch.argmin(score))
    counts = torch.zeros(capture.num_classes, dtype=torch.long)
    counts[label] = 1
    info = {"score": score.tolist(), "source": "bias" if b is not None else "weight-row-sum"}
    return LabelResult.from_counts("idlg", counts, info=info)


def presence_counts(present: torch.Tensor, score: torch.Tensor, n: int) -> torch.Tensor:
    """One slot per present class, most negative score first, at most ``n`` classes; the rest of the
    batch goes to the most negative class (these methods cannot see duplicates)."""
    order = torch.argsort(score)
    chosen = [int(i) for i in order if present[i]][:n]
    counts = torch.zeros(len(score), dtype=torch.long)
    if not chosen:
        chosen = [int(order[0])]
    counts[chosen] = 1
    counts[chosen[0]] += n - len(chosen)
    return counts


@register("idlg-batch", "iDLG extended to batches: classes with negative weight-row sum are present")
def recover_idlg_batch(capture: Capture, aux=None) -> LabelResult:
    """Extended iDLG (as in iLRG's baselines): class i is present iff Σ_d ∇W_{i,d} < 0."""
    w, _ = capture.last_layer()
    score = w.sum(1)
    if not torch.any(score != 0):
        return LabelResult.failure("idlg-batch", capture.num_classes, "last-layer gradient is zero")
    counts = presence_counts(score < 0, score, capture.num_samples)
    return LabelResult.from_counts("idlg-batch", counts, info={"present": (score < 0).tolist()})


@register("yin", "GradInversion (Yin et al. 2021): class i is present iff min_d ∇W_{i,d} < 0")
def recover_yin(capture: Capture, aux=None) -> LabelResult:
    """GradInversion's row-minimum rule; assumes non-negative features and no duplicate labels."""
    w, _ = capture.last_layer()
    score = w.min(1).values
    if not torch.any(w != 0):
        return LabelResult.failure("yin", capture.num_classes, "last-layer gradient is zero")
    counts = presence_counts(score < 0, score, capture.num_samples)
    return LabelResult.from_counts("yin", counts, info={"present": (score < 0).tolist()})
