"""The FL-scheme registry: one entry is a whole scheme for the victim, the unrolled client and RLU."""


import pytest
import torch

from gi.attack.recon.simulate import update_simulator
from gi.core.errors import ConfigError
from gi.world.fl import SCHEMES, Protocol, Scheme, get_scheme, local_train, register_scheme
from gi.world.fl.victim import run_federation, simulate_client
from labels.rlu import history_offset, impulse_rho, scheme_rho
from tests.factories import random_batch


def _cnn() -> torch.nn.Module:
    from gi.world.models import build

    return build("lenet5", 4, in_shape=(1, 28, 28), seed=0)


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(n, (1, 28, 28), 4, seed)


@pytest.fixture
def toy_scheme():
    """A scheme the code base has never seen: a proximal pull plus a constant read from its own history term."""

    def constant(protocol, history, num_steps):
        return 0.5 * history("toy.offset") / num_steps

    def client_state(protocol, history, update, num_steps):
        return {k: history[k] + update[k.split("/", 1)[1]] for k in history}

    scheme = register_scheme(Scheme("toy", shares="update", summary="test scheme", history=("toy.offset",),
                                    pull=lambda p: 0.7, constant=constant, client_state=client_state))
    yield scheme
    del SCHEMES["toy"]


def test_every_scheme_is_registered_once_with_a_valid_kind():
    assert {"fedsgd", "fedavg", "fedprox", "scaffold", "feddyn", "feddc"} <= set(SCHEMES)
    assert SCHEMES["fedsgd"].shares == "gradient" and not Protocol().is_update
    with pytest.raises(ValueError, match="twice"):
        register_scheme(Scheme("fedavg", shares="update", summary="again"))
    with pytest.raises(ValueError, match="shares"):
        Scheme("bad", shares="weights", summary="")
    with pytest.raises(ConfigError, match="valid"):
        Protocol(scheme="fednova")
    with pytest.raises(ConfigError, match="valid"):
        get_scheme("fedsgd", shares="update")


def test_term_is_pull_times_offset_plus_constant():
    p = Protocol(scheme="feddyn", feddyn_alpha=0.25)
    theta, theta0, const = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.0]), torch.tensor([0.1, -0.1])
    torch.testing.assert_close(SCHEMES["feddyn"].term(p, theta, theta0, const), torch.tensor([0.225, 0.4]))
    assert SCHEMES["fedavg"].term(Protocol(scheme="fedavg"), theta, theta0, None) is None


def test_local_train_exact_on_a_quadratic():
    """Loss ½‖θ‖² (gradient θ), FedProx μ: θ ← θ − η(θ + μ(θ − θ⁰)) = (1 − η(1 + μ))θ + ημθ⁰, in closed form."""
    p = Protocol(scheme="fedprox", prox_mu=0.5, lr=0.1)
    theta0 = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    out = local_train(theta0, p, 3, lambda theta, tau: {"w": theta["w"]})
    expected = theta0["w"].clone()
    for _ in range(3):
        expected = (1 - 0.1 * 1.5) * expected + 0.1 * 0.5 * theta0["w"]
    torch.testing.assert_close(out["w"], expected)


def test_a_new_scheme_is_one_registry_entry(toy_scheme):
    """Victim, unrolled client, federation and RLU's scheme factors all work from the entry alone."""
    model = _cnn()
    x, y = _data(6)
    protocol = Protocol(scheme="toy", batch_size=6, lr=0.1, local_epochs=2)
    g = torch.Generator().manual_seed(3)
    history = {f"toy.offset/{n}": 0.1 * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    capture, truth = simulate_client(model, (x, y), protocol, torch.Generator().manual_seed(1), history=history)
    sim = update_simulator(capture.model(), capture.protocol, list(capture.update), num_samples=6,
                           history=capture.history)
    upd, _ = sim(truth.images, truth.targets)
    for k, v in capture.update.items():
        torch.testing.assert_close(upd[k], v, rtol=1e-4, atol=1e-6)
    # RLU: ρ from the pull, h from the constant; Δb = −η Σ_τ ρ_τ g_τ − h holds exactly on the victim's bias
    rho = scheme_rho(protocol, 2)
    torch.testing.assert_close(rho, impulse_rho(protocol, 2))
    torch.testing.assert_close(rho, torch.tensor([1 - 0.1 * 0.7, 1.0], dtype=torch.float64))
    g_steps = truth.extra["step_bias_grad"]
    h = history_offset(capture, "fc.bias", rho)
    predicted = -protocol.lr * (rho.unsqueeze(1) * g_steps).sum(0) - h
    torch.testing.assert_close(capture.update["fc.bias"].double(), predicted, rtol=1e-5, atol=1e-7)
    fed = run_federation(model, (x, y), protocol, num_clients=2, rounds=2, alpha=None,
                         partition=[torch.arange(3), torch.arange(3, 6)], capture_rounds=[2])
    assert len(fed.captures) == 2 and set(fed.client_states[0]) == {f"toy.offset/{n}" for n, _ in
                                                                     model.named_parameters()}
    assert any(float(v.abs().sum()) > 0 for v in fed.client_states[0].values())  # client_state ran


@pytest.mark.parametrize("scheme", ["scaffold", "feddyn", "feddc"])
def test_federation_history_evolves_per_scheme(scheme):
    """After a round the client's history follows the scheme's rule and the next round's capture carries it."""
    model = _cnn()
    x, y = _data(8)
    protocol = Protocol(scheme=scheme, batch_size=4, lr=0.1, feddyn_alpha=0.3, feddc_alpha=0.3)
    fed = run_federation(model, (x, y), protocol, num_clients=2, rounds=2, alpha=None,
                         partition=[torch.arange(4), torch.arange(4, 8)], capture_rounds=[1, 2])
    first = {c: cap for t, c, cap, _ in fed.captures if t == 1}
    second = {c: cap for t, c, cap, _ in fed.captures if t == 2}
    name = "fc.bias"
    d = first[0].update[name]
    if scheme == "feddyn":
        torch.testing.assert_close(second[0].history[f"feddyn.sum_updates/{name}"], d)
    elif scheme == "feddc":
        torch.testing.assert_close(second[0].history[f"feddc.drift/{name}"], d)
        torch.testing.assert_close(second[0].history[f"feddc.prev_local/{name}"], d)
        mean = sum(0.5 * first[c].update[name] for c in (0, 1))
        torch.testing.assert_close(second[1].history[f"feddc.prev_global/{name}"], mean)
    else:  # Scaffold option II, c = c_k = 0 in round 1, one step (N_k = B): c_k ← −Δθ/η; c ← mean of the c_k
        ck = [-first[c].update[name] / protocol.lr for c in (0, 1)]
        torch.testing.assert_close(second[0].history[f"scaffold.c_k/{name}"], ck[0])
        torch.testing.assert_close(second[1].history[f"scaffold.c/{name}"], 0.5 * ck[0] + 0.5 * ck[1])


def test_plain_first_step_is_a_property_of_the_scheme():
    from gi.world.fl.schemes import SCHEMES

    plain = {name for name, scheme in SCHEMES.items() if scheme.plain_first_step}
    assert plain == {"fedavg", "fedprox"}  # FedSGD shares a gradient; Scaffold, FedDyn, FedDC add history terms
