"""Per-sample labels of a FedSGD batch, or of a one-epoch FedAvg round of plain SGD, from a disaggregated
fully-connected layer.

A net whose first ``nn.Linear`` sees a ReLU / max-pool map shares that layer's gradient ``∇W = Δ Xᵀ``; its B
inputs X are the extreme rays of the nonnegative cone in ∇W's row space
(:func:`fcn_analytic.disaggregate.linear_inputs`: vertices by linear programs, SPEAR's sparsity sampling as the
fallback; Dimitrov et al. 2024 sample the other factor), and with them come each sample's output errors
e_i = ∂ℓ_i/∂z_i of that layer (the columns of Δ).

Completing the inputs (:func:`complete_inputs`). Random linear objectives can miss a vertex, and the sampling
fallback then fills the gap with a spurious one: a vector of the cone that is not an input (on a FedAvg round of
50 Fashion-MNIST images, 4 of 50 in some rounds, with ~100 zeros of 3136 where an input has ~700). One spurious
input mixes its missing sample's error into every other sample's e_i, because Δ = ∇W X⁺ solves all columns
together. The true inputs are the vertices with many zeros; a linear objective orthogonal to the coefficient
vectors of those already found vanishes on them, so its optimum over the polytope is one of the missing vertices
(every point of the polytope is a nonnegative mixture of the vertices): a few programs per missing input.

Each sample's label from its own error. When the layer is followed by a ReLU and the last layer (h = relu(z)),
each sample's error is ``e_i = relu'(z_i) ⊙ W_Lᵀ g_i`` with g_i = ∂ℓ_i/∂logits (the chain rule): the units where
e_i ≠ 0 are the active ones at the sample's own step, and on them g_i is the least-squares solution of
``W_L[:, active]ᵀ g_i = e_i[active]`` (C unknowns, about half of the hidden units as equations). For the
cross-entropy loss ``g_i = softmax(z_i) − y_i`` (``(softmax(z_i/T) − y_i)/T`` under a softmax temperature T), so the
label is ``y_i = softmax(z_i) − g_i``; a hard label is the one negative entry of g_i. W_L at θᵗ stands for the
sample's own step's (its drift over one epoch of 10 steps is small), where the previous reading, the last layer's
gradient ``∇W_L = (1/B) Σ_i δ_i h_iᵀ`` solved for all δ_i together (:func:`fcn_analytic.disaggregate.sample_errors`),
needs every h_i and reads them at θᵗ; that reading remains for nets of another shape.

A FedAvg update of plain SGD over one local epoch reads the same way: its ``−ΔW/η`` sums the steps' batch gradients,
each sample once, at its own step's parameters (:func:`fcn_analytic.disaggregate.summed_layer`). The last layer's
bias update checks the errors: ``Σ_i g_i = B·(−Δb_L/η)`` (FedSGD: ``B·∇b_L``) holds exactly at the steps'
parameters (``info["bias_residual"]``, relative).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gi.capture import Capture
from gi.core.errors import GIError
from gi.label_result import LabelResult
from labels.base import register

SURE_ZEROS = 0.5  # complete_inputs: an input is sure with at least this fraction of the found inputs' median zeros
ACTIVE = 1e-2  # hidden_errors: an error entry below this fraction of the sample's largest marks an inactive unit
BIAS_TOL = 0.05  # labels_from_inputs: a relative miss of the bias identity that doubts the worst-fitted row
LEAK_ROUNDS = 3  # hidden_errors: refits of the active set with doubtful inputs' errors mixed in


@register("fc-inputs", "per-sample labels of a FedSGD batch or a one-epoch plain-SGD FedAvg round: the first Linear "
                       "layer's inputs from its gradient (completed by targeted linear programs), each sample's "
                       "label from its own output error of that layer (cross-entropy)")
def recover_fc_inputs(capture: Capture, aux=None, layer: str | None = None, draws: int = 1_000_000,
                      programs: int = 8) -> LabelResult:
    """The labels of every sample of a FedSGD batch or a one-epoch round (module docstring); ``layer`` the Linear
    layer to disaggregate (default: the model's first); ``draws`` the budget of the sampling that looks for inputs
    the vertex search missed; ``programs`` the targeted linear programs per input still missing
    (:func:`complete_inputs`; 0: none). ``ok=False`` with the reason where it does not apply: an update of another
    optimiser or of more than one epoch, one sample, a loss other than cross-entropy, a layer without shared weight
    and bias gradients, inputs not found."""
    from fcn_analytic.disaggregate import first_linear, linear_inputs, summed_layer

    c = capture.num_classes
    if capture.protocol.loss != "ce":
        return LabelResult.failure("fc-inputs", c, f"y = softmax(z) − δ holds for the cross-entropy loss, not "
                                                   f"protocol.loss={capture.protocol.loss!r}")
    name = layer or first_linear(capture.model())
    summed = None if name is None or name == capture.last_layer_name else summed_layer(capture, name)
    if summed is None:
        return LabelResult.failure("fc-inputs", c, f"no fully-connected layer before the last with shared weight "
                                                   f"and bias gradients, or an update that is not a plain sum of "
                                                   f"SGD steps (layer {name!r})")
    if not summed.once:
        return LabelResult.failure("fc-inputs", c, "an update of more than one local epoch: each sample's visits "
                                                   "differ by the parameters' drift, so they are not one input each")
    if summed.samples < 2:
        return LabelResult.failure("fc-inputs", c, "one sample: its layer input is ∇Wᵀ∇b/‖∇b‖²; use soft-lambda")
    try:
        found = linear_inputs(summed.weight, summed.bias, summed.samples, samples=draws, **summed.tolerances)
    except GIError as exc:
        return LabelResult.failure("fc-inputs", c, str(exc))
    result = labels_from_inputs(capture, name, summed, found.inputs, programs)
    result.info["draws"] = found.draws
    return result


def labels_from_inputs(capture: Capture, name: str, summed, inputs: torch.Tensor, programs: int = 8
                       ) -> LabelResult:
    """The ``fc-inputs`` labels from the inputs :func:`fcn_analytic.disaggregate.linear_inputs` found for layer
    ``name`` of ``summed`` (:class:`fcn_analytic.disaggregate.SummedLayer`): completed (:func:`complete_inputs`),
    each sample's error read (:func:`hidden_errors`, else the last layer's least squares), the doubtful rows'
    classes from the bias identity (:func:`missed_labels`). Where the errors miss the bias identity by more than
    :data:`BIAS_TOL` with no row doubtful, the worst-fitted row is doubted and the reading redone; the reading
    that misses it less is kept."""
    read = _reading(capture, name, summed, inputs, programs, None)
    if read.bias is not None and read.bias > BIAS_TOL and read.fit is not None and not bool(read.doubtful.any()):
        again = _reading(capture, name, summed, read.inputs, programs, int(read.fit.argmax()))
        if again.bias is not None and again.bias < read.bias:
            read = again
    info = {"layer": name, "residual": read.residual, "completed": read.added, "doubtful": int(read.doubtful.sum()),
            "errors_from": "last-layer least squares" if read.fit is None else "own hidden error",
            "bias_residual": read.bias}
    if read.fit is not None:
        info["fit_residual_max"] = float(read.fit[~read.doubtful].max())
    counts = torch.bincount(read.labels, minlength=capture.num_classes)
    return LabelResult.from_counts("fc-inputs", counts, soft=read.soft.float(), info=info)


@dataclass
class _Reading:
    """One reading of the labels (:func:`labels_from_inputs`): the completed inputs, soft rows, hard labels, each
    row's fit residual (None: the last layer's least squares), the doubtful rows, the bias identity's relative
    miss, the rows replaced and the factorisation's residual."""

    inputs: torch.Tensor
    soft: torch.Tensor
    labels: torch.Tensor
    fit: torch.Tensor | None
    doubtful: torch.Tensor
    bias: float | None
    added: int
    residual: float


