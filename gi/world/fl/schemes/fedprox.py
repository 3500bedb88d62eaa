"""FedProx (Li et al. 2020; RLU App. A.7, eq. 64–65): the proximal term ``μ(θ − θᵗ)`` on every local step."""

from gi.world.fl.schemes.base import Scheme, register_scheme

FEDPROX = register_scheme(Scheme("fedprox", shares="update", summary="proximal pull μ(θ − θᵗ) on every step",
                                 pull=lambda p: p.prox_mu))
