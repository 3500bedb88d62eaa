"""What the server sees (:class:`Capture`) and the ground truth kept for scoring (:class:`Truth`).

docs/architecture.md, "Data flow": a capture is self-describing (model spec and state, protocol, gradients **or**
update, history terms of the FL scheme). Sign convention: ``gradients`` are ∇θ of the mean-reduced
loss; ``update`` is ``θ_local − θ_global``. Files are safetensors with the JSON metadata in the
header: loading never unpickles.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gi.core.errors import CaptureError, ConfigError, as_os_error
from gi.world.fl.protocol import Protocol

Tensor = torch.Tensor
_KINDS = ("state", "gradients", "update", "history", "bn_stats", "buffers")


def _atomic_save(tensors: dict[str, Tensor], meta: dict[str, Any], path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        try:
            save_file(flat, tmp, metadata={"gi": json.dumps(meta)})
        except Exception as exc:  # a full disk inside safetensors: the OSError it is (docs/guarantees.md)
            raise as_os_error(exc, tmp) from None
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


MAX_JSON_DEPTH = 32  # a capture's header nests 4 levels; deeper is not ours (and json recursion is bounded)
MAX_SAMPLES = 1_000_000  # samples behind one message: a client's whole data set, with room to spare


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON text, counted without parsing it (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _read(path: str | os.PathLike, expect: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CaptureError(f"no {expect} file at {path}; write one with {expect.capitalize()}.save(path)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own types for corrupt files
        raise CaptureError(f"{path} is not a valid safetensors file: {exc}") from None
    if "gi" not in header:
        raise CaptureError(f"{path} has no gi metadata; it was not written by {expect.capitalize()}.save")
    depth = json_depth(header["gi"])
    if depth > MAX_JSON_DEPTH:
        raise CaptureError(f"{path}: its gi metadata nests {depth} levels deep; at most {MAX_JSON_DEPTH} are read")
    try:
        meta = json.loads(header["gi"])
    except json.JSONDecodeError as exc:
        raise CaptureError(f"{path}: its gi metadata is not valid JSON ({exc.msg} at {exc.pos})") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise CaptureError(f"{path}: its gi metadata holds a value that cannot be read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("type") != expect:
        kind = meta.get("type") if isinstance(meta, dict) else type(meta).__name__
        raise CaptureError(f"{path} holds a {kind!r}, not a {expect!r}")
    return tensors, meta


def _field(meta: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Any) -> Any:
    """``meta[key]`` checked to be of ``kind``; a :class:`CaptureError` naming the field otherwise."""
    if key not in meta:
        raise CaptureError(f"{path}: metadata field {key!r} is missing; re-save the capture with Capture.save")
    if not isinstance(meta[key], kind):
        raise CaptureError(f"{path}: metadata field {key!r} is a {type(meta[key]).__name__}, expected "
                           f"{getattr(kind, '__name__', kind)}")
    return meta[key]


def _bn_pairs(flat: dict[str, Tensor], path: Any) -> dict[str, tuple[Tensor, Tensor]]:
    """``{"<module>.mean": m, "<module>.var": v}`` → ``{module: (m, v)}``; an unpaired entry is a CaptureError."""
    modules = {key.rsplit(".", 1)[0] for key in flat}
    pairs = {}
    for module in sorted(modules):
        mean, var = flat.get(f"{module}.mean"), flat.get(f"{module}.var")
        if mean is None or var is None or len(flat) != 2 * len(modules):
            raise CaptureError(f"{path}: bn_stats of {module!r} need exactly a '.mean' and a '.var' tensor")
        pairs[module] = (mean, var)
    return pairs


def _split(tensors: dict[str, Tensor], path: Any) -> dict[str, dict[str, Tensor]]:
    out: dict[str, dict[str, Tensor]] = {k: {} for k in _KINDS}
    for key, value in tensors.items():
        kind, _, name = key.partition("/")
        if kind not in _KINDS or not name:
            raise CaptureError(f"{path}: tensor {key!r} is not named '<kind>/<name>' with kind one of {list(_KINDS)}")
        out[kind][name] = value
    return out


def _finite(t: Tensor) -> bool:
    """Whether every entry of float tensor ``t`` is finite. A sum in ``t``'s own dtype decides at the cost of one
    read: IEEE 754 arithmetic carries a NaN or an infinity through every addition, so a finite sum has only finite
    terms. A sum that is not finite may be an overflow of finite entries; ``isfinite`` then decides. (A float64 sum
    of a float32 tensor converts every entry: 15× slower on a 50M-entry layer.)"""
    return math.isfinite(float(t.sum())) or bool(torch.isfinite(t).all())


def _check_finite(group: str, name: str, t: Tensor) -> None:
    if not _finite(t):
        raise CaptureError(f"{group} tensor {name!r} contains NaN or Inf; drop this capture or re-capture it")


class _Checked:
    """The tensors a :class:`Capture`'s checks found finite, so that every stage's door (labels, features, the
    analytic inversion, the reconstruction) reads each tensor once per capture. A tensor counts as checked while
    it is the same object at the same version (its in-place counter), so a tensor replaced or changed in place is
    checked again. It lives on one capture object: ``dataclasses.replace`` and :meth:`Capture.to` make a new one,
    a copy or a pickle starts empty, and :meth:`Capture.save` never writes it."""

    __slots__ = ("seen", "forward")

    def __init__(self) -> None:
        self.seen: dict[int, tuple[weakref.ref, int | None]] = {}
        self.forward = False  # the rebuilt factory model's forward checked (Capture.model)

    def __reduce__(self) -> tuple[type, tuple]:
        return _Checked, ()

    def __repr__(self) -> str:
        return f"_Checked({len(self.seen)} tensors)"

    @staticmethod
    def _version(t: Tensor) -> int | None:
        try:
            return t._version
        except RuntimeError:  # inference tensors keep no version counter
            return None

    def finite(self, group: str, name: str, t: Tensor) -> None:
        """:func:`_check_finite` of ``t``, once per tensor and version."""
        entry = self.seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == self._version(t):
            return
        _check_finite(group, name, t)
        self.seen[id(t)] = (weakref.ref(t), self._version(t))


def _positive(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CaptureError(f"num_samples must be a positive int (the samples behind the message), got {n!r}")
    return n


def _image_shape(shape: Any) -> bool:
    """``shape`` is an image's (C, H, W) of positive ints."""
    return isinstance(shape, list | tuple) and len(shape) == 3 and all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)