def _reading(capture: Capture, name: str, summed, inputs: torch.Tensor, programs: int, doubt: int | None
             ) -> _Reading:
    from fcn_analytic.disaggregate import sample_errors

    c = capture.num_classes
    found, added, doubtful = complete_inputs(summed.weight, summed.bias, inputs, programs=programs, doubt=doubt,
                                             **summed.tolerances)
    t = float(capture.protocol.temperature)  # g = (softmax(z/T) − y)/T
    errors = found.output_errors * summed.per_mean
    read = hidden_errors(capture, name, found.inputs, errors, leak=errors[doubtful])
    if read is None:
        logits, g = sample_errors(capture, name, found.inputs, summed.per_mean)
        fit = None
    else:
        logits, g, fit = read
    probs = torch.softmax(logits / t, 1)
    soft = (probs - t * g).clamp(0, 1)
    soft = soft / soft.sum(1, keepdim=True).clamp_min(1e-12)
    hard = g.argmin(1)  # a cross-entropy error p − y is negative only at the label
    total = bias_total(capture, summed.per_mean)
    bias = None
    if total is not None:
        sure = ~doubtful
        explained = t * g[sure].sum(0)
        if bool(doubtful.any()):  # the doubtful rows stand for missed samples: their classes from the bias identity
            missed = missed_labels(t * total, t * g[sure], probs[sure], int(doubtful.sum()))
            soft[doubtful] = torch.nn.functional.one_hot(missed, c).to(soft.dtype)
            hard[doubtful] = missed
            explained = explained + len(missed) * probs[sure].mean(0) - soft[doubtful].sum(0)
        bias = float((explained - t * total).norm() / (t * total).norm().clamp_min(1e-30))
    return _Reading(found.inputs, soft, hard, fit, doubtful, bias, added, found.residual)


