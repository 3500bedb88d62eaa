"""Test-wide settings: one torch thread per worker (pytest -n 2 already uses both cores; more threads
oversubscribe the CPU and make small-op loops an order of magnitude slower)."""

import os
from collections.abc import Callable

import pytest
import torch

os.environ.setdefault("GI_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture
def lenet_captures() -> Callable[[int], list[tuple]]:
    """``make(n)``: (capture, oracle LabelResult, truth) of the first n cifar10-samples images, one FedSGD capture
    each, of one DLG LeNet (uniform init, seed 0)."""
    from gi.label_result import LabelResult
    from gi.world import data as gdata
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import build

    def make(n: int) -> list[tuple]:
        ds = gdata.load("cifar10-samples")
        model = build("lenet", 10, init="uniform", seed=0)
        out = []
        for i in range(n):
            c, t = capture_gradients(model, ds.images[i:i + 1], ds.labels[i:i + 1], Protocol())
            out.append((c, LabelResult.from_counts("truth", t.counts, soft=t.targets), t))
        return out

    return make


@pytest.fixture
def fashion_mnist() -> None:
    """Skip where the Fashion-MNIST files are not installed (``make install`` puts them under .assets)."""
    from gi.core.errors import AssetError
    from gi.world import assets

    try:
        assets.fashion_mnist_dir()
    except AssetError:
        pytest.skip("Fashion-MNIST is not installed (make install)")
