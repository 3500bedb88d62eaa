"""labels ``fc-inputs``: every sample's label of a FedSGD batch from the disaggregated first Linear layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import labels
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build


def _batch(n: int = 6):
    data = load("fashion-mnist")
    g = torch.Generator().manual_seed(4)
    idx = torch.randperm(len(data), generator=g)[:n]
    return data.images[idx], data.labels[idx]


def _cnn(**kw):
    return build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, batch_norm=True, channels=[16, 32],
                 hidden=64, **kw)


@pytest.mark.parametrize("aug", [dict(), dict(label_aug="smoothing", label_eps=0.2), dict(temperature=3.0)],
                         ids=["one-hot", "smoothed", "temperature"])
def test_every_sample_label_is_recovered_exactly(aug):
    images, y = _batch()
    capture, truth = capture_gradients(_cnn(), images, y, Protocol(batch_size=6, model_mode="train", **aug))
    result = labels.recover(capture, "fc-inputs")
    assert result.ok and result.info["layer"] == "body.1"
    assert torch.equal(result.counts, truth.counts)
    # the rows come in the order the inputs were found: each is some sample's soft target, to 1e-3
    assert float(torch.cdist(result.soft.double(), truth.targets.double()).min(1).values.max()) < 1e-3


def test_where_it_does_not_apply_it_says_why():
    images, y = _batch(4)
    model = _cnn()
    one, _ = capture_gradients(model, images[:1], y[:1], Protocol())
    assert "one sample" in labels.recover(one, "fc-inputs").info["reason"]
    bce, _ = capture_gradients(model, images, y, Protocol(batch_size=4, loss="bce"))
    assert "cross-entropy" in labels.recover(bce, "fc-inputs").info["reason"]
    twice, _ = simulate_client(model, (images, y), Protocol(scheme="fedavg", batch_size=2, local_steps=4),
                               torch.Generator().manual_seed(0))
    assert "more than one local epoch" in labels.recover(twice, "fc-inputs").info["reason"]
    momentum, _ = simulate_client(model, (images, y), Protocol(scheme="fedavg", batch_size=2, momentum=0.9),
                                  torch.Generator().manual_seed(0))
    assert "not a plain sum" in labels.recover(momentum, "fc-inputs").info["reason"]
    fcn = build("fcn3", 10, in_shape=(1, 28, 28), seed=0)  # its first Linear sees the raw pixels: too dense
    dense, _ = capture_gradients(fcn, images, y, Protocol(batch_size=4))
    result = labels.recover(dense, "fc-inputs", draws=2_000)  # the sampling fallback's budget, kept small
    assert not result.ok and result.info["reason"]


def test_a_one_epoch_fedavg_round_gives_every_samples_label():
    """Two SGD steps of 2 over the client's 4 images: −ΔW/η of the first Linear layer is one batch gradient over
    the 4 inputs (each at its own step's parameters), and each label follows as for a FedSGD batch."""
    images, y = _batch(4)
    update, truth = simulate_client(_cnn(), (images, y), Protocol(scheme="fedavg", batch_size=2, lr=0.01),
                                    torch.Generator().manual_seed(0))
    result = labels.recover(update, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    assert sorted(result.soft.argmax(1).tolist()) == sorted(truth.labels.tolist())


def test_a_one_epoch_round_with_a_short_last_batch_is_one_epoch():
    """N = 5, B = 2 without drop_last: steps of 2, 2, 1 (three steps, more than N // B = 2) still see each sample
    once, so its labels follow; two epochs of it (ten visits of five samples) are refused."""
    images, y = _batch(5)
    protocol = Protocol(scheme="fedavg", batch_size=2, lr=0.01, drop_last=False)
    update, truth = simulate_client(_cnn(), (images, y), protocol, torch.Generator().manual_seed(0))
    assert update.meta["num_steps"] == 3
    result = labels.recover(update, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    twice, _ = simulate_client(_cnn(), (images, y), dataclasses.replace(protocol, local_epochs=2),
                               torch.Generator().manual_seed(0))
    assert "more than one local epoch" in labels.recover(twice, "fc-inputs").info["reason"]
