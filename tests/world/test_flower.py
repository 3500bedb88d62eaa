"""Flower (optional extra ``flower``): CapturingFedAvg records real Flower client updates as gi Captures, RLU reads
them exactly; the example runs small."""

from __future__ import annotations

import pytest
import torch

flwr = pytest.importorskip("flwr")

import gi  # noqa: E402
from gi.core.errors import CaptureError, ConfigError  # noqa: E402
from gi.world.fl.flower import CapturingFedAvg, ndarrays_to_state, protocol_from_config, state_to_ndarrays  # noqa: E402


@pytest.mark.slow  # loads Fashion-MNIST's 60k training images and runs 2 federations: ~30 s on a loaded 2-core box
def test_flower_example_small_rlu_exact_with_1_and_5_steps():
    from examples.flower_fmnist import main

    summaries = main(["--clients", "2", "--samples", "24", "--rounds", "2", "--steps", "1", "5", "--eval", "200"])
    assert [s["steps"] for s in summaries] == [1, 5]
    for s in summaries:
        assert s["captures"] == 4 and s["exact"] == 4, s  # every recorded client's label counts exact
        assert s["last_layer"] == "classifier" and s["protocol"]["local_steps"] == s["steps"]
        assert s["protocol"]["lr"] == 0.05 and s["protocol"]["batch_size"] == 8
        assert set(s["federation_accuracy"]) == {0, 1, 2}


def test_protocol_from_config_and_parameter_checks():
    base = gi.Protocol(scheme="fedavg")
    p = protocol_from_config(base, {"lr": 0.1, "local_steps": 3, "batch_size": 4, "round": 7, "app_key": "x"})
    assert (p.lr, p.local_steps, p.batch_size, p.scheme) == (0.1, 3, 4, "fedavg")
    with pytest.raises(ConfigError, match="local_steps"):
        protocol_from_config(base, {"local_steps": 0})
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    arrays = state_to_ndarrays(model)
    back = ndarrays_to_state(model, arrays)
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    with pytest.raises(CaptureError, match="1 arrays but the model's state_dict has 2"):
        ndarrays_to_state(model, arrays[:1])
    with pytest.raises(CaptureError, match="not in state_dict order"):
        ndarrays_to_state(model, arrays[::-1])
    with pytest.raises(ConfigError, match="records updates"):
        CapturingFedAvg(model, gi.Protocol())


class _Client(flwr.client.NumPyClient):
    """A client that returns the global parameters moved by a fixed step, or a broken message."""

    def __init__(self, bad: str | None = None) -> None:
        self.bad = bad

    def get_parameters(self, config):
        return []

    def fit(self, parameters, config):
        import numpy as np

        new = [p - 0.01 for p in parameters]
        if self.bad == "nan":
            new[0] = new[0] * np.nan
        if self.bad == "missing":
            new = new[:1]
        if self.bad == "shape":
            new[0] = new[0][:, :2]
        return new, 0 if self.bad == "empty" else 4, {}


@pytest.mark.parametrize("bad", ["nan", "empty", "missing", "shape"])
def test_a_bad_client_is_skipped_and_logged_and_the_round_goes_on(bad, caplog):
    from gi.world.fl.flower import run_in_process

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg", lr=0.1, batch_size=4), in_shape=(1, 2, 2),
                               min_fit_clients=3, min_available_clients=3, fraction_evaluate=0.0)
    run_in_process(strategy, [_Client(), _Client(bad), _Client()], num_rounds=2)
    assert sorted(cid for _, cid, _ in strategy.captures) == ["0", "0", "2", "2"]  # both rounds ran without client 1
    assert [(r, cid) for r, cid, _ in strategy.skipped] == [(1, "1"), (2, "1")]
    why = {"nan": "NaN", "empty": "num_examples=0", "missing": "hold 1 arrays, the model's state_dict 2",
           "shape": "array 0 has shape (3, 2), the model's is (3, 4)"}[bad]
    assert why in strategy.skipped[0][2]
    assert "client 1 skipped" in caplog.text


def test_a_fit_config_without_the_round_keys_is_warned_about_once_naming_what_is_assumed(caplog):
    from gi.world.fl.flower import run_in_process

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg", lr=0.1, batch_size=4), in_shape=(1, 2, 2),
                               min_fit_clients=2, min_available_clients=2, fraction_evaluate=0.0,
                               on_fit_config_fn=lambda r: {"batch_size": 4})
    run_in_process(strategy, [_Client(), _Client()], num_rounds=2)
    warned = [r.getMessage() for r in caplog.records if "fit config sets none of" in r.getMessage()]
    assert len(strategy.captures) == 4 and len(warned) == 1
    assert "['lr', 'local_epochs']" in warned[0] and "lr=0.1, local_epochs=1" in warned[0]
    caplog.clear()
    full = CapturingFedAvg(model, gi.Protocol(scheme="fedavg"), in_shape=(1, 2, 2), min_fit_clients=2,
                           min_available_clients=2, fraction_evaluate=0.0,
                           on_fit_config_fn=lambda r: {"batch_size": 4, "lr": 0.1, "local_steps": 1})
    run_in_process(full, [_Client(), _Client()], num_rounds=1)
    assert "fit config sets none of" not in caplog.text


