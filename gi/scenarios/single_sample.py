"""Single-sample FedSGD captures with augmented labels (soft-label paper, Wang, Liang & He 2024, §4.1, §5.2).

One scenario call builds one model (a fresh initialisation every ``model.reseed_every`` trials, or one
model throughout when ``model.seed`` fixes it), optionally trains it briefly (once per model), and
captures ``samples`` one-image gradients:

- ``label_aug: smoothing`` (or ``smoothing-alt``): a random image, ε ~ U(``eps``) per sample;
- ``label_aug: mixup``: two images of different classes, x = (1−λ)x₁ + λx₂ with λ ~ U(``mix``);
- ``label_aug: onehot``: a random image with its one-hot label.

``noise`` adds Gaussian or Laplace noise of the given variance to every last-layer gradient (§5.2).
``shared: last`` shares only the last layer (the label methods need nothing else; the body is frozen
so the capture is fast); ``all`` shares every gradient (what ``fcn_analytic`` and reconstruction need).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from gi.capture import capture_gradients
from gi.core.errors import ConfigError
from gi.fl.protocol import LABEL_AUGS, Protocol
from gi.models import LAST_BIAS, LAST_WEIGHT, build
from gi.scenarios import Trial, check_keys, register_scenario

Tensor = torch.Tensor

DEFAULTS: dict[str, Any] = {
    "dataset": "cifar10-samples",  # gi.data.load name
    "split": "test",
    "size": None,  # resize the images (int or [H, W]); None keeps the dataset's size
    "model": {},  # see MODEL_DEFAULTS
    "label_aug": "smoothing",  # onehot | smoothing | smoothing-alt | mixup
    "eps": [0.0, 0.5],  # smoothing ε ~ U(eps[0], eps[1]) per sample
    "mix": [0.0, 1.0],  # mixup λ ~ U(mix[0], mix[1]) per sample
    "samples": 20,  # captures per trial (one model per trial)
    "loss": "ce",
    "temperature": 1.0,
    "train": None,  # None (untrained) or a mapping, see TRAIN_DEFAULTS
    "noise": None,  # None or a mapping, see NOISE_DEFAULTS
    "shared": "all",  # all | last
}
MODEL_DEFAULTS: dict[str, Any] = {"name": "lenet", "activation": None, "init": None, "bias_last": False,
                                  "norm": None, "seed": None, "reseed_every": 1, "options": {}}
TRAIN_DEFAULTS: dict[str, Any] = {"dataset": "same", "split": "train", "epochs": 1.0, "lr": 0.01, "momentum": 0.9,
                                  "batch_size": 64, "max_samples": None}
NOISE_DEFAULTS: dict[str, Any] = {"kind": "gaussian", "variance": 0.0}
SHARED = ("all", "last")


def _noise_gaussian(shape: torch.Size, variance: float, generator: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=generator) * math.sqrt(variance)


def _noise_laplace(shape: torch.Size, variance: float, generator: torch.Generator) -> Tensor:
    # Laplace(0, b) has variance 2b²; inverse CDF of a uniform draw in (−½, ½)
    b = math.sqrt(variance / 2)
    u = torch.rand(shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12) - 0.5
    return (-b * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


NOISES = {"gaussian": _noise_gaussian, "laplace": _noise_laplace}
_TRAINED: dict[str, tuple[dict[str, Tensor], dict[str, Any]]] = {}  # trained states of models shared by several trials
_SEEDS: dict[tuple[str, int], int] = {}  # (setup, trial // reseed_every) → model seed


def _uniform(bounds: Any, n: int, generator: torch.Generator, what: str) -> Tensor:
    lo, hi = (float(b) for b in bounds)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ConfigError(f"single-sample {what} must be [low, high] within [0, 1], got {bounds!r}")
    return lo + (hi - lo) * torch.rand(n, generator=generator)


def _make_samples(ds: Any, setup: dict[str, Any], generator: torch.Generator) -> tuple[Tensor, Tensor, dict]:
    """Images (n, C, H, W) in [0, 1], soft targets (n, C) and their draw parameters, all vectorised."""
    from gi import data

    n, c, aug = int(setup["samples"]), ds.num_classes, setup["label_aug"]
    if aug == "mixup":
        i1, i2 = data.sample_mixup_pairs(ds, n, generator)
        lam = _uniform(setup["mix"], n, generator, "mix")
        x, y = data.mixup(ds.images[i1], ds.labels[i1], ds.images[i2], ds.labels[i2], lam, c)
        return x.clamp(0, 1), y, {"indices": torch.stack([i1, i2], 1).tolist(), "mix_lambda": lam.tolist()}
    idx = torch.randint(len(ds), (n,), generator=generator)
    if aug == "onehot":
        return ds.images[idx], data.onehot(ds.labels[idx], c), {"indices": idx.tolist()}
    eps = _uniform(setup["eps"], n, generator, "eps")
    y = data.smooth_labels(ds.labels[idx], c, eps, convention=aug)
    return ds.images[idx], y, {"indices": idx.tolist(), "eps": eps.tolist()}


def _train(model: torch.nn.Module, ds: Any, attack_name: str, attack_split: str, cfg: dict[str, Any],
           generator: torch.Generator) -> dict[str, Any]:
    """Brief SGD training (gi.train.train_model) on ``cfg['dataset']`` / ``cfg['split']``; ``same`` is the
    attacked dataset's ``split`` (the attacked samples themselves when that split does not exist)."""
    from gi import data
    from gi.train import train_model

    name = attack_name if cfg["dataset"] == "same" else cfg["dataset"]
    if name not in data.DATASETS:
        raise ConfigError(f"train.dataset {name!r} is unknown; valid: {sorted(data.DATASETS)} or 'same'")
    if cfg["split"] not in data.DATASETS[name].splits or (name == attack_name and cfg["split"] == attack_split):
        images, labels, source = ds.images, ds.labels, f"{attack_name}/{attack_split} (the attacked samples)"
    else:
        source = f"{name}/{cfg['split']}"
        train_ds = data.load(name, split=cfg["split"], size=tuple(ds.images.shape[-2:]))
        if train_ds.images.shape[1:] != ds.images.shape[1:] or train_ds.num_classes != ds.num_classes:
            raise ConfigError(f"train.dataset {cfg['dataset']!r} has images {tuple(train_ds.images.shape[1:])} and "
                              f"{train_ds.num_classes} classes; the attacked dataset has "
                              f"{tuple(ds.images.shape[1:])} and {ds.num_classes}")
        images, labels = train_ds.images, train_ds.labels
    if cfg["max_samples"]:
        keep = torch.randperm(labels.shape[0], generator=generator)[: int(cfg["max_samples"])]
        images, labels = images[keep], labels[keep]
    stats = train_model(model, images, labels, epochs=float(cfg["epochs"]), batch_size=int(cfg["batch_size"]),
                        lr=float(cfg["lr"]), momentum=float(cfg["momentum"]), generator=generator)
    return {**{k: cfg[k] for k in ("epochs", "lr", "momentum", "batch_size", "max_samples")}, "data": source,
            "train_samples": int(labels.shape[0]), **stats}


