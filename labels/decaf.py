"""Decaf: Data Distribution Decompose Attack (Dai, Zhou, Fu, arXiv 2405.15316, 2024).

Four steps on the last fully connected layer of a victim's update:

1. **Gradient change extraction** (eq. 4): ``g_target = (θ_i − θ_global)/α`` for the last-layer weight
   (scheme history terms removed, see :func:`labels.rlu.update_view`).
2. **Null-class removal** (Algorithm 1): class c is null iff none of its neurons (row c of the layer) has a
   gradient change above ``threshold`` (0 for ReLU/sigmoid features, where a null class's row can only
   decrease — the paper's proof, eq. 13–18; a small positive threshold for leaky activations, §V-A).
3. **Gradient bases** (Algorithm 2): for every remaining class c one SGD step from the global model on the
   aux samples of class c gives ``g_c``; one step on the union of those samples gives the unified
   calibrator ``g_u``. A single step changes the last layer by exactly ``−α ∇_W L``, so the bases are
   computed in closed form from one aux forward: ``g_c = −mean_{x ∈ c} (∂L/∂z)(x) h(x)ᵀ``.
4. **Remaining-class decomposition** (Algorithm 3, eq. 19–21): ``min ‖Σ_c η_c g_c + η_u g_u − g_target‖²``
   over ``η ≥ 0`` (scipy NNLS, or the paper's gradient descent with ``solver="gd"``), then
   ``r_c = (η_c + η_u) / Σ_c (η_c + η_u)``.

Calibrator scale. With a mean-reduced loss on a class-balanced union, ``g_u`` is the *mean* of the
``g_c``; then ``η_u`` enters each class's coefficient as ``η_u/K`` while eq. 21 adds the full ``η_u``,
which pulls every estimate toward uniform by an amount that depends on how the solver splits the
collinear bases. The default ``calibrator="sum"`` takes the union step with the per-class mean losses
summed (``g_u = Σ_c g_c``), for which eq. 21 is exactly each class's coefficient; ``"mean"`` is the
literal union mean. With the exact NNLS solver the calibrator does not change the fit (``g_u`` lies in the
cone of the ``g_c``) and both give the same estimate; it matters only with gradient descent, whose path
decides how much of the fit ``η_u`` takes. ``decaf-paper`` is the literal form of Algorithms 2–3: union-mean
calibrator and 1000 epochs of gradient descent from η = 0 (on Fashion-MNIST it pulls estimates toward
uniform: better on the uniform user, worse on skewed ones).

Switches for the paper's ablations and for realistic partitions:

- ``null_removal=False`` skips step 2 (§IV-E, Fig. 9 / Table XIV): every class enters the decomposition.
- ``calibrator="none"`` drops ``g_u`` (§IV-F, Fig. 10 / Table XV); it changes the estimate only with ``solver="gd"``.
- ``null_test="calibrated"`` (ours): Algorithm 1's sign test is a necessary condition only (null ⇒ no positive
  entry; the converse fails for a class with one or two samples among thousands, whose single positive
  contribution is outweighed by every other sample's negative one). The calibrated test keeps Algorithm 1's
  candidates and re-admits a candidate c when the decomposition on *every* class with the per-class bases
  alone (``g_k`` = the aux data's per-class gradient at θᵗ, no calibrator, so ``η_k`` is proportional to the
  class's sample count: ``ΔW/α ≈ Σ_k (visits of class k)·g_k``) attributes at least ``min_count`` samples to
  c, ``n̂_c = η_c / Σ_k η_k · N`` with N the client's distinct samples. Measured on Dirichlet splits of
  Fashion-MNIST (docs/results/paper-tables.md) it fails: the coefficients of truly absent classes move by 10–55 samples
  with the client's drift from θᵗ, so it re-admits them and recall falls to 0–0.06. It is exact only with exact
  bases (one full-batch step, the client's own samples as aux) and is kept to reproduce that measurement.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.label_result import LabelResult
from labels.aux_stats import aux_forward, embedded_targets, label_embedding, logit_gradients
from labels.base import register
from labels.counts import largest_remainder
from labels.rlu import update_view

Tensor = torch.Tensor
SOLVERS = ("nnls", "gd")
CALIBRATORS = ("sum", "mean", "none")
NULL_TESTS = ("sign", "calibrated")


def null_classes(target: Tensor, threshold: float = 0.0) -> Tensor:
    """Algorithm 1: boolean (C,), True where no entry of the class's row of ``target`` exceeds ``threshold``."""
    return target.amax(dim=1) <= threshold


