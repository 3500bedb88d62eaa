"""Class-label distributions from model updates (Ramakrishna & Dán, AISec 2022, §4–5).

With cross-entropy the client's bias update satisfies eq. 23: the label proportions p equal the scaled bias
update plus the client's mean softmax output along its local steps. The four estimators approximate the
second term; each result is projected onto the probability simplex (eq. 43, :func:`project_simplex`):

- ``dist-init-bias`` (eq. 25): the softmax of the global bias σ(bᵗ);
- ``dist-soft-label`` (eq. 34): ``(I − Σ_aux) p = Δb/η``, Σ_aux's column c the mean softmax of the
  server's class-c aux data along a simulated local run on that class (eq. 27–31);
- ``dist-aux-bias-grad`` (eq. 37): ``B_aux p = Δb``, B_aux's column c the bias update of that run (eq. 35–38);
- ``dist-aux-weight-grad`` (eq. 41): the same with the last-layer weight update, ``vec(ΔW)``;
- ``dist-soft-label-path`` (ours, not in the paper): eq. 34 with Σ_aux read along the client's own path
  θᵗ + s·Δθ instead of along per-class aux runs (:func:`path_softmax`);
- ``dist-exact`` (Proposition 2, eq. 18): eq. 25 under its conditions W⁰ = 0, one full-batch SGD step;
  then (Corollary 2, eq. 39) init-bias, soft-label and aux-bias-grad are exact too.

Normalisation. The paper divides the bias update by ηE, i.e. it counts one full-batch step per epoch. A
client with J mini-batches per epoch and a mean-reduced loss moves J times further, so we divide by
``η Σ_τ ρ_τ`` over the client's actual steps (``ρ = 1`` for plain SGD: the number of steps; momentum and
FedProx-style schemes through RLU Table 1, history terms removed), which equals ηE in the paper's own
setting; ``normalize="epochs"`` keeps the paper's ηE. Every aux run is normalised the same way by its own
steps. I − Σ_aux and B_aux are singular (their columns sum to zero, Note 1), so eq. 34 and eq. 37 are solved
with the sum-to-one row appended: ``solver="nnls"`` (default) is the public code's
``lsqnonneg([A; 1ᵀ], [Δ; 1])``, ``"lstsq"`` the plain least-squares inverse; both are exact in the
Corollary 2 case. With plain SGD and this common scaling ``B_aux = I − Σ_aux`` exactly (a class-c run moves
its bias by ``η Σ_steps (e_c − σ)``), so eq. 34 and eq. 37 give the same estimate; they differ under
momentum (B_aux carries ρ, Σ_aux does not) and with the paper's unequal scalings.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from gi.world.fl import Protocol, local_train
from gi.world.fl.schemes import get_scheme
from gi.world.losses import loss_for
from labels.aux_stats import aux_arrays, class_means, model_last_layer
from labels.base import register
from labels.counts import largest_remainder
from labels.rlu import UpdateView, scheme_rho, update_view

Tensor = torch.Tensor
SOLVERS = ("lstsq", "nnls")
NORMALIZE = ("steps", "epochs")


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection onto the probability simplex, ``argmin_{p ∈ Δ} ‖p − v‖²`` (eq. 43).

    Sort-based algorithm of Duchi et al. (2008), vectorised over leading dimensions: ``v`` (..., C) →
    (..., C) with non-negative rows summing to one. Non-finite entries count as 0 (+inf as a large value).
    """
    v = torch.nan_to_num(torch.as_tensor(v, dtype=torch.float64), nan=0.0, posinf=1e300, neginf=-1e300)
    c = v.shape[-1]
    u = torch.sort(v, dim=-1, descending=True).values
    css = u.cumsum(-1) - 1.0
    k = torch.arange(1, c + 1, dtype=v.dtype)
    cond = u - css / k > 0
    rho = cond.to(torch.long).cumsum(-1).argmax(-1, keepdim=True)  # last index where cond holds
    theta = css.gather(-1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0.0)


# --------------------------------------------------------------------------- the client's side
def _steps(view: UpdateView, protocol: Protocol, normalize: str) -> float:
    """The divisor of ``Δb/η``: the effective number of steps ``Σ_τ ρ_τ`` (or the paper's E)."""
    if normalize not in NORMALIZE:
        raise ConfigError(f"normalize={normalize!r} is not allowed; valid: {list(NORMALIZE)}")
    return float(view.rho.sum()) if normalize == "steps" else float(protocol.local_epochs)


