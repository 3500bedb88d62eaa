"""FedAvg client updates for the update-based label benchmarks (RLU, Ramakrishna & Dán, Decaf).

One trial = one simulated federation (:func:`gi.fl.victim.run_federation`): ``num_clients`` clients split a
real dataset, train ``round − 1`` rounds from the initial model, and every client's update of round
``round`` is captured (one :class:`Trial` per client). All randomness of a trial (partition, model
initialisation, batch order, DP noise) comes from ``seed`` and the trial index, so grid points that only
change ``round`` (or the attack) see the *same* federation: it is simulated once up to
``federation_rounds`` and cached in-process. Setup keys (defaults in :data:`DEFAULTS`):

- ``dataset`` / ``split`` / ``aux_split`` / ``size`` / ``channels``: client data from
  ``gi.data.load(dataset, split)``; the attacker's aux set (``aux_per_class`` per class) from ``aux_split``
  (disjoint: a different split, or the same split minus every client's samples).
- ``partition``: ``dirichlet`` (RLU App. B.5: per-class Dir(``alpha``), ``min_size`` per client, default
  ``B·local_steps``; ``balance`` the reference code's rule), ``simplex`` (Ramakrishna & Dán §6: client size
  ``N_k ~ U[client_size]``, proportions uniform on the simplex, disjoint draws) or ``table`` (Decaf
  Tables III–VII: fixed ``compositions`` — one list of C proportions or percentages per client — of
  ``client_size`` samples each).
- ``model``: ``{name, activation, init, bias_last, norm, options}`` for :func:`gi.models.build`;
  ``dtype``: ``float32`` or ``float64`` (model and images).
- ``protocol``: :class:`gi.Protocol` fields of the clients (scheme defaults to ``fedavg``);
  ``local_steps`` sets ``protocol.local_steps`` (RLU's "epochs": that many steps on fresh batches).
- ``round`` (captured round, 1 = the untrained initial model), ``federation_rounds`` (how far the cached
  federation is simulated; default ``round``), ``clients`` (captured clients; default all).
- ``eval_samples``: test images for the global accuracy stored in ``capture.meta['global_acc']`` (0: skip).
- ``group``: row label of the trials (default ``"round <t>"``).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from gi.core.errors import ConfigError
from gi.fl.protocol import Protocol
from gi.scenarios import Trial, check_keys, register_scenario

Tensor = torch.Tensor

DEFAULTS: dict[str, Any] = {
    "dataset": "fashion-mnist",
    "split": "train",
    "aux_split": "test",
    "size": None,
    "channels": None,
    "aux_per_class": 100,
    "num_clients": 10,
    "partition": "dirichlet",
    "alpha": 0.5,
    "balance": False,
    "min_size": None,
    "client_size": [100, 1500],
    "compositions": None,
    "model": {},
    "dtype": "float32",
    "protocol": {},
    "local_steps": None,
    "round": 1,
    "federation_rounds": None,
    "clients": None,
    "eval_samples": 1000,
    "seed": 0,
    "group": None,
}
MODEL_DEFAULTS: dict[str, Any] = {"name": "cnn", "activation": None, "init": None, "bias_last": True, "norm": None,
                                  "options": {}}
PARTITIONS = ("dirichlet", "simplex", "table")
DTYPES = {"float32": torch.float32, "float64": torch.float64}

_DATA: OrderedDict[tuple, Any] = OrderedDict()
_AUX: OrderedDict[str, Any] = OrderedDict()
_FEDERATIONS: OrderedDict[str, Any] = OrderedDict()
_CACHE_SIZE = 3


def _remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _dataset(setup: dict[str, Any], split: str, dtype: torch.dtype) -> Any:
    from gi.data import ImageDataset, load

    key = (setup["dataset"], split, json.dumps(setup["size"]), setup["channels"], str(dtype))
    if key in _DATA:
        return _DATA[key]
    data = load(setup["dataset"], split=split, size=setup["size"])
    images = data.images
    if setup["channels"] is not None:
        if images.shape[1] != 1 or int(setup["channels"]) != 3:
            raise ConfigError(f"channels={setup['channels']!r}: only grey → RGB (channels: 3) is supported")
        images = images.repeat(1, 3, 1, 1)
    data = ImageDataset(images.to(dtype), data.labels, data.num_classes, data.name, data.classes, split)
    return _remember(_DATA, key, data)


class _ClassPools:
    """Per-class index pools in a seeded random order, drawn from without replacement (clients are disjoint)."""

    def __init__(self, labels: Tensor, num_classes: int, gen: torch.Generator) -> None:
        pools = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
        self.pools = [p[torch.randperm(len(p), generator=gen)] for p in pools]
        self.used = [0] * num_classes

    def take(self, counts: Tensor, too_few: Callable[[int], str]) -> Tensor:
        """The next ``counts[c]`` indices of every class c, sorted; ``too_few(c)`` is the error when c runs out."""
        idx = []
        for c, pool in enumerate(self.pools):
            k = int(counts[c])
            if self.used[c] + k > len(pool):
                raise ConfigError(too_few(c))
            idx.append(pool[self.used[c]:self.used[c] + k])
            self.used[c] += k
        return torch.sort(torch.cat(idx)).values


def _simplex_partition(labels: Tensor, num_clients: int, sizes: tuple[int, int], num_classes: int,
                       gen: torch.Generator) -> list[Tensor]:
    """Ramakrishna & Dán §6: N_k ~ U[lo, hi], p_k uniform on the simplex (sorted uniform breakpoints),
    counts by largest remainder, samples drawn without replacement (clients disjoint)."""
    from labels.counts import largest_remainder

    draw = _ClassPools(labels, num_classes, gen)
    parts = []
    for _ in range(num_clients):
        n = int(torch.randint(int(sizes[0]), int(sizes[1]) + 1, (1,), generator=gen))
        cuts = torch.sort(torch.rand(num_classes - 1, generator=gen, dtype=torch.float64)).values
        p = torch.diff(torch.cat([torch.zeros(1, dtype=torch.float64), cuts, torch.ones(1, dtype=torch.float64)]))
        parts.append(draw.take(largest_remainder(p, n), lambda c: (
            f"simplex partition: class {c} has too few samples for {num_clients} clients of size {sizes}; lower "
            f"client_size or num_clients")))
    return parts


def _table_partition(labels: Tensor, compositions: list[list[float]], size: int, num_classes: int,
                     gen: torch.Generator) -> list[Tensor]:
    """Decaf: fixed per-client class compositions (fractions or percentages) of ``size`` samples each."""
    from labels.counts import largest_remainder

    draw = _ClassPools(labels, num_classes, gen)
    parts = []
    for row in compositions:
        p = torch.tensor([float(v) for v in row], dtype=torch.float64)
        if p.numel() != num_classes or (p < 0).any() or p.sum() <= 0:
            raise ConfigError(f"compositions rows need {num_classes} non-negative values, got {row}")
        parts.append(draw.take(largest_remainder(p / p.sum(), size), lambda c: (
            f"table partition: class {c} has too few samples ({len(draw.pools[c])}) for the compositions at "
            f"client_size={size}; lower client_size")))
    return parts


def _protocol(setup: dict[str, Any]) -> Protocol:
    fields = {"scheme": "fedavg", **setup["protocol"]}
    if setup["local_steps"] is not None:
        fields["local_steps"] = int(setup["local_steps"])
    protocol = Protocol.from_dict(fields)
    if not protocol.is_update:
        raise ConfigError(f"fedavg-client needs an update scheme; protocol.scheme={protocol.scheme!r}")
    return protocol


def _partition(setup: dict[str, Any], data: Any, protocol: Protocol, gen: torch.Generator) -> list[Tensor]:
    kind, k = setup["partition"], int(setup["num_clients"])
    if kind not in PARTITIONS:
        raise ConfigError(f"partition={kind!r} is not allowed; valid: {list(PARTITIONS)}")
    if kind == "dirichlet":
        from gi.data import dirichlet_partition

        min_size = setup["min_size"]
        if min_size is None:
            min_size = protocol.batch_size * int(protocol.local_steps or 1)
        return dirichlet_partition(data.labels, k, float(setup["alpha"]), gen, min_size=int(min_size),
                                   balance=bool(setup["balance"]))
    if kind == "simplex":
        sizes = setup["client_size"]
        if not isinstance(sizes, list | tuple) or len(sizes) != 2:
            raise ConfigError(f"client_size for the simplex partition is [low, high], got {sizes!r}")
        return _simplex_partition(data.labels, k, (int(sizes[0]), int(sizes[1])), data.num_classes, gen)
    comps = setup["compositions"]
    if not comps or len(comps) != k:
        raise ConfigError(f"partition=table needs `compositions` with one row per client ({k}); got "
                          f"{None if comps is None else len(comps)} rows")
    size = setup["client_size"]
    if not isinstance(size, int):
        raise ConfigError(f"partition=table needs an integer client_size (samples per client), got {size!r}")
    return _table_partition(data.labels, comps, size, data.num_classes, gen)


def _aux(setup: dict[str, Any], dtype: torch.dtype, exclude: Tensor | None) -> Any:
    from gi.data import sample_aux
    from labels.aux import AuxData

    key = json.dumps({k: setup[k] for k in ("dataset", "aux_split", "aux_per_class", "seed", "size", "channels")}
                     | {"dtype": str(dtype), "exclude": None if exclude is None else int(exclude.sum())})
    if key in _AUX:
        return _AUX[key]
    data = _dataset(setup, setup["aux_split"], dtype)
    gen = torch.Generator().manual_seed(int(setup["seed"]) * 7919 + 17)
    images, labels, _ = sample_aux(data, int(setup["aux_per_class"]), gen, exclude=exclude)
    return _remember(_AUX, key, AuxData(images, labels, data.num_classes))


def _federation(setup: dict[str, Any], trial: int) -> tuple[Any, Any, Any]:
    """The (cached) federation of this setup and trial: ``(Federation, dataset, model)``."""
    from gi.fl.victim import run_federation
    from gi.models import build

    rounds = int(setup["federation_rounds"] or setup["round"])
    if int(setup["round"]) > rounds:
        raise ConfigError(f"round={setup['round']} is beyond federation_rounds={rounds}")
    key_setup = {k: v for k, v in setup.items() if k not in ("round", "clients", "group", "aux_per_class")}
    key = json.dumps({"setup": key_setup, "rounds": rounds, "trial": trial}, sort_keys=True, default=str)
    if key in _FEDERATIONS:
        return _FEDERATIONS[key]
    dtype = DTYPES[setup["dtype"]]
    data = _dataset(setup, setup["split"], dtype)
    protocol = _protocol(setup)
    gen = torch.Generator().manual_seed(int(setup["seed"]) * 1_000_003 + trial)
    parts = _partition(setup, data, protocol, gen)
    m = {**MODEL_DEFAULTS, **setup["model"]}
    unknown = sorted(set(m) - set(MODEL_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in setup.model; valid: {sorted(MODEL_DEFAULTS)}")
    model = build(m["name"], data.num_classes, activation=m["activation"], in_shape=tuple(data.image_shape),
                  bias_last=m["bias_last"], init=m["init"], norm=m["norm"],
                  seed=int(setup["seed"]) * 1_000_003 + trial, **m["options"]).to(dtype)
    eval_data = None
    if int(setup["eval_samples"]) > 0:
        test = _dataset(setup, setup["aux_split"], dtype)
        n = min(int(setup["eval_samples"]), len(test.labels))
        eval_data = (test.images[:n], test.labels[:n])
    fed = run_federation(model, data, protocol, len(parts), rounds, None, gen, partition=parts,
                         capture_rounds=range(1, rounds + 1), eval_data=eval_data)
    return _remember(_FEDERATIONS, key, (fed, data, model))


@register_scenario("fedavg-client")
def fedavg_client(setup: dict[str, Any], generator: torch.Generator, trial: int) -> list[Trial]:
    """Every captured client's update at ``round`` of one simulated federation (see the module docstring)."""
    setup = check_keys(setup, DEFAULTS, "setup (fedavg-client)")
    if setup["dtype"] not in DTYPES:
        raise ConfigError(f"dtype={setup['dtype']!r} is not allowed; valid: {sorted(DTYPES)}")
    fed, data, _ = _federation(setup, trial)
    exclude = torch.cat(fed.partition) if setup["aux_split"] == setup["split"] else None
    aux = _aux(setup, DTYPES[setup["dtype"]], exclude)
    t = int(setup["round"])
    wanted = None if setup["clients"] is None else {int(c) for c in setup["clients"]}
    group = setup["group"] or f"round {t}"
    trials = []
    for r, client, capture, truth in fed.captures:
        if r != t or (wanted is not None and client not in wanted):
            continue
        capture = copy.copy(capture)
        capture.meta = {**capture.meta, "trial": trial}
        if t in fed.accuracy:
            capture.meta["global_acc"] = fed.accuracy[t]
        trials.append(Trial(capture=capture, truth=truth, aux=aux, group=group))
    return trials
