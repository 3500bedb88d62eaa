"""Shared fixtures of the gi tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def lenet_captures() -> Callable[[int], list[tuple]]:
    """``make(n)``: (capture, oracle LabelResult, truth) of the first n cifar10-samples images, one FedSGD capture
    each, of one DLG LeNet (uniform init, seed 0)."""
    from gi import data as gdata
    from gi.capture import capture_gradients
    from gi.fl.protocol import Protocol
    from gi.label_result import LabelResult
    from gi.models import build

    def make(n: int) -> list[tuple]:
        ds = gdata.load("cifar10-samples")
        model = build("lenet", 10, init="uniform", seed=0)
        out = []
        for i in range(n):
            c, t = capture_gradients(model, ds.images[i:i + 1], ds.labels[i:i + 1], Protocol())
            out.append((c, LabelResult.from_counts("truth", t.counts, soft=t.targets), t))
        return out

    return make
