"""The victim builders: what :mod:`gi.world.setup`'s schema names, made (docs/architecture.md, "Layout").

:func:`load_data`, :func:`build_model`, :func:`train_on`, :func:`trained_model` and :func:`draw_aux` (torch, the
data and the models load on first use), with the in-process caches :data:`DATA`, :data:`AUX` and :data:`TRAINED`
(trained states also on disk under ``$GI_CACHE_DIR`` when a caller asks); and the client of a gi run (its victim
part, shared by gi ablate and the time-to-quality bench): :func:`build_victim` (data and global model),
:func:`victim_batches` and :func:`client_batch` (the batches attacked), :func:`capture_client` and
:func:`capture_all` (what each client shares, with :func:`share_bn_statistics` when the threat model grants it),
:func:`make_aux` (the attacker's aux set, none of the victims' samples).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.core.cache import read_entry, remove_entry, write_entry
from gi.core.config import to_dict
from gi.core.errors import ConfigError
from gi.core.lru import LRU
from gi.world.setup import DataConfig, ModelConfig, TrainConfig, VictimSetup, check_capture_count, client_size

if TYPE_CHECKING:
    import torch

    from gi.capture import Capture, Truth
    from gi.world.fl.protocol import Protocol

log = logging.getLogger("gi.build")


DATA = LRU(4)  # datasets (whole splits, relabelled, channel-expanded) and victim pools


AUX = LRU(4)  # aux sets of a configuration (trials sharing one object are recovered in one batched call)


TRAINED = LRU(4)  # trained model states and their training record


def key_of(*parts: Any) -> str:
    """A cache key of config values (dataclasses included)."""
    return json.dumps(to_dict(list(parts)), sort_keys=True, default=str)


def synthetic_labels(n: int, num_classes: int, seed: int, split: str) -> torch.Tensor:
    """The fixed random relabelling of a split of ``n`` images into ``num_classes`` classes.

    ``randperm(n) mod C`` from a generator seeded by ``seed`` and the split name: each image's label is
    uniform over [0, C), the split is balanced (class sizes differ by at most one), and the same
    ``(seed, split)`` always gives the same labels.
    """
    import torch

    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(split.encode()) + 15485863)
    return torch.randperm(int(n), generator=gen) % int(num_classes)


def load_data(data: DataConfig, split: str | None = None, relabel: tuple[int, int] | None = None) -> Any:
    """The (cached) dataset of ``data`` (``split`` instead of ``data.split`` if given): ``relabel=(C, seed)`` gives
    every image a fixed random label in [0, C) (:func:`synthetic_labels`); ``data.channels`` expands a grey
    channel (a view)."""
    split = data.split if split is None else split
    key = ("data", data.name, split, data.root, json.dumps(data.size), data.channels, relabel)

    def make() -> Any:
        from gi.world.data import ImageDataset, load

        ds = load(data.name, split=split, root=data.root, size=data.size)
        images, labels, name, classes = ds.images, ds.labels, ds.name, ds.classes
        if relabel is not None:
            classes_n, seed = relabel
            labels = synthetic_labels(len(ds), classes_n, seed, split)
            name, classes = f"{ds.name}/synthetic-{classes_n}", [f"synthetic-{c}" for c in range(classes_n)]
        want = data.channels
        if want is not None and want != images.shape[1]:
            if images.shape[1] != 1:
                raise ConfigError(f"data.channels={want}: only grey (1-channel) datasets can be repeated into "
                                  f"channels; {data.name!r} has {images.shape[1]}")
            images = images.expand(-1, int(want), -1, -1)
        if images is ds.images and labels is ds.labels:
            return ds
        return ImageDataset(images, labels, len(classes) if relabel else ds.num_classes, name, classes, ds.split)

    return DATA.get(key, make)


def build_model(model: ModelConfig, dataset: Any, seed: int, dtype: Any = None) -> torch.nn.Module:
    """The global model for ``dataset``'s images and classes; ``model.seed`` (if set) replaces ``seed``. A
    ``model.factory`` model is checked on one of the dataset's images before it is trained or used
    (:func:`gi.world.models.check_forward`: other input channels, a tuple or dict output are a one-line
    :class:`ConfigError`)."""
    import torch

    from gi.world.models import build, check_forward, from_factory

    if model.factory is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(model.seed if model.seed is not None else seed))
            net = from_factory(model.factory, **model.options)
        net = net if dtype is None else net.to(dtype)
        check_forward(net, dataset.images.shape[1:], where=f"model.factory={model.factory!r}: ")
        return net
    net = build(model.name, model.num_classes or dataset.num_classes, activation=model.activation,
                in_shape=tuple(dataset.images.shape[1:]), bias_last=model.bias_last, init=model.init,
                norm=model.norm, seed=int(model.seed if model.seed is not None else seed), **model.options)
    return net if dtype is None else net.to(dtype)


def train_on(model: torch.nn.Module, train: TrainConfig, data: DataConfig, dataset: Any,
             generator: torch.Generator) -> dict[str, Any]:
    """Train ``model`` in place (:func:`gi.world.train.train_model`) on ``train``'s samples (:class:`TrainConfig`;
    ``dataset`` is the victim's whole split); returns ``{"data", "train_samples", "steps", "final_loss",
    "train_acc"}``."""
    import torch

    from gi.world import data as gdata
    from gi.world.train import train_model

    name = data.name if train.dataset == "same" else train.dataset
    if name not in gdata.DATASETS:
        raise ConfigError(f"train.dataset {name!r} is unknown; valid: {sorted(gdata.DATASETS)} or 'same'")
    if train.split not in gdata.DATASETS[name].splits or (name == data.name and train.split == data.split):
        images, labels, source = dataset.images, dataset.labels, f"{data.name}/{data.split} (the attacked samples)"
    else:
        source = f"{name}/{train.split}"
        if name == data.name:
            pool = load_data(data, train.split)
        else:
            pool = load_data(DataConfig(name=name, split=train.split, size=list(dataset.images.shape[-2:]),
                                        channels=data.channels))
        if pool.images.shape[1:] != dataset.images.shape[1:] or pool.num_classes != dataset.num_classes:
            raise ConfigError(f"train.dataset {train.dataset!r} has images {tuple(pool.images.shape[1:])} and "
                              f"{pool.num_classes} classes; the attacked dataset has "
                              f"{tuple(dataset.images.shape[1:])} and {dataset.num_classes}")
        images, labels = pool.images, pool.labels
    if train.samples is not None:
        keep = torch.randperm(labels.shape[0], generator=generator)[: int(train.samples)]
        images, labels = images[keep], labels[keep]
    stats = train_model(model, images, labels, epochs=float(train.epochs), batch_size=int(train.batch_size),
                        lr=float(train.lr), momentum=float(train.momentum), generator=generator)
    return {"data": source, "train_samples": int(labels.shape[0]), **stats}


def _disk_path(key: str) -> Path | None:
    """Where a trained model is kept across processes: ``$GI_CACHE_DIR/trained/<sha1 of its config>``."""
    root = os.environ.get("GI_CACHE_DIR")
    if not root:
        return None
    return Path(root) / "trained" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.safetensors"


def trained_model(key: str, build: Callable[[], torch.nn.Module],
                  train: Callable[[torch.nn.Module], dict[str, Any]], disk: bool = False,
                  pin: bool = False) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A fresh ``build()`` with the state of ``train(build())``, trained once per ``key`` (:data:`TRAINED`; with
    ``disk``, also kept under ``$GI_CACHE_DIR``; ``pin`` when the training cannot be repeated identically)."""
    path = _disk_path(key) if disk else None

    def make() -> tuple[dict[str, Any], dict[str, Any]]:
        if path is not None:
            entry = read_entry(path)  # checked against its digest; a damaged one is rebuilt (gi.core.cache)
            if entry is not None:
                try:
                    build().load_state_dict(entry[0])
                    return entry
                except RuntimeError as exc:  # the file's tensors are not this model's
                    log.warning("cache: %s does not fit the model (%s); rebuilt", path, str(exc).splitlines()[0])
                    remove_entry(path)
        model = build()
        info = train(model)
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        if path is not None:
            write_entry(path, state, info)
        return state, info

    state, info = TRAINED.get(key, make, pin=pin)
    model = build()
    model.load_state_dict(state)
    return model, info


