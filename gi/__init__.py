"""Label-first gradient inversion: the pipeline package (DESIGN.md).

Light imports only; the Lightning-driven reconstruction and the FL simulator load on first use.
"""

from __future__ import annotations

from typing import Any

from gi.capture import Capture, Truth, capture_gradients
from gi.errors import AssetError, CaptureError, ConfigError, GIError
from gi.fl.protocol import Protocol

__all__ = [
    "AssetError",
    "Capture",
    "CaptureError",
    "ConfigError",
    "GIError",
    "Protocol",
    "Truth",
    "capture_gradients",
    "reconstruct",
    "simulate_client",
]

_LAZY = {"reconstruct": ("gi.recon", "reconstruct"), "simulate_client": ("gi.fl.victim", "simulate_client")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gi' has no attribute {name!r}")
