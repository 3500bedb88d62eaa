"""FedSGD batch captures for the batch-label benchmarks (posterior paper §4, Tables 2–3, Figures 3–4).

One trial = one client batch of B real images, one FedSGD gradient of the mean loss through the global
model, and the attacker's auxiliary set (``aux.per_class`` labelled samples per class, disjoint from every
victim batch). Setup keys (defaults in :data:`DEFAULTS`):

- ``dataset`` / ``root`` / ``size`` / ``channels``: real data from :func:`gi.data.load`; ``size`` resizes
  (e.g. Fashion-MNIST 28 → 32 for VGG/ResNet), ``channels: 3`` repeats a grey channel into RGB.
- ``victim_split`` / ``aux_split``: victim batches come from the first, the aux set from the second (the
  paper samples aux data from the validation set). With one split for both, victim batches exclude the
  aux indices.
- ``batch_size``, ``replace`` (draw batches with replacement: the only way to make batches larger than a
  20-image foolbox sample pool), ``imbalance`` (fraction of the batch in one random dominant class, the
  rest uniform over the other classes; Fig. 3). Without ``imbalance`` batches are uniform random draws.
- ``model``: ``{name, activation, init, bias_last, norm, options}`` for :func:`gi.models.build`; ``reinit``:
  ``true`` a fresh initialisation per trial (default for untrained models), an integer k: k initialisations
  used in turn (trial mod k; k aux forwards instead of one per trial), ``false`` one model for all trials.
  Trained models (``train.epochs > 0``, whatever ``reinit`` says, so a grid can mix both) are trained
  once per configuration and cached in-process, and on disk under ``$GI_CACHE_DIR`` when it is set.
- ``shared``: ``all`` (the full FedSGD gradient) or ``last`` (only ``fc.weight``/``fc.bias``: identical
  last-layer gradients without the backward pass through the body, ~3× faster on VGG-16; every batch
  label method reads only the last layer). ``last`` refuses DP clipping (the clip norm is global).
- ``train``: ``{epochs, lr, batch_size, momentum, samples}`` for :func:`gi.train.train_model` on the
  ``train_split`` (``samples`` caps the training set; the paper trains one epoch at lr 0.001).
- ``protocol``: :class:`gi.Protocol` fields (loss, focal_alpha/gamma, temperature, label_aug, label_eps,
  model_mode); ``batch_size`` is filled in. Mixup has no fixed label embedding and is refused here.
- ``synthetic_classes``: ``null`` (the dataset's labels) or C >= 2: every image of every split gets a
  random label in [0, C) (a fixed, seeded relabelling per split and ``seed``: each image's label is uniform
  over the C classes, the split balanced, ``randperm(N) mod C``, so ``aux.per_class`` up to N/C is met
  without replacement) and the model has C outputs. For UNTRAINED models only (the network cannot tell
  classes apart, so which image carries which label does not matter; e.g. the posterior paper's 100-class
  CIFAR-100 cells with Fashion-MNIST images); any training (``train.epochs > 0``) is refused.
- ``aux``: ``{per_class}``; ``seed`` fixes models, training, the aux draw and the synthetic labels; the
  trial generator draws the victim batches. ``group`` names the table row (default ``"<model>/<activation>"``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from gi.capture import capture_gradients
from gi.core.errors import ConfigError
from gi.fl.protocol import Protocol
from gi.scenarios import Trial, check_keys, register_scenario

Tensor = torch.Tensor

DEFAULTS: dict[str, Any] = {
    "dataset": "fashion-mnist",
    "root": None,
    "size": None,
    "channels": None,
    "victim_split": "train",
    "aux_split": "test",
    "train_split": "train",
    "batch_size": 32,
    "replace": False,
    "imbalance": None,
    "model": {},
    "reinit": None,
    "shared": "all",
    "train": {},
    "protocol": {},
    "aux": {},
    "seed": 0,
    "group": None,
    "synthetic_classes": None,
}
MODEL_DEFAULTS: dict[str, Any] = {"name": "lenet5", "activation": None, "init": None, "bias_last": True,
                                  "norm": None, "options": {}}
TRAIN_DEFAULTS: dict[str, Any] = {"epochs": 0, "lr": 0.001, "batch_size": 64, "momentum": 0.9, "samples": None}
AUX_DEFAULTS: dict[str, Any] = {"per_class": 100}

_CACHE_SIZE = 4
_DATA: OrderedDict[tuple, Any] = OrderedDict()
_AUX: OrderedDict[str, tuple[Any, Tensor]] = OrderedDict()
_TRAINED: OrderedDict[str, tuple[dict[str, Tensor], dict[str, float]]] = OrderedDict()


def _remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def synthetic_labels(n: int, num_classes: int, seed: int, split: str) -> Tensor:
    """The fixed random relabelling of a split of ``n`` images into ``num_classes`` classes.

    ``randperm(n) mod C`` from a generator seeded by ``seed`` and the split name: each image's label is
    uniform over [0, C), the split is balanced (class sizes differ by at most one), and the same
    ``(seed, split)`` always gives the same labels.
    """
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(split.encode()) + 15485863)
    return torch.randperm(int(n), generator=gen) % int(num_classes)


def _dataset(setup: dict, split: str) -> Any:
    from gi.data import ImageDataset, load

    synthetic = setup.get("synthetic_classes")
    key = (setup["dataset"], split, setup["root"], json.dumps(setup["size"]), synthetic,
           setup["seed"] if synthetic is not None else None)
    if key not in _DATA:
        data = load(setup["dataset"], split=split, root=setup["root"], size=setup["size"])
        if synthetic is not None:
            labels = synthetic_labels(len(data), int(synthetic), int(setup["seed"]), split)
            data = ImageDataset(data.images, labels, int(synthetic), f"{data.name}/synthetic-{synthetic}",
                                [f"synthetic-{c}" for c in range(int(synthetic))], data.split)
        _remember(_DATA, key, data)
    return _DATA[key]


def _images(setup: dict, images: Tensor) -> Tensor:
    """Repeat a grey channel into ``channels`` (a view; batches index it without copying the whole set)."""
    want = setup["channels"]
    if want is None or want == images.shape[1]:
        return images
    if images.shape[1] != 1:
        raise ConfigError(f"setup.channels={want}: only grey (1-channel) datasets can be repeated into channels; "
                          f"{setup['dataset']!r} has {images.shape[1]}")
    return images.expand(-1, int(want), -1, -1)


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def _aux(setup: dict) -> tuple[Any, Tensor]:
    """The attacker's aux set (one object per configuration, so trials share it and its forward)."""
    from gi.data import sample_aux
    from labels.aux import AuxData

    per_class = int(setup["aux"]["per_class"])
    key = _key(setup["dataset"], setup["root"], setup["size"], setup["channels"], setup["aux_split"], per_class,
               setup["seed"], setup["synthetic_classes"])
    if key not in _AUX:
        data = _dataset(setup, setup["aux_split"])
        gen = torch.Generator().manual_seed(int(setup["seed"]) + 7919)
        images, labels, idx = sample_aux(data, per_class, gen)
        _remember(_AUX, key, (AuxData(_images(setup, images).contiguous(), labels, data.num_classes), idx))
    return _AUX[key]


