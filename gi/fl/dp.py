"""The DP defence on what a client shares: clip the global L2 norm, add Gaussian noise (Abadi et al. 2016).

One routine for FedSGD gradients and FedAvg updates. ``protocol.dp_scale`` says where σ applies: ``"update"``
adds N(0, σ²) to the shared tensors; ``"gradient"`` puts σ on the gradient-like ``−Δθ/η`` (noise ``η·σ`` on
Δθ); ``"step"`` adds the noise inside local training instead (:func:`step_noise`, DP-SGD style as RLU §4.10
cites), so the shared message is only clipped here. A FedSGD gradient is one step: σ applies to it directly.
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor
State = dict[str, Tensor]


def privatize(shared: State, protocol: Any, generator: torch.Generator | None) -> State:
    """A clipped, noised copy of ``shared`` per ``protocol.dp_clip`` / ``dp_sigma`` / ``dp_scale``."""
    out = {k: v.clone() for k, v in shared.items()}
    if protocol.dp_clip is not None:
        norm = float(torch.sqrt(sum((t.double() ** 2).sum() for t in out.values())))
        factor = min(1.0, protocol.dp_clip / max(norm, 1e-12))
        for t in out.values():
            t.mul_(factor)
    update = protocol.is_update
    if protocol.dp_sigma > 0 and not (update and protocol.dp_scale == "step"):
        sigma = protocol.dp_sigma * (protocol.lr if update and protocol.dp_scale == "gradient" else 1.0)
        for t in out.values():
            t.add_(torch.randn(t.shape, generator=generator, dtype=t.dtype) * sigma)
    return out


def step_noise(grads: tuple[Tensor, ...], protocol: Any, batch_size: int,
               generator: torch.Generator | None) -> tuple[Tensor, ...]:
    """``dp_scale="step"``: N(0, σ²) on one step's batch-summed gradient, i.e. ``σ/|B|`` on the mean gradient."""
    if protocol.dp_scale != "step" or protocol.dp_sigma <= 0:
        return grads
    return tuple(g + torch.randn(g.shape, generator=generator, dtype=g.dtype) * (protocol.dp_sigma / batch_size)
                 for g in grads)
