"""The label-recovery contract: :class:`LabelResult`, the method registry and :func:`recover`.

DESIGN.md §3–4: one module per method family, each registering its methods by name here; a method
that cannot decide returns ``ok=False`` with a reason instead of raising, so batch jobs keep going.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gi.capture import Capture
from gi.errors import CaptureError, ConfigError

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


Method = Callable[..., LabelResult]
BatchMethod = Callable[..., list[LabelResult]]
METHODS: dict[str, Method] = {}
BATCH_METHODS: dict[str, BatchMethod] = {}
_DOCS: dict[str, str] = {}


def register(name: str, summary: str = "", batch: BatchMethod | None = None) -> Callable[[Method], Method]:
    """Decorator: register ``fn(capture, aux=None, **options) -> LabelResult`` under ``name``.

    ``batch``, when given, is a vectorised ``fn(captures, aux=None, **options) -> list[LabelResult]``
    that :func:`recover_many` uses instead of a Python loop.
    """

    def wrap(fn: Method) -> Method:
        if name in METHODS:
            raise ValueError(f"label method {name!r} registered twice")
        METHODS[name] = fn
        if batch is not None:
            BATCH_METHODS[name] = batch
        _DOCS[name] = summary or (fn.__doc__ or "").strip().splitlines()[0]
        return fn

    return wrap


def register_batch(name: str) -> Callable[[BatchMethod], BatchMethod]:
    """Decorator: attach a vectorised many-captures implementation to the registered method ``name``."""

    def wrap(fn: BatchMethod) -> BatchMethod:
        BATCH_METHODS[name] = fn
        return fn

    return wrap


def describe() -> dict[str, str]:
    """One line per registered method (for ``gi labels --help`` and the README)."""
    return dict(sorted(_DOCS.items()))


def recover(capture: Capture, method: str, aux: Any = None, **options: Any) -> LabelResult:
    """Recover labels from a capture with a registered method (DESIGN.md §4).

    ``aux`` is the attacker's auxiliary data when the method needs it (an :class:`labels.aux.AuxData` or
    a dataset); ``options`` are method-specific. Wall time goes to ``info['seconds']``.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown label method {method!r}; valid: {sorted(METHODS)}")
    if not isinstance(capture, Capture):
        raise CaptureError(f"labels.recover needs a gi.Capture, got {type(capture).__name__}")
    start = time.perf_counter()
    result = METHODS[method](capture, aux=aux, **options)
    result.info.setdefault("seconds", time.perf_counter() - start)
    return result


def recover_many(captures: list[Capture], method: str, aux: Any = None, **options: Any) -> list[LabelResult]:
    """:func:`recover` over many captures; vectorised when the method registered a batch form."""
    if method not in METHODS:
        raise ConfigError(f"unknown label method {method!r}; valid: {sorted(METHODS)}")
    if method in BATCH_METHODS:
        start = time.perf_counter()
        results = BATCH_METHODS[method](captures, aux=aux, **options)
        per = (time.perf_counter() - start) / max(len(captures), 1)
        for r in results:
            r.info.setdefault("seconds", per)
        return results
    return [recover(c, method, aux=aux, **options) for c in captures]
