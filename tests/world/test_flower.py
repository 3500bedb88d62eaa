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
        return new, 0 if self.bad == "empty" else 4, {}


@pytest.mark.parametrize("bad", ["nan", "empty"])
def test_a_bad_client_is_skipped_and_logged_and_the_round_goes_on(bad, caplog):
    from gi.world.fl.flower import run_in_process

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg", lr=0.1, batch_size=4), in_shape=(1, 2, 2),
                               min_fit_clients=3, min_available_clients=3, fraction_evaluate=0.0)
    run_in_process(strategy, [_Client(), _Client(bad), _Client()], num_rounds=2)
    assert sorted(cid for _, cid, _ in strategy.captures) == ["0", "0", "2", "2"]  # both rounds ran without client 1
    assert [(r, cid) for r, cid, _ in strategy.skipped] == [(1, "1"), (2, "1")]
    assert ("NaN" if bad == "nan" else "num_examples=0") in strategy.skipped[0][2]
    assert "client 1 skipped" in caplog.text


def test_a_client_whose_capture_fails_still_counts_in_the_mean():
    from gi.world.fl.flower import run_in_process

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    strategy = CapturingFedAvg(model, gi.Protocol(scheme="fedavg"), in_shape=(1, 2, 2), min_fit_clients=2,
                               min_available_clients=2, fraction_evaluate=0.0,
                               on_fit_config_fn=lambda r: {"lr": "0.1"})  # a config value of the wrong type
    history = run_in_process(strategy, [_Client(), _Client()], num_rounds=1)
    assert not strategy.captures and len(strategy.skipped) == 2 and "not captured" in strategy.skipped[0][2]
    assert history is not None
