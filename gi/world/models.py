"""Models: the zoo of the papers, any user ``nn.Module``, their last layer and how a capture rebuilds them
(docs/architecture.md "Public contract", "Models and providers").

Every zoo model is a :class:`GIModel`: the dataset normalisation is its first layer (so gradients are taken
w.r.t. pixel-space inputs in [0, 1]), ``body`` maps images to the penultimate feature ``(B, D)``, and ``fc`` is
the last linear layer. Any other classifier ``nn.Module`` works too: its last layer is found by
:func:`find_last_layer` (or named), its last-layer features are the input of that layer
(:func:`features_and_logits`), and normalisation is the module's own business (none is added). A capture
records how to rebuild its model with a *provider* (:data:`PROVIDERS`): ``zoo`` (a :func:`build` spec) or
``factory`` (an import string ``"package.module:callable"`` plus JSON keyword arguments, :func:`from_factory`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

from gi.core.errors import CaptureError, ConfigError
from gi.core.registry import registrar

LAST_LAYER = "fc"  # the zoo's last layer (and that of captures saved before the name was recorded)
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
    "cnn6": (_cnn6, "leaky_relu"),
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


def last_layer_input_dim(model: GIModel) -> int:
    return model.fc.in_features


# --------------------------------------------------------------------------- the last layer of any module
def linear_layers(model: nn.Module) -> list[str]:
    """The names of the model's ``nn.Linear`` submodules, in registration order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def find_last_layer(model: nn.Module, last_layer: str | None = None, example: Tensor | None = None) -> str:
    """The name of the model's last layer: the ``nn.Linear`` whose output is the logits.

    Rule: ``last_layer`` when given (it must name an ``nn.Linear``); a model's recorded name
    (:func:`last_layer_of`); the only ``nn.Linear``; else, with an ``example`` input, the ``nn.Linear`` whose
    output *is* the model's output (a forward pass in eval mode, no gradients, the module left as it was).
    Anything else is ambiguous: :class:`ConfigError` listing the candidates and asking for ``last_layer=``.
    """
    linears = linear_layers(model)
    if last_layer is not None:
        if last_layer not in linears:
            raise ConfigError(f"last_layer={last_layer!r} is not an nn.Linear of the model; its nn.Linear layers: "
                              f"{linears}")
        return last_layer
    recorded = getattr(model, "gi_last_layer", None) or (LAST_LAYER if isinstance(model, GIModel) else None)
    if recorded in linears:
        return recorded
    if not linears:
        raise ConfigError("the model has no nn.Linear layer; label recovery and feature matching read the last "
                          "linear layer (the classifier head): give the model one")
    if len(linears) == 1:
        return linears[0]
    if example is not None:
        outputs: dict[str, Tensor] = {}
        hooks = [model.get_submodule(n).register_forward_hook(
            lambda _m, _i, out, n=n: outputs.__setitem__(n, out)) for n in linears]
        was = model.training
        try:
            model.eval()
            with torch.no_grad():
                logits = model(example)
        finally:
            model.train(was)
            for h in hooks:
                h.remove()
        hits = [n for n, out in outputs.items() if out is logits]
        if len(hits) == 1:
            return hits[0]
    raise ConfigError(f"cannot tell which nn.Linear is the last layer (the one whose output is the logits): "
                      f"candidates {linears}; pass last_layer=NAME")


def last_layer_of(model: nn.Module) -> str:
    """The last layer recorded on a model (:func:`attach`, :meth:`gi.Capture.model`), ``fc`` for a zoo model,
    else :func:`find_last_layer` without an example."""
    return find_last_layer(model)


def last_layer_keys(name: str) -> tuple[str, str]:
    """``(weight, bias)`` parameter names of the last layer ``name``."""
    return f"{name}.weight", f"{name}.bias"


def features_and_logits(model: nn.Module, x: Tensor, last_layer: str | None = None) -> tuple[Tensor, Tensor]:
    """``(f_{N−1}(x), logits)`` in one forward pass: the input of the last layer (flattened to (B, D)), for any
    module (a forward pre-hook on the last layer; works under ``torch.func.functional_call``/``grad``/``vmap``)."""
    if isinstance(model, GIModel) and last_layer in (None, LAST_LAYER):
        f = model.features(x)
        return f, model.fc(f)
    layer = model.get_submodule(last_layer or last_layer_of(model))
    box: list[Tensor] = []
    hook = layer.register_forward_pre_hook(lambda _m, args: box.append(args[0]))
    try:
        logits = model(x)
    finally:
        hook.remove()
    return box[-1].flatten(1), logits