def complete_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, inputs: torch.Tensor, *, programs: int = 8,
                    zero_tol: float = 1e-4, sign_tol: float = 1e-3, seed: int = 0, doubt: int | None = None):
    """The B inputs ``inputs`` (B × n, :func:`fcn_analytic.disaggregate.linear_inputs`) with the doubtful ones
    replaced by the vertices they stand for (module docstring, "Completing the inputs"), and how many were replaced.

    An input is sure when its zeros (entries below ``zero_tol`` of its largest) are at least :data:`SURE_ZEROS` of
    the median over the B (row ``doubt``, where given, is doubted regardless); for each of the others,
    ``programs`` linear programs maximise a random objective orthogonal to the sure inputs' coefficient vectors
    (in the basis V of ∇W's top-B right singular vectors), and an optimum that is sure, one-signed (``sign_tol``)
    and new joins them. Inputs still missing keep the
    doubtful ones with the most zeros. The output errors are then solved for the completed inputs as
    :func:`fcn_analytic.disaggregate.linear_inputs` does (∇W V C⁻ᵀ, one scale per sample from ∇b). Returns
    ``(LinearInputs, replaced, doubtful)``, ``doubtful`` (B,) marking the rows kept without being sure."""
    import numpy as np
    from scipy.optimize import linprog

    from fcn_analytic.disaggregate import LinearInputs, factor_residual, spanning

    gw, gb = grad_w.double(), grad_b.double()
    batch = inputs.shape[0]
    v = torch.linalg.svd(gw, full_matrices=False)[2][:batch].T  # n × B
    coef = torch.nn.functional.normalize(inputs.double() @ v, dim=1)  # x = V c: c = Vᵀ x
    zeros = _zeros(coef @ v.T, zero_tol)
    need = SURE_ZEROS * float(zeros.median())
    sure = zeros >= need
    if doubt is not None:
        sure[doubt] = False
    replaced, left = 0, 0
    if programs > 0 and not bool(sure.all()):
        norms = v.norm(dim=1)
        live = norms > 1e-6 * norms.max()
        vn = (v[live] / norms[live, None]).numpy()
        gen = torch.Generator().manual_seed(seed)
        kept = coef[sure]
        for _ in range(programs * int((~sure).sum())):
            if len(kept) >= batch:
                break
            q = torch.linalg.qr(kept.T, mode="complete").Q[:, len(kept):]  # the objectives that vanish on `kept`
            w = q @ torch.randn(q.shape[1], generator=gen, dtype=torch.float64)
            res = linprog(-w.numpy(), A_ub=-vn, b_ub=np.zeros(vn.shape[0]), A_eq=vn.sum(0, keepdims=True),
                          b_eq=[1.0], bounds=[(None, None)] * batch, method="highs")
            if res.status != 0:
                continue
            c = torch.nn.functional.normalize(torch.from_numpy(res.x), dim=0)
            x = c @ v.T
            x = x / x.abs().max()
            if (float(_zeros(x[None], zero_tol)[0]) < need or bool((x < -sign_tol).any())
                    or bool(((kept @ c) > 1 - 1e-4).any())):
                continue
            kept = torch.cat([kept, c[None]])
            replaced += 1
        if len(kept) < batch:  # what the programs did not find: the doubtful inputs with the most zeros
            rest = coef[~sure][zeros[~sure].argsort(descending=True)]
            left = batch - len(kept)
            kept = torch.cat([kept, rest[:left]])
        coef = kept
    elif not bool(sure.all()):
        coef, left = torch.cat([coef[sure], coef[~sure]]), int((~sure).sum())
    if len(coef) > batch:
        coef = coef[spanning(coef, batch)]
    c = coef.T
    deltas = gw @ v @ torch.linalg.inv(c.T)
    scale = torch.linalg.lstsq(deltas, gb[:, None]).solution.squeeze(1)
    x, errors = (v @ c / scale).T, (deltas * scale).T
    doubtful = torch.arange(batch) >= batch - left
    return LinearInputs(x, errors, 0, factor_residual(gw, gb, x, errors)), replaced, doubtful


