"""Secure aggregation (Bonawitz et al. 2017): the server sees only the sum of the updates of groups of k clients.

The registry entry gives k (``group_size``); :func:`pool_group` is what the server then holds for one group: the
size-weighted mean of the shared tensors (it divides the secure sum of ``N_k·Δθ_k`` by ``Σ N_k``) behind
``Σ N_k`` samples, one message for the whole group. FedAvg's aggregate is unchanged (the mean of the group
means is the mean). Duck-typed on :class:`gi.Capture` / :class:`gi.Truth` (this layer loads no capture module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gi.world.fl.defences.base import Context, Spec, register_defence


@register_defence("secagg", "aggregate", "secure aggregation: the server sees only the sum of k clients' messages",
                  "k, clients per secure sum", valid=lambda s: s >= 1 and float(s).is_integer(),
                  valid_text="an integer >= 1")
def secagg(value: Any, spec: Spec, ctx: Context) -> int:
    return int(spec.strength)


def pool_group(pairs: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
    """One ``(capture, truth)`` for a group of clients' ``(capture, truth)`` pairs: the size-weighted mean of the
    shared tensors behind the summed sample count; the truth is the union of their samples, and its
    ``meta["member_counts"]`` keeps each member's own per-class counts (the first is the attacker's target)."""
    import torch

    if len(pairs) == 1:
        return pairs[0]
    caps, truths = [p[0] for p in pairs], [p[1] for p in pairs]
    sizes = [float(c.num_samples) for c in caps]
    total = sum(sizes)
    field = "update" if caps[0].is_update else "gradients"
    mean = {k: sum(s * getattr(c, field)[k] for s, c in zip(sizes, caps)) / total for k in getattr(caps[0], field)}
    n = int(round(total))
    meta = {**caps[0].meta, "num_samples": n, "clients": [c.meta.get("client") for c in caps],
            "secure_group": len(caps)}
    protocol = dataclasses.replace(caps[0].protocol, num_samples=n) if caps[0].protocol.num_samples else \
        caps[0].protocol
    capture = dataclasses.replace(caps[0], protocol=protocol, meta=meta, **{field: mean})
    truth = dataclasses.replace(
        truths[0], images=torch.cat([t.images for t in truths]), labels=torch.cat([t.labels for t in truths]),
        targets=torch.cat([t.targets for t in truths]), counts=sum(t.counts for t in truths), extra={},
        meta={"clients": meta["clients"], "member_counts": [t.counts.tolist() for t in truths]})
    return capture, truth