def _build(setup: dict, seed: int) -> torch.nn.Module:
    from gi.models import build

    m = setup["model"]
    data = _dataset(setup, setup["victim_split"])
    shape = (int(setup["channels"] or data.images.shape[1]), *data.images.shape[2:])
    return build(m["name"], data.num_classes, activation=m["activation"], in_shape=shape, bias_last=m["bias_last"],
                 init=m["init"], norm=m["norm"], seed=seed, **(m["options"] or {}))


def _disk_path(key: str) -> Path | None:
    """Where a trained model is kept across processes: ``$GI_CACHE_DIR/trained/<sha1 of its config>``."""
    root = os.environ.get("GI_CACHE_DIR")
    if not root:
        return None
    return Path(root) / "trained" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.safetensors"


def _trained(setup: dict) -> tuple[torch.nn.Module, dict[str, float]]:
    """The model after ``train.epochs`` of centralised training, built once per configuration."""
    from gi.train import train_model

    t = setup["train"]
    key = _key(setup["model"], t, setup["dataset"], setup["size"], setup["channels"], setup["train_split"],
               setup["seed"])
    disk = _disk_path(key)
    if key not in _TRAINED and disk is not None and disk.is_file():
        from safetensors.torch import load_file

        meta_path = disk.with_suffix(".json")
        info = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        _remember(_TRAINED, key, (load_file(str(disk)), info))
    if key not in _TRAINED:
        model = _build(setup, int(setup["seed"]))
        data = _dataset(setup, setup["train_split"])
        gen = torch.Generator().manual_seed(int(setup["seed"]) + 104729)
        images, labels = _images(setup, data.images), data.labels
        if t["samples"] is not None:
            idx = torch.randperm(labels.shape[0], generator=gen)[: int(t["samples"])]
            images, labels = _images(setup, data.images[idx]), labels[idx]
        info = train_model(model, images, labels, epochs=float(t["epochs"]), batch_size=int(t["batch_size"]),
                           lr=float(t["lr"]), momentum=float(t["momentum"]), generator=gen)
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        _remember(_TRAINED, key, (state, info))
        if disk is not None:
            from safetensors.torch import save_file

            disk.parent.mkdir(parents=True, exist_ok=True)
            save_file(state, str(disk))
            disk.with_suffix(".json").write_text(json.dumps(info))
    state, info = _TRAINED[key]
    model = _build(setup, int(setup["seed"]))
    model.load_state_dict(state)
    return model, info


