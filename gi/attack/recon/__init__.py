"""Optimisation-based reconstruction (gradient/update matching + features + priors), driven by Lightning.

Only :class:`ReconConfig` loads with the package (configs are read without torch or Lightning); the rest on first
use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig

if TYPE_CHECKING:
    from gi.attack.recon.api import reconstruct, reconstruct_many
    from gi.attack.recon.inits import INITS, register_init
    from gi.attack.recon.objectives import OBJECTIVES, register_objective
    from gi.attack.recon.optim import OPTIMIZERS, register_optimizer
    from gi.attack.recon.problem import Problem, build_problem, labels_for_slots
    from gi.attack.recon.regularizers import REGULARIZERS, register_regularizer
    from gi.attack.recon.result import Reconstruction
    from gi.attack.recon.simulate import SIMULATORS
    from gi.attack.recon.terms import TERMS, register_term

__all__ = [
    "INITS",
    "OBJECTIVES",
    "OPTIMIZERS",
    "REGULARIZERS",
    "SIMULATORS",
    "TERMS",
    "Problem",
    "ReconConfig",
    "Reconstruction",
    "build_problem",
    "labels_for_slots",
    "reconstruct",
    "reconstruct_many",
    "register_init",
    "register_objective",
    "register_optimizer",
    "register_regularizer",
    "register_term",
]

_LAZY = {
    "Reconstruction": "result", "reconstruct": "api", "reconstruct_many": "api",
    "Problem": "problem", "build_problem": "problem", "labels_for_slots": "problem",
    "TERMS": "terms", "register_term": "terms",
    "INITS": "inits", "register_init": "inits", "OBJECTIVES": "objectives", "register_objective": "objectives",
    "OPTIMIZERS": "optim", "register_optimizer": "optim", "REGULARIZERS": "regularizers",
    "register_regularizer": "regularizers", "SIMULATORS": "simulate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"gi.attack.recon.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gi.attack.recon' has no attribute {name!r}")
