"""Federated learning, in one home: the protocol, the schemes, the local update rules and training loop, DP.

The simulated clients and server loop live in :mod:`gi.fl.victim` (imported on use: it depends on
:mod:`gi.capture`, which depends on this package's protocol).
"""

from gi.fl.local import local_schedule, local_train, slot_schedule
from gi.fl.optim import LINEAR, RULES, LocalOptimizer, register_rule
from gi.fl.protocol import Protocol
from gi.fl.schemes import SCHEMES, Scheme, get_scheme, register_scheme

__all__ = ["LINEAR", "RULES", "SCHEMES", "LocalOptimizer", "Protocol", "Scheme", "get_scheme", "local_schedule",
           "local_train", "register_rule", "register_scheme", "slot_schedule"]
