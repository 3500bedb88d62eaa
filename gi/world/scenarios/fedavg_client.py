"""FedAvg client updates for the update-based label benchmarks (RLU, Ramakrishna & Dán, Decaf).

One trial = one simulated federation (:func:`gi.world.fl.victim.run_federation`): ``num_clients`` clients split a
real dataset, train ``round − 1`` rounds from the initial model, and every client's update of round
``round`` is captured (one :class:`Trial` per client). All randomness of a trial (partition, model
initialisation, batch order, DP noise) comes from ``seed`` and the trial index, so grid points that only
change ``round`` (or the attack) see the *same* federation: it is simulated once up to
``federation_rounds`` and cached in-process. The setup (:class:`FedAvgClientSetup`) is the shared victim setup
(:mod:`gi.world.setup`) with these defaults and fields:

- ``data``: the clients' data, ``gi.world.data.load(data.name, data.split)`` (default Fashion-MNIST ``train``;
  ``data.size``, ``data.channels`` as everywhere); ``aux``: the attacker's aux set (``aux.per_class``, default
  100 per class) from ``aux.split`` (default ``test``; disjoint: a different split, or the same split minus every
  client's samples).
- ``partition``: ``dirichlet`` (RLU App. B.5: per-class Dir(``alpha``), ``min_size`` per client, default
  ``B·local_steps``; ``balance`` the reference code's rule), ``simplex`` (Ramakrishna & Dán §6: client size
  ``N_k ~ U[client_size]``, proportions uniform on the simplex, disjoint draws) or ``table`` (Decaf
  Tables III–VII: fixed ``compositions`` — one list of C proportions or percentages per client — of
  ``client_size`` samples each). ``samples``: Dirichlet-split only a seeded random subset of that many samples
  (smaller clients, cheaper runs; default all).
- ``model`` (default ``cnn``); ``dtype``: ``float32`` or ``float64`` (the model).
- ``protocol``: :class:`gi.Protocol` fields of the clients (``scheme`` defaults to ``fedavg``);
  ``protocol.local_steps`` is RLU's "epochs": that many steps on fresh batches.
- ``train`` (:class:`gi.world.setup.TrainConfig`; default ``epochs: 0``): the initial model's centralised
  pre-training before round 1, as a server that deploys a pre-trained model. One model, initialised with
  ``seed``, is trained once (:func:`gi.world.build.pretrained_model`, the checkpoint the batch scenarios attack
  for the same ``model`` / ``train`` / ``data`` / ``seed``) and every trial's federation starts from it; the
  trials then differ in their partition and batches. It trains on ``train.samples`` of the clients' own split
  unless ``train.dataset`` / ``train.split`` name another. Without it each trial starts from its own
  initialisation.
- ``round`` (captured round, 1 = the initial model, untrained unless ``train`` says otherwise),
  ``federation_rounds`` (how far the cached federation is simulated; default ``round``), ``clients`` (captured
  clients; default all).
- ``average_from``: the multi-round attack (Decaf §IV-B, Fig. 6 d). Each trial also carries the same client's
  captures of rounds ``average_from … round − 1`` (``Trial.history``); ``gi labels`` then runs every method on
  each of those k = round − average_from + 1 rounds and averages the distributions
  (:func:`labels.recover_rounds`). Default null: the single-round attack.
- ``eval_samples``: test images (of ``aux.split``) for the global accuracy stored in
  ``capture.meta['global_acc']`` (0: skip).
- ``group``: row label of the trials (default ``"round <t>"``).

Old spellings (``dataset``, ``split``, ``size``, ``channels``, ``aux_split``, ``aux_per_class``, ``local_steps``)
are read with a deprecation notice (:data:`FedAvgClientSetup.LEGACY`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gi.core.config import require, to_dict
from gi.core.errors import ConfigError
from gi.core.lru import LRU
from gi.world.build import AUX, build_model, draw_aux, key_of, load_data, pretrained_model
from gi.world.fl.protocol import Protocol
from gi.world.scenarios import Trial, register_scenario
from gi.world.setup import SCENARIO_LEGACY, AuxConfig, DataConfig, ModelConfig, VictimSetup, section

if TYPE_CHECKING:
    import torch
    from torch import Tensor


PARTITIONS = ("dirichlet", "simplex", "table")
MODEL_DTYPES = ("float32", "float64")


@dataclass
class FedAvgClientSetup(VictimSetup):
    """The ``fedavg-client`` setup (module docstring)."""

    LEGACY: ClassVar[dict[str, str]] = {**SCENARIO_LEGACY, "split": "data.split", "aux_per_class": "aux.per_class",
                                        "local_steps": "protocol.local_steps"}

    data: DataConfig = section(DataConfig, name="fashion-mnist", split="train")
    model: ModelConfig = section(ModelConfig, name="cnn")
    aux: AuxConfig = section(AuxConfig, per_class=100, split="test")
    protocol: Protocol = section(Protocol, scheme="fedavg")
    num_clients: int = 10
    partition: str = "dirichlet"
    alpha: float = 0.5
    balance: bool = False
    min_size: int | None = None
    samples: int | None = None
    client_size: int | list[int] = field(default_factory=lambda: [100, 1500])
    compositions: list[list[float]] | None = None
    dtype: str = "float32"
    round: int = 1
    federation_rounds: int | None = None
    clients: list[int] | None = None
    average_from: int | None = None
    eval_samples: int = 1000
    seed: int = 0
    group: str | None = None

    def __post_init__(self) -> None:
        require(self.dtype in MODEL_DTYPES, "setup.dtype", self.dtype, f"one of {list(MODEL_DTYPES)}")
        require(self.partition in PARTITIONS, "setup.partition", self.partition, f"one of {list(PARTITIONS)}")
        require(self.num_clients >= 1, "setup.num_clients", self.num_clients, ">= 1")
        require(self.samples is None or (self.samples >= self.num_clients and self.partition == "dirichlet"),
                "setup.samples", self.samples, "null, or >= num_clients with partition=dirichlet")
        if not self.protocol.is_update:
            raise ConfigError(f"fedavg-client needs an update scheme; protocol.scheme={self.protocol.scheme!r}")
        if self.round > self.rounds:
            raise ConfigError(f"round={self.round} is beyond federation_rounds={self.rounds}")
        require(self.average_from is None or 1 <= self.average_from <= self.round, "setup.average_from",
                self.average_from, f"null (single-round attack) or a round in 1..round={self.round}")

    @property
    def rounds(self) -> int:
        """How far the federation is simulated (derived: ``federation_rounds``, default ``round``)."""
        return int(self.federation_rounds or self.round)


class _ClassPools:
    """Per-class index pools in a seeded random order, drawn from without replacement (clients are disjoint)."""

    def __init__(self, labels: Tensor, num_classes: int, gen: torch.Generator) -> None:
        import torch

        pools = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
        self.pools = [p[torch.randperm(len(p), generator=gen)] for p in pools]
        self.used = [0] * num_classes

    def take(self, counts: Tensor, too_few: Callable[[int], str]) -> Tensor:
        """The next ``counts[c]`` indices of every class c, sorted; ``too_few(c)`` is the error when c runs out."""
        import torch

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
    import torch

    from gi.core.counts import largest_remainder

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
    import torch

    from gi.core.counts import largest_remainder

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


def _partition(s: FedAvgClientSetup, data: Any, gen: torch.Generator) -> list[Tensor]:
    import torch

    kind, k, protocol = s.partition, s.num_clients, s.protocol
    if kind == "dirichlet":
        from gi.world.fl.partition import dirichlet_partition

        min_size = s.min_size
        if min_size is None:
            min_size = protocol.batch_size * int(protocol.local_steps or 1)
        if s.samples is None:
            return dirichlet_partition(data.labels, k, float(s.alpha), gen, min_size=int(min_size),
                                       balance=s.balance)
        if s.samples > len(data.labels):
            raise ConfigError(f"setup.samples={s.samples} exceeds the {len(data.labels)} samples of the client data")
        subset = torch.sort(torch.randperm(len(data.labels), generator=gen)[:s.samples]).values
        parts = dirichlet_partition(data.labels[subset], k, float(s.alpha), gen, min_size=int(min_size),
                                    balance=s.balance)
        return [subset[p] for p in parts]
    if kind == "simplex":
        sizes = s.client_size
        if not isinstance(sizes, list) or len(sizes) != 2:
            raise ConfigError(f"client_size for the simplex partition is [low, high], got {sizes!r}")
        return _simplex_partition(data.labels, k, (int(sizes[0]), int(sizes[1])), data.num_classes, gen)
    comps = s.compositions
    if not comps or len(comps) != k:
        raise ConfigError(f"partition=table needs `compositions` with one row per client ({k}); got "
                          f"{None if comps is None else len(comps)} rows")
    size = s.client_size
    if not isinstance(size, int):
        raise ConfigError(f"partition=table needs an integer client_size (samples per client), got {size!r}")
    return _table_partition(data.labels, comps, size, data.num_classes, gen)


def _aux(s: FedAvgClientSetup, exclude: Tensor | None) -> Any:
    import torch

    key = key_of("fedavg-client aux", s.data, s.aux, s.seed, None if exclude is None else int(exclude.sum()))
    return AUX.get(key, lambda: draw_aux(load_data(s.data, s.aux.split), s.aux.per_class,
                                         torch.Generator().manual_seed(int(s.seed) * 7919 + 17), exclude,
                                         *s.aux.shift_args)[0])


_FEDERATIONS = LRU(3)


def _federation(s: FedAvgClientSetup, trial: int) -> tuple[Any, Any, Any]:
    """The (cached) federation of this setup and trial: ``(Federation, dataset, model)``."""
    import torch

    from gi.world.fl.victim import run_federation

    what = to_dict(s)  # what makes the federation: not the round captured, the clients kept, the aux set's size
    for name in ("round", "clients", "group", "average_from"):
        what.pop(name)
    what["aux"].pop("per_class")
    key = key_of("fedavg-client federation", what, s.rounds, trial)

    def make() -> tuple[Any, Any, Any]:
        data = load_data(s.data)
        seed = int(s.seed) * 1_000_003 + trial
        gen = torch.Generator().manual_seed(seed)
        parts = _partition(s, data, gen)
        if s.train.epochs > 0:  # one pre-trained model for every trial (gi.world.build.pretrained_model)
            model = pretrained_model(s.model, s.train, s.data, data, s.seed)[0].to(getattr(torch, s.dtype))
        else:
            model = build_model(s.model, data, seed, dtype=getattr(torch, s.dtype))
        eval_data = None
        if s.eval_samples > 0:
            test = load_data(s.data, s.aux.split)
            n = min(s.eval_samples, len(test.labels))
            eval_data = (test.images[:n], test.labels[:n])
        fed = run_federation(model, data, s.protocol, len(parts), s.rounds, None, gen, partition=parts,
                             capture_rounds=range(1, s.rounds + 1), eval_data=eval_data)
        return fed, data, model

    return _FEDERATIONS.get(key, make)


@register_scenario("fedavg-client", setup=FedAvgClientSetup)
def fedavg_client(s: FedAvgClientSetup, generator: torch.Generator, trial: int) -> list[Trial]:
    """Every captured client's update at ``round`` of one simulated federation (see the module docstring)."""
    import torch

    fed, data, _ = _federation(s, trial)
    exclude = torch.cat(fed.partition) if (s.aux.split or s.data.split) == s.data.split else None
    aux = _aux(s, exclude)
    t = s.round
    wanted = None if s.clients is None else set(s.clients)
    group = s.group or f"round {t}"
    first = t if s.average_from is None else s.average_from
    earlier = {(r, client): capture for r, client, capture, _ in fed.captures if first <= r < t}
    trials = []
    for r, client, capture, truth in fed.captures:
        if r != t or (wanted is not None and client not in wanted):
            continue
        capture = copy.copy(capture)
        capture.meta = {**capture.meta, "trial": trial}
        if t in fed.accuracy:
            capture.meta["global_acc"] = fed.accuracy[t]
        history = [earlier[(e, client)] for e in range(first, t)]
        trials.append(Trial(capture=capture, truth=truth, aux=aux, group=group, history=history))
    return trials
