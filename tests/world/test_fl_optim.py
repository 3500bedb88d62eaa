"""The client's local update rules equal torch.optim step for step; simulate_client trains with them."""

from __future__ import annotations

import pytest
import torch

import labels
from gi.core.errors import ConfigError
from gi.world.data import ImageDataset
from gi.world.fl.optim import LINEAR, RULES, LocalOptimizer
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build

TORCH = {
    "sgd": lambda p, pr: torch.optim.SGD(p, lr=pr.lr),
    "sgdm": lambda p, pr: torch.optim.SGD(p, lr=pr.lr, momentum=pr.momentum),
    "nesterov": lambda p, pr: torch.optim.SGD(p, lr=pr.lr, momentum=pr.momentum, nesterov=True),
    "adadelta": lambda p, pr: torch.optim.Adadelta(p, lr=pr.lr, rho=pr.adadelta_rho, eps=pr.adadelta_eps),
}


def test_every_protocol_optimizer_has_a_rule():
    assert set(RULES) == set(TORCH)
    assert set(LINEAR) < set(RULES)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_rule_trajectory_equals_torch_optim(name):
    """Ten steps on two parameters with random gradients: same parameters as torch.optim to 1e-14."""
    protocol = Protocol(optimizer=name, lr=0.3, momentum=0.8, adadelta_rho=0.85, adadelta_eps=1e-5)
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
    grads = [[torch.randn(p.shape, generator=g, dtype=torch.float64) for p in start] for _ in range(10)]
    ours = [p.clone() for p in start]
    theirs = [p.clone().requires_grad_(True) for p in start]
    rule, reference = LocalOptimizer(protocol), TORCH[name](theirs, protocol)
    for step in grads:
        for i, (p, d) in enumerate(zip(ours, step)):
            p.sub_(rule.displacement(i, d))
        for p, d in zip(theirs, step):
            p.grad = d.clone()
        reference.step()
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b.detach(), atol=1e-14, rtol=0)
    assert not torch.allclose(ours[0], start[0])


def _setup():
    g = torch.Generator().manual_seed(1)
    images, y = torch.rand(40, 1, 6, 6, generator=g, dtype=torch.float64), torch.arange(40) % 4
    model = build("cnn", 4, in_shape=(1, 6, 6), seed=0).double()
    return model, images, y


def test_adadelta_client_matches_torch_and_only_decaf_reads_it():
    model, images, y = _setup()
    protocol = Protocol(scheme="fedavg", optimizer="adadelta", lr=1.0, batch_size=40, local_epochs=3)
    capture, _ = simulate_client(model, (images, y), protocol, torch.Generator().manual_seed(0))
    reference = build("cnn", 4, in_shape=(1, 6, 6), seed=0).double()
    opt = torch.optim.Adadelta(reference.parameters(), lr=1.0)
    for _ in range(3):  # full batch: the shuffle does not change the mean loss
        opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(images), y).backward()
        opt.step()
    for name, p in reference.named_parameters():
        assert torch.allclose(capture.update[name], p.detach() - model.state_dict()[name], atol=1e-12)
    decaf = labels.recover(capture, "decaf", aux=ImageDataset(images, y, 4))
    assert decaf.ok and float(decaf.proportions.sum()) == pytest.approx(1.0)
    for method in ("rlu", "dist-init-bias", "dist-soft-label-path"):
        with pytest.raises(ConfigError, match="linear"):
            labels.recover(capture, method, aux=ImageDataset(images, y, 4))


def test_bad_adadelta_settings():
    with pytest.raises(ConfigError, match="adadelta_rho"):
        Protocol(optimizer="adadelta", adadelta_rho=1.0)
    with pytest.raises(ConfigError, match="adadelta"):
        Protocol(optimizer="adadelta", adadelta_eps=0.0)
    model, images, y = _setup()
    capture, _ = simulate_client(model, (images, y), Protocol(scheme="fedprox", prox_mu=0.1, optimizer="adadelta",
                                                              batch_size=8), torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="FedAvg"):
        labels.recover(capture, "decaf", aux=ImageDataset(images, y, 4))
