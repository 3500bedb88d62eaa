"""One helper for the name → function registries (objectives, regularisers, inits, optimisers, scenarios).

``register_objective = registrar(OBJECTIVES, "objective")`` gives the decorator ``@register_objective("l2")``;
registering a name twice is an error (two modules silently overriding each other is a bug).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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


def lazy_names(package: str, table: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves each name of ``table`` on first use: a module path
    (imported and returned) or ``(module path, attribute)`` (the module imported, the attribute returned), keeping
    the package's own import light (PEP 562)."""
    known = dict(table)

    def getattr_(name: str) -> Any:
        if name in known:
            import importlib

            target = known[name]
            if isinstance(target, tuple):
                return getattr(importlib.import_module(target[0]), target[1])
            return importlib.import_module(target)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_


def lazy_submodules(package: str, names: Iterable[str]) -> Callable[[str], Any]:
    """:func:`lazy_names` for ``package``'s own submodules ``names`` (``gi.world.data`` without ``import
    gi.world.data``)."""
    return lazy_names(package, {name: f"{package}.{name}" for name in names})
