"""Models: the zoo of the papers, any user ``nn.Module``, their last layer and how a capture rebuilds them
(docs/architecture.md "Public contract", "Models and providers").

Every zoo model is a :class:`GIModel`: the dataset normalisation is its first layer (so gradients are taken
w.r.t. pixel-space inputs in [0, 1]), ``body`` maps images to the penultimate feature ``(B, D)``, and ``fc`` is
the last linear layer. Any other classifier ``nn.Module`` works too: its last layer is found by
:func:`find_last_layer` (or named), its last-layer features are the input of that layer
(:func:`features_and_logits`), and normalisation is the module's own business (none is added). A capture
records how to rebuild its model with a *provider* (:data:`PROVIDERS`): ``zoo`` (a :func:`build` spec, checked
against the zoo's schema before anything is built, :func:`check_zoo_spec`) or ``factory`` (an import string
``"package.module:callable"`` plus JSON keyword arguments, :func:`from_factory`). A factory named by a spec is
never imported or called on the spec's word alone: only a factory the user passes, one registered in the user's
code (:func:`register_factory`) or, with ``trust_factory=True``, the spec's own import string
(:func:`trusted_factory`; docs/architecture.md "Models and providers").
"""

from __future__ import annotations

import importlib
import inspect
import json
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gi.core.errors import CaptureError, ConfigError
from gi.core.registry import registrar
from gi.world.bodies import ACTIVATIONS, BODIES, NORM_LAYERS, body_options, flat_dim

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
        fc = nn.Linear(flat_dim(body, in_shape), int(num_classes), bias=bias_last)
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


def _describe_output(out: Any) -> str:
    if isinstance(out, Tensor):
        return f"Tensor {tuple(out.shape)}"
    if isinstance(out, dict):
        return f"a {type(out).__name__} with keys {list(out)[:6]}"
    if isinstance(out, list | tuple):
        parts = ", ".join(f"Tensor {tuple(o.shape)}" if isinstance(o, Tensor) else type(o).__name__ for o in out[:4])
        return f"a {type(out).__name__} of {len(out)} ({parts}{', …' if len(out) > 4 else ''})"
    return f"a {type(out).__name__}"


class _FirstLayerMismatch(Exception):
    pass


_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def check_forward(model: nn.Module, in_shape: Sequence[int], error: type[Exception] = ConfigError,
                  where: str = "") -> Tensor:
    """One forward pass of a zero image of ``in_shape`` (C, H, W) through ``model`` (eval mode, no gradients, the
    module's mode restored), before any work that calls it: gi calls ``model(images)`` on ``(B, C, H, W)`` pixels
    and reads the logits ``(B, classes)`` (docs/architecture.md "Models and providers"). Returns the logits.

    Raises ``error``, one line naming what is wrong and what to do: the first convolution or linear layer the
    forward pass reaches takes another channel (feature) count than the images give (the layer is named); the
    forward pass fails for another reason (the first line of its error); or it returns a tuple, a dict (a
    HuggingFace-style output) or a tensor that is not ``(1, K)`` logits. ``where`` prefixes the message (e.g. the
    config key that named the model)."""
    shape = [int(s) for s in in_shape]
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    example = torch.zeros(1, *shape, dtype=param.dtype if param is not None else torch.float32,
                          device=param.device if param is not None else None)
    names = {m: n for n, m in model.named_modules()}
    seen: list[bool] = []

    def first_layer(module: nn.Module, args: tuple) -> None:
        if seen or not args or not isinstance(args[0], Tensor):
            return
        seen.append(True)
        x = args[0]
        if isinstance(module, nn.Linear):
            want, got, unit = module.in_features, int(x.shape[-1]) if x.ndim else 0, "input features"
        else:
            want, got, unit = module.in_channels, int(x.shape[1]) if x.ndim > 1 else 0, "input channels"
        if want and want != got:  # a lazy layer (0) learns its size from this call
            layer = f"{names.get(module, '?')!r} ({type(module).__name__})"
            raise _FirstLayerMismatch(
                f"{where}the model's first layer {layer} takes {want} {unit} but the images of shape {shape} give "
                f"it {got}: build the model for these images (e.g. its channels option) or give it images of the "
                "shape it was built for")

    hooks = [m.register_forward_pre_hook(first_layer) for m in model.modules() if isinstance(m, _LAYERS)]
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            out = model(example)
    except _FirstLayerMismatch as exc:
        raise error(str(exc)) from None
    except Exception as exc:  # the user's forward: any failure is reported in one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise error(f"{where}the model's forward pass fails on one image of shape {shape}: {type(exc).__name__}: "
                    f"{first}; it must take images (B, C, H, W) of the data's shape") from None
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    if not isinstance(out, Tensor):
        raise error(f"{where}the model's forward returns {_describe_output(out)}, not the logits tensor "
                    "(B, classes): gi reads model(images) as the logits; wrap the model so that forward returns "
                    "only them (e.g. out[0] or out['logits'])")
    if out.ndim != 2 or int(out.shape[0]) != 1 or not out.is_floating_point():
        raise error(f"{where}the model's forward returns a {out.dtype} tensor of shape {tuple(out.shape)} for one "
                    f"image of shape {shape}; gi reads it as the logits, a float tensor (B, classes): wrap the "
                    "model so that forward returns them")
    return out


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
    """A spec's provider: its ``provider`` key, else ``zoo`` (older captures). A spec without the key is never a
    factory spec, whatever other keys it holds."""
    name = spec.get("provider", "zoo")
    if not isinstance(name, str):
        raise CaptureError(f"model spec 'provider' must be a str, got {type(name).__name__}")
    return name


