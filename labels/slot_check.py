"""Batch label counts checked against the last layer's gradient, and corrected sample by sample where it asks.

Given counts, the cross-entropy gradient of the last layer ``z = W h + b`` is a determined system in the batch's
last-layer inputs once 2 ≤ B ≤ C − 1 (soft-label paper, eq. 2 for a batch:
``∇W = (1/B) Σ_i (softmax(W h_i + b) − y_i) h_iᵀ``, :func:`fcn_analytic.disaggregate.slot_inputs`). Counts the
batch really has leave a relative gradient mismatch at the solver's precision; counts one sample off leave a
larger one, because no set of inputs gives that gradient with those labels. :func:`check_counts` solves the system
for the counts a method recovered and for every count vector one sample away (one sample moved from class a to
class c) that the bias gradient allows, and keeps the count vector the gradient explains best. The method's own
answer is preferred unless a neighbour's mismatch is below :data:`PREFER` times its own; from a moved vector the
search steps on, one sample per step, up to :data:`STEPS` samples.

The bias gradient prunes the neighbours: ``B ∇b_c = Σ_i p_ic − n_c``, so ``n_c`` can drop only where the batch's
summed probability of class c, ``B ∇b_c + n_c``, stays positive (with a softmax temperature T: ``B T ∇b_c + n_c``).
Where the net predicts few classes, a sample can leave only those.

Measured on the default batch job (DLG LeNet, Fashion-MNIST, 6 batches of 8, posterior counts): the two batches
whose counts were one sample off are corrected (their own mismatch 6.1e-3 and 4.9e-5, the true neighbour's 1.4e-6
and 1.8e-5, every other neighbour's at least 3.6e-3 and 7.9e-5); in the four right batches every neighbour's
mismatch is at least 100 times the recovered counts' (docs/results/default-job.md, "Batches end to end").
"""

from __future__ import annotations

import dataclasses
import time

import torch

from fcn_analytic.disaggregate import ROUND, slot_inputs, system_bytes
from gi.capture import Capture
from gi.label_result import LabelResult
from labels.base import METHODS, register

PREFER = 0.5  # a neighbour replaces the recovered counts only with a mismatch below PREFER times theirs
MOVES = 48  # check_counts: the most neighbours solved per step, the likeliest first
STEPS = 3  # check_counts: the most samples moved, one per step
CHECK_BYTES = 64 << 20  # check_counts: larger systems (e.g. B = 32 of C = 100 classes) are left unchecked


def slot_targets(counts: torch.Tensor) -> torch.Tensor:
    """One one-hot row per counted sample (B × C, float64), class by class in increasing class index."""
    classes = torch.repeat_interleave(torch.arange(len(counts)), counts.long().cpu())
    return torch.nn.functional.one_hot(classes, len(counts)).double()


def neighbours(counts: torch.Tensor, summed: torch.Tensor, estimate: torch.Tensor) -> list[tuple[int, int]]:
    """The moves (a, c) of one sample from class a to class c whose counts the bias gradient allows (``counts[a]``
    ≥ 1 and the batch's summed probability of class a, ``summed[a] − 1``, still positive after the move), the
    likeliest first: by the growth of the squared distance between the counts and the real-valued ``estimate``
    the move causes (stably, so ties keep class order)."""
    classes = len(counts)
    moves = [(a, c) for a in range(classes) if int(counts[a]) >= 1 and float(summed[a]) - 1 > 0
             for c in range(classes) if c != a]
    gap = (estimate.double().cpu() - counts.double()).tolist()
    return sorted(moves, key=lambda m: (gap[m[0]] + 1) ** 2 - gap[m[0]] ** 2 + (gap[m[1]] - 1) ** 2 - gap[m[1]] ** 2)


