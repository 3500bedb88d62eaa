"""The victim builders: what :mod:`gi.world.setup`'s schema names, made (docs/architecture.md, "Layout").

:func:`load_data`, :func:`build_model`, :func:`train_on`, :func:`trained_model` and :func:`draw_aux` (torch, the
data and the models load on first use), with the in-process caches :data:`DATA`, :data:`AUX` and :data:`TRAINED`
(trained states also on disk under ``$GI_CACHE_DIR`` when a caller asks).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.core.config import to_dict
from gi.core.errors import ConfigError
from gi.world.setup import DataConfig, ModelConfig, TrainConfig

if TYPE_CHECKING:
    import torch


class LRU:
    """An in-process cache of the ``size`` most recently used entries; ``pin`` keeps an entry that cannot be made
    again identically (e.g. a model trained with a trial's generator) for the whole process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.pinned: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], Any], pin: bool = False) -> Any:
        if key in self.pinned:
            return self.pinned[key]
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = make()
        if pin:
            self.pinned[key] = value
            return value
        self.items[key] = value
        while len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


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
        if path is not None and path.is_file():
            from safetensors.torch import load_file

            meta = path.with_suffix(".json")
            return load_file(str(path)), json.loads(meta.read_text()) if meta.is_file() else {}
        model = build()
        info = train(model)
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        if path is not None:
            from safetensors.torch import save_file

            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(state, str(path))
            path.with_suffix(".json").write_text(json.dumps(info, default=str))
        return state, info

    state, info = TRAINED.get(key, make, pin=pin)
    model = build()
    model.load_state_dict(state)
    return model, info


def draw_aux(dataset: Any, per_class: int, generator: torch.Generator, exclude: Any = None) -> tuple[Any, Any]:
    """``(aux set, dataset indices)``: ``per_class`` samples of every class of ``dataset``, none of ``exclude``."""
    from gi.world.data import ImageDataset, sample_aux

    images, labels, idx = sample_aux(dataset, int(per_class), generator, exclude=exclude)
    return ImageDataset(images.contiguous(), labels, dataset.num_classes, name=f"{dataset.name} aux",
                        split=dataset.split), idx