def import_factory(path: str) -> Callable[..., Any]:
    """``"package.module:callable"`` (dots after the colon reach attributes) → the callable; a
    :class:`CaptureError` naming the import string and the fix when it cannot be imported. Imports run module
    code: only for an import string the user gave or trusted (:func:`trusted_factory`)."""
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


# --------------------------------------------------------------------------- trusted factories
FACTORIES: dict[str, Callable[..., nn.Module]] = {}
"""Factories registered by the user's code (:func:`register_factory`): import string → the callable this process
already holds. A spec naming one of them is rebuilt with it without any import."""

Factory = Callable[..., nn.Module] | str


def register_factory(path: str, fn: Callable[..., nn.Module] | None = None) -> Any:
    """Trust ``fn`` to rebuild the models of specs whose ``factory`` is ``path`` (``"package.module:callable"``):
    ``register_factory("pkg.nets:make", make)``, or ``@register_factory("pkg.nets:make")`` on the function.
    Captures of such a model then load and attack without ``trust_factory``; nothing is imported by name."""
    if not isinstance(path, str) or path.count(":") != 1 or path.startswith(":") or path.endswith(":"):
        raise ConfigError(f"register_factory needs an import string 'package.module:callable', got {path!r}")

    def wrap(f: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if not callable(f):
            raise ConfigError(f"register_factory({path!r}, ...) needs a callable, got {type(f).__name__}")
        if FACTORIES.get(path, f) is not f:
            raise ValueError(f"model factory {path!r} registered twice")
        FACTORIES[path] = f
        return f

    return wrap if fn is None else wrap(fn)


def untrusted_factory_message(path: Any) -> str:
    """The one-line refusal for a spec naming a factory nobody trusted: what the file names and the three ways to
    trust it."""
    return (f"the capture's model is built by the factory {path!r}, named in the file; a capture's file is never "
            "trusted to name code to import or run. To rebuild it, pass your own factory (gi attack CAPTURE "
            "model=pkg.mod:fn; Capture.load(path, factory=fn)), register it in your code "
            f"(gi.models.register_factory({path!r}, fn)), or trust this file (gi attack CAPTURE trust_factory=true; "
            "Capture.load(path, trust_factory=True): imports and calls whatever the file names, with its arguments)")


def check_factory_spec(spec: dict[str, Any]) -> None:
    """A ``factory`` spec's shape (a str ``factory``, JSON-object ``kwargs``), checked without importing anything."""
    path, kwargs = spec.get("factory"), spec.get("kwargs") or {}
    if not isinstance(path, str):
        raise CaptureError(f"a factory model spec needs a str 'factory' import string, got {path!r}")
    if not isinstance(kwargs, dict):
        raise CaptureError(f"model spec kwargs must be a JSON object, got {type(kwargs).__name__}")


def trusted_factory(spec: dict[str, Any], factory: Factory | None = None,
                    trust_factory: bool = False) -> Callable[..., nn.Module]:
    """The callable that rebuilds a ``factory`` spec, from a trusted source only: ``factory`` (the user's callable,
    or an import string the user gave), else the one registered for the spec's import string
    (:data:`FACTORIES`), else, with ``trust_factory``, the spec's import string imported. Otherwise a one-line
    :class:`CaptureError` (:func:`untrusted_factory_message`), before anything is imported."""
    check_factory_spec(spec)
    path = spec["factory"]
    if factory is not None:
        fn = import_factory(factory) if isinstance(factory, str) else factory
        if not callable(fn):
            raise ConfigError(f"factory= must be a callable or an import string, got {type(fn).__name__}")
        return fn
    if path in FACTORIES:
        return FACTORIES[path]
    if trust_factory is True:
        return import_factory(path)
    raise CaptureError(untrusted_factory_message(path))


# --------------------------------------------------------------------------- the zoo's spec schema
MAX_CLASSES = 100_000
MAX_CHANNELS = 64
MAX_SIDE = 4096
MAX_OPTION_INT = 65_536
MAX_OPTION_LIST = 64
_ZOO_KEYS = ("provider", "name", "num_classes", "activation", "in_shape", "bias_last", "init", "norm", "seed")


def _int(value: Any, key: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CaptureError(f"zoo model spec {key}={value!r}: expected an int in [{low}, {high}]")


def _choice(value: Any, key: str, valid: Any) -> None:
    if value is not None and (not isinstance(value, str) or value not in valid):
        raise CaptureError(f"zoo model spec {key}={value!r}: expected null or one of {sorted(valid)}")


def _option_kind(name: str, option: str) -> str:
    """``int``, ``bool``, ``ints`` or ``str`` for a body option, from its annotation or its default."""
    p = inspect.signature(BODIES[name][0]).parameters[option]
    ann = p.annotation if p.annotation is not inspect.Parameter.empty else None
    if isinstance(ann, str):
        return {"int": "int", "bool": "bool", "Sequence[int]": "ints", "str | None": "str", "str": "str"}[ann]
    default = p.default
    return ("bool" if isinstance(default, bool) else "int" if isinstance(default, int)
            else "ints" if isinstance(default, tuple | list) else "str")


OPTION_CHOICES: dict[str, tuple[str, ...]] = {"stem": ("cifar", "imagenet"), "norm_layer": tuple(NORM_LAYERS)}


def check_zoo_spec(spec: dict[str, Any]) -> None:
    """A ``zoo`` spec checked against the zoo's own schema before anything is built: only :func:`build`'s keys and
    the body's options (:func:`body_options`), a known model, activation, init and norm, and bounded ints
    (num_classes, in_shape, the options' widths: far beyond every model of the papers). Raises
    :class:`CaptureError` naming the key."""
    if not isinstance(spec, dict):
        raise CaptureError(f"model spec must be a JSON object, got {type(spec).__name__}")
    if "provider" not in spec and ("factory" in spec or "kwargs" in spec):
        raise CaptureError(f"model spec names factory {spec.get('factory')!r} but no 'provider': a spec without "
                           "'provider' is a zoo spec, never a factory one (captures of a factory model record "
                           "provider: factory)")
    name = spec.get("name")
    if not isinstance(name, str) or name not in BODIES:
        raise CaptureError(f"zoo model spec names model {name!r}; the zoo has {sorted(BODIES)}")
    options = body_options(name)
    unknown = sorted(set(spec) - set(_ZOO_KEYS) - set(options))
    if unknown:
        how = "" if "provider" in spec else " (the spec has no 'provider' key, so it is a zoo spec)"
        raise CaptureError(f"model {name!r} takes no option(s) {unknown}{how}; valid: "
                           f"{sorted({*_ZOO_KEYS, *options})}")
    _int(spec.get("num_classes"), "num_classes", 2, MAX_CLASSES)
    shape = spec.get("in_shape", [3, 32, 32])
    if not isinstance(shape, list | tuple) or len(shape) != 3:
        raise CaptureError(f"zoo model spec in_shape={shape!r}: expected [C, H, W]")
    for key, value, high in zip(("in_shape[0]", "in_shape[1]", "in_shape[2]"), shape,
                                (MAX_CHANNELS, MAX_SIDE, MAX_SIDE)):
        _int(value, key, 1, high)
    _choice(spec.get("activation"), "activation", ACTIVATIONS)
    _choice(spec.get("init"), "init", WEIGHT_INITS)
    _choice(spec.get("norm"), "norm", NORMALIZATIONS)
    if not isinstance(spec.get("bias_last", True), bool):
        raise CaptureError(f"zoo model spec bias_last={spec['bias_last']!r}: expected true or false")
    if spec.get("seed") is not None:
        _int(spec["seed"], "seed", 0, 2**63 - 1)
    for option in options:
        if option not in spec:
            continue
        value, kind = spec[option], _option_kind(name, option)
        if kind == "int":
            _int(value, option, 0, MAX_OPTION_INT)
        elif kind == "bool" and not isinstance(value, bool):
            raise CaptureError(f"zoo model spec {option}={value!r}: expected true or false")
        elif kind == "ints":
            if not isinstance(value, list | tuple) or len(value) > MAX_OPTION_LIST:
                raise CaptureError(f"zoo model spec {option}={value!r}: expected a list of at most "
                                   f"{MAX_OPTION_LIST} ints")
            for i, v in enumerate(value):
                _int(v, f"{option}[{i}]", 1, MAX_OPTION_INT)
        elif kind == "str":
            _choice(value, option, OPTION_CHOICES.get(option, ()))


def check_spec(spec: dict[str, Any]) -> None:
    """A spec read from a file checked before anything is built or imported: a zoo spec against the zoo's schema
    (:func:`check_zoo_spec`), a factory spec's shape (:func:`check_factory_spec`)."""
    name = provider_of(spec)
    if name == "zoo":
        check_zoo_spec(spec)
    elif name == "factory":
        check_factory_spec(spec)


@register_provider("zoo")
def _zoo(spec: dict[str, Any]) -> nn.Module:
    check_zoo_spec(spec)
    return build(**{k: v for k, v in spec.items() if k != "provider"})


def call_factory(spec: dict[str, Any], fn: Callable[..., nn.Module]) -> nn.Module:
    """``fn(**spec["kwargs"])`` checked to be an ``nn.Module``; ``fn`` comes from :func:`trusted_factory`."""
    path, kwargs = spec.get("factory"), spec.get("kwargs") or {}
    ran = f"{getattr(fn, '__module__', None)}:{getattr(fn, '__qualname__', None)}"
    try:
        model = fn(**kwargs)
    except CaptureError:
        raise
    except Exception as exc:
        other = "" if ran == path else (f" (your factory {ran!r}, given for the capture's {path!r}: the kwargs are the "
                                        "capture's; pass the factory the capture was made with)")
        raise CaptureError(f"model factory {path if ran == path else ran!r}(**{kwargs}) failed: "
                           f"{type(exc).__name__}: {exc}{other}") from None
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model factory {path!r} returned a {type(model).__name__}, not an nn.Module")
    return model


@register_provider("factory")
def _factory(spec: dict[str, Any]) -> nn.Module:
    """A factory spec rebuilt by its registered factory only (:func:`from_spec` takes the other trusted sources)."""
    return call_factory(spec, trusted_factory(spec))


def from_spec(spec: dict[str, Any], factory: Factory | None = None, trust_factory: bool = False) -> nn.Module:
    """Rebuild a model from its ``spec`` with its provider (weights come separately, from a state dict). A
    ``factory`` spec is rebuilt by ``factory`` (the user's callable or import string), a registered factory or,
    with ``trust_factory``, its own import string (:func:`trusted_factory`); never on the spec's word alone."""
    name = provider_of(spec)
    if name not in PROVIDERS:
        raise CaptureError(f"model spec names provider {name!r}; known providers: {sorted(PROVIDERS)}")
    if name == "factory":
        return call_factory(spec, trusted_factory(spec, factory, trust_factory))
    if factory is not None:
        raise CaptureError(f"a factory was given, but the model spec's provider is {name!r} (model "
                           f"{spec.get('name')!r}), which rebuilds it without one; drop the factory")
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
    fn = import_factory(factory)  # the caller named it: importing it is the caller's choice
    model = attach(call_factory(spec, fn), spec, last_layer)
    model.gi_factory = fn
    return model


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


def builder_of(model: nn.Module) -> Callable[..., nn.Module] | None:
    """The callable this process holds that rebuilds ``model``'s factory spec (:func:`spec_of`): the factory
    :func:`from_factory` imported at the caller's request, else, when the spec names the model's own class, a copy
    of the model's structure as it is now (:func:`structure_copier`: a class that needs arguments, such as
    ``nn.Sequential``, would rebuild empty from its name alone). In-memory captures of the model keep it
    (``Capture.factory``), so they rebuild without ``trust_factory``; a saved and loaded capture does not have it.
    None for other specs."""
    spec = spec_of(model)
    if provider_of(spec) != "factory":
        return None
    fn = getattr(model, "gi_factory", None)
    if callable(fn):
        return fn
    cls = type(model)
    if spec.get("factory") != f"{cls.__module__}:{cls.__qualname__}":
        return None
    return structure_copier(model)


def structure_copier(model: nn.Module) -> Callable[..., nn.Module]:
    """A callable that returns a fresh copy of ``model`` as it is now (a deep copy taken once, copied again per
    call; the capture's state is loaded into it), named as ``model``'s class so that errors name the user's class.
    A model that cannot be deep-copied (e.g. a hook holding a lock) gets its class instead, called without
    arguments. One copier per model object (:data:`COPIERS`): the many captures of one model (a federation's
    clients, a Flower round) share one copy."""
    import copy

    cls = type(model)
    known = COPIERS.get(model)
    if known is not None:
        return known
    try:
        template = copy.deepcopy(model)
    except Exception:  # noqa: BLE001 - any deepcopy failure: fall back to the class, as before
        return cls

    def rebuild(**kwargs: Any) -> nn.Module:
        return copy.deepcopy(template)

    rebuild.__module__, rebuild.__qualname__ = cls.__module__, cls.__qualname__
    COPIERS[model] = rebuild
    return rebuild


COPIERS: weakref.WeakKeyDictionary[nn.Module, Callable[..., nn.Module]] = weakref.WeakKeyDictionary()
