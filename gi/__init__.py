"""Label-first gradient inversion: the pipeline package (docs/architecture.md).

Light imports only (no torch): captures, the Lightning-driven reconstruction and the FL simulator load on first
use, so ``gi --help`` and config errors answer at once. Importing it checks that the toolkit's own ``labels`` and
``fcn_analytic`` packages are the ones Python finds (:func:`gi.core.packages.check_own_packages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gi.core.devices import env_threads
from gi.core.errors import AssetError, CaptureError, ConfigError, GIError, OutputError
from gi.core.packages import check_own_packages
from gi.core.registry import lazy_names
from gi.world.fl.protocol import Protocol

check_own_packages()  # a user's labels.py beside their script: one line naming it, before anything needs ours

if TYPE_CHECKING:
    from gi.analysis import metrics
    from gi.attack.recon import reconstruct
    from gi.capture import Capture, Truth
    from gi.world import data, models
    from gi.world.fl.victim import capture_gradients, simulate_client

__all__ = [
    "AssetError",
    "attack",
    "Capture",
    "CaptureError",
    "ConfigError",
    "GIError",
    "OutputError",
    "Protocol",
    "Truth",
    "capture_gradients",
    "data",
    "env_threads",
    "metrics",
    "models",
    "reconstruct",
    "simulate_client",
]


_LAZY = {"Capture": ("gi.capture", "Capture"), "Truth": ("gi.capture", "Truth"),
         "capture_gradients": ("gi.world.fl.victim", "capture_gradients"),
         "reconstruct": ("gi.attack.recon", "reconstruct"),
         "simulate_client": ("gi.world.fl.victim", "simulate_client")}
# the modules of the public contract (docs/architecture.md "Public contract"), by their short names
_MODULES = {"attack": "gi.attack", "data": "gi.world.data", "models": "gi.world.models",
            "metrics": "gi.analysis.metrics", "world": "gi.world", "analysis": "gi.analysis"}


__getattr__ = lazy_names(__name__, {**_LAZY, **_MODULES})