def state_of(model: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}


def _state_dict(obj: Any, what: str) -> dict[str, Tensor]:
    if isinstance(obj, torch.nn.Module):
        return {k: v.detach().cpu() for k, v in obj.state_dict().items()}
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CaptureError(f"{what} must be an nn.Module or a state dict {{name: tensor}}, got {type(obj).__name__}")
    return {k: v.detach().cpu() for k, v in obj.items()}


def _checked_message(model: torch.nn.Module, message: Any, what: str) -> dict[str, Tensor]:
    """``message`` {parameter name: tensor} checked against the model's parameters (names, shapes, floats)."""
    if not isinstance(message, dict) or not message:
        raise CaptureError(f"{what} must be a non-empty dict {{parameter name: tensor}}, got {type(message).__name__}")
    params = dict(model.named_parameters())
    out = {}
    for k, v in message.items():
        if k not in params:
            raise CaptureError(f"{what} has {k!r}, which is not a parameter of the model; its parameters: "
                               f"{list(params)[:6]}{' …' if len(params) > 6 else ''}")
        if not isinstance(v, Tensor) or not v.is_floating_point():
            raise CaptureError(f"{what}[{k!r}] must be a float tensor, got {getattr(v, 'dtype', type(v).__name__)}")
        if tuple(v.shape) != tuple(params[k].shape):
            raise CaptureError(f"{what}[{k!r}] has shape {tuple(v.shape)}, the model's parameter has "
                               f"{tuple(params[k].shape)}")
        out[k] = v.detach().clone().cpu()
    return out


def describe_model(model: torch.nn.Module, last_layer: str | None = None, in_shape: Any = None,
                   example: Tensor | None = None) -> tuple[dict[str, Any], str]:
    """``(model_spec, last layer name)`` of any classifier module: its provenance (:func:`gi.world.models.spec_of`)
    with ``num_classes`` (the last layer's outputs) and ``in_shape`` (from ``in_shape`` or the ``example``
    batch) filled in. The last layer is named or found (:func:`gi.world.models.find_last_layer`; ``example`` or
    ``in_shape`` let it probe by one forward pass). With either, the model is first checked to take such images
    and return logits (:func:`gi.world.models.check_forward`: a first layer built for other channels, a tuple or
    dict output, are a one-line :class:`ConfigError` before any work)."""
    from gi.world.models import check_forward, find_last_layer, spec_of

    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if in_shape is not None:
        in_shape = [int(s) for s in in_shape]
    if example is None and in_shape is not None:
        device = next(iter(model.parameters())).device
        example = torch.zeros(1, *in_shape, device=device)
    logits = None if example is None else check_forward(model, example.shape[1:])
    name = find_last_layer(model, last_layer, example)
    spec = spec_of(model)
    classes = int(model.get_submodule(name).out_features)
    if logits is not None and int(logits.shape[1]) != classes:
        raise ConfigError(f"the model's forward returns {int(logits.shape[1])} logits per image but its last layer "
                          f"{name!r} has {classes} outputs: name the nn.Linear whose output is the logits "
                          "(last_layer=NAME)")
    if spec.setdefault("num_classes", classes) != classes:
        raise CaptureError(f"model spec says num_classes={spec['num_classes']} but its last layer {name!r} has "
                           f"{classes} outputs")
    if spec.get("in_shape") is None:
        shape = in_shape if in_shape is not None else (None if example is None else list(example.shape[1:]))
        spec["in_shape"] = None if shape is None else [int(s) for s in shape]
    return spec, name


