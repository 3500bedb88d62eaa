"""Model zoo of the papers, each as ``normalize → body → fc`` (docs/architecture.md "Public contract").

Every model built here is a :class:`GIModel`: the dataset normalisation is its first layer (so
gradients are taken w.r.t. pixel-space inputs in [0, 1]), ``body`` maps images to the penultimate
feature ``(B, D)``, and ``fc`` is the last linear layer, named ``fc.weight`` / ``fc.bias`` in every
state dict. Label and feature recovery rely on those names.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torchvision
from torch import nn

from gi.core.errors import ConfigError

LAST_WEIGHT = "fc.weight"
LAST_BIAS = "fc.bias"

NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "none": ((0.0,), (1.0,)),
}

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "elu": nn.ELU,
    "selu": nn.SELU,
    "silu": nn.SiLU,
    "leaky_relu": lambda: nn.LeakyReLU(0.2),
    "identity": nn.Identity,
}


class Normalize(nn.Module):
    """``(x − mean)/std`` per channel, as a layer (buffers travel with the state dict)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], channels: int) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).expand(channels).clone()
        std_t = torch.as_tensor(std, dtype=torch.float32).expand(channels).clone()
        self.register_buffer("mean", mean_t.view(1, -1, 1, 1))
        self.register_buffer("std", std_t.view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class GIModel(nn.Module):
    """``fc(body(normalize(x)))`` with the build arguments kept in ``spec`` (a capture rebuilds from it)."""

    def __init__(self, normalize: Normalize, body: nn.Module, fc: nn.Linear, spec: dict[str, Any]) -> None:
        super().__init__()
        self.normalize = normalize
        self.body = body
        self.fc = fc
        self.spec = spec

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate feature ``f_{N−1}`` (the input of the last layer), shape ``(B, D)``."""
        return self.body(self.normalize(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

    @property
    def feature_dim(self) -> int:
        return self.fc.in_features

    @property
    def num_classes(self) -> int:
        return self.fc.out_features


def _act(name: str) -> nn.Module:
    return ACTIVATIONS[name]()


def _swap_activations(module: nn.Module, activation: str) -> nn.Module:
    """Replace every ReLU of a torchvision net (in place, shared or not) by a fresh ``activation``."""
    for child_name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            setattr(module, child_name, _act(activation))
        else:
            _swap_activations(child, activation)
    return module


def _flat_dim(body: nn.Module, in_shape: Sequence[int]) -> int:
    with torch.no_grad():
        was = body.training
        body.eval()
        dim = body(torch.zeros(1, *in_shape)).shape[1]
        body.train(was)
    return int(dim)


# --------------------------------------------------------------------------- bodies
def _lenet_dlg(in_shape, activation, **_):
    """The DLG LeNet (Zhu et al. 2019): three 5×5 convs (12 channels), strides 2, 2, 1; 768-d for 32×32."""
    c = in_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, 12, 5, padding=2, stride=2), _act(activation),
        nn.Conv2d(12, 12, 5, padding=2, stride=2), _act(activation),
        nn.Conv2d(12, 12, 5, padding=2, stride=1), _act(activation),
        nn.Flatten(),
    )


def _lenet5(in_shape, activation, hidden: Sequence[int] = (120, 84), **_):
    """LeNet-5: conv6-pool-conv16-pool-fc120-fc84 (the last-layer input is the 84-d feature)."""
    c = in_shape[0]
    convs = nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2 if in_shape[1] == 28 else 0), _act(activation), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), _act(activation), nn.MaxPool2d(2), nn.Flatten(),
    )
    dims = [_flat_dim(convs, in_shape), *hidden]
    layers: list[nn.Module] = [convs]
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), _act(activation)]
    return nn.Sequential(*layers)


def _mlp(in_shape, activation, widths: Sequence[int], bias: bool, **_):
    """Fully-connected body ``Flatten → (Linear → act)*``; with ``widths`` the hidden sizes."""
    dims = [torch.Size(in_shape).numel(), *widths]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b, bias=bias), _act(activation)]
    return nn.Sequential(*layers)


def _fcn4(in_shape, activation, widths: Sequence[int] = (4096, 1024, 256), bias: bool = False, **_):
    """Soft-label paper's FCN-4: bias-free 12288-4096-1024-256-C (for 3×64×64 inputs)."""
    return _mlp(in_shape, activation, widths, bias)


def _fcn3(in_shape, activation, widths: Sequence[int] = (300, 300), bias: bool = True, **_):
    """iLRG's FCN-3: 784-300-300-C with biases."""
    return _mlp(in_shape, activation, widths, bias)


def _linear(in_shape, activation, **_):
    """No hidden layer: softmax regression on the (normalised) pixels; the exact case of several papers."""
    return nn.Flatten()


def _cnn(in_shape, activation, channels: Sequence[int] = (8, 16), hidden: int = 64, batch_norm: bool = False, **_):
    """Small CNN of the label-distribution paper: (conv3×3 → [BN] → act → pool)* → fc hidden → act."""
    layers: list[nn.Module] = []
    c = in_shape[0]
    for out in channels:
        layers += [nn.Conv2d(c, out, 3, padding=1)]
        if batch_norm:
            layers += [nn.BatchNorm2d(out)]
        layers += [_act(activation), nn.MaxPool2d(2)]
        c = out
    layers += [nn.Flatten()]
    convs = nn.Sequential(*layers)
    if not hidden:
        return convs
    return nn.Sequential(convs, nn.Linear(_flat_dim(convs, in_shape), hidden), _act(activation))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, activation: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act1, self.act2 = _act(activation), _act(activation)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


def _resnet32(in_shape, activation, width: int = 16, **_):
    """CIFAR ResNet-32 (He et al. 2016): 3 stages × 5 basic blocks, widths 16/32/64 (× width/16)."""
    layers: list[nn.Module] = [nn.Conv2d(in_shape[0], width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                               _act(activation)]
    cin = width
    for stage, mult in enumerate((1, 2, 4)):
        for block in range(5):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(_BasicBlock(cin, width * mult, stride, activation))
            cin = width * mult
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers)


def _torchvision_resnet(arch: str, in_shape, activation, stem: str | None = None, **_):
    net = getattr(torchvision.models, arch)(weights=None)
    if stem is None:
        stem = "cifar" if in_shape[1] <= 64 else "imagenet"
    if in_shape[0] != 3 or stem == "cifar":
        net.conv1 = nn.Conv2d(in_shape[0], 64, 3 if stem == "cifar" else 7, 1 if stem == "cifar" else 2,
                              1 if stem == "cifar" else 3, bias=False)
    if stem == "cifar":
        net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return nn.Sequential(_swap_activations(net, activation), nn.Flatten())


def _vgg16(in_shape, activation, batch_norm: bool = False, **_):
    """VGG-16 convolutions (configuration D) with a global pool: a 512-d feature (RLU's CIFAR VGG16)."""
    features = torchvision.models.vgg.make_layers(torchvision.models.vgg.cfgs["D"], batch_norm=batch_norm)
    if in_shape[0] != 3:
        features[0] = nn.Conv2d(in_shape[0], 64, 3, padding=1)
    return nn.Sequential(_swap_activations(features, activation), nn.AdaptiveAvgPool2d(1), nn.Flatten())


BODIES: dict[str, tuple[Callable[..., nn.Module], str]] = {
    # name: (body factory, default activation)
    "lenet": (_lenet_dlg, "sigmoid"),
    "lenet5": (_lenet5, "relu"),
    "fcn4": (_fcn4, "relu"),
    "fcn3": (_fcn3, "relu"),
    "mlp": (lambda in_shape, activation, widths=(256,), bias=True, **k: _mlp(in_shape, activation, widths, bias),
            "relu"),
    "linear": (_linear, "identity"),
    "cnn": (_cnn, "relu"),
    "resnet18": (functools.partial(_torchvision_resnet, "resnet18"), "relu"),
    "resnet32": (_resnet32, "relu"),
    "resnet50": (functools.partial(_torchvision_resnet, "resnet50"), "relu"),
    "vgg16": (_vgg16, "relu"),
}


def body_options(name: str) -> list[str]:
    """The options (``build(..., **options)``) that the body of zoo model ``name`` takes."""
    params = inspect.signature(BODIES[name][0]).parameters
    return sorted(n for n, p in params.items() if n not in ("in_shape", "activation")
                  and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL))


