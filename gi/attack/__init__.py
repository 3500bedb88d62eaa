"""The label-first attack as a library: labels → features → image (docs/architecture.md "Data flow").

:func:`run` is the one call (the same stages as ``gi attack``; it returns an :class:`Attack`, which scores and
saves itself); :mod:`gi.attack.stages` holds the stages and the label modes, :mod:`gi.attack.recon` the
optimisation loop (Lightning). Light imports only: they load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gi.attack.api import Attack, run
    from gi.attack.stages import AttackResult, LabelConfig

__all__ = ["Attack", "AttackResult", "LabelConfig", "run"]

_LAZY = {"run": ("gi.attack.api", "run"), "Attack": ("gi.attack.api", "Attack"),
         "AttackResult": ("gi.attack.stages", "AttackResult"),
         "LabelConfig": ("gi.attack.stages", "LabelConfig")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gi.attack' has no attribute {name!r}")
