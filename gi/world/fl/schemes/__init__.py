"""The FL schemes, one module each, all registered in :data:`SCHEMES` (see :mod:`gi.world.fl.schemes.base`)."""

from gi.world.fl.schemes import fedavg, feddc, feddyn, fedprox, fedsgd, scaffold  # noqa: F401  (registration)
from gi.world.fl.schemes.base import SCHEMES, History, Scheme, get_scheme, history_of, register_scheme

__all__ = ["SCHEMES", "History", "Scheme", "get_scheme", "history_of", "register_scheme"]
