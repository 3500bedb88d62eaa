"""Optimisation-based reconstruction (gradient/update matching + features + priors), driven by Lightning."""

from gi.recon.api import Reconstruction, labels_for_slots, reconstruct, reconstruct_many
from gi.recon.config import ReconConfig
from gi.recon.inits import INITS, register_init
from gi.recon.objectives import OBJECTIVES, register_objective
from gi.recon.optim import OPTIMIZERS, register_optimizer
from gi.recon.regularizers import REGULARIZERS, register_regularizer
from gi.recon.simulate import SIMULATORS

__all__ = [
    "INITS",
    "OBJECTIVES",
    "OPTIMIZERS",
    "REGULARIZERS",
    "SIMULATORS",
    "ReconConfig",
    "Reconstruction",
    "labels_for_slots",
    "reconstruct",
    "reconstruct_many",
    "register_init",
    "register_objective",
    "register_optimizer",
    "register_regularizer",
]
