"""The result of a reconstruction (:func:`gi.attack.recon.reconstruct`, or an analytic answer of the reconstruct
stage): a plain record, loaded without Lightning, so an attack answered analytically never imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Reconstruction:
    """Result of :func:`gi.attack.recon.reconstruct`.

    ``images`` (B, C, H, W) of the restart with the lowest attack objective; ``all_images`` (R, B, …) the best
    iterate of every restart; ``labels`` the soft labels used (B, C): the fixed targets, or for joint labels the
    optimised softmax of the chosen restart; ``objective`` per restart (R,); ``history`` the objective per
    restart every ``log_every`` steps plus whatever callbacks logged.
    """

    images: Tensor
    all_images: Tensor
    labels: Tensor
    objective: Tensor
    best_restart: int
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    iterations: int = 0
    all_labels: Tensor | None = None
