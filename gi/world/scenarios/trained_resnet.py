"""A trained ResNet-18 with BatchNorm as the victim: label-first counts on realistic batches.

torchvision's ResNet-18 (CIFAR stem, BatchNorm after every convolution) trained by the project on Fashion-MNIST
resized to 32×32 (:class:`TrainedResNetSetup`'s defaults: 3000 training images, 2 epochs of SGD, a few minutes on
one idle CPU core), attacked on FedSGD batches of 8–32 test images. The model is built and trained exactly as
``gi run`` / ``gi ablate`` build theirs for the same ``data``, ``model``, ``train`` and ``seed``
(:func:`gi.world.build.build_model`, :func:`gi.world.build.train_on` with a generator seeded ``seed + 1``), so
with ``$GI_CACHE_DIR`` set the label table and ``configs/ablate/resnet18-bn.yaml`` share one cached training
(:func:`gi.world.train.train_model`).

Fields beyond the shared victim setup: ``seed`` (model, training), ``shared`` (``all`` the full gradient, or
``last``: only ``fc.weight``/``fc.bias``, what every batch label method reads; the body's backward is skipped),
``group`` (the table row, default ``resnet18/trained``); ``aux.per_class`` labelled samples per class of ``aux.split``
(default ``train``, never the victims' split) for the aux-based methods (posterior, LLG+, ZLG+). The client's
BatchNorm statistics (``protocol.share_bn_stats``) are a reconstruction prior, not a label input: this scenario does
not record them (``gi run`` / ``gi ablate`` do).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gi.core.config import require
from gi.core.errors import ConfigError
from gi.world.build import AUX, build_model, draw_aux, key_of, load_data, train_on, trained_model
from gi.world.fl.protocol import Protocol
from gi.world.scenarios import Trial, register_scenario
from gi.world.setup import AuxConfig, DataConfig, ModelConfig, TrainConfig, VictimSetup, section

if TYPE_CHECKING:
    import torch


@dataclass
class TrainedResNetSetup(VictimSetup):
    """The ``trained-resnet18`` setup (module docstring)."""

    data: DataConfig = section(DataConfig, name="fashion-mnist", split="test", size=32)
    model: ModelConfig = section(ModelConfig, name="resnet18")
    train: TrainConfig = section(TrainConfig, epochs=2.0, samples=3000, split="train", lr=0.01, batch_size=64)
    aux: AuxConfig = section(AuxConfig, per_class=0, split="train")
    protocol: Protocol = section(Protocol, batch_size=8)
    seed: int = 0
    shared: str = "last"
    group: str | None = None

    def __post_init__(self) -> None:
        if self.protocol.scheme != "fedsgd":
            raise ConfigError(f"setup.protocol.scheme={self.protocol.scheme!r}: the trained-resnet18 scenario shares "
                              "FedSGD gradients; leave the scheme out")
        if self.train.epochs <= 0:
            raise ConfigError("setup.train.epochs must be > 0: this scenario is about a trained network (untrained "
                              "ResNets: the fedsgd-batch scenario with model.name=resnet18)")
        require(self.shared in ("all", "last"), "setup.shared", self.shared, "one of ['all', 'last']")
        if self.aux.per_class and (self.aux.split or self.data.split) == self.data.split:
            raise ConfigError(f"setup.aux.split={self.aux.split!r}: the aux set must come from another split than the "
                              f"victims' ({self.data.split!r}), e.g. aux.split: train")
        if self.shared == "last" and self.protocol.dp_clip is not None:
            raise ConfigError("setup.shared='last' cannot be combined with protocol.dp_clip (the clip norm is global)")


def trained_victim(s: Any) -> tuple[Any, torch.nn.Module, dict[str, Any]]:
    """The victim dataset and the trained model of a setup with ``data``, ``model``, ``train`` and ``seed``: built
    and trained as :func:`gi.world.build.build_victim` does, cached in-process (and by
    :func:`gi.world.train.train_model` on disk under ``$GI_CACHE_DIR``); returns ``(dataset, model, training
    record)``."""
    import torch

    victims = load_data(s.data)
    key = key_of("trained victim", s.model, s.train, s.data, s.seed)
    model, info = trained_model(key, lambda: build_model(s.model, victims, int(s.seed)),
                                lambda net: train_on(net, s.train, s.data, victims,
                                                     torch.Generator().manual_seed(int(s.seed) + 1)))
    return victims, model, info


@register_scenario("trained-resnet18", setup=TrainedResNetSetup)
def trained_resnet18(s: TrainedResNetSetup, generator: torch.Generator, trial: int) -> list[Trial]:
    """One FedSGD batch of ``protocol.batch_size`` test images through the trained ResNet-18, with its truth."""
    import torch

    from gi.world.data import make_targets, sample_batch
    from gi.world.fl.victim import capture_gradients

    victims, model, info = trained_victim(s)
    images, labels, _ = sample_batch(victims, int(s.protocol.batch_size), generator)
    if s.shared == "last":
        for p in model.body.parameters():
            p.requires_grad_(False)
    targets = make_targets(labels, victims.num_classes, s.protocol.label_aug, s.protocol.label_eps)
    capture, truth = capture_gradients(model, images.contiguous(), targets, copy.deepcopy(s.protocol), generator)
    capture.meta.update(trial=int(trial), dataset=s.data.name, train=info)
    aux = None
    if s.aux.per_class:  # one object per configuration: trials sharing it are recovered in one batched call
        key = key_of("trained victim aux", s.data, s.aux, s.seed)
        aux, _ = AUX.get(key, lambda: draw_aux(load_data(s.data, s.aux.split), s.aux.per_class,
                                               torch.Generator().manual_seed(int(s.seed) + 7919), None,
                                               *s.aux.shift_args))
    return [Trial(capture=capture, truth=truth, aux=aux, group=s.group or f"{s.model.name}/trained")]
