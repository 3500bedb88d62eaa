"""A user's own model that gi cannot call is a one-line error at the door (docs/guarantees.md, "Bad configs fail
before any work"): a forward that returns a tuple or a dict (HuggingFace-style ``(logits, aux)``), a first layer
built for other channels than the images, in every entry point that receives a module (the FedSGD and update
clients, ``Capture.from_gradients`` / ``from_update``, ``model.factory`` of a victim setup) and in the attack of a
capture whose rebuilt model does not fit it (``gi.attack.run``, ``gi attack``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gi
from gi.core.errors import CaptureError, ConfigError
from gi.world.models import from_factory

CALLS: list[str] = []  # every forward pass of the models below


class PlainNet(nn.Module):
    def __init__(self, channels: int = 3, classes: int = 4, size: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3, padding=1)
        self.fc = nn.Linear(4 * size * size, classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        CALLS.append(type(self).__name__)
        return self.fc(torch.sigmoid(self.conv(x)).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)


class TupleNet(PlainNet):
    def forward(self, x):
        z = self.logits(x)
        return z, z.square().mean()


class DictNet(PlainNet):
    def forward(self, x):
        return {"logits": self.logits(x), "hidden": x}


class MLP(nn.Module):
    def __init__(self, features: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.flat, self.fc = nn.Flatten(), nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(self.flat(x))


def plain(channels: int = 3, seed: int = 0) -> PlainNet:
    torch.manual_seed(seed)
    return PlainNet(channels)


def tuple_net(seed: int = 0, size: int = 8) -> TupleNet:
    torch.manual_seed(seed)
    return TupleNet(size=size)


def grey_net(seed: int = 0) -> PlainNet:
    return plain(1, seed)


def data(n: int = 2, channels: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, channels, 8, 8, generator=g), torch.arange(n) % 4


def entry_points():
    """Every entry point that receives a module, as ``(name, call(model))``, on RGB 8×8 images."""
    x, y = data()
    fedavg = gi.Protocol(scheme="fedavg", local_steps=2, batch_size=1, lr=0.1)

    def zeros(m):
        return {k: torch.zeros_like(p) for k, p in m.named_parameters()}

    return [
        ("capture_gradients", lambda m: gi.capture_gradients(m, x, y, gi.Protocol())),
        ("simulate_client", lambda m: gi.simulate_client(m, (x, y), fedavg)),
        ("from_gradients", lambda m: gi.Capture.from_gradients(m, zeros(m), gi.Protocol(), 2, in_shape=(3, 8, 8))),
        ("from_update", lambda m: gi.Capture.from_update(m, m.state_dict(), fedavg, 2, in_shape=(3, 8, 8))),
    ]


ENTRIES = [name for name, _ in entry_points()]


def _call(entry: str, model: nn.Module):
    return dict(entry_points())[entry](model)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("cls, what", [(TupleNet, r"returns a tuple of 2 \(Tensor \(1, 4\), Tensor \(\)\)"),
                                       (DictNet, r"returns a dict with keys \['logits', 'hidden'\]")])
def test_a_forward_that_returns_a_tuple_or_a_dict_is_refused_at_the_door(entry, cls, what):
    torch.manual_seed(0)
    model = cls()
    CALLS.clear()
    with pytest.raises(ConfigError, match=what + r", not the logits tensor \(B, classes\).*out\[0\] or "
                                               r"out\['logits'\]") as exc:
        _call(entry, model)
    one_line(exc)
    assert CALLS == [cls.__name__]  # one probe of one image: the client never ran
    _call(entry, plain())  # the same model returning its logits goes through


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_first_layer_built_for_other_channels_is_named_at_the_door(entry):
    model = grey_net()
    CALLS.clear()
    with pytest.raises(ConfigError, match=r"first layer 'conv' \(Conv2d\) takes 1 input channels but the images of "
                                          r"shape \[3, 8, 8\] give it 3: build the model") as exc:
        _call(entry, model)
    one_line(exc)
    assert CALLS == ["PlainNet"]  # one probe, stopped at the convolution: the client never ran


def test_a_first_linear_layer_of_another_size_and_other_failures_are_one_line():
    x, y = data()
    with pytest.raises(ConfigError, match=r"first layer 'fc' \(Linear\) takes 64 input features but the images of "
                                          r"shape \[3, 8, 8\] give it 192") as exc:
        gi.capture_gradients(MLP(64), x, y, gi.Protocol())
    one_line(exc)

    class Broken(PlainNet):
        def forward(self, x):
            raise ValueError("no\nsecond line")

    with pytest.raises(ConfigError, match=r"forward pass fails on one image of shape \[3, 8, 8\]: ValueError: no; "
                                          "it must take images") as exc:
        gi.capture_gradients(Broken(), x, y, gi.Protocol())
    one_line(exc)
    gi.capture_gradients(MLP(192), x, y, gi.Protocol())


def test_model_factory_of_a_victim_setup_is_checked_before_training(monkeypatch):
    from gi.world import build, setup

    monkeypatch.setattr(build, "train_on", lambda *a, **k: pytest.fail("trained a model that cannot be called"))
    x, y = data(4)
    images = type("Images", (), {"images": x, "labels": y, "num_classes": 4})()
    for factory, match in ((f"{__name__}:tuple_net", r"model.factory='.*:tuple_net': the model's forward returns a "
                                                     "tuple"),
                           (f"{__name__}:grey_net", r"model.factory='.*:grey_net': the model's first layer 'conv'")):
        with pytest.raises(ConfigError, match=match) as exc:
            build.build_model(setup.ModelConfig(factory=factory), images, seed=0)
        one_line(exc)
    assert isinstance(build.build_model(setup.ModelConfig(factory=f"{__name__}:plain"), images, seed=0), PlainNet)


def test_gi_run_with_a_tuple_model_factory_exits_2_with_one_line(tmp_path, capsys):
    from gi.cli import main

    out = tmp_path / "run"
    assert main(["run", "configs/demo.yaml", f"model.factory={__name__}:tuple_net",
                 "model.options.size=32", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gi run: error: model.factory=") and "returns a tuple" in err and "\n" not in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_attacked_capture_whose_rebuilt_model_returns_a_tuple_is_refused_before_the_stages(tmp_path, monkeypatch):
    """A capture of a plain model, read back with a factory whose forward returns a tuple (same parameters):
    ``gi.attack.run`` and ``gi attack`` refuse it in one line before the label stage runs."""
    import labels
    from gi.cli import main

    x, y = data(1)
    capture, _ = gi.capture_gradients(from_factory(f"{__name__}:plain"), x, y, gi.Protocol())
    capture.save(tmp_path / "cap" / "capture.safetensors")
    monkeypatch.setattr(labels, "recover", lambda *a, **k: pytest.fail("the label stage ran"))
    loaded = gi.Capture.load(tmp_path / "cap" / "capture.safetensors", factory=tuple_net)
    with pytest.raises(CaptureError, match=r"capture of model '.*:plain': the model's forward returns a tuple") as exc:
        gi.attack.run(loaded)
    one_line(exc)
    out = tmp_path / "out"
    assert main(["attack", str(tmp_path / "cap"), f"model={__name__}:tuple_net", f"out={out}"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("build", [
    lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)),
    lambda: Widened(32),
], ids=["sequential", "class-with-arguments"])
def test_an_in_process_capture_of_a_model_that_needs_arguments_rebuilds_and_attacks(build):
    """docs/usage.md "Your own model": any classifier module works in the process that made it, also one whose
    class rebuilds empty or fails without arguments (nn.Sequential, a class taking a width): the capture keeps a
    copy of its structure, and the attack answers (one ReLU image through a fully-connected net: analytic)."""
    import gi
    from gi.world.fl.protocol import Protocol

    torch.manual_seed(0)
    net = build()
    x, y = torch.rand(1, 3, 8, 8), torch.tensor([2])
    loss = torch.nn.functional.cross_entropy(net(x), y)
    grads = dict(zip([n for n, _ in net.named_parameters()], torch.autograd.grad(loss, list(net.parameters()))))
    capture = gi.Capture.from_gradients(net, grads, Protocol(), 1, in_shape=(3, 8, 8))
    with torch.no_grad():
        net[-1].weight.add_(1.0) if isinstance(net, torch.nn.Sequential) else net.head.weight.add_(1.0)
    rebuilt = capture.model()  # the capture's state, not the model's later weights
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in capture.model_state.items())
    result = gi.attack.run(capture, iterations=20, progress=False)
    assert result.verdict.labels == [[2]]
    assert float((result.reconstructions[0].images - x).abs().max()) < 1e-3


class Widened(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, width), torch.nn.ReLU())
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.body(x))