def _zeros(x: torch.Tensor, tol: float) -> torch.Tensor:
    """Entries of each row below ``tol`` of the row's largest magnitude."""
    return (x.abs() < tol * x.abs().amax(1, keepdim=True)).sum(1)


def hidden_errors(capture: Capture, layer: str, inputs: torch.Tensor, errors: torch.Tensor,
                  leak: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Each sample's logits at θᵗ, its last-layer output error g_i read from its own output error ``errors[i]`` of
    ``layer`` (module docstring: least squares on the units where it is not zero) and each fit's relative
    residual, all float64; None unless the last layer's input is relu(``layer``'s output) for these inputs (the
    chain rule then gives e_i = relu'(z_i) ⊙ W_Lᵀ g_i).

    ``leak`` (k × H): the errors of k doubtful inputs (:func:`complete_inputs`), which stand for missed samples
    whose errors the solve Δ = ∇W X⁺ mixed into every other sample's (a spurious input s = Σ_j β_j x_j in place of
    x_m gives e_s = δ_m/β_m and e_j = δ_j − (β_j/β_m) δ_m). Each e_i is then fitted as
    ``D_i W_Lᵀ g_i + leakᵀ a_i`` over all units, the active set D_i read from ``e_i − leakᵀ a_i`` and refitted
    (:data:`LEAK_ROUNDS` rounds)."""
    model = capture.model().double().train(capture.protocol.model_mode == "train")
    x = inputs.double()
    seen: dict[str, torch.Tensor] = {}
    hooks = [model.get_submodule(layer).register_forward_pre_hook(lambda m, a: (x,)),
             model.get_submodule(layer).register_forward_hook(lambda m, a, out: seen.__setitem__("z", out)),
             model.get_submodule(capture.last_layer_name).register_forward_pre_hook(
                 lambda m, a: seen.__setitem__("h", a[0].flatten(1)))]
    try:
        with torch.no_grad():
            logits = model(torch.zeros(len(x), *capture.model_spec["in_shape"], dtype=torch.float64)).flatten(1)
    finally:
        for hook in hooks:
            hook.remove()
    z, h = seen["z"].flatten(1), seen["h"]
    if z.shape != h.shape or not torch.allclose(h, z.clamp_min(0), rtol=1e-6, atol=1e-9):
        return None
    w = model.get_submodule(capture.last_layer_name).weight.detach().double()  # C × H
    e = errors.double()
    u = torch.zeros(e.shape[1], 0, dtype=torch.float64) if leak is None else leak.double().T  # H × k
    out = torch.zeros(len(e), w.shape[0], dtype=torch.float64)
    fit = torch.zeros(len(e), dtype=torch.float64)
    for i, row in enumerate(e):
        mix = torch.zeros(u.shape[1], dtype=torch.float64)
        for _ in range(LEAK_ROUNDS if u.shape[1] else 1):
            rest = row - u @ mix
            on = rest.abs() > ACTIVE * rest.abs().max()
            a = torch.cat([on.double()[:, None] * w.T, u], 1)
            sol = torch.linalg.lstsq(a, row[:, None]).solution.squeeze(1)
            out[i], mix = sol[: w.shape[0]], sol[w.shape[0]:]
        r = a @ sol - row
        fit[i] = r[on].norm() / row[on].norm().clamp_min(1e-30)
    return logits, out, fit


def missed_labels(total: torch.Tensor, errors: torch.Tensor, probs: torch.Tensor, missed: int) -> torch.Tensor:
    """The classes of ``missed`` samples whose errors are unknown, from the last layer's bias identity
    ``Σ_i g_i = total`` (module docstring) and the others' errors ``errors`` (B' × C): the missed samples' errors sum
    to R = total − Σ errors, and with g = p − y their labels sum to ``missed · p̄ − R``, p̄ the mean predicted
    probabilities ``probs`` of the others standing for theirs; the classes are taken one sample at a time where
    that sum is largest (a class may come more than once)."""
    want = missed * probs.mean(0) - (total - errors.sum(0))
    out = torch.zeros(missed, dtype=torch.long)
    for k in range(missed):
        out[k] = want.argmax()
        want[out[k]] -= 1
    return out


def bias_total(capture: Capture, per_mean: int) -> torch.Tensor | None:
    """``Σ_i g_i`` over the samples from the last layer's shared bias (module docstring): ``B·∇b`` for a FedSGD
    gradient, ``B·(−Δb/η)`` for a plain-SGD update, B = ``per_mean`` (float64); None without a shared bias."""
    name = capture.last_layer_keys[1]
    if name not in capture.shared:
        return None
    return capture.shared[name].double() * per_mean * (-1.0 / capture.protocol.lr if capture.is_update else 1.0)