@dataclass
class Capture:
    """The shared message of one client (plus everything the server legitimately knows).

    ``model_spec`` rebuilds the architecture (:func:`gi.world.models.from_spec`); ``model_state`` is the
    global model θᵗ the client started from (parameters and buffers). Exactly one of ``gradients``
    (FedSGD) and ``update`` (FedAvg-style schemes) is set. ``history`` holds scheme terms such as
    Scaffold's control variates or FedDyn's state; ``meta`` is free-form JSON (round, client id…).
    ``bn_stats`` maps a BatchNorm module to the client's per-channel batch ``(mean, biased var)`` at its input,
    present only when the threat model grants them (``protocol.share_bn_stats``; the ``bn`` prior reads them).
    ``buffers``: the client's buffers at the end of its round (BatchNorm running statistics and batch counters),
    which a FedAvg client sends with its parameters (a ``state_dict``); empty where the capture has none. With
    ``model_state``'s buffers (before the round) they give the batch statistics of one local step
    (:func:`fcn_analytic.batchnorm.batch_statistics`).
    ``last_layer_name`` names the model's last ``nn.Linear`` (the logits; :func:`gi.world.models.find_last_layer`),
    whose shared ``<name>.weight`` / ``<name>.bias`` every label method reads (``fc`` for zoo models and for
    files saved before the name was recorded).

    Trust (never saved): a ``factory`` model spec is rebuilt only by ``factory`` (a callable this process holds or
    an import string the user gave: captures made in-process from a module keep its builder,
    :func:`gi.world.models.builder_of`), a factory registered in the user's code
    (:func:`gi.models.register_factory`),
    or, with ``trust_factory=True``, the import string the file names (that runs code the file names: only for
    files from a trusted source). Every stage reads the model through :meth:`model` / :meth:`architecture`, so
    the trust set when loading (:meth:`load`) holds for all of them.
    """

    model_spec: dict[str, Any]
    model_state: dict[str, Tensor]
    protocol: Protocol
    gradients: dict[str, Tensor] | None = None
    update: dict[str, Tensor] | None = None
    history: dict[str, Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    bn_stats: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)
    buffers: dict[str, Tensor] = field(default_factory=dict)
    last_layer_name: str = "fc"
    factory: Callable[..., torch.nn.Module] | str | None = field(default=None, repr=False, compare=False)
    trust_factory: bool = field(default=False, repr=False, compare=False)
    _checked: _Checked = field(default_factory=_Checked, init=False, repr=False, compare=False)  # never saved

    # ------------------------------------------------------------------ views
    @property
    def last_layer_keys(self) -> tuple[str, str]:
        """``(weight, bias)``: the parameter names of the last layer (the bias may be absent)."""
        return f"{self.last_layer_name}.weight", f"{self.last_layer_name}.bias"

    @property
    def is_update(self) -> bool:
        return self.update is not None

    @property
    def shared(self) -> dict[str, Tensor]:
        """The shared tensors: ``gradients`` or ``update``, whichever is present."""
        shared = self.update if self.update is not None else self.gradients
        if shared is None:
            raise CaptureError("capture has neither gradients nor update; set exactly one of them")
        return shared

    @property
    def silent(self) -> bool:
        """Whether every shared tensor is exactly zero: the client's loss had no gradient (e.g. a ReLU LeNet with
        U(−0.5, 0.5) weights already predicts the true class with softmax 1.0), so the capture carries neither label
        nor image information and no attack can recover anything from it. The smallest tensors are read first:
        a live capture is told by its biases, without a pass over its largest weights."""
        return not any(bool(t.any()) for t in sorted(self.shared.values(), key=torch.Tensor.numel))

    @property
    def num_classes(self) -> int:
        return int(self.model_spec["num_classes"])

    def __repr__(self) -> str:
        """One line: the model, what is shared and how much, the protocol (the tensors stay out of it)."""
        shared = self.gradients if self.gradients is not None else self.update
        values = sum(int(t.numel()) for t in (shared or {}).values())
        spec = self.model_spec
        model = spec.get("factory") or spec.get("name") or spec.get("provider", "?")
        return (f"Capture(model={model!r}, {'gradients' if self.gradients is not None else 'update'}: "
                f"{len(shared or {})} tensors, {values} values; last_layer={self.last_layer_name!r}, "
                f"num_samples={self.meta.get('num_samples')}, scheme={self.protocol.scheme!r}, "
                f"in_shape={spec.get('in_shape')})")

    @property
    def num_samples(self) -> int:
        """The number of samples behind the shared message: ``meta['num_samples']``, else the protocol's
        ``num_samples``, else (FedSGD only) the batch size. An update without it cannot be read: its local
        schedule depends on it."""
        n = self.meta.get("num_samples") or self.protocol.num_samples
        if n is None:
            if self.is_update:
                raise CaptureError("this update capture records no num_samples (the client's N_k, needed for its "
                                   "local schedule); captures from gi.world.fl.victim set it")
            n = self.protocol.batch_size
        return int(n)

    def architecture(self) -> torch.nn.Module:
        """The model's architecture rebuilt from its spec by its provider (:func:`gi.world.models.from_spec`), under
        this
        capture's trust (``factory``, ``trust_factory``; class docstring); the weights are not loaded. Callers
        that need only the structure build it under ``torch.device("meta")``."""
        from gi.world.models import from_spec, provider_of

        try:
            return from_spec(self.model_spec, factory=self.factory, trust_factory=self.trust_factory)
        except CaptureError as exc:
            if provider_of(self.model_spec) != "zoo":
                raise
            raise CaptureError(f"capture model_spec {self.model_spec} cannot be rebuilt: {exc}") from None
        except (ConfigError, KeyError, TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: torch refusing
            # a spec whose parts disagree (e.g. in_shape's channels against its norm's)
            raise CaptureError(f"capture model_spec {self.model_spec} cannot be rebuilt: "
                               f"{str(exc).splitlines()[0]}") from None

    def model(self, device: str | torch.device = "cpu") -> torch.nn.Module:
        """The global model θᵗ, rebuilt from spec (its provider, :data:`gi.world.models.PROVIDERS`, under the capture's
        trust: :meth:`architecture`) and state, in the protocol's mode (eval/train), with its last layer's name
        recorded (``gi_last_layer``). A zoo spec is first built on the meta device and its shapes checked against
        the state, so a spec read from a file allocates no more than the file holds. A factory model with an
        ``in_shape`` is checked once per capture object to take such images and return logits
        (:func:`gi.world.models.check_forward`; a one-line :class:`CaptureError` otherwise)."""
        from gi.world.models import attach, provider_of

        if provider_of(self.model_spec) == "zoo":
            with torch.device("meta"):
                self._check_fits(self.architecture().state_dict())
        model = self.architecture()
        try:
            missing, unexpected = model.load_state_dict(self.model_state, strict=False)
        except RuntimeError as exc:  # shape mismatches
            first = str(exc).split("\n\t")[1] if "\n\t" in str(exc) else str(exc)
            raise CaptureError(f"capture state does not fit model {self.model_spec.get('name')!r}: {first}") from None
        if missing or unexpected:
            raise CaptureError(
                f"capture state does not fit model {self.model_spec.get('name')!r}: "
                f"missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]}"
            )
        model.train(self.protocol.model_mode == "train")
        if provider_of(self.model_spec) == "factory":  # its captures keep the provenance and this trust
            from gi.world.models import check_forward, trusted_factory

            attach(model, self.model_spec).gi_factory = trusted_factory(self.model_spec, self.factory,
                                                                        self.trust_factory)
            shape = self.model_spec.get("in_shape")
            if not self._checked.forward and _image_shape(shape):
                check_forward(model, shape, CaptureError, f"capture of model {self.model_spec.get('factory')!r}: ")
                self._checked.forward = True
        model.gi_last_layer = self.last_layer_name
        if not hasattr(model, "num_classes"):
            model.num_classes = self.num_classes
        return model.to(device)

    def _check_fits(self, state: dict[str, Tensor]) -> None:
        """Every tensor of the model's ``state`` (shapes only) is in the capture's state with that shape."""
        for name, t in state.items():
            have = self.model_state.get(name)
            if have is None or tuple(have.shape) != tuple(t.shape):
                got = "missing" if have is None else f"of shape {tuple(have.shape)}"
                raise CaptureError(f"capture state does not fit model {self.model_spec.get('name')!r}: "
                                   f"{name!r} is {got}, the model's has {tuple(t.shape)}")

    def shared_last_layer(self) -> tuple[Tensor, Tensor | None]:
        """The shared last-layer tensors ``(W (C, D), b (C,) or None)`` as shared, checked: present, floating
        point, finite, and of the global model's shapes. Raises :class:`CaptureError` naming the tensor."""
        weight, bias = self.last_layer_keys
        shared = self.shared
        if weight not in shared:
            raise CaptureError(f"capture has no {weight!r}; label recovery needs the last layer (shared: "
                               f"{list(shared)[:4]}{' …' if len(shared) > 4 else ''})")
        for name in (weight, bias):
            if name in shared:
                self._check_shared(name, shared[name])
        self._check_head()
        return shared[weight], shared.get(bias)

    def _check_head(self) -> None:
        """The named last layer has the shapes of a classifier head, an ``nn.Linear`` to the logits: weight
        ``(num_classes, D)``, bias ``(num_classes,)``, in the shared tensors and the state. A header whose
        ``last_layer`` names another layer (a convolution, a hidden Linear) is a :class:`CaptureError`."""
        c = self.model_spec.get("num_classes")
        for name, ndim, want in zip(self.last_layer_keys, (2, 1), (f"({c}, D)", f"({c},)")):
            for group, tensors in (("shared", self.shared), ("model_state", self.model_state)):
                t = tensors.get(name)
                if t is not None and (t.ndim != ndim or int(t.shape[0]) != c):
                    raise CaptureError(f"last_layer={self.last_layer_name!r} is not a classifier head: {group} "
                                       f"{name!r} has shape {tuple(t.shape)}, an nn.Linear to the {c} logits has "
                                       f"{want}; name the nn.Linear whose output is the logits")

    def _check_shared(self, name: str, t: Tensor) -> None:
        if not t.is_floating_point():
            raise CaptureError(f"shared tensor {name!r} has dtype {t.dtype}; gradients and updates are floats")
        if name in self.model_state and t.shape != self.model_state[name].shape:
            raise CaptureError(f"shared tensor {name!r} has shape {tuple(t.shape)}, the global model's has "
                               f"{tuple(self.model_state[name].shape)}: capture and model differ")
        self._checked.finite("shared", name, t)

    def last_layer(self, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor | None]:
        """The checked shared last-layer tensors (:meth:`shared_last_layer`) in ``dtype``.

        For an update the result is ``−Δθ/η``: for plain SGD that is the sum of the local step
        gradients, so both kinds of capture read as gradient-like quantities. Update-based attacks
        apply their own scheme factors (ρ, history terms) on top.
        """
        w, b = self.shared_last_layer()
        w, b = w.to(dtype), (None if b is None else b.to(dtype))
        if self.is_update:
            scale = -1.0 / self.protocol.lr
            w, b = w * scale, (None if b is None else b * scale)
        return w, b

    # ------------------------------------------------------------------ checks
    def check(self) -> Capture:
        """The cheap checks every stage runs at its door (no model is built): gradients xor update, the kind
        the scheme shares, every shared tensor a float of its global-model shape, no NaN/Inf anywhere.
        Raises :class:`CaptureError` naming the tensor or field. The NaN/Inf scan, the only check that reads every
        entry, runs once per tensor of this capture object (:class:`_Checked`): the stages that check at their door
        after another pay only for the field and shape checks."""
        if (self.gradients is None) == (self.update is None):
            raise CaptureError("a capture needs exactly one of gradients (FedSGD) and update (FedAvg); "
                               f"got gradients={self.gradients is not None}, update={self.update is not None}")
        if self.is_update != self.protocol.is_update:
            raise CaptureError(f"protocol.scheme={self.protocol.scheme!r} does not match a capture with "
                               f"{'an update' if self.is_update else 'gradients'}")
        for name, tensor in self.shared.items():
            self._check_shared(name, tensor)
        self._check_head()
        bn = {f"{m}.{part}": t for m, pair in self.bn_stats.items() for part, t in zip(("mean", "var"), pair)}
        for group, tensors in (("model_state", self.model_state), ("history", self.history), ("bn_stats", bn),
                               ("buffers", self.buffers)):
            for name, tensor in tensors.items():
                if tensor.is_floating_point():
                    self._checked.finite(group, name, tensor)
        return self

    def validate(self, model: torch.nn.Module | None = None) -> Capture:
        """:meth:`check`, plus names and shapes against the rebuilt model; raise :class:`CaptureError`."""
        self.check()
        model = model if model is not None else self.model()
        try:
            head = model.get_submodule(self.last_layer_name)
        except AttributeError:
            head = None
        if not isinstance(head, torch.nn.Linear):
            raise CaptureError(f"last_layer={self.last_layer_name!r} is not an nn.Linear of the model (it is a "
                               f"{type(head).__name__}); label recovery and feature matching read the classifier "
                               "head, the nn.Linear whose output is the logits")
        params = dict(model.named_parameters())
        state = model.state_dict()
        for name, tensor in self.shared.items():
            if name not in params:
                raise CaptureError(f"shared tensor {name!r} is not a parameter of model "
                                   f"{self.model_spec.get('name')!r}; e.g. {list(params)[:3]}")
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise CaptureError(f"shared tensor {name!r} has shape {tuple(tensor.shape)}, the model's "
                                   f"parameter has {tuple(params[name].shape)}: capture and model differ")
        for name, tensor in self.model_state.items():
            if name in state and tuple(state[name].shape) != tuple(tensor.shape):
                raise CaptureError(f"model_state tensor {name!r} has shape {tuple(tensor.shape)}, "
                                   f"model expects {tuple(state[name].shape)}")
        buffers = dict(model.named_buffers())
        for name, tensor in self.buffers.items():
            if name not in buffers or tuple(buffers[name].shape) != tuple(tensor.shape):
                raise CaptureError(f"buffers tensor {name!r} of shape {tuple(tensor.shape)} is not a buffer of that "
                                   f"shape of model {self.model_spec.get('name')!r}")
        return self

    # ------------------------------------------------------------------ I/O
    def save(self, path: str | os.PathLike) -> None:
        """Write one safetensors file (tensors) with JSON metadata in its header, atomically."""
        tensors: dict[str, Tensor] = {f"state/{k}": v for k, v in self.model_state.items()}
        if self.gradients is not None:
            tensors.update({f"gradients/{k}": v for k, v in self.gradients.items()})
        if self.update is not None:
            tensors.update({f"update/{k}": v for k, v in self.update.items()})
        tensors.update({f"history/{k}": v for k, v in self.history.items()})
        for module, (mean, var) in self.bn_stats.items():
            tensors.update({f"bn_stats/{module}.mean": mean, f"bn_stats/{module}.var": var})
        tensors.update({f"buffers/{k}": v for k, v in self.buffers.items()})
        meta = {"type": "capture", "model_spec": self.model_spec, "protocol": self.protocol.to_dict(),
                "has_gradients": self.gradients is not None, "has_update": self.update is not None,
                "last_layer": self.last_layer_name, "meta": self.meta}
        _atomic_save(tensors, meta, path)

    @classmethod
    def load(cls, path: str | os.PathLike, factory: Callable[..., torch.nn.Module] | str | None = None,
             trust_factory: bool = False) -> Capture:
        """Read a capture written by :meth:`save`; nothing in the file is unpickled, imported or called. Its model
        spec is checked (a zoo spec against the zoo's schema, :func:`gi.world.models.check_spec`). A ``factory`` spec
        rebuilds only with ``factory`` (your callable, or an import string you give), a factory registered in
        your code (:func:`gi.models.register_factory`), or ``trust_factory=True``, which imports and calls the
        factory the file names with the file's arguments: arbitrary code, only for files you trust."""
        from gi.world.models import MAX_CLASSES, check_spec

        tensors, meta = _read(path, "capture")
        parts = _split(tensors, path)
        spec = _field(meta, "model_spec", dict, path)
        if not isinstance(spec.get("num_classes"), int) or not isinstance(spec.get("name"), str):
            raise CaptureError(f"{path}: model_spec needs a str 'name' and an int 'num_classes', got {spec}")
        try:
            check_spec(spec)
        except CaptureError as exc:
            raise CaptureError(f"{path}: {exc}") from None
        if not 2 <= spec["num_classes"] <= MAX_CLASSES:  # any provider's spec (the zoo's schema checks its own)
            raise CaptureError(f"{path}: model_spec num_classes={spec['num_classes']} must be in [2, {MAX_CLASSES}]")
        try:
            protocol = Protocol.from_dict(_field(meta, "protocol", dict, path))
        except ConfigError as exc:
            raise CaptureError(f"{path}: its protocol is invalid: {exc}") from None
        has_gradients, has_update = (_field(meta, k, bool, path) for k in ("has_gradients", "has_update"))
        inner = _field({"meta": meta.get("meta", {})}, "meta", dict, path)
        n = inner.get("num_samples")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES):
            raise CaptureError(f"{path}: meta.num_samples={n!r} must be an int in [1, {MAX_SAMPLES}]")
        last_layer = _field({"last_layer": meta.get("last_layer", "fc")}, "last_layer", str, path)  # older: fc
        return cls(
            model_spec=spec,
            model_state=parts["state"],
            protocol=protocol,
            gradients=parts["gradients"] if has_gradients else None,
            update=parts["update"] if has_update else None,
            history={k: v for k, v in parts["history"].items() if not k.startswith("bn_stats/")},
            meta=inner,
            bn_stats=_bn_pairs({**{k.split("/", 1)[1]: v for k, v in parts["history"].items()  # older files kept
                                   if k.startswith("bn_stats/")}, **parts["bn_stats"]}, path),  # them in history
            buffers=parts["buffers"],
            last_layer_name=last_layer,
            factory=factory,
            trust_factory=trust_factory is True,
        )

    def to(self, device: str | torch.device) -> Capture:
        """A copy with every tensor on ``device`` (label recovery on a GPU: ``labels.recover(..., device=)``)."""
        def move(d: dict[str, Tensor] | None) -> dict[str, Tensor] | None:
            return None if d is None else {k: v.to(device) for k, v in d.items()}

        return dataclasses.replace(self, model_state=move(self.model_state), gradients=move(self.gradients),
                                   update=move(self.update), history=move(self.history), buffers=move(self.buffers),
                                   bn_stats={k: (m.to(device), v.to(device)) for k, (m, v) in self.bn_stats.items()})

    # ------------------------------------------------------------------ from real FL systems
    @classmethod
    def from_gradients(cls, model: torch.nn.Module, gradients: dict[str, Tensor], protocol: Protocol,
                       num_samples: int, last_layer: str | None = None,
                       in_shape: tuple[int, ...] | None = None) -> Capture:
        """A FedSGD capture from what a real client shared: ``gradients`` {parameter name: ∇θ of the mean loss}
        (docs/architecture.md sign convention) of ``model`` at θᵗ (its current weights and buffers) over
        ``num_samples`` samples. ``last_layer`` names the last ``nn.Linear`` (found when omitted,
        :func:`gi.world.models.find_last_layer`; ``in_shape`` (C, H, W) lets it probe by a forward pass and is what a
        reconstruction needs: without it, and without a model that records it (a zoo model's spec), the capture
        serves the label stage and ``gi.reconstruct`` refuses it in one line). Names and shapes are checked
        against the model: :class:`CaptureError`."""
        if protocol.is_update:
            raise CaptureError(f"from_gradients builds FedSGD captures; protocol.scheme={protocol.scheme!r} shares "
                               "an update: use Capture.from_update")
        from gi.world.models import builder_of

        shared = _checked_message(model, gradients, "gradients")
        spec, name = describe_model(model, last_layer, in_shape)
        n = _positive(num_samples)
        return cls(model_spec=spec, model_state=state_of(model), protocol=protocol, gradients=shared,
                   meta={"num_samples": n}, last_layer_name=name, factory=builder_of(model)).check()

    @classmethod
    def from_update(cls, model_before: torch.nn.Module | dict[str, Tensor],
                    model_after: torch.nn.Module | dict[str, Tensor], protocol: Protocol, num_samples: int,
                    last_layer: str | None = None, in_shape: tuple[int, ...] | None = None,
                    model: torch.nn.Module | None = None) -> Capture:
        """An update capture from a real client round: ``update = after − before`` over the trained (float)
        parameters; ``model_before`` is θᵗ, the global model the client started from. Each side is a module or a
        state dict; ``model`` gives the architecture when both are state dicts (default: whichever is a module,
        loaded with θᵗ). ``num_samples`` is the client's N_k (its local schedule depends on it)."""
        from gi.world.models import builder_of

        if not protocol.is_update:
            raise CaptureError(f"from_update builds update captures; protocol.scheme={protocol.scheme!r} shares a "
                               "gradient: use Capture.from_gradients")
        arch = model if model is not None else next((m for m in (model_before, model_after)
                                                      if isinstance(m, torch.nn.Module)), None)
        if arch is None:
            raise CaptureError("from_update got two state dicts: pass model= (the architecture, an nn.Module)")
        before = _state_dict(model_before, "model_before")
        after = _state_dict(model_after, "model_after")
        params = [k for k, p in arch.named_parameters() if p.requires_grad]
        state = state_of(arch)
        for side, sd in (("model_before", before), ("model_after", after)):
            missing = [k for k in params if k not in sd]
            if missing:
                raise CaptureError(f"{side} lacks parameter(s) {missing[:3]} of the model; pass full state dicts "
                                   "(or the modules) with the model's parameter names")
            for k in params:
                if tuple(sd[k].shape) != tuple(state[k].shape):
                    raise CaptureError(f"{side}[{k!r}] has shape {tuple(sd[k].shape)}, the model's parameter has "
                                       f"{tuple(state[k].shape)}")
        unknown = sorted(k for k in before if k not in state)
        if unknown:
            raise CaptureError(f"model_before has entries {unknown[:3]} that the model does not have")
        theta = {k: before[k].detach().clone().to(state[k].dtype) if k in before else v for k, v in state.items()}
        update = {k: (after[k].detach().to(theta[k].dtype) - theta[k]) for k in params}
        buffers = {k: after[k].detach().clone().to(b.dtype) for k, b in arch.named_buffers()  # a state_dict sends them
                   if k in after and tuple(after[k].shape) == tuple(b.shape)}
        spec, name = describe_model(arch, last_layer, in_shape)
        n = _positive(num_samples)
        proto = dataclasses.replace(protocol, num_samples=n)
        return cls(model_spec=spec, model_state=theta, protocol=proto, update=update, meta={"num_samples": n},
                   buffers=buffers, last_layer_name=name, factory=builder_of(arch)).check()


