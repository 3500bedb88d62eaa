"""``gi.reconstruct``: the attack's public entry point (DESIGN.md §4).

The attack API takes a :class:`Capture`, a label result and optional features: there is no parameter through
which ground truth could reach it, so restarts can only be ranked by the attack objective.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch

from gi.capture import Capture
from gi.core.devices import env_threads, resolve_device
from gi.core.errors import CaptureError, ConfigError, GIError
from gi.label_result import LabelResult
from gi.recon.config import SMALL_MODEL, ReconConfig
from gi.recon.module import Context, GradientInversion

Tensor = torch.Tensor
log = logging.getLogger("gi.recon")


@dataclass
class Reconstruction:
    """Result of :func:`reconstruct`.

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


def labels_for_slots(label_result: LabelResult | None, batch: int, num_classes: int) -> Tensor:
    """Soft targets (B, C) from a LabelResult: its soft labels, else one one-hot slot per counted label.

    The order of slots is irrelevant to a mean loss (and the batch metric matches images one-to-one), so slots
    are put in a canonical order: by class (argmax), stably. Counts fill slots class by class in increasing
    class index; an oracle's per-sample labels land in the same order, so exact counts give identical slots.
    """
    if label_result is None:
        raise ConfigError("reconstruct needs labels: pass a LabelResult (labels.recover, or oracle labels made by "
                          "the pipeline), or set attack.labels=joint to optimise them from a random start")
    soft = label_result.soft
    if soft is not None and soft.shape == (batch, num_classes):
        soft = soft.float()
        return soft[torch.argsort(soft.argmax(1), stable=True)]
    counts = label_result.counts.long()
    if int(counts.sum()) != batch:
        reason = label_result.info.get("reason") if not label_result.ok else None
        raise ConfigError(f"label counts of {label_result.method!r} sum to {int(counts.sum())} but the capture has "
                          f"{batch} samples" + (f" (the method failed: {reason})" if reason else ""))
    slots = torch.repeat_interleave(torch.arange(num_classes), counts)
    return torch.nn.functional.one_hot(slots, num_classes).float()


def feature_targets(capture: Capture, label_result: LabelResult | None, soft: Tensor) -> Tensor | None:
    """f*_{N−1} per slot (B, D), float64, for the feature term of eq. 8; None when the capture does not give it.

    One sample: :func:`fcn_analytic.last_layer_features` (``λ·g_r`` of the soft-label method, ``∇Wᵀ∇b/‖∇b‖²``
    with a bias, or λ fitted to the slot label). A batch with a last-layer bias: slot with label c gets
    ``∇W_c/∇b_c``, the ∇b-weighted mean of the features in the batch, which is the feature of a class that
    occurs once (breaching's ``features`` regulariser); a bias-free batch has no analytic per-slot feature.
    """
    b = soft.shape[0]
    if capture.is_update:
        return None
    if b == 1:
        from fcn_analytic import last_layer_features

        if label_result is None or (label_result.features is None and label_result.soft is None):
            # counts only (or joint labels): λ fitted to the slot label
            label_result = LabelResult.from_counts("slots", soft.argmax(1).bincount(minlength=soft.shape[1]),
                                                   soft=soft)
        try:
            return last_layer_features(capture, label_result).reshape(1, -1)
        except GIError:
            return None
    gw, gb = capture.last_layer(torch.float64)
    if gb is None:
        return None
    cls = soft.argmax(1)
    denom = gb[cls]
    if bool((denom == 0).any()):
        return None
    return gw[cls] / denom.unsqueeze(1)


def analytic_prior(capture: Capture, label_result: LabelResult | None) -> Tensor | None:
    """The analytic inversion of a fully-connected net (soft-label paper §4.2) as (B=1, C, H, W), else None."""
    from fcn_analytic import invert

    try:
        return invert(capture, label_result).image
    except GIError:
        return None


def bn_targets(capture: Capture, model: torch.nn.Module, source: str) -> dict[str, tuple[Tensor, Tensor]]:
    """BatchNorm targets the threat model grants: ``shared`` reads ``capture.history['bn_stats/<module>.mean'|'.var']``
    (the client's batch statistics, e.g. from FedAvg's shared buffers), ``running`` the model's running stats."""
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            continue
        if source == "running":
            if m.running_mean is None:
                continue
            mean, var = m.running_mean, m.running_var
        else:
            mean, var = capture.history.get(f"bn_stats/{name}.mean"), capture.history.get(f"bn_stats/{name}.var")
            if mean is None or var is None:
                continue
        out[name] = (mean.detach().float().reshape(1, -1), var.detach().float().reshape(1, -1))
    return out


def quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the victim keeps its mode
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")


@contextlib.contextmanager
def cpu_threads(threads: int | None, model: torch.nn.Module, accelerator: str) -> Iterator[int]:
    """Set torch's CPU threads for the loop and restore them after. null: ``$GI_THREADS`` when set (the same in
    the Python API as on the command line, whose ``--threads`` sets it), else 1 for small models on CPU
    (overhead-bound), else torch's default."""
    before = torch.get_num_threads()
    if threads is None:
        threads = env_threads()
    if threads is None:
        small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
        threads = 1 if small and accelerator == "cpu" else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def _same_model(a: Capture, b: Capture) -> bool:
    if a.model_spec != b.model_spec or a.protocol != b.protocol or a.num_samples != b.num_samples:
        return False
    if a.is_update != b.is_update or set(a.shared) != set(b.shared) or set(a.model_state) != set(b.model_state):
        return False
    return all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state) and \
        all(torch.equal(a.history.get(k, torch.zeros(0)), b.history.get(k, torch.zeros(0))) for k in a.history)


