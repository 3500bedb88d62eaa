"""One helper for the name → function registries (objectives, regularisers, inits, optimisers, scenarios).

``register_objective = registrar(OBJECTIVES, "objective")`` gives the decorator ``@register_objective("l2")``;
registering a name twice is an error (two modules silently overriding each other is a bug).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def registrar(table: dict[str, Any], kind: str) -> Callable[[str], Callable[[F], F]]:
    """A decorator factory that adds functions to ``table`` under a unique name."""

    def register(name: str) -> Callable[[F], F]:
        def wrap(fn: F) -> F:
            if name in table:
                raise ValueError(f"{kind} {name!r} registered twice")
            table[name] = fn
            return fn

        return wrap

    register.__doc__ = f"Decorator: register a {kind} under ``name``."
    return register


def import_members(package: str, path: Iterable[str]) -> None:
    """Import every public module of ``package`` (its ``__path__``), so that each registers what it defines: the
    one discovery rule of every registry (label methods, FL schemes, defences, scenarios). Modules whose name
    starts with ``_`` are skipped; importing a module twice is a no-op."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(list(path)):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
