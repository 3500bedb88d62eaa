"""The decoupled BatchNorm train-mode attack (gi.attack.recon.batchnorm_decoupled; docs/results/batchnorm.md): with
the batch statistics a one-step FedAvg update's buffers give, the simulated client's parameter gradient is the
train-mode client's, exactly; the custom backward is differentiable; a capture without buffers is one line."""

import copy

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from fcn_analytic.batchnorm import batch_statistics
from gi.attack.recon.batchnorm_decoupled import (
    DecoupledBatchNorm,
    batch_norm_layers,
    decoupled_model,
    train_mode_batch_norm,
)
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.problem import build_problem, same_model
from gi.attack.recon.simulate import gradient_simulator, update_simulator
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build

B = 8


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _client(name: str, options: dict, size: int = 32, seed: int = 0):
    """A float64 zoo model at θ⁰, and one FedAvg client step of B random images in train mode (its capture carries
    the BatchNorm buffers before and after)."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(B, 3, size, size, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 10, (B,), generator=gen)
    model = build(name, 10, in_shape=(3, size, size), seed=0, **options).double()
    protocol = Protocol(scheme="fedavg", batch_size=B, lr=0.01, model_mode="train")
    capture, truth = simulate_client(model, (images, labels), protocol, rng=torch.Generator().manual_seed(0))
    return model, capture, truth


def _theta0(capture) -> torch.nn.Module:
    """The capture's global model in float64 with θ⁰ loaded at full precision (``Capture.model`` rebuilds it)."""
    model = capture.model().double()
    model.load_state_dict(capture.model_state)
    return model


def _relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over every tensor together."""
    diff = sum(float((a[k] - b[k]).pow(2).sum()) for k in b)
    return (diff / sum(float(b[k].pow(2).sum()) for k in b)) ** 0.5


@pytest.mark.parametrize("name, options", [("resnet32", {}), ("convnet", {"width": 4})])
def test_the_decoupled_gradient_is_the_train_mode_clients(name, options):
    """On the truth, with the statistics batch_statistics recovers from the client's buffers: the decoupled model's
    parameter gradient equals the train-mode gradient (1e-5 relative; ~1e-12 in float64), and the attack's
    unrolled client reproduces the captured update, every layer before a BatchNorm included. A plain
    fixed-statistics forward (eval-mode BatchNorm) does not."""
    model, capture, truth = _client(name, options)
    stats = batch_statistics(capture)
    decoupled = decoupled_model(_theta0(capture), stats)
    assert sum(isinstance(m, DecoupledBatchNorm) for m in decoupled.modules()) == len(stats) >= 8
    x, y = truth.images.double(), truth.labels
    client = copy.deepcopy(model).train()
    reference = dict(zip([n for n, _ in client.named_parameters()], torch.autograd.grad(
        torch.nn.functional.cross_entropy(client(x), y), list(client.parameters()))))
    ours = dict(zip([n for n, _ in decoupled.named_parameters()], torch.autograd.grad(
        torch.nn.functional.cross_entropy(decoupled(x), y), list(decoupled.parameters()))))
    assert ours.keys() == reference.keys()
    error = _relative(ours, reference)
    print(f"{name}: decoupled vs train-mode gradient, relative {error:.2e}")
    assert error < 1e-5
    first = next(iter(reference))  # the first convolution: before every BatchNorm
    assert _relative({first: ours[first]}, {first: reference[first]}) < 1e-5
    names = list(capture.update)
    simulated, _ = update_simulator(decoupled, capture.protocol, names, num_samples=B)(x, truth.targets.double())
    update_error = _relative(simulated, capture.update)
    print(f"{name}: unrolled decoupled client vs captured update, relative {update_error:.2e}")
    assert update_error < 1e-5
    frozen = copy.deepcopy(model).eval()  # the running statistics replaced by the batch's: eval-mode forward
    for layer, (mean, var) in stats.items():
        frozen.get_submodule(layer).running_mean.copy_(mean)
        frozen.get_submodule(layer).running_var.copy_(var)
    plain = dict(zip(reference, torch.autograd.grad(
        torch.nn.functional.cross_entropy(frozen(x), y), list(frozen.parameters()))))
    assert _relative({first: plain[first]}, {first: reference[first]}) > 1e-2


def test_the_custom_backward_is_train_mode_batchnorm_and_differentiable():
    """gradcheck on the truth (the statistics recomputed from x at every numerical probe, so the forward is
    train-mode BatchNorm and the analytic backward must be its Jacobian); gradgradcheck with fixed statistics off
    the truth (the attack differentiates the simulated gradient again: the backward's own derivatives)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)

    def on_truth(x, w, b):
        dims = (0, 2, 3)
        return train_mode_batch_norm(x, x.detach().mean(dims), x.detach().var(dims, unbiased=False), w, b, 1e-5)

    assert gradcheck(on_truth, (x, w, b))
    y = on_truth(x, w, b)
    torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, None, None, w, b, True, 0.1, 1e-5))
    mean = torch.randn(3, generator=gen, dtype=torch.float64)
    var = torch.rand(3, generator=gen, dtype=torch.float64) + 0.5
    assert gradgradcheck(lambda x, w, b: train_mode_batch_norm(x, mean, var, w, b, 1e-5), (x, w, b))
    assert gradgradcheck(lambda x: train_mode_batch_norm(x, mean, var), (x,))  # affine=False
    flat = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)  # BatchNorm1d's (N, C)
    assert gradcheck(lambda x: train_mode_batch_norm(x, x.detach().mean(0), x.detach().var(0, unbiased=False)),
                     (flat,))


