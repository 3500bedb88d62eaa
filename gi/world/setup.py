"""The victim setup: one typed schema of who is attacked and how (its builders: :mod:`gi.world.build`).

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

The builders (data, models, training, aux sets and their caches) are :mod:`gi.world.build`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from gi.core.config import from_dict, require, set_dotted
from gi.core.devices import torch_device
from gi.core.errors import ConfigError
from gi.core.names import check_name
from gi.world.fl.protocol import Protocol

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
    the victim's split); drawn from the victim's split, it never holds a victim's sample. ``shift`` (null: none)
    names a registered distribution shift of its images (:data:`gi.core.names.AUX_SHIFTS`, built in
    :mod:`gi.world.aux_shift`) of ``shift_strength``: RLU's aux set from a shifted distribution (Chen & Vikalo
    2024, §4.7, Table 5)."""

    per_class: int = 0
    split: str | None = None
    shift: str | None = None
    shift_strength: float = 0.0

    def __post_init__(self) -> None:
        require(self.per_class >= 0, "aux.per_class", self.per_class, ">= 0")
        require(self.shift_strength >= 0 and self.shift_strength != float("inf"), "aux.shift_strength",
                self.shift_strength, "a finite number >= 0")
        if self.shift is None:
            require(self.shift_strength == 0, "aux.shift_strength", self.shift_strength, "0 without aux.shift")
        else:
            check_name("aux shift", self.shift, "aux.shift")

    @property
    def shift_args(self) -> tuple[str | None, float]:
        """``(shift, strength)``: the last two arguments of :func:`gi.world.build.draw_aux`."""
        return self.shift, self.shift_strength


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


def check_seed_reaches(seed: int, pinned: Any, key: str, fixes: str) -> None:
    """Refuse a run's ``seed`` (other than the default 0) that a pinned ``key`` (= ``pinned``) keeps from reaching
    what that key ``fixes``: the run would repeat those random choices while the user believes them redrawn."""
    if pinned is not None and seed not in (0, pinned):
        raise ConfigError(f"seed={seed} would not reach {fixes}: {key}={pinned} fixes them; set {key} (or drop it, "
                          "and seed= sets it)")


MAX_CAPTURES = 1000  # captures of one gi run (data.max_captures raises it), and trials per grid point of gi labels:
# each holds the model's gradient or update and its state (float32: 0.13 MB for the DLG LeNet, 89 MB for a
# ResNet-18), all kept in memory; `data.images: all` on fashion-mnist's train split would be 60 000 of them


def client_size(protocol: Any) -> tuple[int, str]:
    """``(images, key)``: how many images one client of a gi run holds, and the protocol key that says so. FedSGD:
    one batch of ``protocol.batch_size``. An update-sharing scheme with ``protocol.num_samples`` set: a client's
    whole round, its N = ``num_samples`` images trained for ``local_epochs`` epochs of reshuffled mini-batches of
    ``batch_size`` (:func:`gi.world.fl.local.local_schedule`); without it, one batch of ``batch_size`` images."""
    if getattr(protocol, "is_update", False) and protocol.num_samples is not None:
        return int(protocol.num_samples), "protocol.num_samples"
    return int(protocol.batch_size), "protocol.batch_size"


def capture_count(data: Any, trials: int, batch_size: int, dataset_size: int | None = None) -> int | None:
    """The number of captures a gi run asks for: ``trials`` batches, ``data.images`` in chunks of ``batch_size``
    (``all``: of the dataset's ``dataset_size`` images, else its fixed size,
    :data:`gi.core.names.DATASET_SIZES`; None while it is not known, a folder before it is read)."""
    if data.images is None:
        return 1 if data.indices is not None else int(trials)
    dataset_size = _size(data, dataset_size)
    n = dataset_size if data.images == "all" else len(data.images)
    return None if n is None else -(-int(n) // max(int(batch_size), 1))


def _size(data: Any, dataset_size: int | None) -> int | None:
    """``dataset_size``, else the fixed size of ``data``'s dataset and split (None for a folder: counted once read)."""
    from gi.core.names import DATASET_SIZES

    return dataset_size if dataset_size is not None else DATASET_SIZES.get((data.name, data.split))


def check_capture_count(data: Any, trials: int, batch_size: int, dataset_size: int | None = None,
                        key: str = "protocol.batch_size") -> None:
    """Refuse a gi run of more than ``data.max_captures`` captures (gi run's default:
    :data:`MAX_CAPTURES`) in one line, naming the count and what to do (docs/guarantees.md): at config load for
    ``trials``, ``data.images`` lists and ``data.images: all`` of a dataset of fixed size, once a folder is read
    (before any model is built; :func:`gi.world.build.victim_batches`)."""
    dataset_size = _size(data, dataset_size)
    n = capture_count(data, trials, batch_size, dataset_size)
    if n is None or n <= data.max_captures:
        return
    asked = (f"trials={trials}" if data.images is None else
             f"data.images=all ({dataset_size} images of {data.name}/{data.split})" if data.images == "all" else
             f"data.images lists {len(data.images)} images")
    unit = "batches" if key == "protocol.batch_size" else "clients"
    raise ConfigError(f"{asked} asks for {n} captures ({unit} of {key}={batch_size}), more than "
                      f"data.max_captures={data.max_captures}: every capture keeps the model's gradient and state in "
                      "memory for one packed reconstruction; list the images to attack (data.images=[...]), split "
                      "the job (gi sweep over data.images), or raise data.max_captures")


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
