"""The FL schemes, one module each, all registered in :data:`SCHEMES` (see :mod:`gi.world.fl.schemes.base`)."""

from gi.core.registry import import_members
from gi.world.fl.schemes.base import SCHEMES, History, Scheme, get_scheme, history_of, register_scheme

__all__ = ["SCHEMES", "History", "Scheme", "get_scheme", "history_of", "register_scheme"]

import_members(__name__, __path__)  # every scheme / defence module registers itself