def pixel_problem(images: Tensor) -> str | None:
    """What makes ``images`` unfit to score against (None when nothing does): not float pixels, NaN or Inf, values
    outside [0, 1]. A truth with such pixels is refused, never clamped: a clamped 8-bit or normalised truth would
    turn a perfect reconstruction into a wrong PSNR reported as valid."""
    if not images.is_floating_point():
        return f"images are {images.dtype}, not float pixels in [0, 1] (8-bit images: divide by 255)"
    if not images.numel():
        return None
    if not torch.isfinite(images).all():
        return "images contain NaN or Inf"
    if images.min() < 0 or images.max() > 1:
        return (f"pixels span [{float(images.min()):.4g}, {float(images.max()):.4g}], not [0, 1] (8-bit images: "
                "divide by 255; normalised ones: undo the normalisation)")
    return None


@dataclass
class Truth:
    """Ground truth of a capture, for scoring only (never passed to the attack side).

    ``images`` (B, C, H, W) in [0, 1]; ``labels`` (B,) class ids (argmax of the target);
    ``targets`` (B, C) the soft targets actually used; ``counts`` (C,) labels per class over all the
    samples the shared message depends on; ``extra`` holds e.g. per-step counts of local training.
    """

    images: Tensor
    labels: Tensor
    targets: Tensor
    counts: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: the batch's shape and labels (the pixels stay out of it)."""
        return f"Truth(images={tuple(self.images.shape)}, labels={self.labels.tolist()})"

    def check(self, num_classes: int | None = None, in_shape: tuple[int, ...] | list[int] | None = None,
              where: str = "truth") -> Truth:
        """Refuse a truth that would make a score meaningless, with one line naming the field (returns ``self``).

        Images: (B, C, H, W) float pixels in [0, 1], finite (8-bit or normalised images are refused, not clamped);
        ``in_shape``: the capture model's input shape they must have. Targets: finite (B, C) rows on the simplex.
        Labels: B integer class ids in [0, C). Counts: (C,) non-negative integers equal to the labels' histogram.
        ``num_classes``: the capture's C, which the targets must have. A truth saved without images
        (``keep_images=False``) holds an empty image tensor and is checked for its labels only."""
        images, labels, targets, counts = self.images, self.labels, self.targets, self.counts
        problem = "images must be (B, C, H, W)" if images.ndim != 4 else pixel_problem(images)
        bad = None if problem is None else f"{where}: {problem}"
        if bad is None and images.numel() and in_shape is not None and tuple(images.shape[1:]) != tuple(in_shape):
            bad = f"{where}: images are {tuple(images.shape[1:])} but the capture's model takes {tuple(in_shape)}"
        if bad is None and (targets.ndim != 2 or not targets.is_floating_point()):
            bad = f"{where}: targets must be float (B, C) soft labels, got {targets.dtype} {tuple(targets.shape)}"
        if bad is None and (labels.ndim != 1 or labels.is_floating_point() or labels.dtype == torch.bool):
            bad = f"{where}: labels must be (B,) integer class ids, got {labels.dtype} {tuple(labels.shape)}"
        if bad is None:
            b, c = int(labels.shape[0]), int(targets.shape[1])
            if num_classes is not None and c != int(num_classes):
                bad = f"{where}: targets have {c} classes but the capture's model has {num_classes}"
            elif targets.shape[0] != b or (images.numel() and images.shape[0] != b):
                bad = (f"{where}: {b} labels, {targets.shape[0]} targets and {images.shape[0]} images; one of each "
                       "per sample")
            elif not torch.isfinite(targets).all() or (targets < 0).any() or (
                    b and ((targets.double().sum(1) - 1).abs() > 1e-3).any()):
                bad = f"{where}: targets must be finite, non-negative rows that sum to 1 (soft labels)"
            elif b and (labels.min() < 0 or labels.max() >= c):
                bad = f"{where}: labels span [{int(labels.min())}, {int(labels.max())}], outside the classes [0, {c})"
            elif counts.shape != (c,) or counts.is_floating_point() or counts.dtype == torch.bool:
                bad = f"{where}: counts must be ({c},) integers, got {counts.dtype} {tuple(counts.shape)}"
            elif not torch.equal(counts.long(), torch.bincount(labels.long(), minlength=c)):
                bad = (f"{where}: counts {counts.tolist()} disagree with the labels' histogram "
                       f"{torch.bincount(labels.long(), minlength=c).tolist()}")
        if bad is not None:
            raise CaptureError(bad)
        return self

    @property
    def proportions(self) -> Tensor:
        c = self.counts.double()
        return c / c.sum().clamp_min(1)

    def save(self, path: str | os.PathLike) -> None:
        tensors = {"images": self.images, "labels": self.labels, "targets": self.targets, "counts": self.counts}
        tensors.update({f"extra/{k}": v for k, v in self.extra.items()})
        _atomic_save(tensors, {"type": "truth", "meta": self.meta}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Truth:
        tensors, meta = _read(path, "truth")
        missing = sorted({"images", "labels", "targets", "counts"} - set(tensors))
        if missing:
            raise CaptureError(f"{path}: truth tensor(s) {missing} are missing; re-save it with Truth.save")
        extra = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("extra/")}
        inner = meta.get("meta", {})
        if not isinstance(inner, dict):
            raise CaptureError(f"{path}: metadata field 'meta' is a {type(inner).__name__}, expected dict")
        return cls(tensors["images"], tensors["labels"], tensors["targets"], tensors["counts"], extra,
                   inner).check(where=str(path))
