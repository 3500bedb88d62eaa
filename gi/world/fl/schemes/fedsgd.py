"""FedSGD (McMahan et al. 2017): the client shares the gradient of one batch; nothing is trained locally."""

from gi.world.fl.schemes.base import Scheme, register_scheme

FEDSGD = register_scheme(Scheme("fedsgd", shares="gradient", summary="one gradient of the mean loss per round"))