# --------------------------------------------------------------------------- the server's aux runs
@dataclass
class AuxRuns:
    """Per-class local runs of the server on its aux data from θᵗ (eq. 28–30, 36, 42).

    ``softmax`` (C, C): column c the mean softmax over the run's steps on class c (Σ_aux of eq. 33);
    ``bias`` (C, C): column c the scaled bias update ``(b_c − bᵗ)/(η Σρ)`` (B_aux of eq. 38, scaled);
    ``weight`` (C·D, C): column c the scaled ``vec(W_c − Wᵗ)`` (W_aux of eq. 42, scaled); ``steps`` the
    number of steps of each run.
    """

    softmax: Tensor
    bias: Tensor
    weight: Tensor
    steps: int
    seconds: float


_RUNS: OrderedDict[tuple, tuple[Any, dict[str, Tensor], AuxRuns]] = OrderedDict()


def _aux_steps(capture: Capture, view: UpdateView, aux_steps: str | int) -> int:
    if isinstance(aux_steps, int):
        if aux_steps < 1:
            raise ConfigError(f"aux_steps must be >= 1, got {aux_steps}")
        return aux_steps
    if aux_steps == "epochs":
        return int(capture.protocol.local_epochs) if capture.protocol.local_steps is None \
            else len(view.batch_sizes)
    if aux_steps == "steps":
        return len(view.batch_sizes)
    raise ConfigError(f"aux_steps={aux_steps!r} is not allowed; valid: 'epochs', 'steps' or an int >= 1")


def aux_runs(capture: Capture, aux: Any, steps: int) -> AuxRuns:
    """Train θᵗ for ``steps`` full-batch steps on the aux samples of each class (:func:`gi.world.fl.local.local_train`
    with the protocol's loss, lr and optimiser, FedAvg), recording the mean softmax before every step and the
    last-layer change.

    Cached per (aux object, global state, steps), so all clients of one round share the runs.
    """
    images, labels = aux_arrays(aux, "the distribution estimators")
    c = capture.num_classes
    # the runs depend on the protocol's rules, not on the client's own sample count: one key per round
    rules = dataclasses.replace(capture.protocol, num_samples=None)
    key = (id(aux), steps, repr(sorted(capture.model_spec.items())), repr(rules))
    hit = _RUNS.get(key)
    if hit is not None and hit[0]() is aux and all(torch.equal(hit[1][k], v) for k, v in capture.model_state.items()):
        return hit[2]
    start = time.perf_counter()
    protocol = capture.protocol
    weight_key, bias_key = capture.last_layer_keys
    dtype = capture.model_state[weight_key].dtype
    base = capture.model().to(dtype)
    base.load_state_dict(capture.model_state, strict=False)  # again, so float64 states keep their bits
    base.eval()
    images = images.to(dtype)
    loss_fn = loss_for(protocol)
    w0, b0 = model_last_layer(capture)
    softmax = torch.zeros(c, c, dtype=torch.float64)
    bias = torch.zeros(c, c, dtype=torch.float64)
    weight = torch.zeros(w0.numel(), c, dtype=torch.float64)
    run_protocol = Protocol(scheme="fedavg", optimizer=protocol.optimizer, momentum=protocol.momentum, lr=protocol.lr)
    rho = scheme_rho(run_protocol, steps)
    theta0 = {k: p.detach() for k, p in base.named_parameters() if p.requires_grad}
    for cls in range(c):
        x = images[labels == cls]
        if x.shape[0] == 0:
            raise ConfigError(f"the aux set has no samples of class {cls}; the estimators need every class")
        target = torch.nn.functional.one_hot(torch.full((x.shape[0],), cls), c).to(x.dtype)

        def gradient(theta: dict[str, Tensor], tau: int, x: Tensor = x, target: Tensor = target,
                     cls: int = cls) -> dict[str, Tensor]:
            live = {k: t.detach().requires_grad_() for k, t in theta.items()}
            with torch.enable_grad():
                logits = functional_call(base, live, (x,))
                grads = torch.autograd.grad(loss_fn(logits, target), list(live.values()))
            softmax[:, cls] += torch.softmax(logits.detach().double(), 1).mean(0) / steps
            return dict(zip(live, grads))

        with torch.no_grad():
            theta = local_train(theta0, run_protocol, steps, gradient)
        scale = protocol.lr * float(rho.sum())
        weight[:, cls] = (theta[weight_key].double() - w0).flatten() / scale
        if b0 is not None:
            bias[:, cls] = (theta[bias_key].double() - b0) / scale
    runs = AuxRuns(softmax=softmax, bias=bias, weight=weight, steps=steps, seconds=time.perf_counter() - start)
    try:
        _RUNS[key] = (weakref.ref(aux), capture.model_state, runs)
        while len(_RUNS) > 4:
            _RUNS.popitem(last=False)
    except TypeError:
        pass
    return runs


