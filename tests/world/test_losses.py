import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gi.core.errors import ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.losses import as_soft_targets, binary_cross_entropy, focal_loss, loss_for, soft_cross_entropy


def _logits(seed=0, b=4, c=5):
    return torch.randn(b, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64, requires_grad=True)


def test_focal_gamma0_alpha1_gradients_equal_cross_entropy():
    z = _logits()
    y = torch.tensor([0, 2, 4, 1])
    g_focal = torch.autograd.grad(focal_loss(z, y, alpha=1.0, gamma=0.0), z)[0]
    g_ce = torch.autograd.grad(soft_cross_entropy(z, y), z)[0]
    assert torch.allclose(g_focal, g_ce, atol=1e-12)
    assert torch.allclose(g_ce, (torch.softmax(z, 1) - as_soft_targets(y, 5, z.dtype)) / 4, atol=1e-12)


def test_focal_gradient_matches_theorem1_phi():
    """Posterior paper, Table 1: ∇z = Φ(α_c, p_c, γ)(p − y)/τ for one-hot y, mean over the batch."""
    z, y, gamma, tau = _logits(1, 1, 6), torch.tensor([3]), 2.0, 1.3
    g = torch.autograd.grad(focal_loss(z, y, alpha=0.7, gamma=gamma, temperature=tau), z)[0][0]
    p = torch.softmax(z.detach() / tau, 1)[0]
    pc = p[3]
    phi = 0.7 * (1 - pc) ** gamma * (1 - gamma * pc * torch.log(pc) / (1 - pc))
    expected = phi * (p - torch.nn.functional.one_hot(y, 6)[0]) / tau
    assert torch.allclose(g, expected, atol=1e-10)


def test_bce_gradient_is_sigma_minus_y():
    z = _logits(2)
    y = torch.tensor([1, 0, 3, 3])
    g = torch.autograd.grad(binary_cross_entropy(z, y), z)[0]
    assert torch.allclose(g, (torch.sigmoid(z) - as_soft_targets(y, 5, z.dtype)) / 4, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.floats(0.5, 3.0), st.integers(0, 1000))
def test_temperature_scales_ce_gradient(tau, seed):
    z = _logits(seed)
    y = torch.softmax(torch.randn(4, 5, dtype=torch.float64), 1)
    g = torch.autograd.grad(soft_cross_entropy(z, y, tau), z)[0]
    assert torch.allclose(g, (torch.softmax(z / tau, 1) - y) / (tau * 4), atol=1e-10)


def test_loss_registry_and_bad_targets():
    z = _logits()
    assert torch.isclose(loss_for(Protocol(loss="ce"))(z, torch.tensor([0, 1, 2, 3])),
                         soft_cross_entropy(z, torch.tensor([0, 1, 2, 3])))
    with pytest.raises(ConfigError, match="targets must be"):
        soft_cross_entropy(z, torch.zeros(4, 3))
