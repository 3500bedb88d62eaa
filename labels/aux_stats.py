"""Shared helpers of the count-based label attacks: the FedSGD view of a capture, the protocol's label
embedding, per-sample logit gradients, and the attacker's auxiliary data run through the global model.

:func:`aux_forward` is the one place where auxiliary (or dummy) images go through the capture's global
model θᵗ; every aux-based method (posterior, LLG+, ZLG+, RLU) reads its statistics from the returned
:class:`AuxStats`. The body runs in ``dtype`` (float64 by default, docs/architecture.md); the last layer always
runs in float64 from the capture's own state. Results are cached per (aux object, model state), so a
benchmark that attacks many captures of one global model forwards the aux set once.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.schemes import get_scheme
from gi.world.losses import loss_for, posterior
from gi.world.models import features_and_logits

Tensor = torch.Tensor


# --------------------------------------------------------------------------- the capture, FedSGD view
@dataclass
class GradientView:
    """The last-layer gradients of the mean loss: ``weight`` (C, D), ``bias`` (C,) or None, batch size B."""

    weight: Tensor
    bias: Tensor | None
    batch_size: int


def fedsgd_view(capture: Capture) -> GradientView | str:
    """The capture as one FedSGD gradient, or the reason (a string) why it cannot be read as one.

    A model update counts as a gradient only when it is a single plain SGD step on one batch
    (``−Δθ/η`` is then exactly the gradient); anything else needs an update-based method (RLU).
    """
    if capture.is_update:
        p = capture.protocol
        steps = p.local_epochs * -(-capture.num_samples // p.batch_size)
        single = steps == 1 and p.optimizer == "sgd" and p.weight_decay == 0 and p.prox_mu == 0 \
            and get_scheme(p.scheme).plain_first_step
        if not single:
            return (f"this is a FedSGD attack; the capture is a {p.scheme} update of {steps} local step(s) with "
                    f"{p.optimizer}: use an update-based method (e.g. rlu)")
    w, b = capture.last_layer(torch.float64)
    return GradientView(w, b, capture.num_samples)


def model_last_layer(capture: Capture) -> tuple[Tensor, Tensor | None]:
    """The global model's own last layer ``(W (C, D), b (C,) or None)`` in float64 (not its gradient)."""
    weight, bias = capture.last_layer_keys
    state = capture.model_state
    if weight not in state:
        raise CaptureError(f"capture model_state has no {weight!r} (its last layer {capture.last_layer_name!r}); "
                           "re-capture with the model's last nn.Linear (last_layer=NAME)")
    b = state.get(bias)
    return state[weight].double(), (None if b is None else b.double())


# --------------------------------------------------------------------------- label embeddings and gradients
def label_embedding(protocol: Protocol, num_classes: int) -> tuple[float, float] | str:
    """``(y⁺, y⁻)``: the target value of the true class and of every other class (posterior paper §3.3).

    One-hot: ``(1, 0)``. ``smoothing`` (``(1−ε)·onehot + ε/C``): ``(1 − ε + ε/C, ε/C)``. ``smoothing-alt``
    (the paper's convention): ``(1 − ε, ε/(C−1))``. Mixup targets and smoothing with an unknown ε have no
    fixed embedding: the reason comes back as a string.
    """
    kind, eps, c = protocol.label_aug, protocol.label_eps, num_classes
    if kind == "onehot":
        return 1.0, 0.0
    if kind in ("smoothing", "smoothing-alt"):
        if eps is None:
            return f"label_aug={kind!r} needs the smoothing factor protocol.label_eps to build the label embedding"
        if kind == "smoothing":
            return 1.0 - eps + eps / c, eps / c
        return 1.0 - eps, eps / (c - 1)
    return f"label_aug={kind!r} has no per-class label embedding (targets mix two classes)"


def embedded_targets(labels: Tensor, num_classes: int, embedding: tuple[float, float]) -> Tensor:
    """Soft targets ``(N, C)`` float64 with ``y⁺`` at the label and ``y⁻`` elsewhere."""
    y_pos, y_neg = embedding
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).double()
    return y_neg + (y_pos - y_neg) * onehot


def logit_gradients(logits: Tensor, targets: Tensor, protocol: Protocol) -> Tensor:
    """Per-sample gradients ``∂L_n/∂z_n`` ``(N, C)`` of the protocol's loss (focal/CE/BCE, τ), float64.

    Computed by autograd on the loss of :func:`gi.world.losses.loss_for` (mean-reduced, hence the factor N),
    so every loss variant of Table 1 (and focal loss with soft targets, which Table 1 leaves out) is exact.
    """
    z = logits.detach().double().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_for(protocol)(z, targets.double())
        (grad,) = torch.autograd.grad(loss, z)
    return grad * z.shape[0]


