"""Every method that reads a FedAvg-style update refuses bad captures with the same clear errors:
a FedSGD gradient instead of an update, NaN in the update, a last layer of the wrong shape."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import labels
from gi.core.errors import CaptureError
from gi.world.data import ImageDataset
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build

C = 4
UPDATE_METHODS = ["rlu", "dist-init-bias", "dist-soft-label", "dist-soft-label-path", "dist-aux-bias-grad",
                  "dist-aux-weight-grad", "dist-exact", "decaf", "decaf-paper", "uniform-guess"]


@pytest.fixture(scope="module")
def setup():
    g = torch.Generator().manual_seed(0)
    images, y = torch.rand(24, 1, 6, 6, generator=g, dtype=torch.float64), torch.arange(24) % C
    model = build("cnn", C, in_shape=(1, 6, 6), seed=0, channels=(4,), hidden=8).double()
    update, _ = simulate_client(model, (images, y), Protocol(scheme="fedavg", batch_size=8),
                                torch.Generator().manual_seed(0))
    gradient, _ = capture_gradients(model, images[:8], y[:8], Protocol(scheme="fedsgd", batch_size=8))
    return update, gradient, ImageDataset(images, y, C)


def test_every_update_method_is_listed():
    """A new method that reads updates through labels.rlu.update_view belongs in UPDATE_METHODS."""
    assert set(UPDATE_METHODS) <= set(labels.METHODS)


@pytest.mark.parametrize("method", UPDATE_METHODS)
def test_bad_updates_give_clear_errors(method, setup):
    update, gradient, aux = setup
    with pytest.raises(CaptureError, match="update"):
        labels.recover(gradient, method, aux=aux)
    nan = dataclasses.replace(update, update={**update.update, "fc.bias": torch.full((C,), float("nan"),
                                                                                       dtype=torch.float64)})
    with pytest.raises(CaptureError, match="NaN"):
        labels.recover(nan, method, aux=aux)
    wrong = dataclasses.replace(update, update={**update.update, "fc.weight": torch.zeros(C + 1, 8,
                                                                                          dtype=torch.float64)})
    with pytest.raises(CaptureError, match="shape"):
        labels.recover(wrong, method, aux=aux)