def reconstruct(
    capture: Capture,
    label_result: LabelResult | None = None,
    features: Tensor | None = None,
    config: ReconConfig | None = None,
    callbacks: Sequence[L.Callback] = (),
) -> Reconstruction:
    """Reconstruct the client's images from a capture (FedSGD gradients or a FedAvg update), given recovered
    (or oracle) labels; ``features`` (B, D) the feature targets of eq. 8 (default: from the capture and labels).

    Optimises ``config.restarts`` restarts as one batched problem through a Lightning ``Trainer`` and returns
    the restart with the lowest attack objective (never chosen with ground truth).
    """
    return reconstruct_many([capture], [label_result], None if features is None else [features], config,
                            callbacks)[0]


def reconstruct_many(
    captures: Sequence[Capture],
    label_results: Sequence[LabelResult | None] | None = None,
    features: Sequence[Tensor | None] | None = None,
    config: ReconConfig | None = None,
    callbacks: Sequence[L.Callback] = (),
) -> list[Reconstruction]:
    """:func:`reconstruct` for many captures of one global model as one batched problem (captures × restarts).

    Captures must share model, state, protocol, history and batch size (an ablation's captures do); otherwise
    they are reconstructed one after another. On a CPU a LeNet step over 10 captures costs about twice one.
    """
    cfg = config or ReconConfig()
    captures = list(captures)
    if not captures:
        raise ConfigError("reconstruct_many needs at least one capture")
    label_results = list(label_results) if label_results is not None else [None] * len(captures)
    features = list(features) if features is not None else [None] * len(captures)
    if len(label_results) != len(captures) or len(features) != len(captures):
        raise ConfigError(f"{len(captures)} captures but {len(label_results)} label results and {len(features)} "
                          "feature tensors")
    for c in captures:
        if not isinstance(c, Capture):
            raise CaptureError(f"reconstruct needs a gi.Capture, got {type(c).__name__}")
        if (c.gradients is None) == (c.update is None):
            raise CaptureError("a capture needs exactly one of gradients (FedSGD) and update (FedAvg) to match")
    if not all(_same_model(captures[0], c) for c in captures[1:]):
        return [reconstruct_many([c], [lr], [f], cfg, callbacks)[0] for c, lr, f in zip(captures, label_results,
                                                                                         features)]
    first = captures[0]
    model = first.model()
    for c in captures:
        c.validate(model)
    b, classes = first.num_samples, first.num_classes
    joint_random = cfg.labels == "joint" and all(lr is None for lr in label_results)
    soft = None if joint_random else torch.stack([labels_for_slots(lr, b, classes) for lr in label_results])
    feats = None
    if cfg.feature_weight > 0:
        slots = soft if soft is not None else torch.zeros(len(captures), b, classes)
        rows = [f if f is not None else (feature_targets(c, lr, s) if soft is not None or b == 1 else None)
                for c, lr, f, s in zip(captures, label_results, features, slots)]
        if any(f is None for f in rows):
            raise ConfigError("attack.feature_weight > 0 but no last-layer feature target f* is available for this "
                              "capture (needs one sample, or a batch with a last-layer bias, or explicit features)")
        feats = torch.stack([f.reshape(b, -1) for f in rows])
    prior = None
    if cfg.init == "analytic":
        priors = [analytic_prior(c, lr) for c, lr in zip(captures, label_results)]
        if any(p is None for p in priors) or b != 1:
            raise ConfigError("attack.init=analytic needs a fully-connected net and one sample (fcn_analytic.invert); "
                              "use attack.init=uniform")
        prior = torch.stack(priors)
    names = list(first.shared)
    target = {k: torch.stack([c.shared[k] for c in captures]) for k in names}
    ctx = Context(model=model, protocol=first.protocol, kind="update" if first.is_update else "gradient",
                  history=dict(first.history), trained=names)
    if "bn" in cfg.regularizers and cfg.regularizers["bn"]:
        ctx.bn_targets = bn_targets(first, model, cfg.bn_stats)
    image_shape = tuple(int(s) for s in first.model_spec["in_shape"])
    module = GradientInversion(ctx, target, soft, cfg, image_shape, num_samples=b, features=feats, prior=prior)
    quiet_lightning()
    accelerator, devices = resolve_device(cfg.device)
    trainer = L.Trainer(
        max_steps=cfg.iterations, max_epochs=1, accelerator=accelerator, devices=devices,
        logger=False, enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
        enable_progress_bar=cfg.progress, callbacks=list(callbacks),
    )
    with cpu_threads(cfg.threads, model, accelerator) as threads:
        start = time.perf_counter()
        trainer.fit(module)
        seconds = time.perf_counter() - start
    log.info("reconstructed %d capture(s) x %d restart(s) in %.1f s (%d threads)", len(captures), cfg.restarts,
             seconds, threads)
    n, r = len(captures), cfg.restarts
    loss = module.best_loss.detach().cpu().view(n, r)
    images = module.best_images.detach().cpu().clamp(0, 1).view(n, r, *module.best_images.shape[1:])
    labels = module.best_soft.detach().cpu().view(n, r, *module.best_soft.shape[1:])
    out = []
    for i in range(n):
        best = int(torch.argmin(loss[i]))
        history = {"step": module.history["step"],
                   "objective": [o[i * r:(i + 1) * r] for o in module.history["objective"]],
                   "threads": threads}
        out.append(Reconstruction(images=images[i, best], all_images=images[i], labels=labels[i, best],
                                  objective=loss[i], best_restart=best, history=history, seconds=seconds / n,
                                  iterations=cfg.iterations, all_labels=labels[i]))
    return out
