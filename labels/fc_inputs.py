"""Per-sample labels of a FedSGD batch, or of a one-epoch FedAvg round of plain SGD, from a disaggregated
fully-connected layer.

A net whose first ``nn.Linear`` sees a ReLU / max-pool map shares that layer's gradient ``∇W = Δ Xᵀ``; its B
inputs X are the extreme rays of the nonnegative cone in ∇W's row space
(:func:`fcn_analytic.disaggregate.linear_inputs`: vertices by linear programs, SPEAR's sparsity sampling as the
fallback; Dimitrov et al. 2024 sample the other factor), and with them come each sample's output errors
e_i = ∂ℓ_i/∂z_i of that layer (the columns of Δ).

The inputs come from :func:`fcn_analytic.disaggregate.vertex_inputs` and are completed by
:func:`fcn_analytic.disaggregate.complete_inputs` (that module's docstring, "Completing the inputs").

Each sample's label from its own error. When the layer is followed by a ReLU and the last layer (h = relu(z)),
each sample's error is ``e_i = relu'(z_i) ⊙ W_Lᵀ g_i`` with g_i = ∂ℓ_i/∂logits (the chain rule): the units where
e_i ≠ 0 are the active ones at the sample's own step, and on them g_i is the least-squares solution of
``W_L[:, active]ᵀ g_i = e_i[active]`` (C unknowns, about half of the hidden units as equations). For the
cross-entropy loss ``g_i = softmax(z_i) − y_i`` (``(softmax(z_i/T) − y_i)/T`` under a softmax temperature T), so the
label is ``y_i = softmax(z_i) − g_i``; a hard label its argmax (:func:`labels_of_errors`). W_L at θᵗ stands for the
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

ACTIVE = 1e-2  # hidden_errors: an error entry below this fraction of the sample's largest marks an inactive unit
BIAS_TOL = 0.05  # labels_from_inputs: a relative miss of the bias identity that doubts a suspect row
DOUBTS = 2  # labels_from_inputs: rows doubted at most, one at a time
PASSING = (torch.nn.MaxPool2d, torch.nn.Flatten, torch.nn.Dropout, torch.nn.Identity)  # reads_round: keep x ≥ 0
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
    from fcn_analytic.disaggregate import first_linear, search_inputs, summed_layer

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
        inputs, used, vertices, sure = search_inputs(summed.weight, summed.bias, summed.samples, draws=draws,
                                                     **summed.tolerances)
    except GIError as exc:
        return LabelResult.failure("fc-inputs", c, str(exc))
    result = labels_from_inputs(capture, name, summed, inputs, programs, doubt=list(range(sure, len(inputs))))
    result.info.update({"draws": used, "vertices": vertices, "search_sure": sure})
    return result


def reads_round(capture: Capture) -> bool:
    """Whether ``fc-inputs`` applies to ``capture`` as a FedAvg round (the ``auto`` picker's test, cheap: no
    linear program): a plain-SGD update of one local epoch (each sample seen once) under the cross-entropy loss, of
    a net whose first Linear layer comes after a convolution and a ReLU (its input a sparse nonnegative feature
    map, not raw pixels; pooling, flattening and dropout between them pass, :data:`PASSING`) and before the last,
    with at least 2 and at most min(m, n) samples for that layer's m × n weight."""
    from fcn_analytic.disaggregate import first_linear, summed_layer

    if not capture.is_update or capture.protocol.loss != "ce":
        return False
    with torch.device("meta"):
        model = capture.architecture()
    name = first_linear(model)
    if name is None or name == capture.last_layer_name:
        return False
    before = []
    for n, m in model.named_modules():
        if n == name:
            break
        if not list(m.children()) and not isinstance(m, PASSING):
            before.append(m)
    if not any(isinstance(m, torch.nn.Conv2d) for m in before) or not isinstance(before[-1], torch.nn.ReLU):
        return False
    summed = summed_layer(capture, name)
    return summed is not None and summed.once and 2 <= summed.samples <= min(summed.weight.shape)