def focal_weight(p: Tensor, protocol: Protocol) -> Tensor:
    """``φ = Φ(α_j, p_j, γ)/τ`` of Theorem 1 / Theorem 2 (eq. 2–3) for class probabilities ``p`` (C,).

    ``Φ(α, p, γ) = α (1 − p)^γ (1 − γ p log p / (1 − p))``; cross-entropy and BCE have γ = 0, α = 1, so
    ``φ = 1/τ`` (Table 1).
    """
    tau = protocol.temperature
    if protocol.loss != "focal":
        return torch.full_like(p, 1.0 / tau)
    alpha = protocol.focal_alpha
    a = torch.ones_like(p) if alpha is None else torch.as_tensor(alpha, dtype=p.dtype).expand_as(p)
    gamma = float(protocol.focal_gamma)
    q = (1.0 - p).clamp_min(0.0)
    ratio = torch.where(q > 1e-12, p * torch.log(p.clamp_min(1e-300)) / q.clamp_min(1e-300), torch.full_like(p, -1.0))
    return a * q.pow(gamma) * (1.0 - gamma * ratio) / tau


# --------------------------------------------------------------------------- auxiliary data through the model
@dataclass
class AuxStats:
    """Auxiliary samples through the global model, float64.

    ``logits`` (N, C), ``probs`` (N, C) the protocol's posterior (softmax(z/τ), or sigmoid(z/τ) for BCE),
    ``features`` (N, D) the last-layer inputs, ``labels`` (N,) class ids, ``seconds`` the forward time
    (0 when served from the cache).
    """

    logits: Tensor
    probs: Tensor
    features: Tensor
    labels: Tensor
    num_classes: int
    seconds: float = 0.0

    @property
    def per_class(self) -> Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)


def aux_arrays(aux: Any, method: str) -> tuple[Tensor, Tensor]:
    if aux is None:
        raise ConfigError(f"label method {method!r} needs auxiliary data: pass aux=gi.world.data.ImageDataset(images, "
                          "labels, num_classes) (a few labelled samples per class, disjoint from the victim's)")
    images, labels = getattr(aux, "images", None), getattr(aux, "labels", None)
    if not isinstance(images, Tensor) or not isinstance(labels, Tensor):
        raise ConfigError(f"aux for {method!r} must have tensors .images (N, C, H, W) and .labels (N,); "
                          f"got {type(aux).__name__}")
    if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0] or images.shape[0] == 0:
        raise ConfigError(f"aux images {tuple(images.shape)} and labels {tuple(labels.shape)} do not match: "
                          "need (N, C, H, W) and (N,) with N >= 1")
    return images, labels.long()


DTYPES = {"float64": torch.float64, "float32": torch.float32}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float64``/``torch.float32`` or their names (YAML configs pass strings)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ConfigError(f"dtype={dtype!r} is not allowed; valid: {sorted(DTYPES)}")


def _state_equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    if a is b:
        return True
    if a.keys() != b.keys():
        return False
    return all(a[k] is b[k] or (a[k].shape == b[k].shape and torch.equal(a[k], b[k])) for k in a)


_CACHE: OrderedDict[tuple, tuple[Any, dict[str, Tensor], Tensor, Tensor]] = OrderedDict()
_CACHE_SIZE = 24


def _forward(capture: Capture, images: Tensor, dtype: torch.dtype, chunk: int) -> tuple[Tensor, Tensor]:
    model = capture.model().to(dtype)
    model.load_state_dict(capture.model_state, strict=False)  # again, so float64 states keep their bits
    in_shape = tuple(capture.model_spec.get("in_shape") or images.shape[1:])
    if tuple(images.shape[1:]) != in_shape:
        raise ConfigError(f"aux images have shape {tuple(images.shape[1:])} per sample, the model expects {in_shape}")
    feats = []
    with torch.no_grad():
        for part in images.split(chunk):
            feats.append(features_and_logits(model, part.to(dtype), capture.last_layer_name)[0].double())
    features = torch.cat(feats)
    w, b = model_last_layer(capture)
    logits = features @ w.T + (0.0 if b is None else b)
    return logits, features


