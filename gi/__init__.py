"""Label-first gradient inversion: the pipeline package (docs/architecture.md).

Light imports only (no torch): captures, the Lightning-driven reconstruction and the FL simulator load on first
use, so ``gi --help`` and config errors answer at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.core.devices import env_threads
from gi.core.errors import AssetError, CaptureError, ConfigError, GIError
from gi.fl.protocol import Protocol

if TYPE_CHECKING:
    from gi.capture import Capture, Truth, capture_gradients
    from gi.fl.victim import simulate_client
    from gi.recon import reconstruct

__all__ = [
    "AssetError",
    "Capture",
    "CaptureError",
    "ConfigError",
    "GIError",
    "Protocol",
    "Truth",
    "capture_gradients",
    "env_threads",
    "reconstruct",
    "simulate_client",
]


_LAZY = {"Capture": ("gi.capture", "Capture"), "Truth": ("gi.capture", "Truth"),
         "capture_gradients": ("gi.capture", "capture_gradients"), "reconstruct": ("gi.recon", "reconstruct"),
         "simulate_client": ("gi.fl.victim", "simulate_client")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gi' has no attribute {name!r}")
