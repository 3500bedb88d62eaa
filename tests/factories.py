"""Shared builders of the tests: synthetic batches, small models, FedSGD captures and oracle labels.

One home for what the test modules used to copy: each builder is deterministic in its seed, so a test that
switches to it keeps its numbers.
"""

from __future__ import annotations

import torch

from gi.label_result import LabelResult
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def random_batch(n: int, shape: tuple[int, ...], classes: int, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` uniform-random images of ``shape`` in [0, 1] and uniform-random labels below ``classes``."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g, dtype=dtype), torch.randint(classes, (n,), generator=g)


def patterned_batch(n: int, classes: int, seed: int, pattern_seed: int, shape: tuple[int, ...] = (1, 6, 6),
                    noise: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-structured images: a fixed random pattern per class (drawn with ``pattern_seed``) plus Gaussian
    noise, clamped to [0, 1]; labels uniform below ``classes``."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.rand(classes, *shape, generator=torch.Generator().manual_seed(pattern_seed))
    labels = torch.randint(classes, (n,), generator=g)
    return (patterns[labels] + noise * torch.randn(n, *shape, generator=g)).clamp(0, 1), labels


def tiny_cnn(classes: int, seed: int = 0, **options) -> torch.nn.Module:
    """The zoo's ``cnn`` at 3×8×8 with one tanh conv of 4 channels and 8 hidden units: a net small enough for
    exact, fast reconstruction tests."""
    return build("cnn", classes, in_shape=(3, 8, 8), seed=seed, activation="tanh", channels=(4,), hidden=8,
                 **options)


def oracle(truth) -> LabelResult:
    """The LabelResult an oracle returns: the truth's counts and soft targets."""
    return LabelResult.from_counts("truth", truth.counts, soft=truth.targets)


def fedsgd_capture(model: torch.nn.Module, b: int, seed: int, classes: int, shape: tuple[int, ...] = (3, 8, 8),
                   protocol: Protocol | None = None):
    """A FedSGD capture of ``model`` on a random batch of ``b`` (:func:`random_batch`), with its oracle labels."""
    x, y = random_batch(b, shape, classes, seed)
    capture, truth = capture_gradients(model, x, y, protocol or Protocol(batch_size=b))
    return capture, oracle(truth)


def first_of_classes(classes: tuple[int, ...] = (7, 2, 5, 0, 9, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """The first Fashion-MNIST test image of each of ``classes``, in that order: ``(images, labels)``."""
    from gi.world.data import load

    data = load("fashion-mnist")
    first: dict[int, int] = {}
    for i, y in enumerate(data.labels.tolist()):
        first.setdefault(y, i)
    idx = [first[c] for c in classes]
    return data.images[idx], data.labels[idx]