# --------------------------------------------------------------------------- providers: how a capture rebuilds
Provider = Callable[[dict[str, Any]], nn.Module]
PROVIDERS: dict[str, Provider] = {}
register_provider = registrar(PROVIDERS, "model provider")
"""Decorator: ``@register_provider(name)`` on ``provider(spec) -> nn.Module``, which rebuilds the architecture of
a spec with ``provider: name`` (weights come from the capture's state)."""


def provider_of(spec: dict[str, Any]) -> str:
    """A spec's provider: its ``provider`` key, else ``factory`` when it has one, else ``zoo`` (older captures)."""
    return str(spec.get("provider") or ("factory" if "factory" in spec else "zoo"))


def import_factory(path: str) -> Callable[..., Any]:
    """``"package.module:callable"`` (dots after the colon reach attributes) → the callable; a
    :class:`CaptureError` naming the import string and the fix when it cannot be imported."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise CaptureError(f"model factory {path!r} is not an import string 'package.module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise CaptureError(f"cannot import the model factory {path!r} ({type(exc).__name__}: {exc}); make "
                           f"{module_name!r} importable in this process (e.g. PYTHONPATH=/dir/with/it, or pip "
                           "install its package), or rebuild the capture with an importable factory") from None
    if not callable(obj):
        raise CaptureError(f"model factory {path!r} is a {type(obj).__name__}, not a callable")
    return obj


@register_provider("zoo")
def _zoo(spec: dict[str, Any]) -> nn.Module:
    return build(**{k: v for k, v in spec.items() if k != "provider"})


@register_provider("factory")
def _factory(spec: dict[str, Any]) -> nn.Module:
    path, kwargs = spec.get("factory"), spec.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise CaptureError(f"model spec kwargs must be a JSON object, got {type(kwargs).__name__}")
    try:
        model = import_factory(path)(**kwargs)
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(f"model factory {path!r}(**{kwargs}) failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model factory {path!r} returned a {type(model).__name__}, not an nn.Module")
    return model


def from_spec(spec: dict[str, Any]) -> nn.Module:
    """Rebuild a model from its ``spec`` with its provider (weights come separately, from a state dict)."""
    name = provider_of(spec)
    if name not in PROVIDERS:
        raise CaptureError(f"model spec names provider {name!r}; known providers: {sorted(PROVIDERS)}")
    return PROVIDERS[name](spec)


def factory_spec(factory: str, **kwargs: Any) -> dict[str, Any]:
    """The spec of ``factory(**kwargs)``: ``{"provider": "factory", "name", "factory", "kwargs"}``; the keyword
    arguments must be JSON (they are saved in the capture's header)."""
    try:
        kwargs = json.loads(json.dumps(kwargs))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model factory keyword arguments must be JSON values: {exc}") from None
    return {"provider": "factory", "name": str(factory), "factory": str(factory), "kwargs": kwargs}


def from_factory(factory: str, last_layer: str | None = None, **kwargs: Any) -> nn.Module:
    """``factory(**kwargs)`` imported from ``"package.module:callable"``, with its provenance attached
    (:func:`attach`), so captures of it can be rebuilt in another process where the factory is importable."""
    spec = factory_spec(factory, **kwargs)
    return attach(_factory(spec), spec, last_layer)


def attach(model: nn.Module, spec: dict[str, Any] | None = None, last_layer: str | None = None) -> nn.Module:
    """Record a model's provenance ``spec`` (how to rebuild it) and/or its last layer's name on the module."""
    if spec is not None:
        model.spec = dict(spec)
    if last_layer is not None:
        model.gi_last_layer = find_last_layer(model, last_layer)
    return model


def spec_of(model: nn.Module) -> dict[str, Any]:
    """How to rebuild ``model``: its recorded spec (zoo models, :func:`from_factory`), else the import string of
    its class called without arguments (``"module:Class"``; rebuilding then needs that to be importable and
    callable so; record a factory with :func:`from_factory` or :func:`attach` otherwise)."""
    spec = getattr(model, "spec", None)
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        return dict(spec)
    cls = type(model)
    return factory_spec(f"{cls.__module__}:{cls.__qualname__}")
