"""Client-side defences, one registry (:data:`DEFENCES`, :func:`register_defence`; :mod:`gi.world.fl.defences.base`).

Families, one module each: :mod:`~gi.world.fl.defences.noise` (clip, Gaussian, Laplace, per-step Gaussian),
:mod:`~gi.world.fl.defences.dpsgd` (per-example DP-SGD with Opacus' accountant), :mod:`~gi.world.fl.defences.sparsify`
(top-k,
quantisation), :mod:`~gi.world.fl.defences.training` (oversampling, label smoothing, mixup, dropout) and
:mod:`~gi.world.fl.defences.secagg` (secure aggregation). Importing this package loads no torch.
"""

from gi.core.registry import import_members
from gi.world.fl.defences.base import (
    DEFENCE_STAGES,
    DEFENCES,
    Context,
    Defence,
    Spec,
    apply,
    at,
    check_entries,
    data_indices,
    group_size,
    model_defences,
    record,
    register_defence,
    specs,
)
from gi.world.fl.defences.client import defended_gradient

__all__ = ["DEFENCES", "DEFENCE_STAGES", "Context", "Defence", "Spec", "apply", "at", "check_entries", "data_indices",
           "defended_gradient",
           "group_size", "model_defences", "record", "register_defence", "specs"]

import_members(__name__, __path__)  # every scheme / defence module registers itself
