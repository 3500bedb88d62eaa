"""The FL-scheme contract: one :class:`Scheme` entry per scheme, in one registry (:data:`SCHEMES`).

Every FedAvg-style scheme of RLU Appendix A.6–A.9 adds a term to the loss gradient of every local step that is
affine in the parameters, ``term = pull · (θ − θᵗ) + constant`` (eq. 57, 64–65, 71, 81–82): ``pull`` is the
scheme's coefficient λ and ``constant`` is read from the server-known history terms. The same entry says how
the client's history evolves after a round (Scaffold eq. 58, FedDyn eq. 73, FedDC eq. 82) and how the server
aggregates (McMahan 2017, RLU eq. 1, plus each scheme's server state). The victim
(:mod:`gi.world.fl.victim`), the attack's unrolled client (:mod:`gi.attack.recon.simulate`) and the update-based label
attacks (:mod:`labels.rlu`, :mod:`labels.distribution`) all read these entries, so a new scheme is one file
(see ``docs/architecture.md``, "Add an FL scheme").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gi.core.errors import ConfigError

if TYPE_CHECKING:  # schemes use tensor methods only: the registry loads without torch (fast config checks)
    from torch import Tensor

State = dict[str, "Tensor"]
History = Callable[[str], "Tensor"]  # history term name → that term's tensor for the parameter at hand


def _no_pull(protocol: Any) -> float:
    return 0.0


def _average(protocol: Any, avg: State, weights: list[float], clients: dict[int, State], server: State) -> State:
    return avg


@dataclass(frozen=True)
class Scheme:
    """One FL scheme.

    ``shares``: ``"gradient"`` (FedSGD) or ``"update"`` (``θ_local − θᵗ``). ``history``: the history terms the
    server knows at the start of a round (capture keys ``"<term>/<param>"``; absent = zero, the first round).
    ``pull(protocol)``: λ of ``λ(θ − θᵗ)``; ``constant(protocol, history, num_steps)``: the constant part of the
    per-step term for one parameter (None: zero). ``client_state(protocol, history, update, num_steps)``: the
    client's history after its round (None: unchanged). ``aggregate(protocol, avg, weights, clients, server)``:
    the server's step per parameter from the weighted mean update ``avg``; it may update every client's
    history (server-broadcast terms) and its own ``server`` state in place.
    """

    name: str
    shares: str
    summary: str
    history: tuple[str, ...] = ()
    pull: Callable[[Any], float] = _no_pull
    constant: Callable[[Any, History, int], Tensor] | None = None
    client_state: Callable[[Any, State, State, int], State] | None = None
    aggregate: Callable[[Any, State, list[float], dict[int, State], State], State] = _average

    def __post_init__(self) -> None:
        if self.shares not in ("gradient", "update"):
            raise ValueError(f"scheme {self.name!r}: shares must be 'gradient' or 'update', got {self.shares!r}")

    @property
    def plain_first_step(self) -> bool:
        """Whether the client's first local step is a plain step of the loss: the scheme shares an update and
        adds no history or constant term (a pull ``λ(θ − θᵗ)`` vanishes at θᵗ). FedAvg and FedProx; not FedSGD
        (a gradient), Scaffold, FedDyn or FedDC."""
        return self.shares == "update" and not self.history and self.constant is None

    def term(self, protocol: Any, theta: Tensor, theta0: Tensor, constant: Tensor | None) -> Tensor | None:
        """The scheme's gradient term for one parameter, ``pull·(θ − θᵗ) + constant`` (None when both vanish)."""
        pull = self.pull(protocol)
        out = pull * (theta - theta0) if pull else None
        if constant is not None:
            out = constant if out is None else out + constant
        return out


SCHEMES: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> Scheme:
    """Add ``scheme`` to :data:`SCHEMES`; a name registered twice is an error."""
    if scheme.name in SCHEMES:
        raise ValueError(f"FL scheme {scheme.name!r} registered twice")
    SCHEMES[scheme.name] = scheme
    return scheme


def get_scheme(name: str, shares: str | None = None) -> Scheme:
    """The registered scheme ``name``; ``shares`` restricts it to gradient- or update-sharing schemes."""
    scheme = SCHEMES.get(name)
    valid = sorted(n for n, s in SCHEMES.items() if shares is None or s.shares == shares)
    if scheme is None or (shares is not None and scheme.shares != shares):
        raise ConfigError(f"protocol.scheme={name!r} is not allowed here; valid: {valid}")
    return scheme


def history_of(history: State | None, term_prefix: str, like: Tensor) -> Tensor:
    """``history["<term>/<param>"]`` in the dtype and device of ``like`` (zeros when absent)."""
    t = (history or {}).get(term_prefix)
    return like.new_zeros(like.shape) if t is None else t.to(like)
