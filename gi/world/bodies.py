"""The zoo's bodies (docs/architecture.md "How to add", "A model"): each maps images to the penultimate feature
``(B, D)``; :func:`gi.world.models.build` adds the input normalisation and the last layer ``fc``. :data:`BODIES`
names each body factory with its default activation; a factory's keyword arguments are the model's options
(:func:`body_options`). The DLG LeNet (Zhu et al. 2019), the soft-label paper's FCNs, the ResNets (He et al.
2016) and VGG-16 (Simonyan & Zisserman 2015; torchvision's, on first use)."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gi.core.errors import ConfigError

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


def _act(name: str) -> nn.Module:
    return ACTIVATIONS[name]()


GROUPS = 8  # GroupNorm's groups per layer (fewer where the channels are not a multiple: their gcd)
NORM_LAYERS: dict[str, Callable[[int], nn.Module]] = {
    # a conv body's normalisation layer of C channels (the ResNet-32's ``norm_layer`` option)
    "batch": nn.BatchNorm2d,
    "group": lambda channels: nn.GroupNorm(math.gcd(GROUPS, channels), channels),  # Wu & He 2018: per sample
}


def _norm_layer(name: str, channels: int) -> nn.Module:
    if name not in NORM_LAYERS:
        raise ConfigError(f"unknown norm_layer {name!r}; valid: {sorted(NORM_LAYERS)}")
    return NORM_LAYERS[name](channels)


def _swap_activations(module: nn.Module, activation: str) -> nn.Module:
    """Replace every ReLU of a torchvision net (in place, shared or not) by a fresh ``activation``."""
    for child_name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            setattr(module, child_name, _act(activation))
        else:
            _swap_activations(child, activation)
    return module


def flat_dim(body: nn.Module, in_shape: Sequence[int]) -> int:
    """The width of ``body``'s output for one image of ``in_shape`` (one eval-mode forward pass)."""
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


def _cnn6(in_shape, activation, **_):
    """R-GAP's CNN6 (Zhu & Blaschko 2021; breaching's ``cnn6``): six bias-free convs (12, 36, 36, 36, 64, 128
    channels; strides 2, 2, 1, 1, 2, 1), leaky ReLU 0.2 by default; 3200-d for 32×32."""
    c = in_shape[0]
    spec = [(c, 12, 4, 2, 2), (12, 36, 3, 1, 2), (36, 36, 3, 1, 1), (36, 36, 3, 1, 1), (36, 64, 3, 1, 2),
            (64, 128, 3, 1, 1)]
    layers: list[nn.Module] = []
    for cin, cout, k, pad, stride in spec:
        layers += [nn.Conv2d(cin, cout, k, padding=pad, stride=stride, bias=False), _act(activation)]
    return nn.Sequential(*layers, nn.Flatten())


def _lenet5(in_shape, activation, hidden: Sequence[int] = (120, 84), **_):
    """LeNet-5: conv6-pool-conv16-pool-fc120-fc84 (the last-layer input is the 84-d feature)."""
    c = in_shape[0]
    convs = nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2 if in_shape[1] == 28 else 0), _act(activation), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), _act(activation), nn.MaxPool2d(2), nn.Flatten(),
    )
    dims = [flat_dim(convs, in_shape), *hidden]
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
    return nn.Sequential(convs, nn.Linear(flat_dim(convs, in_shape), hidden), _act(activation))


def _convnet(in_shape, activation, width: int = 64, batch_norm: bool = True, **_):
    """Inverting Gradients' ConvNet (Geiping et al. 2020; breaching's and LeakPro's ``ConvNet``): eight 3×3
    conv → BatchNorm → act layers of widths w, 2w, 2w, 4w, 4w, 4w, a 3×3 max-pool, 4w, 4w, a 3×3 max-pool
    (w = ``width``); a 36w-d feature for 32×32 inputs. ``batch_norm=False``: the same net without BatchNorm (the
    FedAvg client round's CIFAR-10 victim, whose samples must not interact through batch statistics)."""
    widths = (width, 2 * width, 2 * width, 4 * width, 4 * width, 4 * width, None, 4 * width, 4 * width, None)
    layers: list[nn.Module] = []
    c = in_shape[0]
    for out in widths:
        if out is None:
            layers.append(nn.MaxPool2d(3))
            continue
        layers += [nn.Conv2d(c, out, 3, padding=1), *([nn.BatchNorm2d(out)] if batch_norm else []), _act(activation)]
        c = out
    return nn.Sequential(*layers, nn.Flatten())


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, activation: str, norm_layer: str = "batch") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm_layer(norm_layer, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm_layer(norm_layer, cout)
        self.act1, self.act2 = _act(activation), _act(activation)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm_layer(norm_layer, cout))

    def forward(self, x):
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


def _resnet32(in_shape, activation, width: int = 16, norm_layer: str = "batch", **_):
    """CIFAR ResNet-32 (He et al. 2016): 3 stages × 5 basic blocks, widths 16/32/64 (× width/16). ``norm_layer``:
    ``batch`` (BatchNorm, the paper's) or ``group`` (GroupNorm of :data:`GROUPS` groups, Wu & He 2018: every
    sample normalised on its own, so a client's batch does not couple its samples in either mode;
    docs/results/batchnorm.md). The module names are the same for both."""
    layers: list[nn.Module] = [nn.Conv2d(in_shape[0], width, 3, 1, 1, bias=False), _norm_layer(norm_layer, width),
                               _act(activation)]
    cin = width
    for stage, mult in enumerate((1, 2, 4)):
        for block in range(5):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(_BasicBlock(cin, width * mult, stride, activation, norm_layer))
            cin = width * mult
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers)


def _torchvision_resnet(arch: str, in_shape, activation, stem: str | None = None, **_):
    import torchvision  # here only: importing it loads torch's compiler stack (seconds), which no other model needs

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
    import torchvision

    features = torchvision.models.vgg.make_layers(torchvision.models.vgg.cfgs["D"], batch_norm=batch_norm)
    if in_shape[0] != 3:
        features[0] = nn.Conv2d(in_shape[0], 64, 3, padding=1)
    return nn.Sequential(_swap_activations(features, activation), nn.AdaptiveAvgPool2d(1), nn.Flatten())


BODIES: dict[str, tuple[Callable[..., nn.Module], str]] = {
    # name: (body factory, default activation)
    "lenet": (_lenet_dlg, "sigmoid"),
    "lenet5": (_lenet5, "relu"),
    "cnn6": (_cnn6, "leaky_relu"),
    "fcn4": (_fcn4, "relu"),
    "fcn3": (_fcn3, "relu"),
    "mlp": (lambda in_shape, activation, widths=(256,), bias=True, **k: _mlp(in_shape, activation, widths, bias),
            "relu"),
    "linear": (_linear, "identity"),
    "cnn": (_cnn, "relu"),
    "convnet": (_convnet, "relu"),
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