def pretrained_model(model: ModelConfig, train: TrainConfig, data: DataConfig, dataset: Any, seed: int
                     ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``model`` (initialised with ``seed``) after ``train``'s centralised training on ``dataset`` (the ``data``
    split; :func:`train_on`), trained once per configuration and kept under ``$GI_CACHE_DIR``
    (:func:`trained_model`). One home for "the trained model of this setup": the batch scenarios attack it, the
    federations of ``fedavg-client`` start from it, and equal ``model`` / ``train`` / ``data`` / ``seed`` give them
    the same checkpoint. Returns the model and :func:`train_on`'s record."""
    import torch

    key = key_of("trained", model, train, data, seed)
    return trained_model(key, lambda: build_model(model, dataset, seed),
                         lambda net: train_on(net, train, data, dataset,
                                              torch.Generator().manual_seed(int(seed) + 104729)),
                         disk=True)


def draw_aux(dataset: Any, per_class: int, generator: torch.Generator, exclude: Any = None,
             shift: str | None = None, strength: float = 0.0) -> tuple[Any, Any]:
    """``(aux set, dataset indices)``: ``per_class`` samples of every class of ``dataset``, none of ``exclude``;
    with ``shift`` (``aux.shift``), their images under that registered shift of ``strength``
    (:func:`gi.world.aux_shift.shift_images`, drawn with ``generator`` after the samples)."""
    from gi.world.data import ImageDataset, sample_aux

    images, labels, idx = sample_aux(dataset, int(per_class), generator, exclude=exclude)
    if shift is not None:
        from gi.world.aux_shift import shift_images

        images = shift_images(images, shift, strength, generator)
    return ImageDataset(images.contiguous(), labels, dataset.num_classes, name=f"{dataset.name} aux",
                        split=dataset.split), idx


