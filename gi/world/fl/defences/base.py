"""The client-side defence registry: one :class:`Defence` per name in :data:`DEFENCES`.

A protocol lists its defences in order (``Protocol.defences``: ``{name, strength, params}`` entries; the legacy
``dp_clip`` / ``dp_sigma`` / ``dp_scale`` fields map onto ``clip``, ``gaussian`` and ``gaussian-step`` first). Each
defence acts at one **stage** of the client's round, and every client path (the FedSGD gradient of
:func:`gi.capture_gradients`, the local training of :mod:`gi.world.fl.victim`) runs the stages in this order:

============ ======================================================== =============================================
stage        value the defence maps                                   example
============ ======================================================== =============================================
data         the client's labels (N,) → indices of the samples to     random oversampling (Ramakrishna & Dán §6.3)
             train on
model        the client's model → hook handles (removed afterwards)   dropout before the last layer (Decaf)
batch        one step's ``(images, soft targets)`` → new pair         label smoothing, mixup
per-example  per-sample gradients ``{name: (B, ...)}`` → the step's   DP-SGD (Abadi et al. 2016) through Opacus'
             mean gradient (switches to per-sample gradients)         accountant
step         the step's mean gradient → a new one                     Gaussian noise on every local step
shared       the shared gradient or update → what is sent             clip, Gaussian / Laplace noise, top-k,
                                                                      quantisation
aggregate    nothing → the number k of clients the server sees only   secure aggregation
             as a sum
============ ======================================================== =============================================

A defence function is ``fn(value, spec, ctx) -> value`` with ``spec`` the protocol's entry (:class:`Spec`:
``strength``, ``params``) and ``ctx`` (:class:`Context`) the protocol, the generator and the step's batch size.
This module loads no torch: the defences import it inside their functions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gi.core.errors import ConfigError

DEFENCE_STAGES = ("data", "model", "batch", "per-example", "step", "shared", "aggregate")


@dataclass(frozen=True)
class Defence:
    """One registered defence: its stage, what its ``strength`` means, its options (name → default) and, for a
    defence with a privacy accountant, ``account(spec, steps, sample_rate) -> dict`` (recorded in the capture)."""

    name: str
    stage: str
    summary: str
    fn: Callable[..., Any]
    strength: str
    valid: Callable[[float], bool]
    valid_text: str
    params: Mapping[str, Any] = field(default_factory=dict)
    account: Callable[..., dict[str, Any]] | None = None
    check: Callable[[Mapping[str, Any], str], None] | None = None


@dataclass(frozen=True)
class Spec:
    """One entry of ``Protocol.defences``, checked: the defence, its strength and its options (defaults filled)."""

    defence: Defence
    strength: float
    params: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.defence.name


@dataclass
class Context:
    """What a defence may read besides its value: the protocol, the client's generator, the step's batch size."""

    protocol: Any
    generator: Any = None
    batch_size: int = 1


DEFENCES: dict[str, Defence] = {}


def register_defence(name: str, stage: str, summary: str, strength: str, valid: Callable[[float], bool] | None = None,
                     valid_text: str = ">= 0", account: Callable[..., dict[str, Any]] | None = None,
                     check: Callable[[Mapping[str, Any], str], None] | None = None,
                     **params: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn(value, spec, ctx)`` as defence ``name`` at ``stage`` (module docstring); ``strength``
    says what the strength is, ``valid`` checks it (default: >= 0), keyword ``params`` are its options and defaults;
    ``check(params, where)`` checks the options' values (defaults filled) when the protocol is built, raising a
    ConfigError that names ``where.params.<key>`` and the allowed range."""
    if stage not in DEFENCE_STAGES:
        raise ValueError(f"defence {name!r}: stage {stage!r} is not one of {list(DEFENCE_STAGES)}")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in DEFENCES:
            raise ValueError(f"defence {name!r} registered twice")
        DEFENCES[name] = Defence(name, stage, summary, fn, strength, valid or (lambda s: s >= 0), valid_text,
                                 dict(params), account, check)
        return fn

    return wrap