def path_points(num_steps: int, points: int) -> list[float]:
    """Where the client's steps sit on the straight path θᵗ + s·Δθ: step τ of m starts at ``s = τ/m``;
    when ``m > points`` the ``points`` steps ``τ_k = ⌊(k + ½)·m/points⌋`` stand for all of them."""
    if points < 1:
        raise ConfigError(f"points must be >= 1, got {points}")
    m = max(int(num_steps), 1)
    taus = range(m) if m <= points else [int((k + 0.5) * m / points) for k in range(points)]
    return [t / m for t in taus]


def path_softmax(capture: Capture, aux: Any, points: list[float], chunk: int = 512) -> Tensor:
    """Σ_path (C, C): column c the mean softmax of the class-c aux samples, averaged over the models
    θᵗ + s·Δθ at the given path points ``s`` (the whole update Δθ, every layer; softmax in float64)."""
    images, labels = aux_arrays(aux, "dist-soft-label-path")
    c = capture.num_classes
    present = torch.bincount(labels, minlength=c)
    if present.numel() > c or bool((present == 0).any()):
        raise ConfigError(f"the aux set must hold samples of every class in [0, {c}); counts {present.tolist()}")
    dtype = capture.model_state[capture.last_layer_keys[0]].dtype
    model = capture.model().to(dtype)
    images = images.to(dtype)
    total = torch.zeros(c, c, dtype=torch.float64)
    shared = capture.shared
    for s in points:
        state = {k: (v + s * shared[k].to(v.dtype)) if k in shared else v for k, v in capture.model_state.items()}
        model.load_state_dict(state, strict=False)
        with torch.no_grad():
            probs = torch.cat([torch.softmax(model(part).double(), 1) for part in images.split(chunk)])
        total += class_means(probs, labels, c).T  # (C out, C class): mean softmax per aux class
    return total / len(points)


# --------------------------------------------------------------------------- solvers and results
def _solve_with_sum_row(a: Tensor, y: Tensor, solver: str) -> Tensor:
    """Least squares of ``[A; 1ᵀ] p = [y; 1]`` (``"lstsq"``) or its non-negative version (``"nnls"``)."""
    if solver not in SOLVERS:
        raise ConfigError(f"solver={solver!r} is not allowed; valid: {list(SOLVERS)}")
    c = a.shape[1]
    a_aug = torch.cat([a, torch.ones(1, c, dtype=torch.float64)])
    y_aug = torch.cat([y, torch.ones(1, dtype=torch.float64)])
    if solver == "nnls":
        from scipy.optimize import nnls  # here: scipy loads only for the methods that solve with it

        p, _ = nnls(a_aug.numpy(), y_aug.numpy(), maxiter=50 * c)
        return torch.from_numpy(p)
    return torch.linalg.lstsq(a_aug, y_aug.unsqueeze(1), driver="gelsd").solution.squeeze(1)


def _result(method: str, raw: Tensor, view: UpdateView, info: dict[str, Any]) -> LabelResult:
    """Project onto the simplex (eq. 43) and round to counts over the client's samples."""
    if not torch.isfinite(raw).all():
        return LabelResult.failure(method, raw.numel(), "the estimator produced non-finite values", **info)
    p = project_simplex(raw)
    counts = largest_remainder(p, view.distinct)
    return LabelResult(method=method, ok=True, counts=counts, proportions=p, estimate=p * view.distinct,
                       info={"raw": raw.tolist(), **info})


def _prepare(capture: Capture, method: str, normalize: str,
             need_bias: bool = True) -> tuple[UpdateView, Tensor | None, Tensor, float] | LabelResult:
    """The update view and its scaled bias / weight updates; a failure when a needed bias is missing."""
    view = update_view(capture)
    if view.bias is None and need_bias:
        return LabelResult.failure(method, capture.num_classes, "this estimator reads the last-layer bias update; "
                                   f"the last layer {capture.last_layer_name!r} has no bias")
    steps = _steps(view, capture.protocol, normalize)
    return view, (None if view.bias is None else view.bias / steps), view.weight / steps, steps


