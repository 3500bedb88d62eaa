"""The client's local training, written once: the step schedule and the update loop.

:func:`local_schedule` gives the batch size of every local step from what the server knows, so the victim and
every attack derive the same schedule. :func:`local_train` runs the steps: at step τ the caller's ``gradient``
gives ``g_τ`` at the current parameters, the step direction is ``d = g + wd·θ + term`` with the scheme's term
``pull·(θ − θᵗ) + constant`` (:class:`gi.world.fl.schemes.Scheme`; RLU App. A.4–A.9), and the optimiser rule
(:mod:`gi.world.fl.optim`) turns ``d`` into the displacement, ``θ ← θ − rule(d)``. The loop is out of place, so it
serves the victim (real data, :mod:`gi.world.fl.victim`), the attack's unrolled client (``torch.func`` over dummy
data, :mod:`gi.attack.recon.simulate`), the server's aux runs (:mod:`labels.distribution`) and RLU's impulse response
(:mod:`labels.rlu`) alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gi.core.errors import CaptureError
from gi.world.fl.optim import LocalOptimizer
from gi.world.fl.schemes import get_scheme, history_of

Tensor = torch.Tensor
State = dict[str, Tensor]
Gradient = Callable[[State, int], State]


def local_schedule(protocol: Any, num_samples: int | None = None) -> list[int]:
    """Batch size of every local step, from what the server knows (N_k, B, drop_last, E, local_steps).

    A client with fewer samples than ``B`` trains on all of them in one step per epoch (a drop-last
    loader would otherwise never step). ``protocol.local_steps`` overrides ``local_epochs``: epochs
    continue until that many steps are done (RLU's multi-"epoch" setting).
    """
    n = num_samples if num_samples is not None else protocol.num_samples
    if n is None or int(n) < 1:
        raise CaptureError("protocol.num_samples (the client's N_k) is needed to derive the local schedule; "
                           "captures from gi.world.fl.victim set it")
    n, b = int(n), min(int(protocol.batch_size), int(n))
    per_epoch = [b] * (n // b)
    if not protocol.drop_last and n % b:
        per_epoch.append(n % b)
    if protocol.local_steps is None:
        return per_epoch * int(protocol.local_epochs)
    steps = int(protocol.local_steps)
    return (per_epoch * math.ceil(steps / len(per_epoch)))[:steps]


def distinct_samples(protocol: Any, num_samples: int | None = None) -> int:
    """How many of the client's ``N_k`` samples its local steps touch: ``min(N_k, Σ_τ |B^τ|)``.

    ``local_steps`` × ``batch_size`` < ``N_k`` (e.g. a Flower client running 1 step of 8 over 66 samples) leaves
    the rest unseen: the update depends on the first ``distinct_samples`` slots of :func:`slot_schedule` only, and
    RLU's counts sum to it."""
    n = num_samples if num_samples is not None else protocol.num_samples
    return min(int(n), int(sum(local_schedule(protocol, n))))


def sums_gradients(protocol: Any) -> bool:
    """Whether an update is ``−η Σ_τ g_τ``, a plain sum of the local steps' mean-loss gradients: FedAvg with SGD
    without momentum or weight decay (no other term enters a step). Its Linear layers' updates then factor like a
    batch gradient over every (sample, visit): for one local epoch each sample is seen once, at its own step's
    parameters, and ``−ΔW/η`` has rank N with the samples' inputs spanning its rows; over E epochs the E visits of
    a sample differ only by the parameters' drift, so the rank is N up to that drift."""
    return (protocol.scheme == "fedavg" and protocol.optimizer == "sgd" and not protocol.momentum
            and not protocol.weight_decay)


def order_known(protocol: Any, num_samples: int | None = None) -> bool:
    """Whether the server can re-simulate the client's update from its images and labels alone: FedSGD, or local
    steps that each see every sample the round touches (one batch per epoch, or one step). A round of several
    mini-batches reshuffled every epoch (a ``DataLoader(shuffle=True)``) is not: the server does not know which
    samples formed which step, and :func:`slot_schedule`'s order is a guess (measured on a round of 50
    Fashion-MNIST images in 10 batches of 5: the true images in slot order leave a relative mismatch of 0.35
    of the update, a flat grey image 0.95), so a mismatch then says little of the images."""
    if not getattr(protocol, "is_update", False):
        return True
    schedule = local_schedule(protocol, num_samples)
    touched = distinct_samples(protocol, num_samples)
    return len(schedule) == 1 or min(schedule) >= touched


def slot_schedule(protocol: Any, num_samples: int) -> list[tuple[int, int]]:
    """``(start, size)`` of every local step over ``num_samples`` slots walked in order, from the protocol alone.

    The client reshuffles every epoch and the server cannot know its order, so every epoch walks the slots in
    the same order (as inversefed's ``FedAvgReconstructor`` does); within one epoch this is exact up to a
    permutation of the slots.
    """
    out, pos = [], 0
    for size in local_schedule(protocol, num_samples):
        if pos + size > num_samples:
            pos = 0
        out.append((pos, size))
        pos += size
    return out


def scheme_constants(protocol: Any, theta0: State, history: State | None, num_steps: int) -> dict[str, Tensor]:
    """The constant part of the scheme's per-step term for every parameter (none when the scheme has none)."""
    scheme = get_scheme(protocol.scheme, shares="update")
    if scheme.constant is None:
        return {}
    return {name: scheme.constant(protocol, lambda term, n=name: history_of(history, f"{term}/{n}", theta0[n]),
                                  num_steps) for name in theta0}


def local_train(theta0: State, protocol: Any, num_steps: int, gradient: Gradient,
                history: State | None = None) -> State:
    """``θ_m`` after ``num_steps`` local steps from ``θ⁰ = theta0`` (the parameters the client trains).

    ``gradient(θ, τ)`` returns the loss gradient of step τ for every name of ``theta0`` (the caller chooses how:
    autograd on real data, ``torch.func.grad`` on dummy data, a unit impulse). ``history``: the scheme's terms,
    keys ``"<term>/<param>"`` (absent = zero, the first round). Differentiable and vmappable when ``gradient`` is.
    """
    scheme = get_scheme(protocol.scheme, shares="update")
    constants = scheme_constants(protocol, theta0, history, num_steps)
    wd = protocol.weight_decay
    optimizer = LocalOptimizer(protocol)
    theta = dict(theta0)
    for tau in range(num_steps):
        g = gradient(theta, tau)
        new = {}
        for name, t in theta.items():
            d = g[name]
            if wd:
                d = d + wd * t
            term = scheme.term(protocol, t, theta0[name], constants.get(name))
            if term is not None:
                d = d + term
            new[name] = t - optimizer.displacement(name, d)
        theta = new
    return theta
