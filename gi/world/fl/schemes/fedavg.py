"""FedAvg (McMahan et al. 2017; RLU eq. 1, App. A.3): plain local training, size-weighted mean of the local models."""

from gi.world.fl.schemes.base import Scheme, register_scheme

FEDAVG = register_scheme(Scheme("fedavg", shares="update", summary="local training, weighted mean of the updates"))