# --------------------------------------------------------------------------- the estimators
@register("dist-init-bias", "Ramakrishna & Dán eq. 25: p = Δb/(η·steps) + σ(bᵗ), projected onto the simplex")
def recover_init_bias(capture: Capture, aux=None, normalize: str = "steps") -> LabelResult:
    """Initialised-bias estimator (eq. 25): the client's mean softmax is replaced by σ(bᵗ) (eq. 24)."""
    got = _prepare(capture, "dist-init-bias", normalize)
    if isinstance(got, LabelResult):
        return got
    view, u, _, steps = got
    _, b0 = model_last_layer(capture)
    return _result("dist-init-bias", u + torch.softmax(b0, 0), view, {"steps": steps})


def init_bias_over_rounds(captures: list[Capture], normalize: str = "steps") -> Tensor:
    """Eq. 26: the average of eq. 25 over the rounds ``captures`` of one client (each using all its data),
    projected onto the simplex."""
    if not captures:
        raise ConfigError("init_bias_over_rounds needs at least one capture")
    raws = [torch.tensor(recover_init_bias(c, normalize=normalize).info["raw"]) for c in captures]
    return project_simplex(torch.stack(raws).mean(0))


@register("dist-soft-label", "Ramakrishna & Dán eq. 34: (I − Σ_aux) p = Δb/(η·steps), Σ_aux from per-class aux runs")
def recover_dist_soft_label(capture: Capture, aux=None, aux_steps: str | int = "epochs", solver: str = "nnls",
                       normalize: str = "steps") -> LabelResult:
    """Soft-label estimator (eq. 34): Σ_aux's column c is the mean softmax along a local run on class-c aux
    data (eq. 28, 31); solved with the sum-to-one row (I − Σ_aux is singular, Note 1)."""
    got = _prepare(capture, "dist-soft-label", normalize)
    if isinstance(got, LabelResult):
        return got
    view, u, _, steps = got
    runs = aux_runs(capture, aux, _aux_steps(capture, view, aux_steps))
    a = torch.eye(capture.num_classes, dtype=torch.float64) - runs.softmax
    raw = _solve_with_sum_row(a, u, solver)
    return _result("dist-soft-label", raw, view, {"steps": steps, "aux_steps": runs.steps,
                                                   "aux_seconds": runs.seconds})


@register("dist-soft-label-path", "ours: eq. 34 with Σ_aux along the client's path θᵗ + s·Δθ (no aux runs)")
def recover_dist_soft_label_path(capture: Capture, aux=None, points: int = 8, solver: str = "nnls",
                            normalize: str = "steps") -> LabelResult:
    """Soft-label estimator (eq. 34) with a path-matched Σ_aux; ours, not in the paper.

    Eq. 23 needs the client's mean softmax along *its* local steps. The paper's Σ_aux (eq. 28–31) follows a
    server run on one aux class, which drifts towards that class and ignores the direction the client
    actually moved. Here column c is the mean softmax of the class-c aux samples at the models
    θᵗ + s·Δθ, step τ of the client's m steps placed at ``s = τ/m`` (:func:`path_points`, ``points``
    of them at most): the update itself tells the server where the client went. One full-batch step
    (m = 1) gives s = 0, i.e. Σ_aux at θᵗ, so Corollary 2's exact case stays exact. Cost: ``points``
    forward passes of the aux set, no training.
    """
    got = _prepare(capture, "dist-soft-label-path", normalize)
    if isinstance(got, LabelResult):
        return got
    view, u, _, steps = got
    start = time.perf_counter()
    svals = path_points(len(view.batch_sizes), points)
    a = torch.eye(capture.num_classes, dtype=torch.float64) - path_softmax(capture, aux, svals)
    raw = _solve_with_sum_row(a, u, solver)
    return _result("dist-soft-label-path", raw, view, {"steps": steps, "path_points": svals,
                                                        "aux_seconds": time.perf_counter() - start})


@register("dist-aux-bias-grad", "Ramakrishna & Dán eq. 37: Δb = B_aux p, B_aux the bias updates of per-class aux runs")
def recover_aux_bias_grad(capture: Capture, aux=None, aux_steps: str | int = "epochs", solver: str = "nnls",
                          normalize: str = "steps") -> LabelResult:
    """Aux-bias-gradient estimator (eq. 35–38), each side scaled by its own η·steps."""
    got = _prepare(capture, "dist-aux-bias-grad", normalize)
    if isinstance(got, LabelResult):
        return got
    view, u, _, steps = got
    runs = aux_runs(capture, aux, _aux_steps(capture, view, aux_steps))
    raw = _solve_with_sum_row(runs.bias, u, solver)
    return _result("dist-aux-bias-grad", raw, view, {"steps": steps, "aux_steps": runs.steps,
                                                      "aux_seconds": runs.seconds})


