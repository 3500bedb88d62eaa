"""BatchNorm batch statistics from a FedAvg update's buffers: exact for one local step, refused otherwise."""

import pytest
import torch

from fcn_analytic.batchnorm import batch_statistics
from gi.capture import Capture
from gi.core.errors import CaptureError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build


def _images(n: int, channels: int = 3, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 images (and float64 models below): the recovery divides by the momentum, which multiplies float32
    buffers' rounding by 10 (measured 2–5e-6 relative against the 1e-5 line); in float64 it is 1e-14, so the tests
    check the arithmetic, on any CPU."""
    gen = torch.Generator().manual_seed(0)
    return (torch.rand(n, channels, size, size, generator=gen, dtype=torch.float64),
            torch.randint(0, 10, (n,), generator=gen))


def _true_stats(model: torch.nn.Module, images: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each BatchNorm input's per-channel mean and biased variance over the batch, read by hooks at θ⁰ in train mode
    (every layer normalised by its batch statistics, as the client's forward), on a copy."""
    import copy

    model = copy.deepcopy(model)
    seen = {}
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, a[0].detach().double()))
             for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        model.train()(images)
    for h in hooks:
        h.remove()
    return {n: (x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)) for n, x in seen.items()}


@pytest.mark.parametrize("name, options", [("cnn", {"batch_norm": True, "channels": [4, 8], "hidden": 16}),
                                           ("convnet", {"width": 4}), ("resnet32", {"width": 4})])
def test_one_local_step_gives_the_true_batch_statistics(name, options):
    images, labels = _images(6)
    model = build(name, 10, in_shape=(3, 16, 16), seed=0, **options).double()
    truth = _true_stats(model, images)
    protocol = Protocol(scheme="fedavg", batch_size=6, lr=0.01, model_mode="train")
    capture, _ = simulate_client(model, (images, labels), protocol, rng=torch.Generator().manual_seed(0))
    stats = batch_statistics(capture)
    assert stats.keys() == truth.keys() and len(stats) >= 2
    for layer, (mean, var) in stats.items():
        tm, tv = truth[layer]
        assert torch.allclose(mean, tm, rtol=1e-5, atol=1e-5 * float(tm.abs().max())), layer
        assert torch.allclose(var, tv, rtol=1e-5, atol=1e-5 * float(tv.abs().max())), layer
    back = Capture.load(_saved(capture))  # the buffers travel in the file
    assert all(torch.equal(back.buffers[k], v) for k, v in capture.buffers.items())


def _saved(capture: Capture) -> str:
    import tempfile

    path = tempfile.mkdtemp() + "/c.safetensors"
    capture.save(path)
    return path


def test_what_the_buffers_cannot_give_is_a_clear_error():
    images, labels = _images(6)
    model = build("cnn", 10, in_shape=(3, 16, 16), seed=0, batch_norm=True, channels=[4], hidden=0).double()
    steps = Protocol(scheme="fedavg", batch_size=2, lr=0.01, model_mode="train")
    several, _ = simulate_client(model, (images, labels), steps, rng=torch.Generator().manual_seed(0))
    with pytest.raises(CaptureError, match="ran 3 local steps in train mode: .*weighted sum"):
        batch_statistics(several)
    evaluated, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6),
                                   rng=torch.Generator().manual_seed(0))
    with pytest.raises(CaptureError, match="carries no buffers"):
        batch_statistics(evaluated)
    plain = build("cnn", 10, in_shape=(3, 16, 16), seed=0, channels=[4], hidden=0).double()
    none, _ = simulate_client(plain, (images, labels), Protocol(scheme="fedavg", batch_size=6, model_mode="train"),
                              rng=torch.Generator().manual_seed(0))
    with pytest.raises(CaptureError, match="no BatchNorm layer"):
        batch_statistics(none)


def test_from_update_keeps_the_state_dicts_buffers():
    images, labels = _images(4)
    model = build("cnn", 10, in_shape=(3, 16, 16), seed=0, batch_norm=True, channels=[4], hidden=0).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    truth = _true_stats(model, images)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    opt.step()
    capture = Capture.from_update(before, model.state_dict(), Protocol(scheme="fedavg", batch_size=4,
                                                                        model_mode="train"), 4, model=model)
    (layer,) = truth
    mean, var = batch_statistics(capture)[layer]
    assert torch.allclose(mean, truth[layer][0], atol=1e-5) and torch.allclose(var, truth[layer][1], atol=1e-5)


def test_the_bn_prior_reads_the_statistics_of_the_update():
    from gi.attack.recon.problem import bn_targets

    images, labels = _images(6)
    model = build("convnet", 10, in_shape=(3, 16, 16), seed=0, width=4).double()
    truth = _true_stats(model, images)
    capture, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, model_mode="train"),
                                 rng=torch.Generator().manual_seed(0))
    targets = bn_targets(capture, capture.model(), "update")
    assert targets.keys() == truth.keys()
    assert all(torch.allclose(targets[k][0].double().flatten(), truth[k][0], atol=1e-5) for k in truth)


def test_buffers_that_are_not_the_models_are_a_capture_error():
    import dataclasses

    images, labels = _images(6)
    model = build("cnn", 10, in_shape=(3, 16, 16), seed=0, batch_norm=True, channels=[4], hidden=0).double()
    capture, _ = simulate_client(model, (images, labels), Protocol(scheme="fedavg", batch_size=6, model_mode="train"),
                                 rng=torch.Generator().manual_seed(0))
    (counter,) = [k for k in capture.buffers if k.endswith("num_batches_tracked")]
    bad = dataclasses.replace(capture, buffers={**capture.buffers, counter: torch.ones(5, dtype=torch.long)})
    with pytest.raises(CaptureError, match=f"buffers tensor '{counter}' of shape \\(5,\\) is not a buffer"):
        batch_statistics(bad)
