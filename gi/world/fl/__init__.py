"""Federated learning, in one home: the protocol, the schemes, the local update rules and training loop, the
client-side defences (:mod:`gi.world.fl.defences`).

Importing this package (or :mod:`gi.world.fl.protocol`) loads no torch, so configs are checked at once; the training
loop (:mod:`gi.world.fl.local`) and the simulated clients and server (:mod:`gi.world.fl.victim`) load on first use.
"""

from __future__ import annotations

from typing import Any

from gi.world.fl.optim import LINEAR, RULES, LocalOptimizer, register_rule
from gi.world.fl.protocol import Protocol
from gi.world.fl.schemes import SCHEMES, Scheme, get_scheme, register_scheme

__all__ = ["LINEAR", "RULES", "SCHEMES", "LocalOptimizer", "Protocol", "Scheme", "get_scheme", "local_schedule",
           "local_train", "register_rule", "register_scheme", "slot_schedule"]

_LAZY = {"local_schedule": "gi.world.fl.local", "local_train": "gi.world.fl.local",
         "slot_schedule": "gi.world.fl.local"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gi.world.fl' has no attribute {name!r}")