def test_a_client_whose_capture_fails_still_counts_in_the_mean():
    from gi.world.fl.flower import run_in_process

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg"), in_shape=(1, 2, 2), min_fit_clients=2,
                               min_available_clients=2, fraction_evaluate=0.0,
                               on_fit_config_fn=lambda r: {"lr": "0.1"})  # a config value of the wrong type
    history = run_in_process(strategy, [_Client(), _Client()], num_rounds=1)
    assert not strategy.captures and len(strategy.skipped) == 2 and "not captured" in strategy.skipped[0][2]
    assert history is not None


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 3))


class _Trainer(flwr.client.NumPyClient):
    """A Flower client that trains as Flower's PyTorch examples do: ``local_steps`` SGD steps of ``batch_size``
    over its data walked in order, epoch after epoch (the last batch of an epoch may be smaller), and reports
    ``num_examples`` = its whole data set."""

    def __init__(self, model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor) -> None:
        self.model, self.images, self.targets = model, images, targets

    def get_parameters(self, config):
        return state_to_ndarrays(self.model)

    def fit(self, parameters, config):
        import torch.nn.functional as F

        self.model.load_state_dict(ndarrays_to_state(self.model, parameters))
        n, b, pos = len(self.targets), int(config["batch_size"]), 0
        for _ in range(int(config["local_steps"])):
            if pos >= n:  # a new epoch (a DataLoader without drop_last, not shuffled)
                pos = 0
            x, y = self.images[pos:pos + b], self.targets[pos:pos + b]
            pos += len(y)
            self.model.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            with torch.no_grad():
                for p in self.model.parameters():
                    p -= float(config["lr"]) * p.grad
        return state_to_ndarrays(self.model), n, {}


@pytest.mark.parametrize("steps, trained", [(1, 4), (4, 10)])  # 1 step of 4 of 10 samples; 4+4+2+4 touches all 10
def test_a_flower_capture_is_reconstructed_over_the_samples_trained_on_not_num_examples(steps, trained):
    """``FitRes.num_examples`` is the client's data set (10); the update depends on the samples its local steps
    touched: min(10, local_steps × batch_size) image slots, and the capture's update is exactly the client's
    training unrolled at those images."""
    import copy

    from gi.attack.recon import ReconConfig, reconstruct
    from gi.attack.recon.problem import build_problem, image_slots
    from gi.attack.recon.simulate import SIMULATORS
    from gi.label_result import LabelResult
    from gi.world.fl.flower import run_in_process
    from gi.world.models import from_factory

    model = from_factory(f"{__name__}:mlp")  # rebuildable: the attack rebuilds the architecture
    images, targets = torch.rand(10, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.arange(10) % 3
    config = {"lr": 0.05, "local_steps": steps, "batch_size": 4}
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg", drop_last=False), in_shape=(1, 4, 4),
                               last_layer="3", min_fit_clients=1, min_available_clients=1, fraction_evaluate=0.0,
                               on_fit_config_fn=lambda r: dict(config))
    run_in_process(strategy, [_Trainer(copy.deepcopy(model), images, targets)], num_rounds=1)
    (_, _, cap), = strategy.captures
    assert cap.num_samples == 10 and cap.protocol.local_steps == steps
    assert image_slots(cap) == trained  # not num_examples (10) when fewer were trained on
    counts = torch.bincount(targets[:trained], minlength=3)
    result = LabelResult.from_counts("oracle", counts)
    cfg = ReconConfig(iterations=1, optimizer="adam", objective="l2", regularizers={}, progress=False)
    assert build_problem([cap], [result], cfg).num_samples == trained
    sim = SIMULATORS["update"](cap.model(), cap.protocol, list(cap.update), num_samples=trained)
    update, _ = sim(images[:trained], torch.nn.functional.one_hot(targets[:trained], 3).float())
    for k in cap.update:
        torch.testing.assert_close(update[k], cap.update[k], rtol=1e-4, atol=1e-7)
    assert reconstruct(cap, result, config=cfg).images.shape == (trained, 1, 4, 4)


@pytest.mark.slow  # Fashion-MNIST's training images, one federation, one attack: ~20 s on a loaded 2-core box
def test_the_flower_round_example_recovers_a_clients_images():
    """One client's one-epoch round of 8 images in Flower: every image's input of the hidden layer is read off the
    recorded update, and the images fitted to them stand far above their mean colour (measured 32 dB against 9 dB;
    the line is 10 dB above it)."""
    from examples.flower_round import main

    (row,) = main(["--clients", "1", "--samples", "8", "--batch", "4", "--seeds", "0", "--iterations", "400"])
    assert row["images"] == 8 and row["labels"] == "fc-inputs"  # auto: a one-epoch plain-SGD round of a conv net
    assert row["psnr_mean"] > row["mean_colour_psnr"] + 10, row
