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