def test_torch_func_and_autograd_agree_to_second_order():
    """The attack's two paths (vmap over rows of torch.func.grad, and autograd.grad(create_graph) one row at a time)
    give the same simulated gradient and the same derivative of a gradient-matching objective in the images."""
    model = build("cnn", 10, in_shape=(3, 8, 8), seed=0, batch_norm=True, channels=[4], hidden=0).double()
    (layer,) = [n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    gen = torch.Generator().manual_seed(1)
    stats = {layer: (torch.randn(4, generator=gen, dtype=torch.float64),
                     torch.rand(4, generator=gen, dtype=torch.float64) + 0.5)}
    net = decoupled_model(model, stats)
    for p in net.parameters():
        p.requires_grad_(False)
    names = [n for n, _ in net.named_parameters()]
    protocol = Protocol(batch_size=3)
    x = torch.rand(2, 3, 3, 8, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2], [3, 3, 4]]), 10).double()
    vectorised = gradient_simulator(net, protocol, names)
    g = torch.func.vmap(lambda a, b: vectorised(a, b)[0])(x, y)
    objective = sum(t.pow(2).sum() for t in g.values())
    (dx,) = torch.autograd.grad(objective, x)
    one = gradient_simulator(net, protocol, names, autograd=True)
    rows = [one(x[i], y[i])[0] for i in range(2)]
    (dx_loop,) = torch.autograd.grad(sum(t.pow(2).sum() for r in rows for t in r.values()), x)
    for k in names:
        torch.testing.assert_close(g[k], torch.stack([r[k] for r in rows]))
    torch.testing.assert_close(dx, dx_loop)
    assert float(dx.abs().max()) > 0


def test_the_decoupled_model_leaves_the_model_as_it_was():
    _, capture, _ = _client("cnn", {"batch_norm": True, "channels": [4, 8], "hidden": 0}, size=8)
    model = _theta0(capture)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    net = decoupled_model(model, batch_statistics(capture))
    with torch.no_grad():
        net.train()(torch.rand(B, 3, 8, 8, dtype=torch.float64))
    for p in net.parameters():
        p.data.add_(1.0)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    layers = batch_norm_layers(model)
    assert len(layers) == 2 and all(type(model.get_submodule(n)) is torch.nn.BatchNorm2d for n in layers)
    assert all(isinstance(net.get_submodule(n), DecoupledBatchNorm) for n in layers)
    assert {n for n, _ in net.named_parameters()} == {n for n, _ in model.named_parameters()}


def test_what_the_decoupled_attack_cannot_use_is_one_line():
    model = build("cnn", 10, in_shape=(3, 8, 8), seed=0, batch_norm=True, channels=[4], hidden=0)
    images, labels = torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))
    cfg = ReconConfig(bn_stats="decoupled", iterations=1, progress=False)
    evaluated, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=4),
                                   rng=torch.Generator().manual_seed(0))  # eval mode: no buffers sent
    with pytest.raises(CaptureError, match="attack.bn_stats=decoupled .* carries no buffers .* or set "
                                           "attack.bn_stats=shared") as info:
        build_problem([evaluated], [None], cfg)
    assert "\n" not in str(info.value)
    fedsgd, _ = capture_gradients(model, images, labels, Protocol(batch_size=4, model_mode="train"))
    with pytest.raises(CaptureError, match="attack.bn_stats=decoupled .* FedSGD gradients"):
        build_problem([fedsgd], [None], cfg)
    with pytest.raises(ConfigError, match="attack.bn_stats='exact' is not allowed"):
        ReconConfig(bn_stats="exact")
    with pytest.raises(CaptureError, match="no batch statistics for the model's BatchNorm layer.s. \\['body.1'\\]"):
        decoupled_model(model, {})
    with pytest.raises(CaptureError, match="\\['body.0'\\], which are not BatchNorm layers"):
        decoupled_model(model, {n: (torch.zeros(4), torch.ones(4)) for n in ("body.0", "body.1")})
    plain = build("cnn", 10, in_shape=(3, 8, 8), seed=0, channels=[4], hidden=0)
    with pytest.raises(CaptureError, match="has none"):
        decoupled_model(plain, {})


def test_captures_of_other_buffers_are_not_packed_when_decoupled():
    model = build("cnn", 10, in_shape=(3, 8, 8), seed=0, batch_norm=True, channels=[4], hidden=0)
    protocol = Protocol(scheme="fedavg", batch_size=4, model_mode="train")
    a, _ = simulate_client(model, (torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))), protocol)
    b, _ = simulate_client(model, (torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))), protocol)
    assert same_model(a, b) and not same_model(a, b, buffers=True) and same_model(a, a, buffers=True)
    with pytest.raises(ConfigError, match="also the buffers"):
        build_problem([a, b], [None, None], ReconConfig(bn_stats="decoupled", labels="joint", iterations=1))


@pytest.mark.parametrize("path", ["configs/batchnorm/stats.yaml", "configs/batchnorm/groupnorm.yaml"])
def test_the_batchnorm_configs_load(path):
    from gi.core.config import load
    from gi.experiments.config.run import RunConfig

    cfg = load(RunConfig, path, [])
    assert cfg.protocol.model_mode == "train" and cfg.model.name == "resnet32" and cfg.attack.preset == "resnet"
    if path.endswith("stats.yaml"):  # one local step over the client's 8 images: the buffers give its statistics
        assert cfg.attack.decoupled_bn and cfg.protocol.scheme == "fedavg"
        assert cfg.protocol.num_samples == cfg.protocol.batch_size == 8 and cfg.protocol.local_epochs == 1
    else:
        assert cfg.model.options == {"norm_layer": "group"} and not cfg.attack.decoupled_bn