def gradient_bases(features: Tensor, logit_grads: Tensor, labels: Tensor, classes: list[int],
                   calibrator: str) -> Tensor:
    """Algorithm 2 in closed form: columns ``vec(g_c)`` for ``classes`` and, unless ``calibrator="none"``,
    ``vec(g_u)`` last. ``features`` (N, D), ``logit_grads`` (N, C) per-sample ∂L/∂z, ``labels`` (N,)."""
    cols = []
    for c in classes:
        mask = labels == c
        cols.append(-(logit_grads[mask].T @ features[mask]).flatten() / int(mask.sum()))
    if calibrator == "sum":
        cols.append(torch.stack(cols).sum(0))
    elif calibrator == "mean":
        mask = torch.isin(labels, torch.tensor(classes))
        cols.append(-(logit_grads[mask].T @ features[mask]).flatten() / int(mask.sum()))
    return torch.stack(cols, dim=1)


def calibrated_null_test(features: Tensor, logit_grads: Tensor, labels: Tensor, target: Tensor, null: Tensor,
                         distinct: int, min_count: float = 0.5) -> tuple[Tensor, list[float]]:
    """The calibrated null test (ours; see the module docstring): which of Algorithm 1's ``null`` classes to
    re-admit. Decomposes ``target`` (C, D) on the per-class bases of *every* class (no calibrator, exact NNLS),
    so ``η_k ∝`` the visits of class k, and re-admits a null candidate c when ``η_c / Σ_k η_k · distinct >=
    min_count``. Returns the boolean (C,) re-admission mask and the estimated counts of every class."""
    classes = list(range(target.shape[0]))
    eta = decompose(gradient_bases(features, logit_grads, labels, classes, "none"), target.flatten())
    total = float(eta.sum())
    counts = eta * distinct / total if total > 0 else torch.zeros_like(eta)
    return null & (counts >= min_count), [float(v) for v in counts]


def decompose(bases: Tensor, target: Tensor, solver: str = "nnls", epochs: int = 1000,
              step: float | None = None) -> Tensor:
    """Algorithm 3: non-negative ``η`` minimising ``‖bases·η − target‖²`` (eq. 19–20).

    ``"nnls"``: scipy's Lawson–Hanson active set (exact). ``"gd"``: the paper's gradient descent for
    ``epochs`` steps from η = 0, projected onto η ≥ 0 after every step, with ``step`` β (default ``1/L``,
    L the Lipschitz constant ``2‖bases‖₂²`` of the loss gradient).
    """
    a, y = bases.double().numpy(), target.double().numpy()
    if solver == "nnls":
        from scipy.optimize import nnls  # here: scipy loads only for the methods that solve with it

        eta, _ = nnls(a, y, maxiter=50 * a.shape[1])
        return torch.from_numpy(eta)
    if solver != "gd":
        raise ConfigError(f"decaf solver={solver!r} is not allowed; valid: {list(SOLVERS)}")
    lipschitz = 2 * np.linalg.norm(a, 2) ** 2
    beta = step if step is not None else 1.0 / max(lipschitz, 1e-300)
    eta = np.zeros(a.shape[1])
    for _ in range(int(epochs)):
        eta = np.maximum(eta - beta * 2 * a.T @ (a @ eta - y), 0.0)
    return torch.from_numpy(eta)