# ----------------------------------------------------------------------------- the client of a gi run
# ``cfg`` below is a victim setup with gi run's client fields: ``seed``, ``trials`` and a data section with
# ``indices``, ``images``, ``eps``, ``eps_max``, ``mixup_lam`` and ``max_captures`` (gi run's RunConfig, gi ablate's
# AblateConfig; the world wing does not import the commands' schemas, so it is typed ``Any``).
def client_batch(cfg: Any, dataset: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The client's images, soft targets (per ``protocol.label_aug``: one-hot, smoothing, mixup) and the dataset
    indices of every sample they are made of (both images of a mixup pair): one batch, or a FedAvg client's N
    images (:func:`gi.world.setup.client_size`)."""
    import torch

    from gi.world import data as gdata

    (b, key), c = client_size(cfg.protocol), dataset.num_classes
    kind = cfg.protocol.label_aug
    if kind == "mixup":
        i1, i2 = gdata.sample_mixup_pairs(dataset, b, gen)
        lam = torch.rand(b, generator=gen) if cfg.data.mixup_lam is None else cfg.data.mixup_lam
        images, targets = gdata.mixup(dataset.images[i1], dataset.labels[i1], dataset.images[i2],
                                      dataset.labels[i2], lam, c)
        return images, targets, torch.cat([i1, i2])
    if cfg.data.indices is not None:
        if len(cfg.data.indices) != b:
            raise ConfigError(f"data.indices has {len(cfg.data.indices)} entries but {key}={b}")
        idx = torch.as_tensor(cfg.data.indices)
        images, labels = gdata.to_batch(dataset, idx)
    else:
        images, labels, idx = gdata.sample_batch(dataset, b, gen)
    eps = cfg.data.eps
    if kind != "onehot" and eps is None:
        eps = torch.rand(b, generator=gen, dtype=torch.float64) * cfg.data.eps_max
    return images, gdata.make_targets(labels, c, kind, eps), idx


def build_victim(cfg: Any) -> tuple[Any, torch.nn.Module]:
    """The client's dataset and the global model (trained briefly when ``train.epochs`` > 0).

    ``cfg`` is a victim setup with a ``seed`` (a RunConfig or an AblateConfig): the model is initialised with
    ``seed`` (or ``model.seed``) and trained with a generator seeded ``seed + 1``.
    """
    import torch

    dataset = load_data(cfg.data)
    if getattr(cfg.data, "images", None) is not None:
        victim_batches(cfg, dataset)  # data.images checked against the dataset (size, indices) before any model
    model = build_model(cfg.model, dataset, cfg.seed)
    if cfg.train.epochs > 0:
        stats = train_on(model, cfg.train, cfg.data, dataset, torch.Generator().manual_seed(cfg.seed + 1))
        log.info("trained model: %s", stats)
    return dataset, model


def share_bn_statistics(model: torch.nn.Module, images: torch.Tensor, capture: Capture) -> None:
    """Victim side, when the threat model grants it (``protocol.share_bn_stats``): put the client's
    per-channel batch mean and biased variance at every BatchNorm input into ``capture.bn_stats`` (what FedAvg's
    shared running buffers reveal), for the ``bn`` regulariser."""
    import torch

    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, i[0].detach()))
             for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    for name, a in seen.items():
        dims = (0,) + tuple(range(2, a.ndim))
        capture.bn_stats[name] = (a.mean(dims), a.var(dims, unbiased=False))


def capture_client(cfg: Any, dataset: Any, model: torch.nn.Module, gen: torch.Generator) -> tuple[Capture, Truth]:
    """Victim side: the client's batch (per ``protocol.label_aug``) and what it shares: a FedSGD gradient, or a
    FedAvg-style update of local training on that batch (``gi.world.fl.victim.simulate_client``).
    ``truth.meta["indices"]``
    lists the dataset indices the batch is made of (kept out of the attacker's aux set by :func:`make_aux`)."""
    images, targets, indices = client_batch(cfg, dataset, gen)
    if cfg.protocol.is_update:
        from gi.world.fl.victim import simulate_client

        capture, truth = simulate_client(model, (images, targets.argmax(1)), cfg.protocol, rng=gen,
                                         device=cfg.torch_device)
    else:
        from gi.world.fl.victim import capture_gradients

        capture, truth = capture_gradients(model, images, targets, cfg.protocol, generator=gen,
                                           device=cfg.torch_device)
    if cfg.protocol.share_bn_stats:
        share_bn_statistics(model, images, capture)
    truth.meta = {**truth.meta, "indices": [int(i) for i in indices]}
    return capture, truth


def make_aux(cfg: VictimSetup, dataset: Any, gen: torch.Generator, truths: list[Truth]) -> Any:
    """The attacker's aux set (``aux.per_class`` per class of ``aux.split``), drawn with ``gen``; from the victim's
    ``dataset`` it holds no sample of the victims' batches (``truth.meta["indices"]`` of every truth in ``truths``)."""
    if cfg.aux.per_class <= 0:
        return None
    if cfg.aux.split not in (None, cfg.data.split):
        return draw_aux(load_data(cfg.data, cfg.aux.split), cfg.aux.per_class, gen, None, *cfg.aux.shift_args)[0]
    victims = [i for t in truths for i in t.meta["indices"]]
    return draw_aux(dataset, cfg.aux.per_class, gen, victims, *cfg.aux.shift_args)[0]


def victim_batches(cfg: Any, dataset: Any) -> list[list[int] | None]:
    """The dataset indices of every capture's client: ``data.images`` in chunks of its size (``protocol.batch_size``,
    or a FedAvg client's ``protocol.num_samples``, :func:`gi.world.setup.client_size`), else
    ``data.indices`` (one batch), else ``trials`` batches drawn with the run seed (None each)."""
    b, key = client_size(cfg.protocol)
    if cfg.data.images is None:
        return [cfg.data.indices] if cfg.data.indices is not None else [None] * cfg.trials
    check_capture_count(cfg.data, cfg.trials, b, len(dataset), key)
    images = list(range(len(dataset))) if cfg.data.images == "all" else list(cfg.data.images)
    if max(images) >= len(dataset):
        raise ConfigError(f"data.images has index {max(images)} but {cfg.data.name} holds {len(dataset)} images")
    if len(images) % b:
        raise ConfigError(f"data.images holds {len(images)} images, not a multiple of {key}={b}: "
                          "every capture is a batch of consecutive entries")
    if cfg.protocol.label_aug == "mixup":
        raise ConfigError("data.images with protocol.label_aug=mixup: mixup draws its pairs; use trials")
    return [images[i:i + b] for i in range(0, len(images), b)]


def capture_all(cfg: Any, dataset: Any, model: torch.nn.Module, gen: torch.Generator
                ) -> tuple[list[Capture], list[Truth]]:
    """Victim side: one (capture, truth) per batch of :func:`victim_batches`."""
    captures, truths = [], []
    for indices in victim_batches(cfg, dataset):
        one = cfg if indices is None else dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, images=None, indices=indices))
        capture, truth = capture_client(one, dataset, model, gen)
        captures.append(capture)
        truths.append(truth)
    return captures, truths