def _victim_pool(setup: dict, aux_idx: Tensor) -> Any:
    data = _dataset(setup, setup["victim_split"])
    if setup["victim_split"] != setup["aux_split"]:
        return data
    key = ("pool", setup["dataset"], setup["victim_split"], setup["root"], json.dumps(setup["size"]),
           setup["synthetic_classes"], setup["seed"], _key(aux_idx.tolist()))
    if key not in _DATA:
        keep = torch.ones(len(data), dtype=torch.bool)
        keep[aux_idx] = False
        _remember(_DATA, key, data.subset(torch.nonzero(keep).flatten()))
    return _DATA[key]


def resolve(setup: dict) -> dict[str, Any]:
    """Validate ``setup`` (unknown keys raise :class:`ConfigError`) and fill in every default."""
    s = check_keys(setup, DEFAULTS, "setup of scenario 'fedsgd-batch'")
    s["model"] = check_keys(s["model"] or {}, MODEL_DEFAULTS, "setup.model")
    s["train"] = check_keys(s["train"] or {}, TRAIN_DEFAULTS, "setup.train")
    s["aux"] = check_keys(s["aux"] or {}, AUX_DEFAULTS, "setup.aux")
    if int(s["batch_size"]) < 1:
        raise ConfigError(f"setup.batch_size must be >= 1, got {s['batch_size']!r}")
    if s["imbalance"] is not None and not 0.0 <= float(s["imbalance"]) <= 1.0:
        raise ConfigError(f"setup.imbalance must be null or a fraction in [0, 1], got {s['imbalance']!r}")
    proto = dict(s["protocol"] or {})
    if "batch_size" in proto or "scheme" in proto:
        raise ConfigError("setup.protocol: batch_size comes from setup.batch_size and the scheme is fedsgd here")
    s["protocol"] = Protocol.from_dict({**proto, "batch_size": int(s["batch_size"])})
    if s["protocol"].label_aug == "mixup":
        raise ConfigError("setup.protocol.label_aug='mixup' is not a batch-count scenario; valid: onehot, "
                          "smoothing, smoothing-alt")
    synthetic = s["synthetic_classes"]
    if synthetic is not None:
        if isinstance(synthetic, bool) or not isinstance(synthetic, int) or synthetic < 2:
            raise ConfigError(f"setup.synthetic_classes must be null or an integer >= 2, got {synthetic!r}")
        if float(s["train"]["epochs"]) > 0:
            raise ConfigError("setup.synthetic_classes relabels images at random and is for untrained models only; "
                              "set train.epochs: 0 or synthetic_classes: null")
    if float(s["train"]["epochs"]) > 0 or s["reinit"] is None:  # a trained model is trained once
        s["reinit"] = float(s["train"]["epochs"]) == 0
    if not isinstance(s["reinit"], bool) and int(s["reinit"]) < 1:
        raise ConfigError(f"setup.reinit must be true, false or a number of models >= 1, got {s['reinit']!r}")
    if s["shared"] not in ("all", "last"):
        raise ConfigError(f"setup.shared={s['shared']!r} is not allowed; valid: ['all', 'last']")
    if s["shared"] == "last" and s["protocol"].dp_clip is not None:
        raise ConfigError("setup.shared='last' cannot be combined with protocol.dp_clip (the clip norm is global)")
    return s


@register_scenario("fedsgd-batch")
def fedsgd_batch(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
    """One FedSGD batch capture with its truth and the shared aux set (posterior paper §4.1–4.4)."""
    from gi.data import class_imbalanced_batch, make_targets, sample_batch

    s = resolve(setup)
    protocol: Protocol = s["protocol"]
    aux, aux_idx = _aux(s)
    pool = _victim_pool(s, aux_idx)
    b = int(s["batch_size"])
    if s["imbalance"] is None:
        images, labels, _ = sample_batch(pool, b, generator, replace=bool(s["replace"]))
    else:
        major = int(torch.randint(pool.num_classes, (1,), generator=generator))
        images, labels, _ = class_imbalanced_batch(pool, b, major, float(s["imbalance"]), generator,
                                                   replace=bool(s["replace"]))
    images = _images(s, images).contiguous()
    if s["reinit"] is False:
        model, train_info = _trained(s)
    else:
        index = int(trial) if s["reinit"] is True else int(trial) % int(s["reinit"])
        model, train_info = _build(s, int(s["seed"]) * 100_003 + index), {}
    if s["shared"] == "last":
        for p in model.body.parameters():
            p.requires_grad_(False)
    targets = make_targets(labels, pool.num_classes, protocol.label_aug, protocol.label_eps)
    capture, truth = capture_gradients(model, images, targets, copy.deepcopy(protocol), generator)
    capture.meta.update(trial=int(trial), dataset=s["dataset"], train=train_info)
    group = s["group"] or f"{s['model']['name']}/{model.spec['activation']}"
    return [Trial(capture=capture, truth=truth, aux=aux, group=group)]
