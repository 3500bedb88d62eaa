"""FedSGD batch captures for the batch-label benchmarks (posterior paper §4, Tables 2–3, Figures 3–4).

One trial = one client batch of B real images, one FedSGD gradient of the mean loss through the global
model, and the attacker's auxiliary set (``aux.per_class`` labelled samples per class, disjoint from every
victim batch). The setup (:class:`FedSGDBatchSetup`) is the shared victim setup
(:mod:`gi.world.setup`) with these defaults and fields:

- ``data``: real data from :func:`gi.world.data.load` (default Fashion-MNIST ``train``); ``data.size`` resizes (e.g.
  Fashion-MNIST 28 → 32 for VGG/ResNet), ``data.channels: 3`` repeats a grey channel into RGB.
- ``aux``: ``per_class`` (default 100) samples of ``aux.split`` (default ``test``; the paper samples aux data from
  the validation set). With one split for both, victim batches exclude the aux indices.
- ``protocol``: :class:`gi.Protocol` fields (loss, focal_alpha/gamma, temperature, label_aug, label_eps,
  model_mode); ``protocol.batch_size`` is B (default 32), the scheme is FedSGD. Mixup has no fixed label
  embedding and is refused here.
- ``replace`` (draw batches with replacement: the only way to make batches larger than a 20-image foolbox
  sample pool), ``imbalance`` (fraction of the batch in one random dominant class, the rest uniform over the
  other classes; Fig. 3). Without ``imbalance`` batches are uniform random draws.
- ``model`` (default ``lenet5``); ``reinit``: ``true`` a fresh initialisation per trial (the default for untrained
  models), an integer k: k initialisations used in turn (trial mod k; k aux forwards instead of one per trial),
  ``false`` one model for all trials. Trained models (``train.epochs > 0``, whatever ``reinit`` says, so a grid
  can mix both) are trained once per configuration and cached in-process, and on disk under ``$GI_CACHE_DIR``
  when it is set.
- ``shared``: ``all`` (the full FedSGD gradient) or ``last`` (only ``fc.weight``/``fc.bias``: identical
  last-layer gradients without the backward pass through the body, ~3× faster on VGG-16; every batch
  label method reads only the last layer). ``last`` refuses DP clipping (the clip norm is global).
- ``train``: ``{epochs, lr (default 0.001), batch_size, momentum, samples, split}`` for
:func:`gi.world.train.train_model`
  (``samples`` caps the training set; the paper trains one epoch at lr 0.001).
- ``synthetic_classes``: ``null`` (the dataset's labels) or C >= 2: every image of every split gets a
  random label in [0, C) (a fixed, seeded relabelling per split and ``seed``: each image's label is uniform
  over the C classes, the split balanced, ``randperm(N) mod C``, so ``aux.per_class`` up to N/C is met
  without replacement) and the model has C outputs. For UNTRAINED models only (the network cannot tell
  classes apart, so which image carries which label does not matter; e.g. the posterior paper's 100-class
  CIFAR-100 cells with Fashion-MNIST images); any training (``train.epochs > 0``) is refused.
- ``seed`` fixes models, training, the aux draw and the synthetic labels; the trial generator draws the victim
  batches. ``group`` names the table row (default ``"<model>/<activation>"``).

Old spellings (``dataset``, ``root``, ``size``, ``channels``, ``victim_split``, ``aux_split``, ``train_split``,
``batch_size``) are read with a deprecation notice (:data:`FedSGDBatchSetup.LEGACY`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gi.core.config import require
from gi.core.errors import ConfigError
from gi.world.build import (
    AUX,
    DATA,
    build_model,
    draw_aux,
    key_of,
    load_data,
    pretrained_model,
)
from gi.world.fl.protocol import Protocol
from gi.world.scenarios import Trial, register_scenario
from gi.world.setup import SCENARIO_LEGACY, AuxConfig, DataConfig, ModelConfig, TrainConfig, VictimSetup, section

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass
class FedSGDBatchSetup(VictimSetup):
    """The ``fedsgd-batch`` setup (module docstring)."""

    LEGACY: ClassVar[dict[str, str]] = {**SCENARIO_LEGACY, "root": "data.root", "victim_split": "data.split",
                                        "train_split": "train.split", "batch_size": "protocol.batch_size"}

    data: DataConfig = section(DataConfig, name="fashion-mnist", split="train")
    model: ModelConfig = section(ModelConfig, name="lenet5")
    train: TrainConfig = section(TrainConfig, lr=0.001)
    aux: AuxConfig = section(AuxConfig, per_class=100, split="test")
    protocol: Protocol = section(Protocol, batch_size=32)
    replace: bool = False
    imbalance: float | None = None
    reinit: bool | int | None = None
    shared: str = "all"
    seed: int = 0
    group: str | None = None
    synthetic_classes: int | None = None

    def __post_init__(self) -> None:
        require(self.imbalance is None or 0.0 <= self.imbalance <= 1.0, "setup.imbalance", self.imbalance,
                "null or a fraction in [0, 1]")
        if self.protocol.scheme != "fedsgd":
            raise ConfigError(f"setup.protocol.scheme={self.protocol.scheme!r}: the fedsgd-batch scenario shares "
                              f"FedSGD gradients; leave the scheme out")
        if self.protocol.label_aug == "mixup":
            raise ConfigError("setup.protocol.label_aug='mixup' is not a batch-count scenario; valid: onehot, "
                              "smoothing, smoothing-alt")
        require(self.synthetic_classes is None or self.synthetic_classes >= 2, "setup.synthetic_classes",
                self.synthetic_classes, "null or an integer >= 2")
        if self.synthetic_classes is not None and self.train.epochs > 0:
            raise ConfigError("setup.synthetic_classes relabels images at random and is for untrained models only; "
                              "set train.epochs: 0 or synthetic_classes: null")
        require(self.reinit is None or isinstance(self.reinit, bool) or self.reinit >= 1, "setup.reinit",
                self.reinit, "true, false or a number of models >= 1")
        require(self.shared in ("all", "last"), "setup.shared", self.shared, "one of ['all', 'last']")
        if self.shared == "last" and self.protocol.dp_clip is not None:
            raise ConfigError("setup.shared='last' cannot be combined with protocol.dp_clip (the clip norm is global)")

    @property
    def models(self) -> bool | int:
        """The initialisations in use (derived): ``False`` one (trained) model, ``True`` one per trial, k: k in
        turn. A trained model is trained once, whatever ``reinit`` says; an untrained one follows ``reinit``
        (default: one per trial)."""
        if self.train.epochs > 0:
            return False
        return True if self.reinit is None else self.reinit

    @property
    def relabel(self) -> tuple[int, int] | None:
        return None if self.synthetic_classes is None else (self.synthetic_classes, self.seed)


def _dataset(s: FedSGDBatchSetup, split: str | None = None) -> Any:
    return load_data(s.data, split, relabel=s.relabel)


def _aux(s: FedSGDBatchSetup) -> tuple[Any, Tensor]:
    """The attacker's aux set (one object per configuration, so trials share it and its forward)."""
    import torch

    key = key_of("fedsgd-batch aux", s.data, s.aux, s.seed, s.synthetic_classes)
    return AUX.get(key, lambda: draw_aux(_dataset(s, s.aux.split), s.aux.per_class,
                                         torch.Generator().manual_seed(int(s.seed) + 7919), None,
                                         *s.aux.shift_args))


