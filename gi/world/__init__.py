"""The victim's world: federated learning (``fl``), data, models, losses, training, the victim schema
(``setup``), its builders and the ``gi labels`` scenarios (docs/architecture.md "Layout").

Everything the simulated client and server do lives here; the attack side reads only what they share
(:class:`gi.capture.Capture`), and scoring reads :class:`gi.capture.Truth`.
"""

from typing import Any

_SUBMODULES = ("assets", "data", "fl", "losses", "models", "scenarios", "setup", "train")


def __getattr__(name: str) -> Any:
    """``gi.world.data`` etc. without an explicit import (each loads on first use, as ``gi.data`` does)."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gi.world' has no attribute {name!r}")