def labels_from_inputs(capture: Capture, name: str, summed, inputs: torch.Tensor, programs: int = 8,
                       doubt: list[int] | None = None) -> LabelResult:
    """The ``fc-inputs`` labels from the inputs :func:`fcn_analytic.disaggregate.linear_inputs` found for layer
    ``name`` of ``summed`` (:class:`fcn_analytic.disaggregate.SummedLayer`): completed (:func:`complete_inputs`),
    each sample's error read (:func:`hidden_errors`, else the last layer's least squares), the doubtful rows'
    classes from the bias identity (:func:`missed_labels`). Where the errors miss the bias identity by more than
    :data:`BIAS_TOL`, a spurious input passed for a sure one (its error, δ_m/β_m of the sample it stands for, is
    large and clean, and its zeros few): each suspect (:func:`_suspects`) is doubted in turn, the reading redone,
    and the one that misses the identity least kept, up to :data:`DOUBTS` rows; unless the identity then holds to
    :data:`BIAS_TOL`, the first reading stands. Only a first reading that doubts at most :data:`DOUBTS` rows is
    doubted further: one with more is not one spurious input away from right, and each re-reading would repeat the
    completion's linear programs for every doubtful row (on a trained round's update, 18 doubtful rows of 50: 24 CPU
    s a reading, about 14 readings). ``doubt``: rows doubted from the start (those the search is not sure of)."""
    read = first = _reading(capture, name, summed, inputs, programs, list(doubt or []))
    for _ in range(DOUBTS if int(first.doubtful.sum()) <= DOUBTS else 0):
        if read.bias is None or read.bias <= BIAS_TOL:
            break
        doubted = torch.nonzero(read.doubtful).flatten().tolist()
        tries = [_reading(capture, name, summed, read.inputs, programs, [*doubted, r]) for r in _suspects(read)]
        best = min(tries, key=lambda r: r.bias if r.bias is not None else float("inf"), default=read)
        if best.bias is None or best.bias >= read.bias:
            break
        read = best
    if read.bias is not None and read.bias > BIAS_TOL:  # no doubt made the identity hold: the first reading stands
        read = first
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
    miss, the rows replaced, the factorisation's residual, each row's error norm ‖g_i‖ and zeros."""

    inputs: torch.Tensor
    soft: torch.Tensor
    labels: torch.Tensor
    fit: torch.Tensor | None
    doubtful: torch.Tensor
    bias: float | None
    added: int
    residual: float
    norms: torch.Tensor
    zeros: torch.Tensor


def _suspects(read: _Reading, each: int = 3) -> list[int]:
    """The rows of ``read`` most likely spurious: the ``each`` with the largest output errors, the ``each`` with
    the fewest zeros, and the worst-fitted one (doubtful rows left out)."""
    sure = torch.nonzero(~read.doubtful).flatten()
    picks = [read.norms[sure].argsort(descending=True)[:each], read.zeros[sure].argsort()[:each]]
    if read.fit is not None:
        picks.append(read.fit[sure].argmax()[None])
    return list(dict.fromkeys(int(sure[i]) for i in torch.cat(picks)))


def _reading(capture: Capture, name: str, summed, inputs: torch.Tensor, programs: int, doubt: list[int]
             ) -> _Reading:
    from fcn_analytic.disaggregate import complete_inputs, sample_errors, zero_counts

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
    probs, soft, hard = labels_of_errors(logits, g, t)
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
    return _Reading(found.inputs, soft, hard, fit, doubtful, bias, added, found.residual, g.norm(dim=1),
                    zero_counts(found.inputs, summed.tolerances.get("zero_tol", 1e-4)))


def labels_of_errors(logits: torch.Tensor, errors: torch.Tensor, temperature: float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The labels that cross-entropy output errors ``errors`` (B × C, g_i = (softmax(z_i/T) − y_i)/T) give at
    ``logits`` z_i: the probabilities softmax(z/T), the soft labels y = softmax(z/T) − T·g (clipped to [0, 1],
    rows summed to 1) and the hard labels, their argmax. Where the model predicts a sample confidently and
    rightly, g_i is near zero and read with a noise as large as itself, so its sign pattern (the one negative
    entry of g_i) is a coin toss while softmax(z_i/T) − T·g_i still names the label: on the trained round of
    docs/results/client-round.md with the true inputs, the negative entry of g gave 0.64 of the labels and the
    argmax of y all of them."""
    probs = torch.softmax(logits / temperature, 1)
    soft = (probs - temperature * errors).clamp(0, 1)
    soft = soft / soft.sum(1, keepdim=True).clamp_min(1e-12)
    return probs, soft, soft.argmax(1)


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