def _victim_pool(s: FedSGDBatchSetup, aux_idx: Tensor) -> Any:
    import torch

    data = _dataset(s)
    if s.data.split != (s.aux.split or s.data.split):
        return data
    key = key_of("fedsgd-batch pool", s.data, s.synthetic_classes, s.seed, aux_idx.tolist())

    def make() -> Any:
        keep = torch.ones(len(data), dtype=torch.bool)
        keep[aux_idx] = False
        return data.subset(torch.nonzero(keep).flatten())

    return DATA.get(key, make)


@register_scenario("fedsgd-batch", setup=FedSGDBatchSetup)
def fedsgd_batch(s: FedSGDBatchSetup, generator: torch.Generator, trial: int) -> list[Trial]:
    """One FedSGD batch capture with its truth and the shared aux set (posterior paper §4.1–4.4)."""
    import torch

    from gi.world.data import class_imbalanced_batch, make_targets, sample_batch
    from gi.world.fl.victim import capture_gradients

    protocol = s.protocol
    aux, aux_idx = _aux(s)
    pool = _victim_pool(s, aux_idx)
    b = int(protocol.batch_size)
    if s.imbalance is None:
        images, labels, _ = sample_batch(pool, b, generator, replace=s.replace)
    else:
        major = int(torch.randint(pool.num_classes, (1,), generator=generator))
        images, labels, _ = class_imbalanced_batch(pool, b, major, float(s.imbalance), generator, replace=s.replace)
    images = images.contiguous()
    models = s.models
    if models is False:
        model, train_info = pretrained_model(s.model, s.train, s.data, _dataset(s), s.seed)
    else:
        index = int(trial) if models is True else int(trial) % int(models)
        model, train_info = build_model(s.model, _dataset(s), int(s.seed) * 100_003 + index), {}
    if s.shared == "last":
        for p in model.body.parameters():
            p.requires_grad_(False)
    targets = make_targets(labels, pool.num_classes, protocol.label_aug, protocol.label_eps)
    capture, truth = capture_gradients(model, images, targets, copy.deepcopy(protocol), generator)
    capture.meta.update(trial=int(trial), dataset=s.data.name, train=train_info)
    group = s.group or f"{s.model.name}/{model.spec['activation']}"
    return [Trial(capture=capture, truth=truth, aux=aux, group=group)]