def check_counts(capture: Capture, result: LabelResult, *, seed: int = 0, starts: int = ROUND,
                 moves: int = MOVES, steps: int = STEPS) -> LabelResult:
    """``result`` with its counts checked against the last layer's gradient (module docstring), the check in
    ``info["gradient_check"]``: ``residual`` of the counts kept, ``recovered_residual`` of the method's own,
    ``moved`` (the moves [a, c] made, in order; empty when none), ``tried`` (neighbours solved), ``seconds``. A
    step moves one sample to the best neighbour of the current counts; up to ``steps`` steps, while one helps.
    Returned unchanged, with the reason in ``info["gradient_check"]``, where the check does not apply: a failed
    result, soft labels, counts that do not sum to the capture's samples, a system above :data:`CHECK_BYTES`, an
    update, a loss other than cross-entropy, B outside 2 … C − 1, no last-layer bias, a gradient of rank below B.
    ``starts``: the Levenberg–Marquardt starts per count vector (one round by default); ``moves``: the most
    neighbours solved per step, in the order of :func:`neighbours`, with the method's real-valued ``estimate`` where
    it has one, else the counts the bias gradient alone suggests, ``−B T ∇b`` (iDLG's sign rule made a count)."""
    start = time.process_time()

    def skipped(reason: str) -> LabelResult:
        return dataclasses.replace(result, info={**result.info, "gradient_check": {"applied": False,
                                                                                   "reason": reason}})

    if not result.ok:
        return skipped("the label method failed")
    if result.soft is not None:
        return skipped("soft labels: the check moves whole samples between classes")
    counts = result.counts.long().cpu()
    _, gb = capture.last_layer(torch.float64)
    if gb is None:
        return skipped("no last-layer bias gradient (the moves are pruned by it)")
    batch = int(counts.sum())
    if batch != capture.num_samples:
        return skipped(f"the counts sum to {batch} but the capture has {capture.num_samples} samples")
    size = system_bytes(batch, len(counts), starts)
    if size > CHECK_BYTES:
        return skipped(f"B={batch} of C={len(counts)} classes: each solve would hold {size / 2 ** 20:.0f} MiB, "
                       f"above the check's {CHECK_BYTES >> 20} MiB (labels.slot_check.CHECK_BYTES)")
    own = slot_inputs(capture, slot_targets(counts), seed=seed, starts=starts)
    if own is None:
        return skipped("the per-slot system does not apply (an update, a loss other than cross-entropy, "
                       "B outside 2 … C − 1, a gradient of rank below B or a system above "
                       "fcn_analytic.disaggregate.MAX_SYSTEM_BYTES)")
    bias_sum = batch * float(capture.protocol.temperature) * gb.cpu()  # B T ∇b = Σ_i p_i − n
    estimate = result.estimate if result.estimate is not None and result.estimate.shape == counts.shape else (
        -bias_sum)
    current, residual, made, tried = counts, own.residual, [], 0
    for _ in range(steps):
        best = None
        for a, c in neighbours(current, bias_sum + current, estimate)[:moves]:
            moved = current.clone()
            moved[a] -= 1
            moved[c] += 1
            found = slot_inputs(capture, slot_targets(moved), seed=seed, starts=starts)
            tried += 1
            if found is not None and found.residual < PREFER * residual and (best is None
                                                                          or found.residual < best[0]):
                best = (found.residual, moved, [a, c])
        if best is None:
            break
        residual, current = best[0], best[1]
        made.append(best[2])
    check = {"applied": True, "residual": residual, "recovered_residual": own.residual, "moved": made,
             "tried": tried, "seconds": time.process_time() - start}
    return dataclasses.replace(result, counts=current, proportions=current.double() / batch,
                               info={**result.info, "gradient_check": check})


@register("checked", "another method's batch counts checked against the last layer's gradient and moved sample by "
                     "sample where a neighbour explains it clearly better (labels.slot_check)")
def recover_checked(capture: Capture, aux: object = None, base: str = "auto", options: dict | None = None,
                    moves: int = MOVES, steps: int = STEPS) -> LabelResult:
    """The labels of method ``base`` (with ``options``) passed through :func:`check_counts`: the label stage's
    ``labels.check`` as a method of its own, so that ``gi labels`` tables compare a method with and without the
    check on the same captures. The result keeps the base method's name in ``info["checked_method"]``."""
    result = METHODS[base](capture, aux=aux, **(options or {}))
    checked = check_counts(capture, result, moves=moves, steps=steps)
    return dataclasses.replace(checked, method="checked", info={**checked.info, "checked_method": result.method})