@register("decaf", "Decaf (Dai et al. 2024): null classes from update signs, NNLS on per-class gradient bases")
def recover_decaf(capture: Capture, aux=None, threshold: float = 0.0, solver: str = "nnls", calibrator: str = "sum",
                  epochs: int = 1000, step: float | None = None, dtype: torch.dtype = torch.float64,
                  null_removal: bool = True, null_test: str = "sign", min_count: float = 0.5) -> LabelResult:
    """Decaf (Algorithms 1–3): the class proportions of the victim's local data.

    ``threshold``: null-class threshold on ``ΔW/α`` (Algorithm 1; raise it slightly for leaky activations).
    ``solver``: ``"nnls"`` or ``"gd"`` (``epochs``, ``step``). ``calibrator``: ``"sum"`` (default, see the
    module docstring), ``"mean"`` (literal union step) or ``"none"`` (ablation of §IV-F).
    ``null_removal``: False skips Algorithm 1 and decomposes on every class (ablation of §IV-E).
    ``null_test``: ``"sign"`` (Algorithm 1) or ``"calibrated"`` (Algorithm 1's nulls re-admitted when the
    per-class decomposition gives them ``>= min_count`` samples; module docstring).
    ``info['null']`` lists the null classes found (``info['sign_null']`` Algorithm 1's, with the calibrated test).
    """
    if calibrator not in CALIBRATORS:
        raise ConfigError(f"decaf calibrator={calibrator!r} is not allowed; valid: {list(CALIBRATORS)}")
    if solver not in SOLVERS:
        raise ConfigError(f"decaf solver={solver!r} is not allowed; valid: {list(SOLVERS)}")
    if null_test not in NULL_TESTS:
        raise ConfigError(f"decaf null_test={null_test!r} is not allowed; valid: {list(NULL_TESTS)}")
    if not min_count >= 0:
        raise ConfigError(f"decaf min_count={min_count!r} must be >= 0 (samples a re-admitted class needs)")
    if not isinstance(null_removal, bool):
        raise ConfigError(f"decaf null_removal={null_removal!r} must be true or false")
    c = capture.num_classes
    start = time.perf_counter()
    view = update_view(capture, linear=False)  # Decaf reads directions: any optimiser (Adadelta in the paper)
    target = view.weight  # (ΔW + h)/η = −Σ_τ ρ_τ ∇W_τ: the "gradient change" of eq. 4
    null = null_classes(target, threshold) if null_removal else torch.zeros(c, dtype=torch.bool)
    remaining = torch.nonzero(~null).flatten().tolist()
    info: dict = {"null": torch.nonzero(null).flatten().tolist(), "threshold": threshold,
                  "null_removal": null_removal, "null_test": null_test}
    if not remaining:
        return LabelResult.failure("decaf", c, f"every class looks null (no weight change above {threshold}); "
                                   "the update is zero or the threshold too high", **info)
    embedding = label_embedding(capture.protocol, c)
    if isinstance(embedding, str):
        return LabelResult.failure("decaf", c, embedding, **info)
    stats = aux_forward(capture, aux, dtype=dtype, method="decaf")
    tested = list(range(c)) if null_test == "calibrated" and null_removal else remaining
    missing = [k for k in tested if int((stats.labels == k).sum()) == 0]
    if missing:
        return LabelResult.failure("decaf", c, f"aux set has no samples of remaining class(es) {missing}", **info)
    grads = logit_gradients(stats.logits, embedded_targets(stats.labels, c, embedding), capture.protocol)
    if tested is not remaining and bool(null.any()):
        readmit, counts_all = calibrated_null_test(stats.features, grads, stats.labels, target, null, view.distinct,
                                                   min_count)
        info.update({"sign_null": info["null"], "null_counts": counts_all})
        null = null & ~readmit
        remaining = torch.nonzero(~null).flatten().tolist()
        info["null"] = torch.nonzero(null).flatten().tolist()
    proportions = torch.zeros(c, dtype=torch.float64)
    if len(remaining) == 1:
        proportions[remaining[0]] = 1.0
        eta = torch.ones(1, dtype=torch.float64)
    else:
        bases = gradient_bases(stats.features, grads, stats.labels, remaining, calibrator)
        eta = decompose(bases, target.flatten(), solver, epochs, step)
        shares = eta[:len(remaining)] + (eta[-1] if calibrator != "none" else 0.0)
        if float(shares.sum()) <= 0:
            return LabelResult.failure("decaf", c, "the decomposition gave all-zero factors", eta=eta.tolist(), **info)
        proportions[remaining] = shares / shares.sum()
    counts = largest_remainder(proportions, view.distinct)
    info.update({"eta": eta.tolist(), "solver_seconds": time.perf_counter() - start - stats.seconds,
                 "aux_seconds": stats.seconds})
    return LabelResult(method="decaf", ok=True, counts=counts, proportions=proportions,
                       estimate=proportions * view.distinct, info=info)


@register("decaf-paper", "Decaf, literal Algorithms 2–3: union-mean calibrator g_u, 1000 epochs of projected GD")
def recover_decaf_paper(capture: Capture, aux=None, threshold: float = 0.0, epochs: int = 1000,
                        step: float | None = None) -> LabelResult:
    """Decaf as written in Algorithms 2–3 (Dai et al. 2024): ``g_u`` one step on the union of the aux samples
    (mean loss), η by ``epochs`` of gradient descent from 0 (eq. 19–20), r_c by eq. 21."""
    result = recover_decaf(capture, aux, threshold=threshold, solver="gd", calibrator="mean", epochs=epochs,
                           step=step)
    result.method = "decaf-paper"
    return result
