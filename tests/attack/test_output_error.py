"""The captured output error (ReconConfig.output_error): δ = ∇b of one FedSGD sample is the client's ∂L/∂z for any
loss, the dummy gradients simulated with it are exact at the true image, and the config / problem refuse what
cannot give it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gi.attack.recon import ReconConfig, reconstruct_many
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import build_problem, captured_output_error, output_errors
from gi.attack.recon.simulate import gradient_simulator
from gi.core.errors import ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.losses import output_error_loss
from gi.world.models import build
from labels import LabelResult
from tests.factories import fedsgd_capture, random_batch

C = 5
FAST = dict(iterations=3, progress=False, threads=1, log_every=1)


def _net(activation: str = "relu", bias_last: bool = True):
    return build("cnn", C, in_shape=(3, 8, 8), seed=0, activation=activation, channels=(4,), hidden=8,
                 bias_last=bias_last)


def _capture(model, b: int = 1, seed: int = 0, protocol: Protocol | None = None):
    capture, labels_ = fedsgd_capture(model, b, seed, C, protocol=protocol)
    return capture, labels_, random_batch(b, (3, 8, 8), C, seed)[0]


@pytest.mark.parametrize("protocol", [Protocol(batch_size=1), Protocol(batch_size=1, temperature=2.0),
                                      Protocol(batch_size=1, loss="focal", focal_gamma=2.0),
                                      Protocol(batch_size=1, loss="bce")], ids=["ce", "ce-t2", "focal", "bce"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_the_captured_output_error_reproduces_the_clients_gradient_for_any_loss(protocol, activation):
    model = _net(activation)
    capture, _, x = _capture(model, protocol=protocol)
    delta = captured_output_error(capture)
    assert delta.shape == (1, C)
    names = list(capture.gradients)
    net = capture.model()
    for autograd in (False, True):
        dummy, _ = gradient_simulator(net, protocol, names, autograd=autograd, loss=output_error_loss)(x, delta)
        for k in names:
            torch.testing.assert_close(dummy[k].detach(), capture.gradients[k], rtol=1e-5, atol=1e-7)


def test_output_error_loss_is_the_batch_mean_of_logit_error_products():
    z, d = torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor([[0.5, -0.5], [2.0, 1.0]])
    assert output_error_loss(z, d).item() == pytest.approx(((0.5 - 1.0) + (6.0 - 1.0)) / 2)


def test_no_captured_output_error_for_a_batch_an_update_or_a_bias_free_last_layer():
    assert captured_output_error(_capture(_net(), b=2)[0]) is None
    fedavg = Protocol(scheme="fedavg", batch_size=1, local_steps=1, lr=0.1)
    from gi.world.fl.victim import simulate_client

    update = simulate_client(_net(), (torch.rand(1, 3, 8, 8), torch.tensor([1])), fedavg)[0]
    assert captured_output_error(update) is None
    assert captured_output_error(_capture(_net(bias_last=False))[0]) is None


def test_output_errors_resolve_auto_and_refuse_captured_where_the_capture_cannot_give_it():
    single, batch = _capture(_net())[0], _capture(_net(), b=2)[0]
    assert output_errors([single], "simulated") is None
    assert output_errors([single], "auto", joint=True) is None  # DLG's joint labels keep the simulated error
    assert torch.equal(output_errors([single, single], "auto")[1], captured_output_error(single))
    assert output_errors([batch], "auto") is None
    with pytest.raises(ConfigError, match="2 samples"):
        output_errors([batch], "captured")
    with pytest.raises(ConfigError, match="no bias gradient"):
        output_errors([_capture(_net(bias_last=False))[0]], "captured")


def test_config_refuses_captured_with_joint_labels_and_unknown_values():
    with pytest.raises(ConfigError, match="joint labels have nothing to fit"):
        ReconConfig(output_error="captured", labels="joint")
    with pytest.raises(ConfigError, match="attack.output_error='frozen'"):
        ReconConfig(output_error="frozen")


def test_with_the_captured_error_wrong_labels_do_not_move_the_objective_at_the_truth():
    """Simulated: wrong slot labels make the true image's gradient differ from the capture's. Captured: the labels
    do not enter the dummy gradient, which is the capture's exactly at the true image (objective 0)."""
    capture, truth, x = _capture(_net("tanh"))
    wrong = LabelResult.from_counts("wrong", torch.roll(truth.counts, 1))
    values = {}
    for mode in ("simulated", "captured"):
        cfg = ReconConfig(objective="l2", regularizers={}, output_error=mode, **FAST)
        module = GradientInversion(build_problem([capture], [wrong], cfg), cfg)
        assert module.captured_error == (mode == "captured")
        with torch.no_grad():
            values[mode] = float(module.objective(x.reshape(1, 1, 3, 8, 8))[0][0])
    assert values["simulated"] > 1e-3
    assert values["captured"] < 1e-10


def test_vmap_and_loop_give_the_same_captured_objective():
    capture, truth, _ = _capture(_net())
    cfg = ReconConfig(objective="l2", restarts=3, output_error="captured", **FAST)
    loop = GradientInversion(build_problem([capture], [truth], dataclasses.replace(cfg, batching="loop")), cfg)
    vmapped = GradientInversion(build_problem([capture], [truth], dataclasses.replace(cfg, batching="vmap")), cfg)
    images = torch.rand(3, 1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loop.objective(images)[0], vmapped.objective(images)[0], rtol=1e-5, atol=1e-8)


def test_reconstruct_many_records_the_resolved_output_error_and_culls_with_it():
    (c1, l1, _), (c2, l2, _) = _capture(_net(), seed=0), _capture(_net(), seed=1)
    cfg = ReconConfig(restarts=2, cull_after=1, output_error="auto", **FAST)
    recs = reconstruct_many([c1, c2], [l1, l2], None, cfg)
    assert [r.history["output_error"] for r in recs] == ["captured", "captured"]
    batch, lb, _ = _capture(_net(), b=2)
    assert reconstruct_many([batch], [lb], None, cfg)[0].history["output_error"] == "simulated"
