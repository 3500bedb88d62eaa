"""Client-side defences, one registry (:data:`DEFENCES`, :func:`register_defence`; :mod:`gi.fl.defences.base`).

Families, one module each: :mod:`~gi.fl.defences.noise` (clip, Gaussian, Laplace, per-step Gaussian),
:mod:`~gi.fl.defences.dpsgd` (per-example DP-SGD with Opacus' accountant), :mod:`~gi.fl.defences.sparsify` (top-k,
quantisation), :mod:`~gi.fl.defences.training` (oversampling, label smoothing, mixup, dropout) and
:mod:`~gi.fl.defences.secagg` (secure aggregation). Importing this package loads no torch.
"""

from gi.fl.defences import dpsgd, noise, secagg, sparsify, training  # noqa: F401  (registration)
from gi.fl.defences.base import (
    DEFENCES,
    STAGES,
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
from gi.fl.defences.client import defended_gradient

__all__ = ["DEFENCES", "STAGES", "Context", "Defence", "Spec", "apply", "at", "check_entries", "data_indices",
           "defended_gradient",
           "group_size", "model_defences", "record", "register_defence", "specs"]
