"""Label recovery: single-sample hard and soft labels, batch counts, label distributions.

Every module of this package registers its methods in :data:`labels.METHODS` on import; this file
imports them all, so ``labels.recover(capture, name)`` sees every method.
"""

from __future__ import annotations

from gi.core.registry import import_members
from labels.base import BATCH_METHODS, METHODS, LabelResult, describe, recover, recover_many, register
from labels.counts import largest_remainder, round_counts
from labels.rounds import average_rounds, recover_rounds

__all__ = [
    "BATCH_METHODS",
    "METHODS",
    "LabelResult",
    "average_rounds",
    "describe",
    "largest_remainder",
    "recover",
    "recover_many",
    "recover_rounds",
    "register",
    "round_counts",
]

import_members(__name__, __path__)
