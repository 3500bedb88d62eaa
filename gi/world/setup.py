"""The victim setup: one typed schema of who is attacked and how, and the one place that builds it.

Schema (dataclasses loaded through :func:`gi.core.config.from_dict`: every value type-checked, unknown keys
refused):

* :class:`DataConfig`: the real data the victim holds (``name``, ``split``, ``root``, ``size``, ``channels``);
* :class:`ModelConfig`: the global model (:func:`gi.world.models.build` arguments, ``seed``);
* :class:`TrainConfig`: brief centralised training of that model before the attack (``epochs: 0``: untrained);
* :class:`AuxConfig`: the attacker's auxiliary labelled samples (``per_class``, ``split``);
* :class:`gi.world.fl.protocol.Protocol`: what the client does with its data;
* :class:`VictimSetup`: those five sections. ``gi run``'s RunConfig extends it (and ``gi ablate``'s AblateConfig
  extends RunConfig, so ``gi sweep`` runs both on it); every ``gi labels`` scenario's ``setup`` is a subclass with
  the scenario's own fields (:mod:`gi.world.scenarios`).

A command whose defaults differ (the ``fedsgd-batch`` model is ``lenet5``) declares the section with
:func:`section`: its defaults make the section when it is not given and fill the keys a given one leaves out.

Settings that follow from others are derived, never stored over a user's value (e.g. ``attack.labels`` from
``labels.mode``, fedsgd-batch's model re-initialisation from ``reinit`` and ``train.epochs``).

Old spellings are accepted with a deprecation notice (each class's ``LEGACY``: old dotted key → new dotted key,
e.g. ``model.train_epochs`` → ``train.epochs``, ``aux_per_class`` → ``aux.per_class``); a value given in both
spellings is an error, and an error about a value given in the old spelling names it.

Building (torch, the data and the models load on first use): :func:`load_data`, :func:`build_model`,
:func:`train_on`, :func:`trained_model` and :func:`draw_aux`, with the in-process caches :data:`DATA`,
:data:`AUX` and :data:`TRAINED` (trained states also on disk under ``$GI_CACHE_DIR`` when a caller asks).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import typing
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from gi.core.config import from_dict, require, set_dotted, to_dict
from gi.core.devices import torch_device
from gi.core.errors import ConfigError
from gi.core.names import check_name
from gi.world.fl.protocol import Protocol

if TYPE_CHECKING:
    import torch

log = logging.getLogger("gi.setup")
T = TypeVar("T")
SECTION = "gi.section_defaults"  # field metadata: this command's defaults of a section (see section())


# ----------------------------------------------------------------------------- schema
@dataclass
class DataConfig:
    """The real data the victim holds: ``gi.world.data.load(name, split, root, size)``. ``size`` resizes (an int or
    ``[H, W]``; null keeps the dataset's); ``channels`` repeats a grey channel into that many (e.g. 3 for RGB
    models on Fashion-MNIST; a view, not a copy)."""

    name: str = "cifar10-samples"
    split: str = "test"
    root: str | None = None
    size: int | list[int] | None = None
    channels: int | None = None

    def __post_init__(self) -> None:
        sizes = [self.size] if isinstance(self.size, int) else self.size
        require(sizes is None or (len(sizes) == (1 if isinstance(self.size, int) else 2) and min(sizes) >= 1),
                "data.size", self.size, ">= 1, [H, W] or null")
        require(self.channels is None or self.channels >= 1, "data.channels", self.channels, ">= 1 or null")


@dataclass
class ModelConfig:
    """:func:`gi.world.models.build` arguments; ``num_classes`` null takes the dataset's. ``seed``: the initialisation
    seed; null lets the command derive it (``gi run``: ``seed``; ``fedsgd-batch`` / ``fedavg-client``: from
    ``seed`` and the trial; ``single-sample``: drawn per model). ``factory``: your own model instead of the zoo's,
    an import string ``"package.module:callable"`` called with ``options`` as keyword arguments (JSON) under the
    seeded RNG (:func:`gi.world.models.from_factory`; ``name``, ``activation``, ``init``, ``norm``, ``bias_last`` and
    ``num_classes`` are then the factory's business)."""

    name: str = "lenet"
    num_classes: int | None = None
    activation: str | None = None
    init: str | None = None
    bias_last: bool = True
    norm: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    factory: str | None = None

    def __post_init__(self) -> None:
        require(self.num_classes is None or self.num_classes >= 1, "model.num_classes", self.num_classes,
                ">= 1 or null")
        require(self.factory is None or (":" in self.factory and not self.factory.startswith(":")),
                "model.factory", self.factory, "an import string 'package.module:callable' or null")
        if self.factory is None:
            check_name("model", self.name, "model.name")

    @property
    def label(self) -> str:
        """What the model is, for logs and tables: the factory's import string, else the zoo name."""
        return self.factory or self.name


@dataclass
class TrainConfig:
    """Brief centralised SGD training of the model before the attack (:func:`gi.world.train.train_model`; ``epochs: 0``
    leaves it untrained). The samples: ``dataset``'s ``split`` (``same``: the victim's dataset), the victim's own
    samples when that is the victim's split or the split does not exist; ``samples`` caps them (a seeded draw)."""

    epochs: float = 0.0
    lr: float = 0.01
    momentum: float = 0.9
    batch_size: int = 64
    samples: int | None = None
    dataset: str = "same"
    split: str = "train"

    def __post_init__(self) -> None:
        require(self.epochs >= 0, "train.epochs", self.epochs, ">= 0")
        require(self.lr > 0, "train.lr", self.lr, "> 0")
        require(self.momentum >= 0, "train.momentum", self.momentum, ">= 0")
        require(self.batch_size >= 1, "train.batch_size", self.batch_size, ">= 1")
        require(self.samples is None or self.samples >= 1, "train.samples", self.samples, ">= 1 or null")


@dataclass
class AuxConfig:
    """The attacker's auxiliary set: ``per_class`` labelled samples of every class (0: none) from ``split`` (null:
    the victim's split); drawn from the victim's split, it never holds a victim's sample."""

    per_class: int = 0
    split: str | None = None

    def __post_init__(self) -> None:
        require(self.per_class >= 0, "aux.per_class", self.per_class, ">= 0")


# old flat spellings of the shared sections in the ``gi labels`` scenarios' setups (each adds its own)
SCENARIO_LEGACY: dict[str, str] = {"dataset": "data.name", "size": "data.size", "channels": "data.channels",
                                   "aux_split": "aux.split"}


def section(cls: type[T], **defaults: Any) -> Any:
    """A dataclass field of section type ``cls`` with this command's ``defaults``: they make the section when it
    is not given (or null) and fill the keys a given section leaves out."""
    return field(default_factory=lambda: cls(**copy.deepcopy(defaults)), metadata={SECTION: defaults})


@dataclass
class VictimSetup:
    """The victim: its data, the global model, how that model was trained, the attacker's aux data, the protocol.

    ``device`` (``cpu``, ``auto``, ``gpu``/``cuda``, ``cuda:N``, ``mps``) is where the victim side runs (client
    simulation, label recovery); it is checked when the config loads (:meth:`from_mapping`), so a GPU asked for
    on a machine without one is a one-line :class:`ConfigError` before any data or model work.

    Subclasses add their own fields and may declare ``LEGACY`` (old dotted key → new dotted key)."""

    LEGACY: ClassVar[dict[str, str]] = {}

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    aux: AuxConfig = field(default_factory=AuxConfig)
    protocol: Protocol = field(default_factory=Protocol)
    device: str = "cpu"

    @property
    def torch_device(self) -> str:
        """``device`` as a torch device string (``cpu``, ``cuda``, ``cuda:N``, ``mps``), checked."""
        return torch_device(self.device, "device")

    @classmethod
    def from_mapping(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
        """Build from a mapping: old spellings moved (:func:`upgrade`), section defaults filled, typed checks."""
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"{where or cls.__name__}={data!r}: expected a mapping of {cls.__name__} keys")
        data = copy.deepcopy(data or {})
        moved = upgrade(data, cls.LEGACY, where)  # type: ignore[attr-defined]
        if isinstance(data.get("device"), str):  # a missing GPU fails first, before the sections load torch
            torch_device(data["device"], f"{where}.device" if where else "device")
        try:
            setup = from_dict(cls, with_defaults(cls, data), where)
        except ConfigError as exc:
            raise ConfigError(_old_names(str(exc), moved)) from None
        torch_device(setup.device, f"{where}.device" if where else "device")  # a missing GPU fails here, at once
        return setup


def with_defaults(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every :func:`section` field's defaults under the keys it leaves out (a null section is an
    absent one)."""
    for f in dataclasses.fields(cls):
        defaults = f.metadata.get(SECTION)
        if f.name in data and data[f.name] is None and dataclasses.is_dataclass(_section_type(cls, f.name)):
            del data[f.name]
        if defaults is not None and isinstance(data.get(f.name), dict):
            data[f.name] = {**copy.deepcopy(defaults), **data[f.name]}
    return data


def _section_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _get(data: dict[str, Any], keys: list[str]) -> tuple[bool, Any]:
    node: Any = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


_WARNED: set[tuple[str, str]] = set()


def upgrade(data: dict[str, Any], legacy: dict[str, str], where: str = "") -> dict[str, str]:
    """Move every old-spelled key of ``data`` (``legacy``: old dotted key → new dotted key) to its new place, with a
    deprecation notice (once per process); returns {new: old} of the keys moved. Both spellings given with
    different values is a ConfigError."""
    prefix = f"{where}." if where else ""
    moved: dict[str, str] = {}
    for old, new in legacy.items():
        keys = old.split(".")
        found, value = _get(data, keys)
        if not found:
            continue
        parent = _get(data, keys[:-1])[1] if len(keys) > 1 else data
        del parent[keys[-1]]
        present, current = _get(data, new.split("."))
        if present and current != value:
            raise ConfigError(f"{prefix}{old}={value!r} and {prefix}{new}={current!r} are both given; {old} is the "
                              f"old spelling of {new}: keep {new} only")
        set_dotted(data, new.split("."), value)
        moved[new] = old
        deprecated(where, old, new)
    return moved


def deprecated(where: str, old: str, new: str) -> None:
    """The deprecation notice of old spelling ``old`` (once per process and place)."""
    if (where, old) not in _WARNED:
        _WARNED.add((where, old))
        prefix = f"{where}." if where else ""
        log.warning("%s%s is deprecated: write %s%s (same meaning)", prefix, old, prefix, new)


def upgrade_key(key: str, legacy: dict[str, str]) -> str:
    """The new spelling of dotted key ``key`` (a grid or settings key) under ``legacy``."""
    for old, new in legacy.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return key


def _old_names(message: str, moved: dict[str, str]) -> str:
    for new, old in moved.items():
        if new in message:
            return message.replace(new, f"{old} (now {new})", 1)
    return message


# ----------------------------------------------------------------------------- caches
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


# ----------------------------------------------------------------------------- building
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
