"""Multi-round label-distribution attacks: one client's updates of k rounds combined into one estimate.

Decaf (Dai, Zhou, Fu, arXiv 2405.15316, 2024) §IV-B, "multi-round attack" (Fig. 6 d): the single-round attack is
run on each of k (consecutive) rounds of the same user, the k decomposed distributions are averaged, and the
average is normalised to the simplex ("similar to converting logits to softmax ... so the total proportion is
exactly 1.0"):

    p̄ = (1/k) Σ_{t=1..k} p̂_t,        p̂ = p̄ / Σ_c p̄_c.

Any registered method works as the single-round attack (its ``proportions``); the client's local dataset is the
same in every round, so the counts of the combined estimate are the largest-remainder rounding of ``p̂`` to the
sample total of the latest round's result.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from labels.base import recover_many
from labels.counts import largest_remainder


def average_rounds(results: list[LabelResult]) -> LabelResult:
    """Decaf §IV-B's multi-round estimate from one client's single-round ``results`` (oldest first).

    Failed rounds (``ok=False``) are left out of the mean and listed in ``info['failed_rounds']``; when every
    round failed the result is a failure. ``info['rounds']`` is k, ``info['seconds']`` the sum of the rounds'.
    """
    if not results:
        raise ConfigError("average_rounds needs the results of at least one round")
    num_classes = len(results[-1].proportions)
    if any(len(r.proportions) != num_classes for r in results):
        raise ConfigError(f"average_rounds: the rounds' results have different class counts "
                          f"{sorted({len(r.proportions) for r in results})}; give one client's rounds of one model")
    method = f"{results[-1].method}@{len(results)}rounds"
    seconds = float(sum(float(r.info.get("seconds", 0.0)) for r in results))
    kept = [r for r in results if r.ok]
    failed = [i for i, r in enumerate(results) if not r.ok]
    if not kept:
        return LabelResult.failure(method, num_classes, f"all {len(results)} rounds failed: "
                                   f"{results[-1].info.get('reason', '')}", rounds=len(results), seconds=seconds)
    mean = torch.stack([r.proportions.double().cpu() for r in kept]).mean(0)
    total = mean.sum()
    if not torch.isfinite(total) or total <= 0:
        return LabelResult.failure(method, num_classes, "the averaged distribution has no mass",
                                   rounds=len(results), seconds=seconds)
    props = mean / total
    n = int(results[-1].counts.sum())
    counts = largest_remainder(props, n) if n > 0 else torch.zeros(num_classes, dtype=torch.long)
    return LabelResult(method=method, ok=True, counts=counts.long(), proportions=props, estimate=props * n,
                       info={"rounds": len(results), "failed_rounds": failed, "seconds": seconds})


def recover_rounds(rounds: list[list[Capture]], method: str, aux: Any = None, device: Any = None,
                   **options: Any) -> list[LabelResult]:
    """The multi-round attack over many clients: ``rounds[i][j]`` is client j's capture of the i-th round (oldest
    first, the same clients in the same order every round). Each round is recovered with ``method`` in one
    :func:`labels.recover_many` call; client j's results are combined by :func:`average_rounds`."""
    if not rounds or not rounds[0]:
        raise ConfigError("recover_rounds needs at least one round of at least one capture")
    sizes = sorted({len(r) for r in rounds})
    if len(sizes) != 1:
        raise ConfigError(f"recover_rounds: every round needs the same clients; got rounds of {sizes} captures")
    start = time.perf_counter()
    per_round = [recover_many(caps, method, aux=aux, device=device, **options) for caps in rounds]
    out = [average_rounds([per_round[i][j] for i in range(len(rounds))]) for j in range(sizes[0])]
    for r in out:
        r.info["wall_seconds"] = (time.perf_counter() - start) / sizes[0]
    return out
