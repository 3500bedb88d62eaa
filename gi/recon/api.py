"""``gi.reconstruct``: the attack's public entry point (DESIGN.md §4)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch

from gi.capture import Capture
from gi.errors import CaptureError, ConfigError
from gi.recon.config import ReconConfig
from gi.recon.module import Context, GradientInversion

Tensor = torch.Tensor


@dataclass
class Reconstruction:
    """Result of :func:`reconstruct`.

    ``images`` (B, C, H, W) of the restart with the lowest attack objective; ``all_images`` (R, B, …);
    ``labels`` the soft targets used (B, C); ``objective`` per restart (R,); ``history`` the objective
    per restart every ``log_every`` steps plus whatever callbacks logged.
    """

    images: Tensor
    all_images: Tensor
    labels: Tensor
    objective: Tensor
    best_restart: int
    history: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    iterations: int = 0


def num_samples(capture: Capture) -> int:
    return int(capture.meta.get("num_samples") or capture.protocol.batch_size)


def labels_for_slots(label_result: Any, batch: int, num_classes: int) -> Tensor:
    """Soft targets (B, C) from a LabelResult: its soft labels, else one slot per counted label.

    Slots are filled class by class in increasing class index (order is irrelevant to the gradient of a
    mean loss, and the batch metric matches images one-to-one afterwards).
    """
    if label_result is None:
        raise ConfigError("reconstruct needs labels: pass a LabelResult (labels.recover, or oracle labels "
                          "made by the pipeline)")
    soft = getattr(label_result, "soft", None)
    if soft is not None and soft.shape == (batch, num_classes):
        return soft.float()
    counts = label_result.counts.long()
    if int(counts.sum()) != batch:
        raise ConfigError(f"label counts sum to {int(counts.sum())} but the capture has {batch} samples")
    slots = torch.repeat_interleave(torch.arange(num_classes), counts)
    return torch.nn.functional.one_hot(slots, num_classes).float()


def _quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")


def resolve_device(name: str) -> str:
    if name == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return {"cuda": "gpu"}.get(name, name)


def reconstruct(
    capture: Capture,
    label_result: Any = None,
    features: Tensor | None = None,
    config: ReconConfig | None = None,
    callbacks: Sequence[L.Callback] = (),
) -> Reconstruction:
    """Reconstruct the client's images from a capture, given recovered (or oracle) labels.

    Optimises ``config.restarts`` restarts as one batched problem through a Lightning ``Trainer`` and
    returns the restart with the lowest attack objective (never chosen with ground truth).
    """
    cfg = config or ReconConfig()
    if capture.is_update:
        raise ConfigError("this capture is a FedAvg update; reconstruction matches FedSGD gradients only "
                          "in this version (set protocol.scheme=fedsgd)")
    if capture.gradients is None:
        raise CaptureError("capture has no gradients to match")
    model = capture.model()
    capture.validate(model)
    batch = num_samples(capture)
    soft = labels_for_slots(label_result, batch, capture.num_classes)
    image_shape = tuple(int(s) for s in capture.model_spec["in_shape"])
    ctx = Context(model=model, protocol=capture.protocol, features=features)
    module = GradientInversion(ctx, capture.gradients, soft, cfg, image_shape)
    _quiet_lightning()
    trainer = L.Trainer(
        max_steps=cfg.iterations, max_epochs=1, accelerator=resolve_device(cfg.device), devices=1,
        logger=False, enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
        enable_progress_bar=cfg.progress, callbacks=list(callbacks),
    )
    start = time.perf_counter()
    trainer.fit(module)
    seconds = time.perf_counter() - start
    best = int(torch.argmin(module.best_loss))
    return Reconstruction(
        images=module.best_images[best].detach().cpu().clamp(0, 1),
        all_images=module.best_images.detach().cpu().clamp(0, 1),
        labels=soft,
        objective=module.best_loss.detach().cpu(),
        best_restart=best,
        history=module.history,
        seconds=seconds,
        iterations=cfg.iterations,
    )