# --------------------------------------------------------------------------- initialisations
def _init_uniform(model: GIModel, low: float = -0.5, high: float = 0.5) -> None:
    """DLG / soft-label paper: U(−0.5, 0.5) on every weight and bias."""
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(low, high)


def _init_zero_last(model: GIModel) -> None:
    """Label-distribution paper, Proposition 2: last-layer weights W⁰ = 0 (bias at its default)."""
    with torch.no_grad():
        model.fc.weight.zero_()


def _init_uniform_last(model: GIModel) -> None:
    """Label-distribution paper's CNNs: last layer U(−1, 1)."""
    with torch.no_grad():
        model.fc.weight.uniform_(-1, 1)
        if model.fc.bias is not None:
            model.fc.bias.uniform_(-1, 1)


WEIGHT_INITS: dict[str, Callable[[GIModel], None]] = {
    "default": lambda m: None,
    "uniform": _init_uniform,
    "zero-last": _init_zero_last,
    "uniform-last": _init_uniform_last,
}


def build(
    name: str,
    num_classes: int,
    activation: str | None = None,
    in_shape: Sequence[int] = (3, 32, 32),
    bias_last: bool = True,
    init: str | None = None,
    norm: str | None = None,
    seed: int | None = None,
    **options: Any,
) -> GIModel:
    """Build a model of the zoo (docs/architecture.md, "Public contract").

    ``activation=None`` takes the model's own default (sigmoid for the DLG ``lenet``, ReLU elsewhere).
    ``init``: ``None``/``"default"`` (framework), ``"uniform"`` (U(−0.5, 0.5) on all parameters),
    ``"zero-last"``, ``"uniform-last"``. ``norm`` names the first-layer normalisation (default by channel
    count: ``cifar10`` for RGB, ``mnist`` for grey). ``seed`` makes the initialisation reproducible.
    ``options`` go to the body (e.g. ``widths`` for ``fcn4``, ``stem`` for ResNets).
    """
    if name not in BODIES:
        raise ConfigError(f"unknown model {name!r}; valid: {sorted(BODIES)}")
    factory, default_act = BODIES[name]
    valid = body_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"model {name!r} takes no option(s) {unknown}; valid: {valid}")
    activation = activation or default_act
    if activation not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {activation!r}; valid: {sorted(ACTIVATIONS)}")
    init = init or "default"
    if init not in WEIGHT_INITS:
        raise ConfigError(f"unknown init {init!r}; valid: {sorted(WEIGHT_INITS)}")
    in_shape = tuple(int(s) for s in in_shape)
    if len(in_shape) != 3:
        raise ConfigError(f"in_shape must be (C, H, W), got {in_shape}")
    norm = norm or ("cifar10" if in_shape[0] == 3 else "mnist")
    if norm not in NORMALIZATIONS:
        raise ConfigError(f"unknown norm {norm!r}; valid: {sorted(NORMALIZATIONS)}")
    if int(num_classes) < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
    spec = dict(name=name, num_classes=int(num_classes), activation=activation, in_shape=list(in_shape),
                bias_last=bool(bias_last), init=init, norm=norm, seed=seed, **options)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        body = factory(in_shape, activation, **options)
        fc = nn.Linear(_flat_dim(body, in_shape), int(num_classes), bias=bias_last)
        mean, std = NORMALIZATIONS[norm]
        model = GIModel(Normalize(mean, std, in_shape[0]), body, fc, spec)
        WEIGHT_INITS[init](model)
    return model


def from_spec(spec: dict[str, Any]) -> GIModel:
    """Rebuild a model from its ``spec`` (weights come separately, from a state dict)."""
    return build(**spec)


def last_layer_input_dim(model: GIModel) -> int:
    return model.fc.in_features