@register_scenario("single-sample")
def single_sample(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
    """One model, ``samples`` single-image FedSGD captures with smoothing / mixup / one-hot labels."""
    from gi import data

    setup = check_keys(setup, DEFAULTS, "single-sample setup")
    mcfg = check_keys(setup["model"] or {}, MODEL_DEFAULTS, "single-sample setup.model")
    tcfg = None if setup["train"] is None else check_keys(setup["train"], TRAIN_DEFAULTS, "single-sample setup.train")
    ncfg = None if setup["noise"] is None else check_keys(setup["noise"], NOISE_DEFAULTS, "single-sample setup.noise")
    if setup["label_aug"] not in LABEL_AUGS:
        raise ConfigError(f"single-sample label_aug={setup['label_aug']!r}; valid: {list(LABEL_AUGS)}")
    if setup["shared"] not in SHARED:
        raise ConfigError(f"single-sample shared={setup['shared']!r}; valid: {list(SHARED)}")
    if ncfg is not None and (ncfg["kind"] not in NOISES or float(ncfg["variance"]) < 0):
        raise ConfigError(f"single-sample noise needs kind in {sorted(NOISES)} and variance >= 0, got {ncfg}")
    if int(setup["samples"]) < 1:
        raise ConfigError(f"single-sample samples must be >= 1, got {setup['samples']}")

    size = setup["size"]
    ds = data.load(setup["dataset"], split=setup["split"], size=tuple(size) if isinstance(size, list) else size)
    every = int(mcfg["reseed_every"])
    if every < 1:
        raise ConfigError(f"single-sample model.reseed_every must be >= 1, got {every}")
    drawn = int(torch.randint(2**31 - 1, (1,), generator=generator))
    slot = (json.dumps(setup, sort_keys=True, default=str), trial // every)
    seed = mcfg["seed"] if mcfg["seed"] is not None else _SEEDS.setdefault(slot, drawn)
    shared_model = mcfg["seed"] is not None or every > 1
    model = build(mcfg["name"], ds.num_classes, activation=mcfg["activation"], in_shape=tuple(ds.images.shape[1:]),
                  bias_last=bool(mcfg["bias_last"]), init=mcfg["init"], norm=mcfg["norm"], seed=int(seed),
                  **(mcfg["options"] or {}))
    trained = None
    if tcfg is not None and float(tcfg["epochs"]) > 0:
        key = json.dumps([model.spec, tcfg, setup["dataset"]], sort_keys=True, default=str)
        if shared_model and key in _TRAINED:
            model.load_state_dict(_TRAINED[key][0])
            trained = _TRAINED[key][1]
        else:
            trained = _train(model, ds, setup["dataset"], setup["split"], tcfg, generator)
            if shared_model:
                _TRAINED[key] = ({k: v.clone() for k, v in model.state_dict().items()}, trained)
    model.eval()
    if setup["shared"] == "last":
        for p in model.body.parameters():
            p.requires_grad_(False)

    images, targets, draws = _make_samples(ds, setup, generator)
    protocol = Protocol(label_aug=setup["label_aug"], loss=setup["loss"], temperature=float(setup["temperature"]))
    variance = float(ncfg["variance"]) if ncfg else 0.0
    group = f"{mcfg['name']}/{'trained' if trained else 'untrained'}/{setup['label_aug']}"
    if variance > 0:
        group += f"/{ncfg['kind']}:{variance:g}"
    trials = []
    state = None
    for i in range(images.shape[0]):
        capture, truth = capture_gradients(model, images[i:i + 1], targets[i:i + 1], protocol)
        # the model is in eval mode and unchanged between captures: share one copy of its state (a ResNet-18
        # state is 45 MB; 200 private copies would not fit in memory)
        state = state if state is not None else capture.model_state
        capture.model_state = state
        if variance > 0:
            for name in (LAST_WEIGHT, LAST_BIAS):
                if name in capture.gradients:
                    g = capture.gradients[name]
                    g += NOISES[ncfg["kind"]](g.shape, variance, generator).to(g.dtype)
        capture.meta.update(model_seed=int(seed), trained=trained, shared=setup["shared"])
        truth.meta.update({k: v[i] for k, v in draws.items()}, dataset=setup["dataset"], trial=trial,
                          noise=None if variance == 0 else {"kind": ncfg["kind"], "variance": variance})
        trials.append(Trial(capture=capture, truth=truth, aux=None, group=group))
    return trials