def aux_forward(capture: Capture, aux: Any, dtype: torch.dtype | str = torch.float64, chunk: int = 256,
                method: str = "aux_forward", cache: bool = True) -> AuxStats:
    """Run the attacker's auxiliary set through the capture's global model (posterior paper Fig. 1, step ②).

    ``dtype`` is the precision of the model body (``"float32"`` is 3–4× faster for VGG/ResNet on CPU); the
    last layer and every statistic are float64.
    ``aux`` is a :class:`gi.world.data.ImageDataset` (or any object with ``.images`` in [0, 1] and ``.labels``).
    The model runs in the protocol's mode (eval by default; in train mode BatchNorm uses the statistics of
    each ``chunk``, which only approximates the victim's batch statistics).
    """
    images, labels = aux_arrays(aux, method)
    dtype = as_dtype(dtype)
    num_classes = capture.num_classes
    if int(labels.max()) >= num_classes or int(labels.min()) < 0:
        raise ConfigError(f"aux labels must be class ids in [0, {num_classes}); got range "
                          f"[{int(labels.min())}, {int(labels.max())}]")
    key = (id(aux), dtype, chunk, capture.protocol.model_mode, repr(sorted(capture.model_spec.items())))
    hit = _CACHE.get(key) if cache else None
    if hit is not None and hit[0]() is aux and _state_equal(hit[1], capture.model_state):
        _CACHE.move_to_end(key)
        logits, features, seconds = hit[2], hit[3], 0.0
    else:
        start = time.perf_counter()
        logits, features = _forward(capture, images, dtype, chunk)
        seconds = time.perf_counter() - start
        if cache:
            try:
                ref = weakref.ref(aux)
            except TypeError:  # objects without weakref support are simply not cached
                ref = None
            if ref is not None:
                _CACHE[key] = (ref, capture.model_state, logits, features)
                while len(_CACHE) > _CACHE_SIZE:
                    _CACHE.popitem(last=False)
    probs = posterior(logits, capture.protocol.loss, capture.protocol.temperature)
    return AuxStats(logits=logits, probs=probs, features=features, labels=labels, num_classes=num_classes,
                    seconds=seconds)


_DUMMY: OrderedDict[tuple, Any] = OrderedDict()


def dummy_forward(capture: Capture, count: int, seed: int = 0, dtype: torch.dtype | str = torch.float64) -> AuxStats:
    """Random uniform [0, 1] images of the model's input shape through the model (LLG*, ZLG's dummy data).

    Labels are ``arange(count) mod C`` (dummy data has no class; methods relabel it as they need). The
    dummy set of one (shape, count, seed) is kept, so its forward is cached like an aux set's.
    """
    from gi.world.data import ImageDataset

    in_shape = tuple(int(s) for s in capture.model_spec["in_shape"])
    key = (in_shape, int(count), int(seed), capture.num_classes)
    data = _DUMMY.get(key)
    if data is None:
        gen = torch.Generator().manual_seed(int(seed))
        images = torch.rand((int(count), *in_shape), generator=gen)
        data = ImageDataset(images, torch.arange(int(count)) % capture.num_classes, capture.num_classes, "noise")
        _DUMMY[key] = data
        while len(_DUMMY) > 4:
            _DUMMY.popitem(last=False)
    return aux_forward(capture, data, dtype=dtype, method="dummy")


def class_means(values: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """Row ``j`` is the mean of ``values`` (N, K) over samples of class ``j``; NaN rows for absent classes."""
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(values.dtype)
    counts = onehot.sum(0)
    sums = onehot.T @ values
    return sums / counts.unsqueeze(1).where(counts.unsqueeze(1) > 0, torch.full_like(counts.unsqueeze(1), torch.nan))


def class_posteriors(stats: AuxStats) -> tuple[Tensor, Tensor]:
    """Positive and negative posterior estimates ``(p̂⁺, p̂⁻)``, each (C,) (posterior paper §3.3, App. B.2).

    ``p̂⁺_j`` is the mean j-th probability over aux samples of class j; ``p̂⁻_j`` the mean j-th probability over
    aux samples of every other class. Classes without aux samples (or without negatives) give NaN.
    """
    return split_means(stats.probs, stats.labels, stats.num_classes)


def split_means(values: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """``(mean over positives of values[:, j], mean over negatives of values[:, j])`` for every class j."""
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(values.dtype)
    n_pos = onehot.sum(0)
    n_neg = values.shape[0] - n_pos
    pos_sum = (onehot * values).sum(0)
    neg_sum = values.sum(0) - pos_sum
    nan = torch.full_like(n_pos, torch.nan)
    return pos_sum / n_pos.where(n_pos > 0, nan), neg_sum / n_neg.where(n_neg > 0, nan)