@register("dist-aux-weight-grad", "Ramakrishna & Dán eq. 41: vec(ΔW) = W_aux p by least squares")
def recover_aux_weight_grad(capture: Capture, aux=None, aux_steps: str | int = "epochs", include_bias: bool = False,
                            normalize: str = "steps") -> LabelResult:
    """Aux-weight-gradient estimator (eq. 40–42): unconstrained least squares (the pseudo-inverse of eq. 41),
    then the simplex projection. ``include_bias`` stacks the bias rows too, as the public code does."""
    got = _prepare(capture, "dist-aux-weight-grad", normalize, need_bias=include_bias)
    if isinstance(got, LabelResult):
        return got
    view, u, w, steps = got
    runs = aux_runs(capture, aux, _aux_steps(capture, view, aux_steps))
    a, y = runs.weight, w.flatten()
    if include_bias and u is not None:
        a, y = torch.cat([a, runs.bias]), torch.cat([y, u])
    raw = torch.linalg.lstsq(a, y.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    return _result("dist-aux-weight-grad", raw, view, {"steps": steps, "aux_steps": runs.steps,
                                                        "aux_seconds": runs.seconds})


def exact_conditions(capture: Capture) -> list[str]:
    """What keeps Proposition 2 from holding for this capture (empty when it is exact)."""
    p = capture.protocol
    reasons = []
    w0, b0 = model_last_layer(capture)
    if b0 is None:
        reasons.append("the model has no last-layer bias")
    if bool(torch.any(w0 != 0)):
        reasons.append("the global last-layer weight W⁰ is not zero (build the model with init='zero-last')")
    view = update_view(capture)
    if len(view.batch_sizes) != 1 or view.batch_sizes[0] != capture.num_samples:
        reasons.append(f"the client ran {len(view.batch_sizes)} step(s) of {view.batch_sizes[:3]} samples; "
                       "Proposition 2 needs one full-batch epoch (E = 1, B = N)")
    if not get_scheme(p.scheme).plain_first_step or (p.optimizer != "sgd" and p.momentum > 0) or p.weight_decay:
        reasons.append(f"scheme {p.scheme!r} with optimiser {p.optimizer!r} is not plain SGD")
    if p.loss != "ce" or p.label_aug != "onehot" or p.temperature != 1.0:
        reasons.append("the loss is not cross-entropy with one-hot labels")
    if p.dp_sigma > 0 or p.dp_clip is not None:
        reasons.append("the update carries DP noise or clipping")
    return reasons


@register("dist-exact", "Ramakrishna & Dán Proposition 2 (eq. 18): exact p = Δb/η + σ(b⁰) when W⁰ = 0, E = 1, B = N")
def recover_exact(capture: Capture, aux=None, strict: bool = True) -> LabelResult:
    """Proposition 2 / Corollary 2: with W⁰ = 0 every logit equals b⁰, so one full-batch step gives
    ``Δb = η(p − σ(b⁰))`` exactly. ``strict`` returns ``ok=False`` (with the reasons) when the conditions do
    not hold; ``strict=False`` computes eq. 18 anyway (it is then eq. 25)."""
    reasons = exact_conditions(capture)
    if reasons and strict:
        return LabelResult.failure("dist-exact", capture.num_classes, "; ".join(reasons))
    result = recover_init_bias(capture)
    result.method = "dist-exact"
    result.info["exact"] = not reasons
    if reasons:
        result.info["not_exact_because"] = reasons
    return result


@register("uniform-guess", "Reference: p̂ = 1/C for every class (the guess the distribution estimators must beat)")
def recover_uniform_guess(capture: Capture, aux=None) -> LabelResult:
    """The uniform guess ``p̂_c = 1/C`` over the client's samples (Ramakrishna & Dán's comparison point)."""
    view = update_view(capture)
    p = torch.full((capture.num_classes,), 1.0 / capture.num_classes, dtype=torch.float64)
    return LabelResult(method="uniform-guess", ok=True, counts=largest_remainder(p, view.distinct), proportions=p,
                       estimate=p * view.distinct)


__all__ = [
    "AuxRuns",
    "aux_runs",
    "exact_conditions",
    "init_bias_over_rounds",
    "path_points",
    "path_softmax",
    "project_simplex",
    "recover_aux_bias_grad",
    "recover_aux_weight_grad",
    "recover_exact",
    "recover_init_bias",
    "recover_dist_soft_label",
    "recover_dist_soft_label_path",
    "recover_uniform_guess",
]
