"""The label-method registry and :func:`recover` (the result type, :class:`gi.label_result.LabelResult`, lives
beside :class:`gi.Capture`, so every stage that reads it imports it from below).

docs/architecture.md, "Add a label method": one module per method family, each registering its methods by name
here; a method that cannot decide returns ``ok=False`` with a reason instead of raising, so batch jobs keep going.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.core.names import label_options
from gi.label_result import LabelResult

Tensor = torch.Tensor


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
    """One line per registered method (for ``gi labels --help`` and docs/usage.md)."""
    return dict(sorted(_DOCS.items()))


def check_call(method: str, captures: list[Capture], options: dict[str, Any]) -> None:
    """The door of the label stage: a known method, options it takes (checked once), captures whose last layer is
    readable (present, float, finite, the model's shapes). Raises :class:`ConfigError` / :class:`CaptureError`."""
    if method not in METHODS:
        raise ConfigError(f"unknown label method {method!r}; valid: {sorted(METHODS)}")
    valid = label_options(method)  # the one table of the options a method takes (configs check it at load)
    if valid is not None:
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ConfigError(f"label method {method!r} takes no option(s) {unknown}; valid: {sorted(valid)}")
    for capture in captures:
        if not isinstance(capture, Capture):
            raise CaptureError(f"labels.recover needs a gi.Capture, got {type(capture).__name__}")
        capture.shared_last_layer()


def uninformative(capture: Capture) -> str | None:
    """Why ``capture``'s last layer carries no label information, or None. An all-zero shared last layer
    (weight and bias: a zero gradient, or an update that moved nothing) is explained by every label set
    equally; every method would answer with an arbitrary class, so :func:`recover` answers ``ok=False``."""
    weight, bias = capture.shared_last_layer()
    if bool(weight.any()) or (bias is not None and bool(bias.any())):
        return None
    what = "update" if capture.is_update else "gradient"
    return (f"the shared last layer ({', '.join(k for k in capture.last_layer_keys if k in capture.shared)}) is all "
            f"zero: a zero {what} carries no label information")


def label_device(device: Any) -> str | None:
    """``device`` (``cpu``, ``gpu``/``cuda``, ``cuda:N``, ``mps``, ``auto``, a torch.device or None) checked
    (:func:`gi.core.devices.torch_device`): None means run where the capture's tensors are (the CPU)."""
    from gi.core.devices import torch_device

    return None if device is None else torch_device(device, "labels device")


@contextlib.contextmanager
def on_device(device: str | None) -> Iterator[None]:
    """Run a method with ``device`` as torch's default device (its new tensors are made there)."""
    if device is None or device == "cpu":
        yield
        return
    with torch.device(device):
        yield


def to_cpu(result: LabelResult) -> LabelResult:
    """A result with its tensors back on the CPU (the later stages read it there)."""
    moved = {f.name: getattr(result, f.name).cpu() for f in dataclasses.fields(result)
             if isinstance(getattr(result, f.name), Tensor)}
    return dataclasses.replace(result, **moved) if moved else result


def recover(capture: Capture, method: str, aux: Any = None, device: Any = None, **options: Any) -> LabelResult:
    """Recover labels from a capture with a registered method (docs/architecture.md, "Public contract").

    ``aux`` is the attacker's auxiliary data when the method needs it (an :class:`gi.world.data.ImageDataset` or
    a dataset); ``options`` are method-specific. ``device`` runs the method there (the capture's tensors are
    moved, new tensors are made there; the result comes back on the CPU); asking for a GPU where none exists is
    a :class:`ConfigError` before any work. Wall time goes to ``info['seconds']``.
    """
    dev = label_device(device)
    check_call(method, [capture], options)
    start = time.perf_counter()
    reason = uninformative(capture)
    if reason is not None:
        result = LabelResult.failure(method, capture.num_classes, reason)
        result.info["seconds"] = time.perf_counter() - start
        return result
    if dev not in (None, "cpu"):
        capture = capture.to(dev)
    with on_device(dev):
        result = METHODS[method](capture, aux=aux, **options)
    result.info.setdefault("seconds", time.perf_counter() - start)
    return to_cpu(result) if dev not in (None, "cpu") else result


def recover_many(captures: list[Capture], method: str, aux: Any = None, device: Any = None,
                 **options: Any) -> list[LabelResult]:
    """:func:`recover` over many captures (on ``device``); vectorised when the method registered a batch form."""
    dev = label_device(device)
    check_call(method, list(captures) if method in BATCH_METHODS else [], options)  # options once; the loop
    if method in BATCH_METHODS:                                                    # path's recover checks each
        if any(uninformative(c) is not None for c in captures):  # recover answers those with ok=False
            return [recover(c, method, aux=aux, device=dev, **options) for c in captures]
        start = time.perf_counter()
        moved = [c.to(dev) for c in captures] if dev not in (None, "cpu") else captures
        with on_device(dev):
            results = BATCH_METHODS[method](moved, aux=aux, **options)
        per = (time.perf_counter() - start) / max(len(captures), 1)
        for r in results:
            r.info.setdefault("seconds", per)
        return [to_cpu(r) for r in results] if dev not in (None, "cpu") else results
    return [recover(c, method, aux=aux, device=dev, **options) for c in captures]