# ----------------------------------------------------------------------------- the clients of gi bench
def consecutive_captures(model: torch.nn.Module, dataset: Any, count: int, batch: int
                         ) -> tuple[list[Capture], list[Truth]]:
    """``count`` FedSGD captures of ``batch`` consecutive images each of ``dataset`` (images 0, 1, … in order)
    through ``model``, and their truths: the throughput bench's clients. More images than ``dataset`` holds is a
    ConfigError."""
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients

    if count * batch > len(dataset):
        raise ConfigError(f"{count} captures of {batch} images need {count * batch} images; {dataset.name} has "
                          f"{len(dataset)}")
    captures, truths = [], []
    for i in range(count):
        sl = slice(i * batch, (i + 1) * batch)
        capture, truth = capture_gradients(model, dataset.images[sl], dataset.labels[sl], Protocol(batch_size=batch))
        captures.append(capture)
        truths.append(truth)
    return captures, truths


# ----------------------------------------------------------------------------- the federation of gi defend
@dataclass
class FederationSetup:
    """What every cell of ``gi defend`` shares: the clients' pool, their partition, the initial model, the test and
    aux sets."""

    pool: Any
    partition: list[Any]
    model: Any
    eval_data: tuple[Any, Any]
    aux: Any


def build_federation_setup(cfg: Any) -> FederationSetup:
    """The federation of a ``gi defend`` config (``seed``, ``data``, ``model``, ``protocol``, ``aux`` and its
    ``federation`` section: typed ``Any``, the world wing does not import the commands' schemas): ``federation.samples``
    of the data (a seeded draw), split by a Dirichlet(``alpha``) partition over ``num_clients`` clients, the initial
    model, ``eval_samples`` test images for the utility and the attacker's aux set (none of those test images)."""
    import torch

    from gi.world.data import ImageDataset
    from gi.world.fl.partition import dirichlet_partition

    fed = cfg.federation
    data = load_data(cfg.data)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    if fed.samples is not None and fed.samples < len(data.labels):
        keep = torch.randperm(len(data.labels), generator=gen)[: fed.samples]
        data = ImageDataset(data.images[keep], data.labels[keep], data.num_classes, data.name, data.classes,
                            data.split)
    min_size = fed.min_size if fed.min_size is not None else cfg.protocol.batch_size
    parts = dirichlet_partition(data.labels, fed.num_clients, fed.alpha, gen, min_size=int(min_size))
    model = build_model(cfg.model, data, int(cfg.seed))
    test = load_data(cfg.data, cfg.aux.split)
    n = min(fed.eval_samples, len(test.labels))
    order = torch.randperm(len(test.labels), generator=gen)
    eval_data = (test.images[order[:n]], test.labels[order[:n]])
    aux = None
    if cfg.aux.per_class > 0:  # never one of the test images the utility is measured on
        aux = draw_aux(test, cfg.aux.per_class, gen, order[:n], *cfg.aux.shift_args)[0]
    return FederationSetup(data, parts, model, eval_data, aux)


def group_capture(seed: int, setup: FederationSetup, protocol: Protocol, model: Any, first: int, group: int,
                  batch: int, index: int) -> tuple[Any, Any]:
    """The defended FedSGD capture of the ``index``-th batch of ``batch`` samples of client ``first``, merged with
    those of the rest of its secure-aggregation group of ``group`` clients (who each add a batch of theirs); each
    client's batch drawn with a generator of ``seed``, the batch ``index`` and the client."""
    import torch

    from gi.world.fl.defences.secagg import pool_group
    from gi.world.fl.victim import capture_gradients

    pairs = []
    for client in range(first, min(first + group, len(setup.partition))):
        idx = setup.partition[client]
        pick = idx[torch.arange(index * batch, (index + 1) * batch) % len(idx)]
        proto = dataclasses.replace(protocol, scheme="fedsgd", batch_size=batch, num_samples=len(idx))
        gen = torch.Generator().manual_seed(int(seed) * 7919 + 31 * index + client)
        cap, truth = capture_gradients(model, setup.pool.images[pick], setup.pool.labels[pick], proto, generator=gen)
        pairs.append((dataclasses.replace(cap, meta={**cap.meta, "client": client}), truth))
    return pool_group(pairs)
