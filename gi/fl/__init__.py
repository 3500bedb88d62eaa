"""Federated learning, in one home: the protocol, the schemes, the local update rules and training loop, the
client-side defences (:mod:`gi.fl.defences`).

Importing this package (or :mod:`gi.fl.protocol`) loads no torch, so configs are checked at once; the training
loop (:mod:`gi.fl.local`) and the simulated clients and server (:mod:`gi.fl.victim`) load on first use.
"""

from __future__ import annotations

from typing import Any

from gi.fl.optim import LINEAR, RULES, LocalOptimizer, register_rule
from gi.fl.protocol import Protocol
from gi.fl.schemes import SCHEMES, Scheme, get_scheme, register_scheme

__all__ = ["LINEAR", "RULES", "SCHEMES", "LocalOptimizer", "Protocol", "Scheme", "get_scheme", "local_schedule",
           "local_train", "register_rule", "register_scheme", "slot_schedule"]

_LAZY = {"local_schedule": "gi.fl.local", "local_train": "gi.fl.local", "slot_schedule": "gi.fl.local"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gi.fl' has no attribute {name!r}")
