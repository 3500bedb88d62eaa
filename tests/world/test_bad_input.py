"""No wrong result reported as valid: out-of-range DP parameters, degenerate captures, headers that name the wrong
last layer, and folder datasets whose labels or pixels cannot be read as they are written are errors or ``ok=False``
results with the reason, never a confident number (docs/architecture.md "Conventions", errors)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gi
import labels
from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.world.data import ImageDataset, load
from gi.world.models import build

SIZE, CLASSES = 8, 4


def _images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, SIZE, SIZE, generator=g), torch.arange(n) % CLASSES


def _model(name: str = "mlp", **kw) -> nn.Module:
    return build(name, CLASSES, in_shape=(3, SIZE, SIZE), seed=0, **kw)


def _aux() -> ImageDataset:
    x, _ = _images(3 * CLASSES, seed=7)
    return ImageDataset(x, torch.arange(3 * CLASSES) % CLASSES, CLASSES)


# --------------------------------------------------------------------------- DP parameters
@pytest.mark.parametrize("params, key", [
    ({"delta": 2}, "params.delta=2"), ({"delta": 1.0}, "params.delta=1.0"), ({"delta": 0.0}, "params.delta=0.0"),
    ({"delta": -1e-5}, "params.delta=-1e-05"), ({"delta": float("nan")}, "params.delta=nan"),
    ({"max_grad_norm": 0.0}, "params.max_grad_norm=0.0"), ({"max_grad_norm": -1}, "params.max_grad_norm=-1"),
    ({"accountant": "gdp"}, "params.accountant='gdp'"),
])
def test_dp_sgd_parameters_out_of_range_are_a_config_error_when_the_protocol_is_built(params, key):
    with pytest.raises(ConfigError, match=rf"protocol.defences\[0\].{key}"):
        gi.Protocol(defences=[{"name": "dp-sgd", "strength": 1.0, "params": params}])


def test_dp_sgd_delta_out_of_range_names_the_range():
    with pytest.raises(ConfigError, match=r"δ must lie in \(0, 1\)"):
        gi.Protocol(defences=[{"name": "dp-sgd", "strength": 1.0, "params": {"delta": 2}}])


def test_dp_epsilon_is_never_negative_and_checks_its_inputs():
    pytest.importorskip("opacus")
    from gi.world.fl.defences.dpsgd import epsilon

    with pytest.raises(ConfigError, match=r"delta=2.*\(0, 1\)"):
        epsilon(1.0, 0.01, 1, 2)  # gave ε = -10.3 before
    with pytest.raises(ConfigError, match="sample rate"):
        epsilon(1.0, 0.0, 1, 1e-5)
    for accountant in ("rdp", "prv"):
        assert epsilon(1.0, 0.01, 1, 0.5, accountant) >= 0.0  # the accountants' conversions give ε < 0 here
    assert epsilon(1.0, 0.01, 1, 1e-5) > 0
    x, y = _images(2)
    protocol = gi.Protocol(defences=[{"name": "dp-sgd", "strength": 1.0, "params": {"delta": 0.5}}])
    capture, _ = gi.capture_gradients(_model(), x, y, protocol, generator=torch.Generator().manual_seed(0))
    assert capture.meta["defences"][0]["epsilon"] >= 0.0


# --------------------------------------------------------------------------- degenerate captures
def _zeroed(capture: Capture) -> Capture:
    if capture.is_update:
        return dataclasses.replace(capture, update={k: torch.zeros_like(v) for k, v in capture.update.items()})
    return dataclasses.replace(capture, gradients={k: torch.zeros_like(v) for k, v in capture.gradients.items()})


@pytest.mark.parametrize("n, method, aux", [
    (1, "auto", False), (1, "idlg", False), (1, "soft-lambda", False), (1, "ilrg", False),
    (4, "auto", False), (4, "ilrg-robust", False), (4, "ilrg", False), (4, "auto", True), (4, "posterior", True),
])
def test_an_all_zero_gradient_is_ok_false_with_the_reason(n, method, aux):
    x, y = _images(n)
    capture, _ = gi.capture_gradients(_model(), x, y, gi.Protocol())
    result = labels.recover(_zeroed(capture), method, aux=_aux() if aux else None)
    assert not result.ok and "all zero" in result.info["reason"]
    assert int(result.counts.sum()) == 0
    many = labels.recover_many([capture, _zeroed(capture)], method, aux=_aux() if aux else None)
    assert many[0].ok and not many[1].ok


def test_an_all_zero_update_is_ok_false_with_the_reason():
    x, y = _images(4)
    protocol = gi.Protocol(scheme="fedavg", batch_size=2, lr=0.1)
    capture, _ = gi.simulate_client(_model(), (x, y), protocol, torch.Generator().manual_seed(0))
    for method, aux in (("auto", None), ("auto", _aux()), ("rlu", _aux())):
        result = labels.recover(_zeroed(capture), method, aux=aux)
        assert not result.ok and "zero update" in result.info["reason"], (method, result.info)


def _forge_header(src: Path, dst: Path, **changes) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["gi"])
    meta.update(changes)
    save_file(load_file(str(src)), str(dst), metadata={"gi": json.dumps(meta)})
    return dst


@pytest.mark.parametrize("model, layer", [("lenet", "body.0"), ("mlp", "body.1")])  # a conv; a hidden Linear
def test_a_header_naming_a_layer_that_is_not_the_head_is_a_capture_error(model, layer, tmp_path):
    x, y = _images(1)
    capture, _ = gi.capture_gradients(_model(model), x, y, gi.Protocol())
    capture.save(tmp_path / "c.safetensors")
    bad = Capture.load(_forge_header(tmp_path / "c.safetensors", tmp_path / "bad.safetensors", last_layer=layer))
    for call in (lambda: labels.recover(bad, "idlg"), lambda: labels.recover(bad, "auto"), bad.check,
                 bad.validate, lambda: bad.validate(capture.model())):
        with pytest.raises(CaptureError, match=rf"last_layer='{layer}' is not a classifier head"):
            call()


def test_validate_refuses_a_last_layer_that_is_not_a_linear_module():
    x, y = _images(1)
    capture, _ = gi.capture_gradients(_model(), x, y, gi.Protocol())
    with pytest.raises(CaptureError, match=r"last_layer='fc' is not an nn.Linear of the model \(it is a Identity\)"):
        model = capture.model()
        model.fc = nn.Identity()
        capture.validate(model)


# --------------------------------------------------------------------------- folder datasets
def _pngs(folder: Path, names: list[str], size: int = 6) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(folder / name)


@pytest.mark.parametrize("label, line", [("-1", 3), ("1.5", 3), ("2e1", 3), ("cat", 3)])
def test_a_non_integer_or_negative_label_in_labels_csv_names_its_row(label, line, tmp_path):
    _pngs(tmp_path, ["a.png", "b.png", "c.png"])
    (tmp_path / "labels.csv").write_text(f"file,label\na.png,0\nb.png,{label}\nc.png,1\n")
    with pytest.raises(ConfigError, match=rf"labels.csv line {line} \('b.png,{label}'\): label '{label}' is not a "
                                          "class id"):
        load("folder", root=str(tmp_path))


def test_labels_csv_class_names_and_ids_still_read(tmp_path):
    _pngs(tmp_path / "names", ["a.png", "b.png"])
    (tmp_path / "names" / "labels.csv").write_text("a.png,cat\nb.png,dog\n")
    assert load("folder", root=str(tmp_path / "names")).classes == ["cat", "dog"]
    _pngs(tmp_path / "ids", ["a.png", "b.png"])
    (tmp_path / "ids" / "labels.csv").write_text("file,label\na.png,2\nb.png,0\n")
    ds = load("folder", root=str(tmp_path / "ids"))
    assert ds.labels.tolist() == [2, 0] and ds.num_classes == 3


def test_sixteen_bit_pngs_are_scaled_by_65535_not_clipped_to_white(tmp_path):
    from PIL import Image

    values = (np.arange(36, dtype=np.uint16).reshape(6, 6) * 1800)  # 0 … 63000
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.fromarray(values).save(tmp_path / "a" / "x.png")
    Image.fromarray(values[::-1].copy()).save(tmp_path / "b" / "y.png")
    assert Image.open(tmp_path / "a" / "x.png").mode == "I;16"
    ds = load("folder", root=str(tmp_path))
    expected = torch.from_numpy(values.astype(np.float64) / 65535).float()
    assert ds.images.shape == (2, 1, 6, 6)
    torch.testing.assert_close(ds.images[0, 0], expected, atol=0.5 / 255 + 1e-6, rtol=0)
    assert float(ds.images.mean()) < 0.6  # was 1.0 almost everywhere: clipped to white
    (tmp_path / "rgb").mkdir()
    for sub in ("a", "b"):
        (tmp_path / sub).rename(tmp_path / "rgb" / sub)
    Image.fromarray(np.zeros((6, 6, 3), dtype=np.uint8)).save(tmp_path / "rgb" / "b" / "z.png")  # a colour file
    rgb = load("folder", root=str(tmp_path / "rgb"))  # then all are read as RGB
    torch.testing.assert_close(rgb.images[0, 1], expected, atol=0.5 / 255 + 1e-6, rtol=0)


def test_labels_beyond_the_models_logits_name_both_numbers(tmp_path):
    _pngs(tmp_path / "three", ["a.png", "b.png", "c.png"], size=SIZE)
    (tmp_path / "three" / "labels.csv").write_text("a.png,0\nb.png,1\nc.png,2\n")
    data = load("folder", root=str(tmp_path / "three"))
    x = data.images.expand(-1, 3, -1, -1)
    two = build("mlp", 2, in_shape=(3, SIZE, SIZE), seed=0)
    message = r"the data has 3 classes \(labels up to 2\) but the model has 2 logits"
    with pytest.raises(ConfigError, match=message):
        gi.capture_gradients(two, x, data.labels, gi.Protocol())
    with pytest.raises(ConfigError, match=message):
        gi.simulate_client(two, ImageDataset(x, data.labels, 3), gi.Protocol(scheme="fedavg", batch_size=3),
                           torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="the data has 3 classes, the model 2 logits"):
        gi.capture_gradients(two, x, torch.full((3, 3), 1 / 3), gi.Protocol())
    with pytest.raises(ConfigError, match="class ids >= 0"):
        gi.capture_gradients(two, x, torch.tensor([0, -1, 1]), gi.Protocol())
    ten = build("mlp", 10, in_shape=(3, SIZE, SIZE), seed=0)  # fewer classes in the data than logits: fine
    capture, truth = gi.capture_gradients(ten, x[:2], data.labels[:2], gi.Protocol())
    assert capture.num_classes == 10 and truth.counts.tolist()[:2] == [1, 1]


# --------------------------------------------------------------------------- captures without an input shape
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 2, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(2 * SIZE * SIZE, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    loss = nn.functional.cross_entropy(model.eval()(x), y)
    return dict(zip([n for n, _ in model.named_parameters()], torch.autograd.grad(loss, list(model.parameters()))))


def test_a_capture_without_in_shape_is_refused_at_the_reconstruct_door_in_one_line(tmp_path, capsys):
    from gi.attack.recon import ReconConfig
    from gi.cli import main

    torch.manual_seed(0)
    model = _Net()
    x, y = _images(1)
    capture = Capture.from_gradients(model, _gradients(model, x, y), gi.Protocol(), num_samples=1)
    assert capture.model_spec["in_shape"] is None and labels.recover(capture, "idlg").ok  # labels need no shape
    with pytest.raises(CaptureError, match=r"^the capture records no input shape[^\n]*in_shape=\(C, H, W\)[^\n]*$"):
        gi.reconstruct(capture, labels.recover(capture, "idlg"), config=ReconConfig(iterations=1, progress=False))
    capture.save(tmp_path / "c.safetensors")
    code = main(["attack", str(tmp_path / "c.safetensors"), f"out={tmp_path / 'out'}", "attack.iterations=1",
                 "attack.progress=false", "trust_factory=true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("gi attack: error: the capture records no input shape")  # not TypeError
    zoo = _model()  # a zoo model records its input shape: from_gradients takes it from there
    from_zoo = Capture.from_gradients(zoo, _gradients(zoo, x, y), gi.Protocol(), num_samples=1)
    assert from_zoo.model_spec["in_shape"] == [3, SIZE, SIZE]
    given = Capture.from_gradients(model, _gradients(model, x, y), gi.Protocol(), 1, in_shape=(3, SIZE, SIZE))
    assert given.model_spec["in_shape"] == [3, SIZE, SIZE]