def check_entries(entries: Any) -> list[dict[str, Any]]:
    """``Protocol.defences`` checked and written as ``{name, strength, params}`` dicts (a ConfigError names the bad
    entry and lists what is allowed)."""
    if not isinstance(entries, list):
        raise ConfigError(f"protocol.defences={entries!r}: expected a list of {{name, strength, params}} entries")
    out = []
    for i, entry in enumerate(entries):
        where = f"protocol.defences[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}={entry!r}: expected a mapping {{name, strength, params}}")
        unknown = sorted(set(entry) - {"name", "strength", "params"})
        if unknown:
            raise ConfigError(f"{where} has unknown key(s) {unknown}; valid: ['name', 'params', 'strength']")
        name = entry.get("name")
        if name not in DEFENCES:
            raise ConfigError(f"{where}.name={name!r} is not a defence; valid: {sorted(DEFENCES)}")
        d = DEFENCES[name]
        strength = entry.get("strength")
        if isinstance(strength, bool) or not isinstance(strength, int | float) or not math.isfinite(strength):
            raise ConfigError(f"{where}.strength={strength!r}: {name} needs a finite number ({d.strength})")
        if not d.valid(float(strength)):
            raise ConfigError(f"{where}.strength={strength!r}: {name}'s strength ({d.strength}) must be {d.valid_text}")
        params = entry.get("params") or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.params={params!r}: expected a mapping of options")
        bad = sorted(set(params) - set(d.params))
        if bad:
            raise ConfigError(f"{where}.params has unknown option(s) {bad} for {name}; valid: {sorted(d.params)}")
        for key, value in params.items():
            default = d.params[key]
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}.params.{key}={value!r}: expected a finite number")
            if default is not None and not isinstance(value, type(default)) and not (
                    isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)):
                raise ConfigError(f"{where}.params.{key}={value!r}: expected a {type(default).__name__} like the "
                                  f"default {default!r}")
        if d.check is not None:
            d.check({**d.params, **params}, where)
        out.append({"name": name, "strength": strength, "params": dict(params)})
    return out


def specs(protocol: Any) -> list[Spec]:
    """The protocol's defences in order: the legacy DP fields first (``dp_clip`` → ``clip``; ``dp_sigma`` →
    ``gaussian``, on the gradient-like ``−Δθ/η`` for ``dp_scale: gradient``, or ``gaussian-step`` for
    ``dp_scale: step`` on an update scheme), then ``protocol.defences``."""
    legacy: list[dict[str, Any]] = []
    if protocol.dp_clip is not None:
        legacy.append({"name": "clip", "strength": protocol.dp_clip, "params": {}})
    if protocol.dp_sigma > 0:
        if protocol.is_update and protocol.dp_scale == "step":
            legacy.append({"name": "gaussian-step", "strength": protocol.dp_sigma, "params": {}})
        else:
            on = "gradient" if protocol.dp_scale == "gradient" else "shared"
            legacy.append({"name": "gaussian", "strength": protocol.dp_sigma, "params": {"on": on}})
    out = []
    for entry in legacy + list(protocol.defences):
        d = DEFENCES[entry["name"]]
        out.append(Spec(d, float(entry["strength"]), {**d.params, **(entry.get("params") or {})}))
    return out


def at(protocol: Any, stage: str) -> list[Spec]:
    """The protocol's defences of one stage, in order."""
    return [s for s in specs(protocol) if s.defence.stage == stage]


def apply(stage: str, value: Any, ctx: Context) -> Any:
    """Run every defence of ``stage`` of ``ctx.protocol`` on ``value`` in order."""
    for spec in at(ctx.protocol, stage):
        value = spec.defence.fn(value, spec, ctx)
    return value


def data_indices(labels: Any, ctx: Context) -> Any:
    """The ``data`` stage: indices into the client's samples it trains on (None without a data defence)."""
    stage = at(ctx.protocol, "data")
    if not stage:
        return None
    import torch

    idx = torch.arange(int(labels.shape[0]))
    for spec in stage:
        idx = idx[spec.defence.fn(labels[idx], spec, ctx)]
    return idx


@contextlib.contextmanager
def model_defences(model: Any, ctx: Context) -> Iterator[None]:
    """The ``model`` stage for the duration of a block: hooks added to ``model`` and removed afterwards."""
    handles: list[Any] = []
    try:
        for spec in at(ctx.protocol, "model"):
            handles += list(spec.defence.fn(model, spec, ctx))
        yield
    finally:
        for h in handles:
            h.remove()


def group_size(protocol: Any) -> int:
    """How many clients the server sees only as one sum (the ``aggregate`` stage; 1 without one)."""
    k = 1
    for spec in at(protocol, "aggregate"):
        k *= int(spec.defence.fn(None, spec, Context(protocol)))
    return k


def record(protocol: Any, steps: int, sample_rate: float) -> list[dict[str, Any]]:
    """What a capture records of its defences (``capture.meta["defences"]``): name, strength, options and, for
    an accounted defence, its privacy report over ``steps`` local steps at ``sample_rate``."""
    out = []
    for spec in specs(protocol):
        row: dict[str, Any] = {"name": spec.name, "strength": spec.strength, "params": dict(spec.params)}
        if spec.defence.account is not None:
            row.update(spec.defence.account(spec, steps, sample_rate))
        out.append(row)
    return out

