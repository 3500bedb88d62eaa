"""Layer-by-layer analytic inversion of a fully-connected net (soft-label paper, §4.2, eq. 6–7), and of a
convolutional body with invertible activations (R-GAP's recursive step, :mod:`fcn_analytic.conv`).

For a layer ``z = W a + b`` followed by ``a' = σ(z)``, with the layer's output ``a'`` and ``∂L/∂a'`` known:

    δ = ∂L/∂z = ∂L/∂a' ⊙ σ'(z)          (σ' read from the output a': ReLU mask, a(1−a) for sigmoid, …)
    ∇W = δ aᵀ  ⇒  a = ∇Wᵀ δ / ‖δ‖²      (eq. 7, least squares over every row with a non-zero gradient)
    ∂L/∂a = Wᵀ δ                         (eq. 6, the next layer down)

With a bias the layer's δ is simply ∇b (the bias attack), so no derivative is needed. Starting from the
last-layer feature (``fcn_analytic.last_layer_features``) this walks down to the normalised input and
undoes the model's ``Normalize`` layer, giving the image in pixel space [0, 1].

A body ``(Conv2d → activation)* → Flatten → (Linear → activation)*`` (e.g. the DLG LeNet) is walked the same way;
a convolution's input is not a rank-one read-out of ∇W, so it is solved from the layer's forward and gradient
constraints together (:func:`fcn_analytic.conv.solve_conv`), which needs σ⁻¹ (sigmoid, tanh, leaky ReLU, …).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fcn_analytic.activations import ACTIVATION_DERIVATIVES, ACTIVATION_INVERSES
from fcn_analytic.conv import check_conv, conv_input_gradient, solve_conv, zero_bound
from fcn_analytic.features import feature_source, output_gradient
from fcn_analytic.polish import PolishLayer, polish
from fcn_analytic.prior import refine_input
from gi.capture import Capture
from gi.core.errors import CaptureError, GIError
from gi.label_result import LabelResult

Tensor = torch.Tensor
_ROWS = 512  # rows per block when a large float32 matrix is used in float64
EXACT_TOL = 1e-4  # relative rank-one residual / forward mismatch under which a layer counts as exact
# a full-rank layer solve below this error pins its input for the body polish: the ReLU LeNet's hidden layers
# from float32 gradients land at 1e-6–5e-4 (docs/results/realistic.md, S1)
DETERMINED_TOL = 1e-3


@dataclass
class LayerReport:
    """How one layer was inverted: ``route`` (``bias`` | ``derivative`` for hidden layers; where the feature came
    from for the last layer: ``label-result`` | ``bias`` | ``fitted-lambda`` | ``given``), rows of ∇W used, the relative
    rank-one residual ``‖∇W − δaᵀ‖/‖∇W‖``, the relative forward mismatch ``‖σ(Wa + b) − a'‖/‖a'‖``
    (None for the last layer), whether both are below :data:`EXACT_TOL`, ``unique``: whether the solve's
    equations pin the input to one point (false for a minimum-norm ``lstsq`` answer whose null space nothing pins,
    and for an input whose null space a prior fills), ``prior_filled``: whether the image prior filled it
    (the input layer, :func:`fcn_analytic.prior.refine_input`), and ``free``: there, a lower bound on the input
    values the equations leave to the prior (unknowns less equations, plus the entries no window reads)."""

    name: str
    route: str
    rows_used: int
    rows: int
    residual: float
    forward_error: float | None
    exact: bool
    unique: bool = True
    prior_filled: bool = False
    free: int = 0


@dataclass
class FCNInversion:
    """``image`` (1, C, H, W) in [0, 1]; ``raw`` the un-clipped float64 pixels; ``features`` the recovered
    input of every layer by parameter prefix; ``layers`` one :class:`LayerReport` per layer, last first.

    An inversion stopped by ``invert(..., stop_above=)`` is incomplete: ``image`` and ``raw`` are None,
    ``layers`` ends with the layer that broke the bound and ``info["stopped_at"]`` names it."""

    image: Tensor | None
    raw: Tensor | None
    features: dict[str, Tensor]
    layers: list[LayerReport]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.complete and all(layer.exact for layer in self.layers)

    @property
    def complete(self) -> bool:
        """Whether every layer was solved down to the image (False: stopped by ``stop_above``)."""
        return self.image is not None


@dataclass
class AnalyticLayer:
    """One invertible layer of a GIModel body: parameter ``prefix``, the ``Linear`` / ``Conv2d`` module, the
    activation after it, and its input / output shapes for one sample."""

    prefix: str
    module: nn.Module
    activation: nn.Module
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


PATTERN = "(Conv2d → activation)* → Flatten → (Linear → activation)*"


def _layer_shapes(body: nn.Module, in_shape: tuple[int, ...]) -> dict[nn.Module, tuple[tuple, tuple]]:
    """Input / output shape (one sample) of every Linear / Conv2d of ``body``, by a forward pass on ``meta``."""
    shapes: dict[nn.Module, tuple[tuple, tuple]] = {}

    def hook(mod: nn.Module, inp: tuple, out: Tensor) -> None:
        shapes[mod] = (tuple(inp[0].shape[1:]), tuple(out.shape[1:]))

    handles = [m.register_forward_hook(hook) for m in body.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    try:
        body(torch.zeros(1, *in_shape, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return shapes


def _leaves(module: nn.Sequential, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The modules of nested ``Sequential`` containers in call order, named by their parameter prefix."""
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        if isinstance(child, nn.Sequential):
            out += _leaves(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out


def analytic_layers(model: nn.Module) -> list[AnalyticLayer]:
    """The invertible layers of a GIModel body ``(Conv2d → activation)* → Flatten → (Linear → activation)*``.

    Raises :class:`GIError` naming the first module that breaks the pattern (a pooling layer, BatchNorm, …).
    """
    body = getattr(model, "body", None)
    if body is None or not hasattr(model, "normalize") or not hasattr(model, "fc"):
        raise GIError("fcn_analytic needs a gi.world.models GIModel (normalize → body → fc)")
    if isinstance(body, nn.Flatten):
        return []
    name = getattr(model, "spec", {}).get("name")
    if not isinstance(body, nn.Sequential) or len(body) == 0:
        raise GIError(f"model {name!r}'s body is {type(body).__name__}; the analytic inversion needs {PATTERN}")
    mods = _leaves(body)
    shapes = _layer_shapes(body, tuple(model.spec["in_shape"]) if hasattr(model, "spec") else ())
    layers: list[AnalyticLayer] = []
    i, flat = 0, False
    while i < len(mods):
        mod_name, mod = mods[i]
        if isinstance(mod, nn.Flatten) and not flat:
            flat, i = True, i + 1
            continue
        wanted = nn.Linear if flat else nn.Conv2d
        if not isinstance(mod, wanted):
            raise GIError(f"model {name!r} is not invertible layer by layer: body.{mod_name} is "
                          f"{type(mod).__name__} where {wanted.__name__} was expected; the analytic inversion needs "
                          f"{PATTERN}")
        if i + 1 >= len(mods):
            raise GIError(f"body.{mod_name} ({type(mod).__name__}) has no activation after it; expected {PATTERN}")
        act_name, act = mods[i + 1]
        if any(True for _ in act.parameters()) or isinstance(act, (nn.Linear, nn.Conv2d, nn.Flatten)):
            raise GIError(f"body.{act_name} is {type(act).__name__}, expected a parameter-free activation after "
                          f"body.{mod_name}")
        if isinstance(mod, nn.Conv2d):
            check_conv(mod, f"body.{mod_name}")
        layers.append(AnalyticLayer(f"body.{mod_name}", mod, act, *shapes[mod]))
        i += 2
    if not flat:
        raise GIError(f"model {name!r}'s body has no Flatten; the analytic inversion needs {PATTERN}")
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
    (a dead ReLU) gets δ = 0 even where rounding left a tiny δ. Returns a, the δ used, the rows and the residual.
    A row is zero where its largest and smallest entries are (two reductions, no boolean copy of ∇W: FCN-4's
    first layer has 50M entries)."""
    delta = torch.where((gw.amax(1) != 0) | (gw.amin(1) != 0), delta, torch.zeros_like(delta))
    rows = int((delta != 0).sum())
    dd = float(delta.dot(delta))
    if rows == 0 or dd == 0:
        raise GIError(f"{name}: every unit has a zero gradient (δ = 0), the layer is rank-deficient and its input "
                      "cannot be recovered")
    a = _matvec_t(gw, delta) / dd
    return a, delta, rows, _rank_one_residual(gw, delta, a)


def _normalization(capture: Capture, channels: int) -> tuple[Tensor, Tensor]:
    """The model's Normalize buffers (from the state, else from the spec's named normalisation)."""
    from gi.world.models import NORMALIZATIONS

    state = capture.model_state
    if "normalize.mean" in state and "normalize.std" in state:
        mean, std = state["normalize.mean"], state["normalize.std"]
    else:
        m, s = NORMALIZATIONS[capture.model_spec.get("norm") or ("cifar10" if channels == 3 else "mnist")]
        mean, std = torch.tensor(m).expand(channels), torch.tensor(s).expand(channels)
    return mean.double().reshape(-1, 1, 1), std.double().reshape(-1, 1, 1)


def _delta_from_derivative(layer: AnalyticLayer, grad_a: Tensor, a_out: Tensor) -> Tensor:
    act = layer.activation
    if type(act) not in ACTIVATION_DERIVATIVES:
        raise GIError(f"{layer.prefix}'s activation {type(act).__name__} has no derivative readable from its "
                      f"output; supported: {sorted(t.__name__ for t in ACTIVATION_DERIVATIVES)}")
    return grad_a * ACTIVATION_DERIVATIVES[type(act)](a_out, act)


def _linear_step(capture: Capture, layer: AnalyticLayer, gw: Tensor, a_out: Tensor, grad_a: Tensor,
                 need_grad: bool, nonnegative: bool = False) -> tuple[Tensor, Tensor | None, LayerReport]:
    """Eq. 7 for a Linear layer (δ from its bias gradient, else from σ'), then eq. 6 for the layer below
    (``nonnegative`` is not read: eq. 7's read-out has no null space)."""
    state, lin = capture.model_state, layer.module
    gb = _shared(capture, f"{layer.prefix}.bias") if lin.bias is not None else None
    if gb is not None:
        delta, route = gb.double(), "bias"
    else:
        delta, route = _delta_from_derivative(layer, grad_a, a_out), "derivative"
    a_in, delta, rows, residual = _invert_layer(gw, delta, layer.prefix)
    w = state[f"{layer.prefix}.weight"]
    z = _matvec(w, a_in)
    if lin.bias is not None:
        z = z + state[f"{layer.prefix}.bias"].double()
    forward = float((layer.activation(z) - a_out).norm() / a_out.norm().clamp_min(1e-300))
    report = LayerReport(layer.prefix, route, rows, delta.numel(), residual, forward,
                         residual < EXACT_TOL and forward < EXACT_TOL)
    return a_in, (_matvec_t(w, delta) if need_grad else None), report


def _is_relu(act: nn.Module) -> bool:
    return type(act) is nn.ReLU or (type(act) is nn.LeakyReLU and act.negative_slope == 0)


def snap_dead(act: nn.Module, a_out: Tensor) -> Tensor:
    """A ReLU output recovered by least squares from the layer above holds rounding noise (~1e-8 relative) where
    the unit is dead; read as ``a > 0`` it would mark a quarter of the dead units active and give them forward
    rows ``z = 0`` and a δ they do not have. Snap it to the exact zero the forward pass had: at or below
    :func:`fcn_analytic.conv.zero_bound`."""
    if not _is_relu(act):
        return a_out
    return torch.where(a_out > zero_bound(a_out), a_out, torch.zeros_like(a_out))


def _conv_step(capture: Capture, layer: AnalyticLayer, gw: Tensor, a_out: Tensor, grad_a: Tensor,
               need_grad: bool, nonnegative: bool = False) -> tuple[Tensor, Tensor | None, LayerReport]:
    """A convolution: z = σ⁻¹(a), δ = ∂L/∂a ⊙ σ'(z), then the stacked least squares of
    :func:`fcn_analytic.conv.solve_conv` with the forward rows weighted by σ'(z); eq. 6 (convᵀ δ) for the layer
    below. ``nonnegative``: the layer's input is a ReLU's output, whose zeros pin a rank-deficient solve's null
    space (:func:`fcn_analytic.conv.nonnegative_null_fit`)."""
    act, conv = layer.activation, layer.module
    if type(act) not in ACTIVATION_INVERSES:
        raise GIError(f"{layer.prefix} is a convolution followed by {type(act).__name__}, which has no inverse; "
                      f"the analytic inversion of a convolution needs one of "
                      f"{sorted(t.__name__ for t in ACTIVATION_INVERSES)}")
    state = capture.model_state  # the solve runs on the CPU in float64 (LAPACK), wherever the capture lives
    w, gw, a_out, grad_a = (t.detach().cpu().double() for t in (state[f"{layer.prefix}.weight"], gw, a_out, grad_a))
    a_out = snap_dead(act, a_out)
    z, valid = ACTIVATION_INVERSES[type(act)](a_out, act)
    if conv.bias is not None:
        z = z - state[f"{layer.prefix}.bias"].detach().cpu().double().view(-1, 1, 1)
    slope = ACTIVATION_DERIVATIVES[type(act)](a_out, act)  # σ'(z): δ's factor and the forward rows' weights
    delta = grad_a * slope  # eq. 6 (every activation with an inverse has its derivative registered)
    o = w.shape[0]
    solved = solve_conv(conv, layer.in_shape, w, z.reshape(o, -1), valid.reshape(o, -1), delta.reshape(o, -1),
                        gw, slope.reshape(o, -1), nonnegative=nonnegative)
    x, residual, forward = solved.x, solved.residual, solved.forward_residual
    unread = f", {solved.unread} input entries no window reads" if solved.unread else ""
    route = f"least-squares ({solved.solver}{unread})"
    if solved.null is not None:
        null = solved.null
        route = (f"least-squares (a {null.dim}-dimensional null space pinned by the input's {null.zeros} zeros"
                 f"{unread})" if null.pinned else
                 f"least-squares ({solved.solver}{unread}; its {null.dim}-dimensional null space is not pinned by "
                 f"the input's {null.zeros} zeros)")
    equations = int(valid.sum()) + o * int(w[0].numel())  # the forward rows of the live units and the gradient's
    unique, filled = solved.solver != "lstsq" or (solved.null is not None and solved.null.pinned), False
    if not need_grad and (solved.solver == "lstsq" or equations < solved.unknowns):
        # the input layer leaves a null space (a ReLU's dead units drop their forward rows): fill it with the
        # image prior of fcn_analytic.prior instead of the minimum-norm zeros
        mean, std = _normalization(capture, layer.in_shape[0])
        bias = state.get(f"{layer.prefix}.bias")
        dead = ~valid if _is_relu(act) else torch.zeros_like(valid)
        refined = refine_input(conv, w, None if bias is None else bias.detach().cpu(), z, valid, dead, delta, gw,
                               mean, std, solved.x, forward_weight=slope)
        x, residual, forward = refined.x, refined.residual, max(refined.forward_residual, refined.hinge)
        route += f" + TV prior ({equations} rows < {solved.unknowns} unknowns)"
        unique, filled = False, True
    free = max(solved.unknowns - equations, 0) + solved.unread if filled else 0
    report = LayerReport(layer.prefix, route, solved.rows, solved.unknowns, residual, forward,
                         residual < EXACT_TOL and forward < EXACT_TOL, unique, filled, free)
    grad_in = conv_input_gradient(conv, layer.in_shape, w, delta) if need_grad else None
    return x, grad_in, report


# layer type → its inversion step (a_out, ∂L/∂a_out → a_in, ∂L/∂a_in, report)
LAYER_ROUTES: dict[type, Callable[..., tuple[Tensor, Tensor | None, LayerReport]]] = {
    nn.Linear: _linear_step,
    nn.Conv2d: _conv_step,
}


def layer_error(report: LayerReport) -> float:
    """A layer's inconsistency: the larger of its gradient residual and its forward mismatch."""
    return max(report.residual, report.forward_error or 0.0)


def invert(capture: Capture, label_result: LabelResult | None = None, features: Tensor | None = None,
           stop_above: float | None = None) -> FCNInversion:
    """Reconstruct the input image of a GIModel whose body is :data:`PATTERN` from one sample's gradient, layer
    by layer from the last one: a Linear layer by eq. 7 (§4.2), a convolution by
    :func:`fcn_analytic.conv.solve_conv` (R-GAP); eq. 6 carries ∂L/∂a down.

    ``features`` (the last-layer input) default to :func:`last_layer_features` of ``label_result`` (e.g. the
    ``soft-lambda`` result). Works with bias-free and biased layers (a bias gives a Linear layer's δ directly),
    ReLU masks and other activations through their derivative (and, after a convolution, their inverse). Raises
    :class:`GIError` for a body outside the pattern or a layer whose gradient is all zero, :class:`CaptureError`
    for a capture that lacks a layer.

    ``stop_above``: stop the walk at the first layer whose :func:`layer_error` reaches it, when a layer is left
    below. The inversion's largest layer error is then at or above the bound whatever the layers below give, so
    a caller that discards inversions worse than the bound loses nothing and skips the solves below (a ReLU
    LeNet: the lowest, rank-deficient least-squares solve, the most expensive). The result is then incomplete
    (:attr:`FCNInversion.complete`).
    """
    start = time.perf_counter()
    capture.check()
    n = capture.num_samples
    if n != 1:
        raise GIError(f"analytic inversion reads one sample's gradient; this capture holds {n}")
    with torch.device("meta"):  # structure only: no 55M-parameter allocation or initialisation
        model = capture.architecture()
    layers = analytic_layers(model)
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
    grad_top = grad_a
    a_out = x
    for i, layer in reversed(list(enumerate(layers))):
        gw = _shared(capture, f"{layer.prefix}.weight")
        if gw is None:
            raise CaptureError(f"capture shares no {layer.prefix + '.weight'!r}; analytic inversion needs every "
                               "layer")
        if tuple(gw.shape) != tuple(layer.module.weight.shape):
            raise CaptureError(f"shared {layer.prefix}.weight has shape {tuple(gw.shape)}, the model's layer is "
                               f"{tuple(layer.module.weight.shape)}: capture and model differ")
        step = LAYER_ROUTES[type(layer.module)]
        a_in, grad_a, report = step(capture, layer, gw, a_out.reshape(layer.out_shape),
                                    grad_a.reshape(layer.out_shape), need_grad=i > 0,
                                    nonnegative=i > 0 and _is_relu(layers[i - 1].activation))
        reports.append(report)
        recovered[layer.prefix] = a_in
        a_out = a_in
        if stop_above is not None and i > 0 and layer_error(report) >= stop_above:
            info = {"seconds": time.perf_counter() - start, "layers": len(reports), "stopped_at": layer.prefix,
                    "stop_above": stop_above}
            return FCNInversion(None, None, recovered, reports, info)
    shape = tuple(capture.model_spec["in_shape"])
    mean, std = _normalization(capture, shape[0])
    raw = (a_out.view(shape) * std + mean).unsqueeze(0)
    info: dict[str, Any] = {}
    if polishable(reports):
        done = polish(capture.model(), polish_layers(layers, recovered, reports), capture.shared, grad_top, raw,
                      mean, std)
        raw, info["polish"] = done.raw, done.record()
    info.update({"seconds": time.perf_counter() - start, "layers": len(layers) + 1,
                 "out_of_range": float((raw - raw.clamp(0, 1)).abs().max())})
    return FCNInversion(raw.clamp(0, 1).float(), raw, recovered, reports, info)


def determined(report: LayerReport) -> bool:
    """Whether a layer's solve pinned its input down: a ``unique`` solve (a full-rank one, or a rank-deficient one
    whose null space the input's zeros pin; no minimum-norm ``lstsq`` point, no prior fill) whose
    :func:`layer_error` is below :data:`DETERMINED_TOL`."""
    return report.unique and layer_error(report) < DETERMINED_TOL


def polish_layers(layers: list[AnalyticLayer], recovered: dict[str, Tensor],
                  reports: list[LayerReport]) -> list[PolishLayer]:
    """The body polish's view of a walk (:func:`invert`'s ``layers``, its recovered inputs by prefix and its reports,
    last layer first): each layer's output is the input the layer above recovered, kept where that layer was
    :func:`determined` and the activation is a ReLU (only there is an active output its pre-activation), with the
    dead units' rounding noise snapped to zero."""
    above = [ly.prefix for ly in layers[1:]] + ["fc"]
    return [PolishLayer(ly.prefix, snap_dead(ly.activation, recovered[name].reshape(ly.out_shape).double())
                        if determined(report) and _is_relu(ly.activation) else None)
            for ly, name, report in zip(layers, above, reversed(reports[:-1]))]


def polishable(reports: list[LayerReport]) -> bool:
    """The body polish (:mod:`fcn_analytic.polish`) runs when the input layer needed the TV prior and every layer
    above it was determined: the image then fills a null space, and the layers above say what it must produce."""
    return reports[-1].prior_filled and all(determined(r) for r in reports[:-1])

