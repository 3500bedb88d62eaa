"""Optimisation-based reconstruction (gradient matching + priors), driven by Lightning."""

from gi.recon.api import Reconstruction, labels_for_slots, reconstruct
from gi.recon.config import ReconConfig
from gi.recon.objectives import OBJECTIVES, register_objective
from gi.recon.regularizers import REGULARIZERS, register_regularizer

__all__ = [
    "OBJECTIVES",
    "REGULARIZERS",
    "ReconConfig",
    "Reconstruction",
    "labels_for_slots",
    "reconstruct",
    "register_objective",
    "register_regularizer",
]
