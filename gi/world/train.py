"""Brief, seeded centralised training of a model, to get the "trained" models of the papers' tables.

Training is deterministic (same initial state, samples, hyper-parameters and generator state: same weights on
the same machine), so its result can be cached by content: with ``$GI_CACHE_DIR`` set, :func:`train_model` keeps
the trained state, its record and the generator's final state under ``$GI_CACHE_DIR/train/<hash>.safetensors``
(a checked entry of :mod:`gi.core.cache`: written atomically, its digest verified on load), and a later call with
identical inputs (any command, any process) loads them instead of training again: a trained ResNet-18 costs
minutes on a 2-core CPU, its cache hit a fraction of a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from gi.core.cache import read_entry, remove_entry, write_entry
from gi.world.losses import soft_cross_entropy

log = logging.getLogger("gi.train")

Tensor = torch.Tensor
CACHE_VERSION = 1  # bump when train_model's arithmetic changes: old cache entries then no longer match


def _digest(h: Any, t: Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def training_key(model: torch.nn.Module, images: Tensor, labels: Tensor, settings: dict[str, float | int],
                 generator: torch.Generator | None) -> str:
    """A content hash of everything :func:`train_model` depends on: the model's class and initial state, the
    samples, the hyper-parameters and the generator's state (None: the global generator's)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"v": CACHE_VERSION, "cls": type(model).__qualname__, "torch": torch.__version__,
                         **settings, "spec": getattr(model, "spec", None)}, sort_keys=True, default=str).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        _digest(h, t)
    _digest(h, images)
    _digest(h, labels)
    _digest(h, (generator.get_state() if generator is not None else torch.get_rng_state()))
    return h.hexdigest()


def cache_dir() -> Path | None:
    """``$GI_CACHE_DIR/train`` when ``GI_CACHE_DIR`` is set, else None (no caching)."""
    root = os.environ.get("GI_CACHE_DIR")
    return Path(root) / "train" if root else None


def train_model(
    model: torch.nn.Module,
    images: Tensor,
    labels: Tensor,
    epochs: float = 1.0,
    batch_size: int = 64,
    lr: float = 0.01,
    momentum: float = 0.9,
    generator: torch.Generator | None = None,
    cache: bool = True,
) -> dict[str, float]:
    """Train in place with SGD on soft-target cross-entropy for ``epochs`` (fractions allowed).

    Returns ``{"steps", "final_loss", "train_acc"}`` (plus ``"cached": True`` on a cache hit) so a config can record
    how the model was trained. With ``cache`` and ``$GI_CACHE_DIR`` set, an identical earlier training
    (:func:`training_key`) is loaded, and ``generator`` is left in the state the training would have left it in.
    """
    settings = {"epochs": float(epochs), "batch_size": int(batch_size), "lr": float(lr), "momentum": float(momentum)}
    root = cache_dir() if cache else None
    key = training_key(model, images, labels, settings, generator) if root is not None else None
    path = root / f"{key}.safetensors" if root is not None else None
    if path is not None:
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        cached = _load(model, path, generator)
        if cached is not None:
            return cached
        model.load_state_dict(initial)  # a half-loaded damaged entry must not leak into the training
    stats = _train(model, images, labels, generator=generator, **settings)
    if path is not None:
        _save(model, path, generator, stats)
    return stats


def _train(model: torch.nn.Module, images: Tensor, labels: Tensor, epochs: float, batch_size: int, lr: float,
           momentum: float, generator: torch.Generator | None) -> dict[str, float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    n = images.shape[0]
    steps = max(1, int(round(epochs * n / batch_size)))
    model.train()
    loss = torch.zeros(())
    perm = torch.randperm(n, generator=generator)
    pos = 0
    for _ in range(steps):
        if pos + batch_size > n:
            perm, pos = torch.randperm(n, generator=generator), 0
        idx = perm[pos:pos + batch_size]
        pos += batch_size
        opt.zero_grad(set_to_none=True)
        loss = soft_cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        sub = torch.arange(min(n, 2000))
        acc = (model(images[sub]).argmax(1) == labels[sub]).double().mean().item()
    return {"steps": steps, "final_loss": float(loss.detach()), "train_acc": acc}


def _save(model: torch.nn.Module, path: Path, generator: torch.Generator | None, stats: dict[str, float]) -> None:
    """One checked cache entry (:func:`gi.core.cache.write_entry`): the trained state and the generator's state."""
    rng = generator.get_state() if generator is not None else torch.get_rng_state()
    write_entry(path, {**{f"state/{k}": v for k, v in model.state_dict().items()}, "rng": rng}, stats)


def _load(model: torch.nn.Module, path: Path, generator: torch.Generator | None) -> dict[str, float] | None:
    """The cached training, put into ``model`` and ``generator``; ``None`` where there is none or it was damaged
    (:func:`gi.core.cache.read_entry`) or its tensors are not this model's (removed with a warning)."""
    entry = read_entry(path)
    if entry is None:
        return None
    tensors, stats = entry
    state = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("state/")}
    rng = tensors.get("rng")
    try:
        if rng is None or rng.dtype != torch.uint8:
            raise RuntimeError("no generator state")
        model.load_state_dict(state)  # copies into the model's own tensors (their device and dtype)
    except RuntimeError as exc:
        log.warning("cache: %s does not fit the model (%s); retrained", path, str(exc).splitlines()[0])
        remove_entry(path)
        return None
    if generator is not None:
        generator.set_state(rng)
    else:
        torch.set_rng_state(rng)
    model.eval()
    return {**stats, "cached": True}
