"""One helper for the name → function registries (objectives, regularisers, inits, optimisers, scenarios).

``register_objective = registrar(OBJECTIVES, "objective")`` gives the decorator ``@register_objective("l2")``;
registering a name twice is an error (two modules silently overriding each other is a bug).
"""

from __future__ import annotations

from collections.abc import Callable
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
