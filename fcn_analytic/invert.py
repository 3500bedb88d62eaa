"""Layer-by-layer analytic inversion of a fully-connected net (soft-label paper, §4.2, eq. 6–7).

For a layer ``z = W a + b`` followed by ``a' = σ(z)``, with the layer's output ``a'`` and ``∂L/∂a'`` known:

    δ = ∂L/∂z = ∂L/∂a' ⊙ σ'(z)          (σ' read from the output a': ReLU mask, a(1−a) for sigmoid, …)
    ∇W = δ aᵀ  ⇒  a = ∇Wᵀ δ / ‖δ‖²      (eq. 7, least squares over every row with a non-zero gradient)
    ∂L/∂a = Wᵀ δ                         (eq. 6, the next layer down)

With a bias the layer's δ is simply ∇b (the bias attack), so no derivative is needed. Starting from the
last-layer feature (``fcn_analytic.last_layer_features``) this walks down to the normalised input and
undoes the model's ``Normalize`` layer, giving the image in pixel space [0, 1].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fcn_analytic.features import feature_source, output_gradient
from gi.capture import Capture
from gi.core.errors import CaptureError, GIError
from gi.label_result import LabelResult

Tensor = torch.Tensor
_ROWS = 512  # rows per block when a large float32 matrix is used in float64
EXACT_TOL = 1e-4  # relative rank-one residual / forward mismatch under which a layer counts as exact


def _selu_derivative(a: Tensor, m: nn.Module) -> Tensor:
    scale, alpha = 1.0507009873554805, 1.6732632423543772
    return torch.where(a > 0, torch.full_like(a, scale), a + scale * alpha)


# activation class → σ'(z) written as a function of the output a = σ(z) (and the module, for its parameters)
ACTIVATION_DERIVATIVES: dict[type, Callable[[Tensor, nn.Module], Tensor]] = {
    nn.ReLU: lambda a, m: (a > 0).to(a.dtype),
    nn.Sigmoid: lambda a, m: a * (1 - a),
    nn.Tanh: lambda a, m: 1 - a * a,
    nn.Identity: lambda a, m: torch.ones_like(a),
    nn.LeakyReLU: lambda a, m: torch.where(a > 0, torch.ones_like(a), torch.full_like(a, m.negative_slope)),
    nn.ELU: lambda a, m: torch.where(a > 0, torch.ones_like(a), a + m.alpha),
    nn.SELU: _selu_derivative,
}


@dataclass
class LayerReport:
    """How one layer was inverted: ``route`` (``bias`` | ``derivative`` for hidden layers; where the feature came
    from for the last layer: ``label-result`` | ``bias`` | ``fitted-lambda`` | ``given``), rows of ∇W used, the relative
    rank-one residual ``‖∇W − δaᵀ‖/‖∇W‖``, the relative forward mismatch ``‖σ(Wa + b) − a'‖/‖a'‖``
    (None for the last layer) and whether both are below :data:`EXACT_TOL`."""

    name: str
    route: str
    rows_used: int
    rows: int
    residual: float
    forward_error: float | None
    exact: bool


@dataclass
class FCNInversion:
    """``image`` (1, C, H, W) in [0, 1]; ``raw`` the un-clipped float64 pixels; ``features`` the recovered
    input of every layer by parameter prefix; ``layers`` one :class:`LayerReport` per layer, last first."""

    image: Tensor
    raw: Tensor
    features: dict[str, Tensor]
    layers: list[LayerReport]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return all(layer.exact for layer in self.layers)


def fc_layers(model: nn.Module) -> list[tuple[str, nn.Linear, nn.Module]]:
    """``[(prefix, Linear, activation)]`` of a fully-connected GIModel body ``Flatten → (Linear → act)*``.

    Raises :class:`GIError` naming the first module that breaks the pattern.
    """
    body = getattr(model, "body", None)
    if body is None or not hasattr(model, "normalize") or not hasattr(model, "fc"):
        raise GIError("fcn_analytic needs a gi.models GIModel (normalize → body → fc)")
    if isinstance(body, nn.Flatten):
        return []
    if not isinstance(body, nn.Sequential) or len(body) == 0 or not isinstance(body[0], nn.Flatten):
        first = type(body[0]).__name__ if isinstance(body, nn.Sequential) and len(body) else type(body).__name__
        raise GIError(f"model {getattr(model, 'spec', {}).get('name')!r} is not fully connected: its body starts "
                      f"with {first}, fcn_analytic needs Flatten → (Linear → activation)*")
    mods = list(body.named_children())[1:]
    layers = []
    for i in range(0, len(mods), 2):
        name, lin = mods[i]
        if not isinstance(lin, nn.Linear):
            raise GIError(f"model is not fully connected: body.{name} is {type(lin).__name__}, expected Linear")
        if i + 1 >= len(mods):
            raise GIError(f"body.{name} (Linear) has no activation after it; expected Linear → activation pairs")
        act_name, act = mods[i + 1]
        if any(True for _ in act.parameters()) or isinstance(act, (nn.Linear, nn.Flatten)):
            raise GIError(f"body.{act_name} is {type(act).__name__}, expected a parameter-free activation after "
                          f"body.{name}")
        layers.append((f"body.{name}", lin, act))
    return layers


def _shared(capture: Capture, name: str) -> Tensor | None:
    """Gradient-like shared tensor (updates become −Δθ/η, as Capture.last_layer does); original dtype."""
    t = capture.shared.get(name)
    if t is None:
        return None
    return t * (-1.0 / capture.protocol.lr) if capture.is_update else t


def _matvec_t(mat: Tensor, v: Tensor) -> Tensor:
    """``matᵀ v`` (float64 result). A float32 matrix stays float32 inside blocks of rows (a float64 copy of
    FCN-4's 50M-entry first layer would cost more than the whole inversion); blocks accumulate in float64."""
    out = torch.zeros(mat.shape[1], dtype=torch.float64)
    for s in range(0, mat.shape[0], _ROWS):
        block = mat[s:s + _ROWS]
        out += (block.T @ v[s:s + block.shape[0]].to(block.dtype)).double()
    return out


def _matvec(mat: Tensor, v: Tensor) -> Tensor:
    return (mat @ v.to(mat.dtype)).double()


def _rank_one_residual(gw: Tensor, delta: Tensor, a: Tensor, rows: int = 256) -> float:
    """Relative residual ``‖∇W − δaᵀ‖/‖∇W‖`` in float64 on the ``rows`` rows with the largest |δ|."""
    idx = torch.topk(delta.abs(), min(rows, delta.numel())).indices
    part = gw[idx].double()
    return float((part - delta[idx, None] * a[None]).norm() / part.norm().clamp_min(1e-300))


def _invert_layer(gw: Tensor, delta: Tensor, name: str) -> tuple[Tensor, Tensor, int, float]:
    """Eq. 7 over the rows with a non-zero gradient: ``a = ∇Wᵀ δ/‖δ‖²``. A row of ∇W that is exactly zero
    (a dead ReLU) gets δ = 0 even where rounding left a tiny δ. Returns a, the δ used, the rows and the residual."""
    delta = torch.where(gw.ne(0).any(1), delta, torch.zeros_like(delta))
    rows = int((delta != 0).sum())
    dd = float(delta.dot(delta))
    if rows == 0 or dd == 0:
        raise GIError(f"{name}: every unit has a zero gradient (δ = 0), the layer is rank-deficient and its input "
                      "cannot be recovered")
    a = _matvec_t(gw, delta) / dd
    return a, delta, rows, _rank_one_residual(gw, delta, a)


def _normalization(capture: Capture, channels: int) -> tuple[Tensor, Tensor]:
    """The model's Normalize buffers (from the state, else from the spec's named normalisation)."""
    from gi.models import NORMALIZATIONS

    state = capture.model_state
    if "normalize.mean" in state and "normalize.std" in state:
        mean, std = state["normalize.mean"], state["normalize.std"]
    else:
        m, s = NORMALIZATIONS[capture.model_spec.get("norm") or ("cifar10" if channels == 3 else "mnist")]
        mean, std = torch.tensor(m).expand(channels), torch.tensor(s).expand(channels)
    return mean.double().reshape(-1, 1, 1), std.double().reshape(-1, 1, 1)


def invert(capture: Capture, label_result: LabelResult | None = None, features: Tensor | None = None) -> FCNInversion:
    """Reconstruct the input image of a fully-connected GIModel from one sample's gradient (§4.2, eq. 6–7).

    ``features`` (the last-layer input) default to :func:`last_layer_features` of ``label_result`` (e.g. the
    ``soft-lambda`` result). Works with bias-free and biased layers (a bias gives δ directly), ReLU masks and
    other activations through their derivative. Raises :class:`GIError` for a net that is not fully
    connected or a layer whose gradient is all zero, :class:`CaptureError` for a capture that lacks a layer.
    """
    start = time.perf_counter()
    capture.check()
    n = capture.num_samples
    if n != 1:
        raise GIError(f"analytic inversion reads one sample's gradient; this capture holds {n}")
    with torch.device("meta"):  # structure only: no 55M-parameter allocation or initialisation
        from gi.models import from_spec

        model = from_spec(capture.model_spec)
    layers = fc_layers(model)
    if features is None:
        features, source = feature_source(capture, label_result)
    else:
        source = "given"
    x = features.reshape(-1).double()
    state = capture.model_state
    gw_fc = _shared(capture, "fc.weight")
    if gw_fc is None:
        raise CaptureError("capture shares no 'fc.weight'; analytic inversion needs every layer's gradient")
    delta = output_gradient(capture, x)
    reports, recovered = [], {"fc": x}
    fc_res = _rank_one_residual(gw_fc, delta, x)
    reports.append(LayerReport("fc", source, int((delta != 0).sum()), delta.numel(), fc_res, None,
                               fc_res < EXACT_TOL))
    grad_a = state["fc.weight"].double().T @ delta  # eq. 6: ∂L/∂(input of fc)
    a_out = x
    for i, (prefix, lin, act) in reversed(list(enumerate(layers))):
        gw = _shared(capture, f"{prefix}.weight")
        if gw is None:
            raise CaptureError(f"capture shares no {prefix + '.weight'!r}; analytic inversion needs every layer")
        if tuple(gw.shape) != (lin.out_features, lin.in_features):
            raise CaptureError(f"shared {prefix}.weight has shape {tuple(gw.shape)}, the model's layer is "
                               f"{(lin.out_features, lin.in_features)}: capture and model differ")
        gb = _shared(capture, f"{prefix}.bias") if lin.bias is not None else None
        if gb is not None:
            delta, route = gb.double(), "bias"
        elif type(act) in ACTIVATION_DERIVATIVES:
            delta, route = grad_a * ACTIVATION_DERIVATIVES[type(act)](a_out, act), "derivative"
        else:
            raise GIError(f"{prefix} has no bias and its activation {type(act).__name__} has no derivative readable "
                          f"from its output; supported: {sorted(t.__name__ for t in ACTIVATION_DERIVATIVES)}")
        a_in, delta, rows, residual = _invert_layer(gw, delta, prefix)
        w = state[f"{prefix}.weight"]
        z = _matvec(w, a_in)
        if lin.bias is not None:
            z = z + state[f"{prefix}.bias"].double()
        forward = float((act(z) - a_out).norm() / a_out.norm().clamp_min(1e-300))  # parameter-free modules
        reports.append(LayerReport(prefix, route, rows, delta.numel(), residual, forward,
                                   residual < EXACT_TOL and forward < EXACT_TOL))
        recovered[prefix] = a_in
        if i > 0:
            grad_a = _matvec_t(w, delta)  # eq. 6
        a_out = a_in
    shape = tuple(capture.model_spec["in_shape"])
    mean, std = _normalization(capture, shape[0])
    raw = (a_out.view(shape) * std + mean).unsqueeze(0)
    info = {"seconds": time.perf_counter() - start, "layers": len(layers) + 1,
            "out_of_range": float((raw - raw.clamp(0, 1)).abs().max())}
    return FCNInversion(raw.clamp(0, 1).float(), raw, recovered, reports, info)

