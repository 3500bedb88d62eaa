"""A FedAvg client's whole round in gi run: the client holds protocol.num_samples images and trains local_epochs
epochs of reshuffled mini-batches of batch_size; FedSGD and a FedAvg client without num_samples keep one batch."""

import pytest
import torch

from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.run import RunConfig
from gi.world.build import build_victim, capture_all
from gi.world.fl.protocol import Protocol
from gi.world.setup import client_size

ROUND = ["protocol.num_samples=12", "protocol.batch_size=4", "protocol.local_epochs=2",
         "model.options.channels=[4, 8]", "model.options.hidden=16"]


def test_client_size_is_the_round_for_an_update_and_the_batch_otherwise():
    assert client_size(Protocol(scheme="fedavg", num_samples=50, batch_size=5)) == (50, "protocol.num_samples")
    assert client_size(Protocol(scheme="fedavg", batch_size=5)) == (5, "protocol.batch_size")
    assert client_size(Protocol(scheme="fedsgd", num_samples=50, batch_size=5)) == (5, "protocol.batch_size")


def test_the_round_config_captures_a_client_of_n_images_over_e_epochs(fashion_mnist):
    cfg = load(RunConfig, "configs/fedavg-round.yaml", ROUND)
    dataset, model = build_victim(cfg)
    (capture,), (truth,) = capture_all(cfg, dataset, model, torch.Generator().manual_seed(0))
    assert capture.is_update and capture.num_samples == 12 and capture.meta["num_steps"] == 6
    assert truth.images.shape[0] == 12 and len(set(truth.meta["indices"])) == 12
    epochs = truth.extra["epoch_counts"]
    assert epochs.shape[0] == 2 and all(torch.equal(e, truth.counts) for e in epochs)  # every image once an epoch
    steps = truth.extra["step_counts"]
    assert (steps.sum(1) == 4).all() and not torch.equal(steps[:3], steps[3:])  # reshuffled between the epochs


def test_the_server_can_re_simulate_a_round_only_where_the_batches_are_known():
    from gi.world.fl.local import order_known

    assert order_known(Protocol(batch_size=8))  # FedSGD: the batch is the capture
    assert order_known(Protocol(scheme="fedavg", batch_size=8, local_steps=4), 8)  # every step sees all 8
    assert order_known(Protocol(scheme="fedavg", batch_size=8, local_steps=1), 66)  # one step: its 8 slots
    assert order_known(Protocol(scheme="fedavg", batch_size=50, local_epochs=3), 20)  # N <= B: one batch an epoch
    assert not order_known(Protocol(scheme="fedavg", batch_size=5, local_epochs=1), 50)  # 10 reshuffled batches
    assert not order_known(Protocol(scheme="fedavg", batch_size=4, local_steps=2), 8)  # 2 batches of 4 of 8


def test_data_images_are_split_into_clients_of_n(fashion_mnist):
    images = "data.images=" + str(list(range(24)))
    cfg = load(RunConfig, "configs/fedavg-round.yaml", [*ROUND, "protocol.local_epochs=1", images])
    captures, truths = capture_all(cfg, *build_victim(cfg), torch.Generator().manual_seed(0))
    assert [c.num_samples for c in captures] == [12, 12]
    assert [sorted(t.meta["indices"]) for t in truths] == [list(range(12)), list(range(12, 24))]


@pytest.mark.parametrize("override,match", [
    ("data.images=" + str(list(range(20))), r"holds 20 images, not a multiple of protocol.num_samples=12"),
    ("data.indices=[0, 1, 2, 3]", r"data.indices has 4 entries but protocol.num_samples=12"),
])
def test_a_client_that_does_not_fit_n_is_a_clear_error(fashion_mnist, override, match):
    cfg = load(RunConfig, "configs/fedavg-round.yaml", [*ROUND, override])
    with pytest.raises(ConfigError, match=match):
        capture_all(cfg, *build_victim(cfg), torch.Generator().manual_seed(0))
