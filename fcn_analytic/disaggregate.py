"""A batch's per-sample inputs of one Linear layer from that layer's summed gradient, by sparsity or by labels.

For a Linear layer ``z = W x + b`` and a batch of B samples, the shared gradient is ``∇W = Δ Xᵀ`` and ``∇b = Δ 1``
(Δ: the per-sample output errors ∂L/∂z, m × B; X: the per-sample inputs, n × B), so ∇W has rank ≤ B and
neither factor is determined by ∇W alone. SPEAR (Dimitrov et al., NeurIPS 2024, §3–4) resolves the ambiguity
with the sparsity that a ReLU after the layer puts into Δ: for B − 1 rows of Δ that are zero in sample j's
column, the null space of the corresponding rows of ∇W's left factor is that column's direction; candidates are
drawn at random and kept when their vector is as sparse as a genuine column; ∇b fixes the scales.

This module applies the same sampling to the *input* side (:func:`linear_inputs`), which suits a layer whose
input is a ReLU (and max-pooled) feature map: each column of X is nonnegative with exact zeros, while Δ may be
dense (most units active). The columns of X lie in the span of ∇W's top-B right singular vectors V (∇W = U S Vᵀ):
x_j = V c_j. For B − 1 input coordinates that are all zeros of sample j, the null vector c of those rows of V
gives x_j's direction. A candidate is kept when x = V c has at least ``min_zeros`` near-zero entries and a single
sign (a mixture of nonnegative inputs with coefficients of both signs has entries of both signs), and directions
found twice are kept once; of more than B, the B that span the space best (:func:`spanning`). With
C = [c_1 … c_B], Δ = ∇W V C⁻ᵀ up to one scale per sample, and ∇b = Δ s gives those scales (least squares), so
x_j = V c_j / s_j and the output errors come with them.

Vertices. The same directions are the extreme rays of the cone {x = V c : x ≥ 0} when, as for ReLU maps, no
sample's support contains another's (then x_j − ε x_k leaves the cone for every k ≠ j): they are the vertices of
its cross-section {c : V c ≥ 0, 1ᵀ V c = 1}, a polytope in B dimensions, and a linear program with a random
objective ends on one of them. Random objectives find every vertex in a few dozen programs of n constraints and B
variables (the S4 layers: all 8 inputs of each batch in 20–23 programs, 0.3–0.5 CPU s, including a batch whose
sparsest input has 12.9 % zeros and which 4 million draws of the sampling below did not finish). A vertex is kept
under the same sparsity and sign test as a sampled candidate.

The last layer, by its labels. The logits' layer has no such sparsity (its input is, e.g., a ResNet's pooled
map), but its output errors are known up to the inputs: ``δ_i = softmax(W h_i + b) − y_i`` for the cross-entropy
loss. With the labels y_i (recovered first), ``∇W = (1/B) Δᵀ H`` is a square or overdetermined system in the B²
coefficients of the h_i in ∇W's row space, once B ≤ C − 1 (:func:`last_layer_inputs`).

Completing the inputs (:func:`complete_inputs`). Random linear objectives can miss a vertex, and the sampling
fallback then fills the gap with a spurious one: a vector of the cone that is not an input (on a FedAvg round of
50 Fashion-MNIST images, 4 of 50 in some rounds, with ~100 zeros of 3136 where an input has ~700). One spurious
input mixes its missing sample's error into every other sample's e_i, because Δ = ∇W X⁺ solves all columns
together. The true inputs are the vertices with many zeros; a linear objective orthogonal to the coefficient
vectors of those already found vanishes on them, so its optimum over the polytope is one of the missing vertices
(every point of the polytope is a nonnegative mixture of the vertices): a few programs per missing input. The
search itself runs so from the first program (:func:`vertex_inputs`): each objective orthogonal to the vertices
found before, one program per input (all 50 inputs of each of the three rounds above that missed some, in
14–15 CPU s where 8·B random objectives took 65 s and missed them); ``linear_inputs`` remains the fallback.

The draws are batched (one batched SVD of ``chunk`` (B − 1) × B matrices per round; a draw that repeats a
coordinate is dropped and counted). The number needed grows like
ρ^−(B−1) for a zero fraction ρ per input (SPEAR's exponential cost): at B = 8 and ρ ≈ 0.2, 0.13–0.36 million draws,
17–52 CPU s on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gi.capture import Capture
from gi.core.errors import GIError
from gi.core.lru import LRU, digest
from gi.world.fl.local import distinct_samples, local_schedule, sums_gradients


@dataclass
class LinearInputs:
    """What :func:`linear_inputs` recovered: ``inputs`` (B × n, one row per sample, in no particular order),
    ``output_errors`` (B × m, ∂L/∂z of each sample, the same order), ``draws`` (samples drawn), and ``residual``
    (‖∇W − Δ Xᵀ‖ / ‖∇W‖ and ‖∇b − Δ 1‖ / ‖∇b‖, the larger: how well the answer explains the gradient);
    ``sure`` (:func:`pursued_inputs`): how many rows, the first ones, the search is sure of (None: not counted)."""

    inputs: torch.Tensor
    output_errors: torch.Tensor
    draws: int
    residual: float
    sure: int | None = None


METHODS = ("auto", "lp", "sample")
SURE_ZEROS = 0.5  # complete_inputs: an input is sure with at least this fraction of the found inputs' median zeros


def _valid(x: torch.Tensor, need: int, zero_tol: float, sign_tol: float) -> torch.Tensor:
    """Which candidate inputs (rows of ``x``, each scaled to a largest entry of 1) are sparse and one-signed."""
    x = x / x.abs().amax(1, keepdim=True)
    sparse = (x.abs() < zero_tol).sum(1) >= need
    return sparse & (((x > sign_tol).sum(1) == 0) | ((x < -sign_tol).sum(1) == 0))


def live_rows(v: torch.Tensor) -> torch.Tensor:
    """The rows of V (n × B) that are not zero in every sample, each scaled to unit norm: the constraints of the
    cone {c : V c ≥ 0} (a coordinate that is zero in every sample carries nothing)."""
    norms = v.norm(dim=1)
    live = norms > 1e-6 * norms.max()
    return v[live] / norms[live, None]


def _quiet_highs() -> object:
    """A ``highspy.Highs`` solver, made with the process's standard output (fd 1) sent to /dev/null: HiGHS's C++
    constructor prints a banner there before any option can silence it, which would land in ``gi``'s output."""
    import os
    import sys

    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class ConeProgram:
    """The linear programs over the cone's cross-section {c : V c ≥ 0, 1ᵀ V c = 1} (module docstring,
    "Vertices"; rows ``vn``, n × B): one HiGHS model (Huangfu & Hall 2018, the solver scipy's ``linprog`` wraps)
    built once, each new objective solved from the last optimum's basis. The optimum of a generic objective is a
    unique vertex, so warm and cold solves reach the same one (cosine > 1 − 1e-4 on all 40 random programs of a
    round's 3052 × 50 system). ``simplex``: ``dual`` for random objectives (~150 pivots where a cold solve takes
    ~300: :func:`linear_inputs`' 400 programs on that round in 34 CPU s against 84 cold, the same 48 of 50 true
    inputs found); ``primal`` for objectives orthogonal to the vertices found (:func:`vertex_inputs`,
    :func:`complete_inputs`), whose last optimum is a vertex where the new objective vanishes, among the highly
    degenerate vertices of sparse inputs: the dual simplex stalls there (46 CPU s against 14 cold for the round's
    search), the primal one does not (8 CPU s, the same inputs)."""

    SIMPLEX = {"dual": 1, "primal": 4}  # HiGHS's simplex_strategy

    def __init__(self, vn: torch.Tensor, simplex: str = "dual") -> None:
        import highspy
        import numpy as np
        import scipy.sparse as sp

        a = vn.double().cpu().numpy()
        rows, batch = a.shape
        matrix = sp.csc_matrix(np.vstack([a, a.sum(0, keepdims=True)]))
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = batch, rows + 1
        lp.col_cost_ = np.zeros(batch)
        lp.col_lower_, lp.col_upper_ = np.full(batch, -inf), np.full(batch, inf)
        lp.row_lower_ = np.append(np.zeros(rows), 1.0)
        lp.row_upper_ = np.append(np.full(rows, inf), 1.0)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix.indptr, matrix.indices, matrix.data
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = batch, rows + 1
        self._highs = _quiet_highs()
        self._highs.setOptionValue("output_flag", False)
        self._highs.setOptionValue("threads", 1)
        self._highs.setOptionValue("simplex_strategy", self.SIMPLEX[simplex])
        self._highs.passModel(lp)
        self._optimal = highspy.HighsModelStatus.kOptimal
        self._columns = np.arange(batch, dtype=np.int32)
        self.batch = batch

    def minimise(self, objective: torch.Tensor) -> torch.Tensor | None:
        """The vertex c minimising ``objective`` (B,) · c, as a unit vector (float64); None where the program has
        no optimum (an unbounded or infeasible cross-section)."""
        h = self._highs
        h.changeColsCost(self.batch, self._columns, objective.double().cpu().numpy())
        h.run()
        if h.getModelStatus() != self._optimal:
            return None
        return torch.nn.functional.normalize(torch.tensor(h.getSolution().col_value, dtype=torch.float64), dim=0)


def _vertices(vn: torch.Tensor, batch: int, programs: int, gen: torch.Generator, need: int, zero_tol: float,
              sign_tol: float) -> torch.Tensor:
    """Unit coefficient vectors c (k × B) of the vertices of {c : V c ≥ 0, 1ᵀ V c = 1} that ``programs`` random
    linear objectives reach (:class:`ConeProgram`), kept when V c is sparse and one-signed, each direction once."""
    program = ConeProgram(vn)
    found = torch.zeros(0, batch, dtype=vn.dtype)
    for r in torch.randn(programs, batch, generator=gen, dtype=torch.float64):
        c = program.minimise(r)
        if c is None:
            continue
        c = c.to(vn.dtype)
        if not bool(_valid((c @ vn.T)[None], need, zero_tol, sign_tol)[0]):
            continue
        if len(found) and bool(((found @ c) > 1 - 1e-4).any()):
            continue
        found = torch.cat([found, c[None]])
    return found


def linear_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, batch: int, *, samples: int = 1_000_000,
                  chunk: int = 10_000, zero_tol: float = 1e-4, sign_tol: float = 1e-3, min_zeros: int | None = None,
                  seed: int = 0, method: str = "auto", programs: int | None = None) -> LinearInputs:
    """The ``batch`` per-sample inputs of a Linear layer with weight gradient ``grad_w`` (m × n) and bias gradient
    ``grad_b`` (m) of a loss summed or averaged over the batch (module docstring). Entries below ``zero_tol`` (a
    fraction of a candidate's largest entry) count as zeros and entries beyond ``sign_tol`` as signed;
    ``min_zeros`` (default B − 1 + 20) is the sparsity a candidate needs. Raises :class:`GIError` for shapes that do
    not fit, a gradient whose rank is below ``batch``, or when fewer than ``batch`` inputs were found in ``samples``
    draws (the inputs are not sparse enough, or the layer's input is not nonnegative).

    ``method``: ``lp`` finds the directions as vertices (module docstring, "Vertices"), ``programs`` random linear
    programs (default 8·B); ``sample`` by SPEAR's sampling, ``samples`` draws in rounds of ``chunk``; ``auto`` (the
    default) the vertices first, then the sampling for what they missed. ``draws`` counts both."""
    if grad_w.dim() != 2 or grad_b.shape != (grad_w.shape[0],):
        raise GIError(f"linear_inputs needs a weight gradient (m, n) and a bias gradient (m,); got "
                      f"{tuple(grad_w.shape)} and {tuple(grad_b.shape)}")
    if not 2 <= batch <= min(grad_w.shape):
        raise GIError(f"linear_inputs: batch={batch} must be >= 2 and <= min(m, n) = {min(grad_w.shape)}")
    if samples < 1 or chunk < 1:
        raise GIError(f"linear_inputs: samples={samples} and chunk={chunk} must be >= 1")
    if method not in METHODS:
        raise GIError(f"linear_inputs: method={method!r}; valid: {list(METHODS)}")
    programs = 8 * batch if programs is None else programs
    if programs < 1:
        raise GIError(f"linear_inputs: programs={programs} must be >= 1")
    grad_w, grad_b = grad_w.double(), grad_b.double()
    gen = torch.Generator().manual_seed(seed)
    _, sv, vh = torch.linalg.svd(grad_w, full_matrices=False)
    if sv[batch - 1] <= 1e-9 * sv[0]:
        raise GIError(f"linear_inputs: the weight gradient has rank < batch={batch} (singular values "
                      f"{[f'{v:.1e}' for v in sv[: batch + 1].tolist()]}): fewer distinct samples than the batch")
    v = vh[:batch].T
    vn = live_rows(v)
    need = batch - 1 + 20 if min_zeros is None else min_zeros
    found = torch.zeros(0, batch, dtype=v.dtype)
    draws = 0
    if method in ("lp", "auto"):
        found = _vertices(vn, batch, programs, gen, need, zero_tol, sign_tol)
        draws = programs
    while method != "lp" and draws < samples + (programs if method == "auto" else 0) and len(found) < batch:
        n = min(chunk, samples + (programs if method == "auto" else 0) - draws)
        rows = torch.randint(vn.shape[0], (n, batch - 1), generator=gen)  # O(n B) memory, not O(n × live)
        ordered = rows.sort(1).values
        rows = rows[(ordered[:, 1:] != ordered[:, :-1]).all(1)]  # B − 1 distinct coordinates (the rest redrawn)
        _, rank, vhs = torch.linalg.svd(vn[rows])
        c = vhs[:, -1]
        keep = c[_valid(c @ vn.T, need, zero_tol, sign_tol) & (rank[:, -1] > 1e-3)]
        keep = keep * torch.where((keep @ vn.T).sum(1) < 0, -1.0, 1.0).to(keep.dtype)[:, None]
        found = torch.cat([found, keep / keep.norm(dim=1, keepdim=True)])
        same = (found @ found.T) > 1 - 1e-4
        found = found[~torch.triu(same, 1).any(0)]
        draws += n
    if len(found) < batch:
        raise GIError(f"linear_inputs: {len(found)} of {batch} inputs found in {draws} draws; the layer's inputs "
                      f"are not sparse and nonnegative enough for this batch (or raise samples)")
    if len(found) > batch:  # more one-signed sparse directions than samples: the B that span the space best
        found = found[spanning(found, batch)]
    inputs, output_errors = scaled_inputs(grad_w, grad_b, v, found)
    return LinearInputs(inputs, output_errors, draws, factor_residual(grad_w, grad_b, inputs, output_errors))


def scaled_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, v: torch.Tensor, coef: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs (B × n) and output errors (B × m) for B input directions ``V c_j`` (``coef``: B × B, rows c_j;
    ``v``: n × B, ∇W's top-B right singular vectors): Δ = ∇W V C⁻ᵀ up to one scale per sample, which ∇b = Δ s
    fixes by least squares (module docstring)."""
    c = coef.T
    deltas = grad_w @ v @ torch.linalg.inv(c.T)
    scale = torch.linalg.lstsq(deltas, grad_b[:, None]).solution.squeeze(1)
    return (v @ c / scale).T, (deltas * scale).T


def spanning(directions: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of ``count`` rows of ``directions`` (unit coefficient vectors, K × B) chosen greedily for the largest
    volume: QR with column pivoting (Businger & Golub 1965), each pick the direction farthest from the span of those
    picked before. The B inputs are a basis of the B-dimensional row space; a near-copy of an input (a vertex of a
    slightly perturbed cone, e.g. under the float32 rounding of an update) adds almost no volume, so the copies
    are passed over where keeping the sparsest would keep them (a FedAvg round of 50 images: 48–50 of 50 inputs
    kept against 20–41)."""
    from scipy.linalg import qr

    _, _, pivots = qr(directions.T.numpy(), pivoting=True, mode="economic")
    return torch.as_tensor(pivots[:count].copy(), dtype=torch.long)


def factor_residual(grad_w: torch.Tensor, grad_b: torch.Tensor | None, inputs: torch.Tensor,
                    output_errors: torch.Tensor | None = None) -> float:
    """How well per-sample ``inputs`` X (B × n) explain a Linear layer's gradients ``∇W = Δᵀ X`` (m × n) and
    ``∇b = Δᵀ 1`` (module docstring): ``max(‖∇W − Δᵀ X‖ / ‖∇W‖, ‖∇b − Δᵀ 1‖ / ‖∇b‖)`` (the bias term only when
    ``grad_b`` is given), float64. ``output_errors`` Δ (B × m, each sample's ∂L/∂z, any 1/B of the loss folded in):
    the errors found with the inputs; None: the least-squares Δ for these inputs (the best any errors can do).

    0 for the true inputs; a necessary test, not a sufficient one: any B inputs spanning ∇W's row space (and, with
    the bias, mixtures of them that keep ``Δᵀ 1``) score 0 as well, which is why :func:`linear_inputs` also asks
    for sparse, one-signed inputs (SPEAR's argument, Dimitrov et al. 2024)."""
    gw, x = grad_w.double(), inputs.double()
    if gw.dim() != 2 or x.dim() != 2 or x.shape[1] != gw.shape[1]:
        raise GIError(f"factor_residual: a weight gradient (m, n) and inputs (B, n); got {tuple(gw.shape)} and "
                      f"{tuple(x.shape)}")
    delta = torch.linalg.lstsq(x.T, gw.T).solution if output_errors is None else output_errors.double()
    residual = float((gw - delta.T @ x).norm() / gw.norm().clamp_min(1e-30))
    if grad_b is not None:
        gb = grad_b.double()
        residual = max(residual, float((gb - delta.sum(0)).norm() / gb.norm().clamp_min(1e-30)))
    return residual


RANK_TOL = 3e-6  # row_space: singular values above this fraction of the largest (an update's float32 floor ~1e-6)


def row_space(grad_w: torch.Tensor, rank_tol: float = RANK_TOL) -> torch.Tensor:
    """An orthonormal basis (n × r, float64) of the row space of a Linear layer's weight gradient or summed update
    ``grad_w`` (m × n): its right singular vectors whose singular value exceeds ``rank_tol`` of the largest. Over
    E local epochs it holds (up to the layer's live output units) the E·N visits of the round's N samples."""
    _, sv, vh = torch.linalg.svd(grad_w.double(), full_matrices=False)
    return vh[: max(1, int((sv > rank_tol * sv[0]).sum()))].T


def null_directions(basis: torch.Tensor, inputs: torch.Tensor, zero_tol: float = 1e-2, smallest: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row x of ``inputs`` (K × n), the unit vector of span(``basis``) (n × r, orthonormal columns) that
    best vanishes where x does: with Z the entries of x at most ``zero_tol`` of its largest, the right singular
    vector of ``basis[Z]`` with the smallest singular value, mapped back and signed to a positive sum. Returns the
    K directions (K × n) and, per row, the ratio of the smallest singular value to the next (small: span(basis)
    holds one vector with those zeros, as it holds each input of a ReLU / max-pool map).

    Over several local epochs an image's visits differ by the parameters' drift, so no visit is a vertex of the
    row space's nonnegative cone; but its zeros barely move: given the zero pattern of an image's input at the
    global model (read off a fitted image), this direction is within cosine 0.999 of that input (measured on a
    Fashion-MNIST round of E = 5, N = 50: median 0.9991, min 0.9973, against 0.96 for the cone's vertices).

    ``smallest`` k: Z is each row's k smallest entries instead (negative ones first), a hard-thresholding pursuit.
    Where x mixes several inputs, its exact zeros are only those the inputs share, and span(basis) holds every
    mixture of them, so the direction from its zeros stays a mixture; its k smallest entries fall mostly among the
    zeros of the input that dominates it, so iterating pulls x toward that input (k above r: enough equations for
    one direction, and few of the dominant input's nonzeros among them)."""
    if basis.dim() != 2 or inputs.dim() != 2 or inputs.shape[1] != basis.shape[0]:
        raise GIError(f"null_directions: a basis (n, r) and inputs (K, n); got {tuple(basis.shape)} and "
                      f"{tuple(inputs.shape)}")
    basis, x = basis.double(), inputs.double()
    out = torch.zeros_like(x)
    ratio = torch.ones(x.shape[0], dtype=torch.float64)
    if smallest is not None:
        if not basis.shape[1] <= smallest <= x.shape[1]:
            raise GIError(f"null_directions: smallest={smallest} must be at least the basis' rank {basis.shape[1]} "
                          f"and at most the inputs' length {x.shape[1]}")
        marked = _smallest(x, smallest)
    else:
        marked = x <= zero_tol * x.amax(1, keepdim=True).clamp_min(1e-300)
    for i, zeros in enumerate(marked):
        if int(zeros.sum()) < 2:
            continue
        _, sv, vh = torch.linalg.svd(basis[zeros], full_matrices=False)
        d = basis @ vh[-1]
        out[i] = d * (1.0 if float(d.sum()) >= 0 else -1.0)
        if len(sv) > 1:
            ratio[i] = sv[-1] / sv[-2].clamp_min(1e-300)
    return out, ratio


PURSUIT = 2.0  # the pursuit's zeros: each candidate's PURSUIT·rank smallest entries (measured in drifting_inputs)


def pursue(basis: torch.Tensor, inputs: torch.Tensor, steps: int, factor: float = PURSUIT
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` steps of the hard-thresholding pursuit from each row of ``inputs``: :func:`null_directions` with
    each row's ``factor``·r smallest entries as its zeros (r the rank of ``basis``; at least r, at most the rows'
    length). Returns the directions and their null ratios (``inputs`` and ratios of 1 for ``steps`` 0)."""
    k = min(max(int(factor * basis.shape[1]), basis.shape[1]), basis.shape[0])
    found, ratio = inputs.double().clone(), torch.ones(inputs.shape[0], dtype=torch.float64)
    moving = torch.arange(inputs.shape[0])
    for _ in range(steps):  # a row whose k smallest entries stay the same is at its fixed point: it stops
        if not len(moving):
            break
        marked = _smallest(found[moving], k)
        found[moving], ratio[moving] = null_directions(basis, found[moving], smallest=k)
        moving = moving[~(_smallest(found[moving], k) == marked).all(1)]
    return found, ratio


def _smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's ``k`` smallest entries, as a mask (ties included), as :func:`null_directions` marks them."""
    return x <= x.kthvalue(k, dim=1, keepdim=True).values


def drifting_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, samples: int, *, programs: int | None = None,
                    zero_tol: float = 1e-2, sign_tol: float = 5e-2, iterations: int = 8, distinct: float = 0.98,
                    pursuit: float = PURSUIT, seed: int = 0) -> LinearInputs:
    """Each of ``samples`` images' input of a Linear layer from the summed update of several local epochs, in which
    every image is visited once an epoch at drifting parameters (so the row space holds up to E·N visits and has
    no gap at N). The vertices of the nonnegative cone in the top-N right singular subspace, found by ``programs``
    linear programs at the loose tolerances ``zero_tol`` / ``sign_tol`` (:func:`linear_inputs`' "Vertices"), are
    averages of an image's visits (cosine ~0.95); each is refined ``iterations`` times by
    :func:`null_directions` in the whole row space (:func:`row_space`) of rank r, from its own zero pattern, and
    (``pursuit`` > 0) again from its ``pursuit``·r smallest entries, the hard-thresholding pursuit that splits a
    vertex mixing several images. Both sets are pooled: measured on configs/fedavg-round.yaml at E = 5 (candidates
    within cosine 0.99 of a true input at θ⁰, among those kept), seed 0: 33 from the zeros alone, 26 from the pursuit,
    28 pooled; seed 1: 0, 15, 15 (its maps are denser: 34 % zeros against 28 %); the pursuit at 1.5·r / 2·r / 3·r: 0
    / 15 / 3 on seed 1. Of the refined
    candidates, the ``samples`` with the smallest null-direction ratio are kept, skipping one within cosine
    ``distinct`` of a kept one (where the refinements of many vertices meet, fewer than ``samples`` are distinct:
    the rest are the unrefined vertices farthest from those kept, which the fit refreshes); each input's scale is
    its own vertex's, those that fit the bias update (least squares, as in
    :func:`linear_inputs`), an approximation where an image's visits are not one direction. ``residual`` is
    :func:`factor_residual` of the answer (not 0: the visits differ). Raises :class:`GIError` where fewer than
    ``samples`` vertices are found."""
    grad_w, grad_b = grad_w.double(), grad_b.double()
    if not 2 <= samples <= min(grad_w.shape):
        raise GIError(f"drifting_inputs: samples={samples} must be >= 2 and <= min(m, n) = {min(grad_w.shape)}")
    programs = 8 * samples if programs is None else programs
    if programs < 1 or iterations < 0:
        raise GIError(f"drifting_inputs: programs={programs} must be >= 1 and iterations={iterations} >= 0")
    basis = row_space(grad_w)
    if basis.shape[1] < samples:
        raise GIError(f"drifting_inputs: the update's row space has rank {basis.shape[1]} < samples={samples}")
    top = basis[:, :samples]
    gen = torch.Generator().manual_seed(seed)
    coeffs = _vertices(live_rows(top), samples, programs, gen, samples - 1 + 20, zero_tol, sign_tol)
    found = coeffs @ top.T
    start = torch.nn.functional.normalize(found, dim=1)  # the unrefined vertices
    ratio = torch.ones(len(found), dtype=torch.float64)
    pursued, pursued_ratio = pursue(basis, found, iterations if pursuit > 0 else 0, pursuit)
    for _ in range(iterations):
        found, ratio = null_directions(basis, found, zero_tol)
    vertices = len(start)
    if pursuit > 0 and iterations > 0:
        found, ratio = torch.cat([found, pursued]), torch.cat([ratio, pursued_ratio])
        start = torch.cat([start, start])  # each pursued candidate's vertex, for its scale
    unit = torch.nn.functional.normalize(found, dim=1)
    kept: list[int] = []
    for i in ratio.argsort().tolist():
        if float(unit[i].norm()) > 0 and all(float(unit[i] @ unit[j]) < distinct for j in kept):
            kept.append(i)
        if len(kept) == samples:
            break
    u = unit[kept]
    while len(kept) < samples and len(kept) < len(start):  # refinements that met: the farthest unrefined vertices
        cos = (start @ u.T).amax(1) if kept else torch.zeros(len(start), dtype=start.dtype)
        cos[kept] = float("inf")
        kept.append(int(cos.argmin()))
        u = torch.cat([u, start[kept[-1]][None]])
    if len(kept) < samples:
        raise GIError(f"drifting_inputs: {len(kept)} of {samples} inputs found in {programs} programs")
    # each input's scale from its own vertex (∇W ≈ Σ_i δ̃_i s_i v_iᵀ, ∇b = Σ_i δ̃_i: least squares), where the
    # refined directions' own fit scattered them over three decades (15 to 12 000 against true norms of 13 to 32)
    # (a vertex whose two refinements were both kept counts once)
    own = [i % vertices for i in kept]
    distinct_vertices = sorted(set(own))
    deltas = torch.linalg.lstsq(start[distinct_vertices].T, grad_w.T).solution.T  # m × (vertices kept)
    scale = torch.linalg.lstsq(deltas, grad_b[:, None]).solution.squeeze(1)
    scale = torch.where(scale.abs() > 1e-12, scale.abs(), torch.ones_like(scale))  # the inputs are nonnegative
    inputs = u / scale[[distinct_vertices.index(v) for v in own]][:, None]
    output_errors = torch.linalg.lstsq(inputs.T, grad_w.T).solution  # N × m, the least squares for these inputs
    return LinearInputs(inputs, output_errors, programs, factor_residual(grad_w, grad_b, inputs, output_errors))


PURSUED_ZEROS = 0.8  # pursued_inputs: each candidate's zeros, this fraction of the most a vertex has (measured)
LADDER = 0.75  # pursued_inputs: each round takes this fraction of the zeros the round before took
SURE_RATIO = 1e-3  # pursued_inputs: a fixed point whose null-direction ratio is below this is an input (measured)


def pursued_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, batch: int, *, zeros: float = PURSUED_ZEROS,
                   starts: int = 8, mix: int = 3, steps: int = 40, rounds: int = 3, sure: float = SURE_RATIO,
                   distinct: float = 0.98, zero_tol: float = 1e-3, seed: int = 0) -> LinearInputs:
    """The ``batch`` inputs of a Linear layer whose inputs are exactly in ∇W's top-B row space (a FedSGD batch, a
    one-epoch round) where the cone's vertices are not the inputs: many of them mix several inputs, as on a
    Fashion-MNIST round of N = 100 (the config round's CNN; :func:`vertex_inputs`' 100 vertices are within cosine
    0.99 of only 3 of the 100 inputs, the sampling finds none in a million draws).

    Each input keeps 715–1076 zeros of 3136 there, far more than B, and a mixture's k smallest entries fall mostly
    among the zeros of the input that dominates it, so :func:`pursue` from a mixture ends on that input, exactly: a
    fixed point whose null-direction ratio (the smallest singular value of V restricted to those entries over the
    next) is ~1e-4, where the pursuit's other ends sit at ~0.2. An end is sure where that ratio is below ``sure``
    and its k smallest entries are zeros (below ``zero_tol`` of its largest; on random sparse inputs the ratio
    alone was fooled at k = B, hence also k ≥ 2·B). Each of ``rounds`` rounds starts ``starts``·B pursuits from
    random mixtures (flat Dirichlet weights) of ``mix`` of :func:`vertex_inputs`' vertices (the first round from
    each vertex too), each vertex drawn by its distance to the inputs already sure (1 − its largest cosine to them,
    at least 0.02), runs each to its fixed point (at most ``steps`` steps) and keeps the sure ends that are
    distinct (cosine below ``distinct`` to those kept). k is ``zeros`` of the most zeros a vertex has in the first
    round and :data:`LADDER` of the round before's in each next one (for inputs with fewer zeros), at least 2·B.
    Measured on that round (seed 0; docs/results/client-round.md, "N = 100: the pursuit"): from the vertices alone
    k = 2·B / 4·B / 7·B / 10·B reached 3 / 12 / 27 / 23 of the 100 inputs; this function is sure of 83, every one
    within cosine 0.99 of a true input at θ⁰ (the rest is the drift of the steps between), none of the other 17
    rows is one. The rows not sure of are the other ends with the smallest ratios (then the vertices), after the
    sure ones (``sure`` in the result counts them); scales as :func:`linear_inputs`.
    Raises :class:`GIError` for a rank below ``batch`` or where no vertex is found. The answer is kept per gradient
    (the label and feature stages of one run search the same update)."""
    gw, gb = grad_w.double(), grad_b.double()
    key = (digest(gw, gb), batch, zeros, starts, mix, steps, rounds, sure, distinct, zero_tol, seed)
    return _PURSUED.get(key, lambda: _pursued(gw, gb, batch, zeros, starts, mix, steps, rounds, sure, distinct,
                                              zero_tol, seed))


_PURSUED = LRU(8)


def _pursued(gw: torch.Tensor, gb: torch.Tensor, batch: int, zeros: float, starts: int, mix: int, steps: int,
             rounds: int, sure: float, distinct: float, zero_tol: float, seed: int) -> LinearInputs:
    """:func:`pursued_inputs`, uncached."""
    if not 2 <= batch <= min(gw.shape):
        raise GIError(f"pursued_inputs: batch={batch} must be >= 2 and <= min(m, n) = {min(gw.shape)}")
    if starts < 1 or mix < 1 or steps < 1 or rounds < 1 or not 0 < zeros <= 1:
        raise GIError(f"pursued_inputs: starts={starts}, mix={mix}, steps={steps}, rounds={rounds} must be >= 1 "
                      f"and zeros={zeros} in (0, 1]")
    sv, vh = torch.linalg.svd(gw, full_matrices=False)[1:]
    if sv[batch - 1] <= 1e-9 * sv[0]:
        raise GIError(f"pursued_inputs: the gradient has rank < batch={batch}: fewer distinct samples than that")
    v = vh[:batch].T
    vertices = torch.nn.functional.normalize(vertex_inputs(gw, gb, batch, min_zeros=batch - 1, seed=seed), dim=1)
    if not len(vertices):
        raise GIError("pursued_inputs: no vertex of the gradient's nonnegative cone: the layer's inputs are not "
                      "nonnegative and sparse")
    most = zeros * float(zero_counts(vertices, zero_tol).max())
    gen = torch.Generator().manual_seed(seed)
    kept = torch.zeros(0, v.shape[0], dtype=torch.float64)
    rest, rest_ratio = vertices, torch.ones(len(vertices), dtype=torch.float64)
    for r in range(rounds):
        k = min(max(int(most * LADDER ** r), 2 * batch), v.shape[0] - 1)
        weight = torch.ones(len(vertices), dtype=torch.float64)
        if len(kept):
            weight = (1 - (vertices @ kept.T).amax(1)).clamp_min(0.02)
        picks = torch.multinomial(weight, starts * batch * mix, replacement=True, generator=gen)
        mixture = -torch.rand(starts * batch, mix, generator=gen, dtype=torch.float64).log()  # flat Dirichlet
        x = (mixture.unsqueeze(-1) * vertices[picks].view(starts * batch, mix, -1)).sum(1)
        if not len(kept):  # the first round starts from each vertex too: a vertex that is an input stays there
            x = torch.cat([vertices, x])
        ends, ratio = pursue(v, x, steps, k / batch)
        ends = torch.nn.functional.normalize(ends, dim=1)
        ratio = torch.where(zero_counts(ends, zero_tol) >= k, ratio, torch.ones_like(ratio))  # zeros that are zeros
        for i in ratio.argsort().tolist():
            if float(ratio[i]) >= sure or len(kept) >= batch:
                break
            if not len(kept) or float((kept @ ends[i]).amax()) < distinct:
                kept = torch.cat([kept, ends[i][None]])
        rest, rest_ratio = torch.cat([ends, vertices]), torch.cat([ratio, torch.ones(len(vertices),
                                                                                      dtype=torch.float64)])
        if len(kept) >= batch:
            break
    found = len(kept)
    for i in rest_ratio.argsort().tolist():  # the rows not sure of: the best of the other ends, then the vertices
        if len(kept) >= batch:
            break
        if float(rest[i].norm()) > 0 and (not len(kept) or float((kept @ rest[i]).amax()) < distinct):
            kept = torch.cat([kept, rest[i][None]])
    if len(kept) < batch:
        raise GIError(f"pursued_inputs: {len(kept)} distinct directions of {batch} inputs")
    inputs, output_errors = scaled_inputs(gw, gb, v, kept @ v)
    return LinearInputs(inputs, output_errors, 0, factor_residual(gw, gb, inputs, output_errors), sure=found)


# An update is a float32 difference of two models: its smallest directions carry that rounding, so a zero of an input
# reads as ~1e-4 of its largest entry (measured on a FedAvg round of 50 Fashion-MNIST images: 48 of 50 inputs found
# at 1e-4 / 1e-3, 49 at 1e-3 / 1e-2; on a model trained to 88 %, whose well-fitted images barely move it, 33 at 1e-4
# and 50 at 1e-3)
UPDATE_TOLERANCES = {"zero_tol": 1e-3, "sign_tol": 1e-2}


@dataclass
class SummedLayer:
    """A Linear layer's shared tensors read as one batch gradient (:func:`summed_layer`): ``weight`` (m × n) and
    ``bias`` (m,), float64; ``samples`` the inputs behind them; ``per_mean`` the samples each mean-loss gradient
    averages (the batch: ``∇W = (1/per_mean) Σ_i δ_i x_iᵀ``); ``tolerances`` for :func:`linear_inputs`;
    ``visits`` the (sample, step) pairs summed: ``samples`` for a FedSGD batch or a round that sees each sample at
    most once, more over several local epochs, whose visits of one sample differ by the parameters' drift."""

    weight: torch.Tensor
    bias: torch.Tensor
    samples: int
    per_mean: int
    tolerances: dict[str, float]
    visits: int

    @property
    def once(self) -> bool:
        """Whether each sample entered the sum at most once, so the rows span exactly ``samples`` inputs."""
        return self.visits <= self.samples


def summed_layer(capture: Capture, layer: str) -> SummedLayer | None:
    """The shared weight and bias of Linear layer ``layer`` as a batch gradient over its inputs, or None where the
    capture does not give one (the layer is not a Linear with both tensors shared, or an update that is not a plain
    sum of gradients, :func:`gi.world.fl.local.sums_gradients`). FedSGD: the gradient over its B samples. A FedAvg
    update of plain SGD: ``−ΔW/η = Σ_τ ∇W_τ``, each step the mean over its batch, so every row lies in the span of
    the inputs each visit saw (one epoch: each of the N samples once, at its own step's parameters), over the
    samples the steps touch (:func:`gi.world.fl.local.distinct_samples`), at :data:`UPDATE_TOLERANCES`."""
    names = (f"{layer}.weight", f"{layer}.bias")
    if not all(n in capture.shared for n in names) or (capture.is_update and not sums_gradients(capture.protocol)):
        return None
    gw, gb = (capture.shared[n].double() for n in names)
    if gw.dim() != 2:
        return None
    if not capture.is_update:
        return SummedLayer(gw, gb, capture.num_samples, capture.num_samples, {}, capture.num_samples)
    scale = -1.0 / capture.protocol.lr
    schedule = local_schedule(capture.protocol, capture.num_samples)
    return SummedLayer(gw * scale, gb * scale, distinct_samples(capture.protocol, capture.num_samples), schedule[0],
                       dict(UPDATE_TOLERANCES), int(sum(schedule)))


def first_linear(model: torch.nn.Module) -> str | None:
    """The name of the model's first ``nn.Linear`` in module order (after a conv body: the layer that sees its
    flattened map), None when it has none."""
    return next((n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)), None)


def sample_errors(capture: Capture, layer: str, inputs: torch.Tensor, per_mean: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's logits z_i and output error δ_i = ∂ℓ_i/∂z_i (B × C each, float64, the rows of ``inputs``' order)
    from the B inputs of the Linear layer ``layer`` (:func:`linear_inputs`).

    The inputs are fed to ``layer`` together (a forward pre-hook; the layers before it see zeros and are
    overridden), so the rest of the net runs as the client's forward did (BatchNorm in the protocol's mode), and
    the last layer's input h_i of every sample is read. The last layer's gradient of the batch's mean loss is
    ``∇W_L = (1/B) Σ_i δ_i h_iᵀ``, which least squares solves for the δ_i when the h_i are independent (B ≤ their
    dimension). ``per_mean``: the samples each mean-loss gradient averages (default all B; a FedAvg update's batch
    size, :class:`SummedLayer`), whose ``1/per_mean`` the errors are scaled back from."""
    model = capture.model().double().train(capture.protocol.model_mode == "train")
    x = inputs.double()
    b = x.shape[0]
    seen: dict[str, torch.Tensor] = {}
    feed = model.get_submodule(layer).register_forward_pre_hook(lambda m, a: (x,))
    read = model.get_submodule(capture.last_layer_name).register_forward_pre_hook(
        lambda m, a: seen.__setitem__("h", a[0].flatten(1)))
    try:
        with torch.no_grad():
            logits = model(torch.zeros(b, *capture.model_spec["in_shape"], dtype=torch.float64))
    finally:
        feed.remove()
        read.remove()
    last_w = capture.last_layer(torch.float64)[0]
    errors = (per_mean or b) * torch.linalg.lstsq(seen["h"].T, last_w.T).solution  # (B, C): ∇W_Lᵀ = (1/B) Hᵀ Δ
    return logits.flatten(1), errors


ROUND = 12  # last_layer_inputs: starts solved together per round
MAX_SYSTEM_BYTES = 1 << 30  # last_layer_inputs: the largest Jacobian + normal matrix of one round (float64)


def _system(c: torch.Tensor, a: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor, m: torch.Tensor,
            mb: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual r (K × R) and Jacobian J (K × R × B²) of the label-keyed system (:func:`last_layer_inputs`)
    at K stacked coefficient matrices ``c`` (K × B × B, row i = c_i): the entries of ``Δᵀ C − M`` and, with a bias,
    of ``Δᵀ 1 − B∇b``, each block scaled by its target's norm. With ``δ_k = softmax(A c_k + b) − y_k`` and
    ``S_k = diag(p_k) − p_k p_kᵀ``: ∂(Δᵀ C)_{qj}/∂c_{kl} = (S_k A)_{ql} c_{kj} + δ_{kq} [j = l]."""
    k, batch, _ = c.shape
    p = torch.softmax(c @ a.T + bias, 2)  # K × B × C
    delta = p - targets
    sa = p[..., :, None] * a - p[..., :, None] * (p @ a)[..., None, :]  # K × B × C × B: S_k A
    eye = torch.eye(batch, dtype=c.dtype)
    jac = (sa.permute(0, 2, 1, 3)[:, :, None] * c.transpose(1, 2)[:, None, :, :, None]
           + delta.transpose(1, 2)[:, :, None, :, None] * eye[None, None, :, None, :])  # K × C × B(j) × B(i) × B(l)
    scale = m.norm()
    r = ((delta.transpose(1, 2) @ c - m) / scale).reshape(k, -1)
    jac = (jac / scale).reshape(k, r.shape[1], batch * batch)
    if mb is not None:
        sb = mb.norm().clamp_min(1e-300)
        r = torch.cat([r, (delta.sum(1) - mb) / sb], 1)
        jac = torch.cat([jac, sa.permute(0, 2, 1, 3).reshape(k, -1, batch * batch) / sb], 1)
    return r, jac


def _levenberg_marquardt(c: torch.Tensor, a: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor,
                         m: torch.Tensor, mb: torch.Tensor | None, iterations: int, tol: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Levenberg–Marquardt on :func:`_system` from K stacked starts ``c`` (K × B × B) at once, each with its own
    damping (×10 on a rejected step, ÷3 on an accepted one); returns the K end points and their costs ‖r‖²."""
    k, batch, _ = c.shape
    x = c.clone()
    r, jac = _system(x, a, bias, targets, m, mb)
    cost = (r * r).sum(1)
    damping = torch.full((k,), 1e-3, dtype=c.dtype)
    for _ in range(iterations):
        if bool((cost < tol * tol).any()):
            break
        jtj = jac.transpose(1, 2) @ jac
        diag = torch.diag_embed(jtj.diagonal(dim1=1, dim2=2).clamp_min(1e-12))
        step = torch.linalg.solve(jtj + damping[:, None, None] * diag, -(jac.transpose(1, 2) @ r[..., None]))
        trial = x + step.reshape(k, batch, batch)
        r_new, jac_new = _system(trial, a, bias, targets, m, mb)
        new = (r_new * r_new).sum(1)
        better = new < cost
        x = torch.where(better[:, None, None], trial, x)
        r = torch.where(better[:, None], r_new, r)
        jac = torch.where(better[:, None, None], jac_new, jac)
        cost = torch.where(better, new, cost)
        damping = torch.where(better, (damping / 3).clamp_min(1e-12), (damping * 10).clamp_max(1e12))
    return x, cost


def _starts(starts: int, targets: torch.Tensor, v: torch.Tensor, m: torch.Tensor, bias: torch.Tensor,
            grad_b: torch.Tensor | None, grad_w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``starts`` start matrices (K × B × B), taking turns: the softmax at the bias alone (slightly perturbed, so
    that samples of one class start apart) solved into ``M = Δ₀ᵀ C``; with a bias, the class means
    ``∇W_{y_i} / ∇b_{y_i}`` (exact for a confident net) perturbed by 1 %; a Gaussian of the means' scale."""
    batch, classes = targets.shape
    f64 = torch.float64
    out = []
    means = None
    if grad_b is not None:
        denom = targets @ grad_b
        if bool((denom.abs() > 0).all()):
            means = (targets @ grad_w / denom[:, None]) @ v.T
    size = m.norm() / (targets - torch.softmax(bias, 0)).norm()
    for s in range(starts):
        if s % 3 == 0:
            noise = 1e-2 * (1 + s) * torch.randn(batch, classes, generator=gen, dtype=f64)
            c = torch.linalg.lstsq((torch.softmax(bias + noise, 1) - targets).T, m).solution
        elif s % 3 == 1 and means is not None:
            c = means + 1e-2 * means.norm(dim=1, keepdim=True) * torch.randn(batch, batch, generator=gen, dtype=f64)
        else:  # the third kind, and the second without a bias
            c = size * torch.randn(batch, batch, generator=gen, dtype=f64) / batch ** 0.5
        out.append(c)
    return torch.stack(out)


def system_bytes(batch: int, classes: int, starts: int = ROUND) -> int:
    """Bytes of one round of :func:`last_layer_inputs` (float64 Jacobians of C·B + C residuals in B² unknowns, and
    their B² × B² normal matrices, for up to :data:`ROUND` starts at once)."""
    return 8 * min(ROUND, starts) * (classes * batch + classes + batch * batch) * batch * batch


def last_layer_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor | None, weight: torch.Tensor,
                      bias: torch.Tensor | None, targets: torch.Tensor, *, starts: int = 48, iterations: int = 100,
                      tol: float = 1e-9, seed: int = 0) -> LinearInputs:
    """Each sample's input h_i of the last layer ``z = W h + b`` of a FedSGD batch, from that layer's gradient and
    the batch's labels (one row of ``targets`` per sample, B × C, hard or soft), for the mean cross-entropy loss.

    Soft-label paper eq. 2 for a batch: ``∇W = (1/B) Σ_i δ_i h_iᵀ``, ``∇b = (1/B) Σ_i δ_i`` with
    ``δ_i = softmax(W h_i + b) − y_i``. With rank(∇W) = B the h_i lie in the span of its top-B right singular
    vectors V: ``h_i = Vᵀ c_i``. Then ``B ∇W Vᵀ = Δᵀ C`` and ``B ∇b = Δᵀ 1`` with ``Δ = softmax(C (W Vᵀ)ᵀ + b) − Y``:
    C·B + C equations (C classes) in the B² unknowns of C, a square or overdetermined system once B ≤ C − 1, solved
    by Levenberg–Marquardt from batched starts (:func:`_starts`), in rounds of :data:`ROUND` until one solves it or
    ``starts`` are spent; the one with the smallest residual wins. The labels are what makes it determined: the
    class means ``∇W_c / ∇b_c`` mix every sample's feature unless the net is confident, and do not separate the
    samples of a repeated class at all.
    ``residual`` is the relative gradient mismatch of the answer (as for :func:`linear_inputs`); a large one means
    the labels or the loss do not fit the gradient, or no start reached the solution. ``draws`` counts the starts.

    Raises :class:`GIError` for shapes that do not fit, B ≥ C (then rank(∇W) ≤ C − 1 < B: not determined), a
    system whose round of starts would hold more than :data:`MAX_SYSTEM_BYTES` (e.g. B = 64 of C = 1000 classes),
    or a gradient whose rank is below B (repeated inputs)."""
    if grad_w.dim() != 2 or weight.shape != grad_w.shape or targets.dim() != 2:
        raise GIError(f"last_layer_inputs needs ∇W and W of one shape (C, D) and targets (B, C); got "
                      f"{tuple(grad_w.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    (classes, dim), batch = grad_w.shape, targets.shape[0]
    if targets.shape[1] != classes or (grad_b is None) != (bias is None) or (
            grad_b is not None and (grad_b.shape != (classes,) or bias.shape != (classes,))):
        raise GIError(f"last_layer_inputs: targets {tuple(targets.shape)}, ∇b and b must fit C={classes} classes, "
                      f"and ∇b and b are given together")
    if not 2 <= batch <= min(classes - 1, dim):
        raise GIError(f"last_layer_inputs: B={batch} samples are determined only for 2 <= B <= min(C - 1, D) = "
                      f"{min(classes - 1, dim)} (the output errors of a batch span at most C - 1 directions)")
    if starts < 1 or iterations < 1:
        raise GIError(f"last_layer_inputs: starts={starts} and iterations={iterations} must be >= 1")
    size = system_bytes(batch, classes, starts)
    if size > MAX_SYSTEM_BYTES:
        raise GIError(f"last_layer_inputs: B={batch} samples of C={classes} classes need {size / 2 ** 30:.1f} GiB "
                      f"per round of starts (Jacobian and normal matrix), above {MAX_SYSTEM_BYTES / 2 ** 30:.0f} GiB")
    f64 = torch.float64
    grad_w, weight, targets = grad_w.to(f64), weight.to(f64), targets.to(f64)
    grad_b = None if grad_b is None else grad_b.to(f64)
    _, sv, vh = torch.linalg.svd(grad_w, full_matrices=False)
    if sv[batch - 1] <= 1e-9 * sv[0]:
        raise GIError(f"last_layer_inputs: ∇W has rank < B={batch} (singular values "
                      f"{[f'{v:.1e}' for v in sv[: batch + 1].tolist()]}): fewer distinct samples than the batch")
    v = vh[:batch]
    m, a = batch * grad_w @ v.T, weight @ v.T
    b0 = torch.zeros(classes, dtype=f64) if bias is None else bias.to(f64)
    mb = None if grad_b is None else batch * grad_b
    gen = torch.Generator().manual_seed(seed)
    best, cost, used = None, float("inf"), 0
    while used < starts and cost >= tol * tol:  # rounds of ROUND starts, until one solves the system
        k = min(ROUND, starts - used)
        ends, costs = _levenberg_marquardt(_starts(k, targets, v, m, b0, grad_b, grad_w, gen), a, b0, targets, m,
                                           mb, iterations, tol)
        if float(costs.min()) < cost:
            best, cost = ends[int(costs.argmin())], float(costs.min())
        used += k
    inputs = best @ v
    errors = torch.softmax(inputs @ weight.T + b0, 1) - targets
    res = float((grad_w - errors.T @ inputs / batch).norm() / grad_w.norm())
    if grad_b is not None:
        res = max(res, float((grad_b - errors.mean(0)).norm() / grad_b.norm().clamp_min(1e-300)))
    return LinearInputs(inputs, errors, used, res)


def slot_inputs(capture: Capture, soft: torch.Tensor, *, seed: int = 0, starts: int = 48) -> LinearInputs | None:
    """:func:`last_layer_inputs` for a capture and its slot labels ``soft`` (B × C): each slot's last-layer input
    (rows in the order of ``soft``), or None where the system does not apply (an update, a loss other than
    cross-entropy, B outside 2 … C − 1, a last layer without its weight, a bias gradient without the bias or the
    reverse, a gradient of rank below B). A softmax temperature T (``δ = (softmax(z/T) − y)/T``) is the same system
    for the head ``W/T, b/T`` and the gradient ``T·∇``. ``starts`` bounds the Levenberg–Marquardt starts. None too
    where the system is above :data:`MAX_SYSTEM_BYTES` per round."""
    b, classes = soft.shape
    if capture.is_update or capture.protocol.loss != "ce" or not 2 <= b <= classes - 1:
        return None
    gw, gb = capture.last_layer(torch.float64)
    wkey, bkey = capture.last_layer_keys
    weight, bias = capture.model_state.get(wkey), capture.model_state.get(bkey)
    if weight is None or (gb is None) != (bias is None):
        return None
    t = float(capture.protocol.temperature)
    try:
        return last_layer_inputs(gw.cpu() * t, None if gb is None else gb.cpu() * t, weight.cpu() / t,
                                 None if bias is None else bias.cpu() / t, soft.cpu(), seed=seed, starts=starts)
    except GIError:
        return None


def complete_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, inputs: torch.Tensor, *, programs: int = 8,
                    zero_tol: float = 1e-4, sign_tol: float = 1e-3, seed: int = 0, doubt: list[int] | None = None):
    """The B inputs ``inputs`` (B × n, :func:`fcn_analytic.disaggregate.linear_inputs`) with the doubtful ones
    replaced by the vertices they stand for (module docstring, "Completing the inputs"), and how many were replaced.

    An input is sure when its zeros (entries below ``zero_tol`` of its largest) are at least :data:`SURE_ZEROS` of
    the median over the B (the rows ``doubt`` are doubted regardless); for each of the others,
    ``programs`` linear programs maximise a random objective orthogonal to the sure inputs' coefficient vectors
    (in the basis V of ∇W's top-B right singular vectors), and an optimum that is sure, one-signed (``sign_tol``)
    and new joins them. Inputs still missing keep the
    doubtful ones with the most zeros. The output errors are then solved for the completed inputs as
    :func:`fcn_analytic.disaggregate.linear_inputs` does (∇W V C⁻ᵀ, one scale per sample from ∇b). Returns
    ``(LinearInputs, replaced, doubtful)``, ``doubtful`` (B,) marking the rows kept without being sure."""
    gw, gb = grad_w.double(), grad_b.double()
    batch = inputs.shape[0]
    v = torch.linalg.svd(gw, full_matrices=False)[2][:batch].T  # n × B
    coef = torch.nn.functional.normalize(inputs.double() @ v, dim=1)  # x = V c: c = Vᵀ x
    zeros = zero_counts(coef @ v.T, zero_tol)
    need = SURE_ZEROS * float(zeros.median())
    sure = zeros >= need
    if doubt:
        sure[doubt] = False
    replaced, left = 0, 0
    if programs > 0 and not bool(sure.all()):
        program = ConeProgram(live_rows(v), simplex="primal")
        gen = torch.Generator().manual_seed(seed)
        kept = coef[sure]
        for _ in range(programs * int((~sure).sum())):
            if len(kept) >= batch:
                break
            c = _vertex(program, kept, gen)
            if c is None or not _new(c, v, kept, need, zero_tol, sign_tol):
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
    x, errors = scaled_inputs(gw, gb, v, coef)
    doubtful = torch.arange(batch) >= batch - left
    return LinearInputs(x, errors, 0, factor_residual(gw, gb, x, errors)), replaced, doubtful


def vertex_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, batch: int, *, programs: int = 4,
                  zero_tol: float = 1e-4, sign_tol: float = 1e-3, min_zeros: int | None = None, seed: int = 0
                  ) -> torch.Tensor:
    """Up to ``batch`` inputs of a Linear layer (rows, each up to its scale) from its gradient, one linear program
    each: the vertices of {c : V c ≥ 0, 1ᵀ V c = 1} (:func:`fcn_analytic.disaggregate.linear_inputs`, "Vertices"),
    each program's random objective orthogonal to the coefficient vectors found before, so that it vanishes on
    their vertices and its optimum is a vertex not yet found (module docstring, "Completing the inputs"), where
    random objectives alone find the last vertices as a coupon collector does (8·B programs). A vertex is kept
    when it is one-signed (``sign_tol``), new, and has at least ``min_zeros`` (default B − 1 + 20) zeros and
    :data:`SURE_ZEROS` of the median of those kept before; at most ``programs``·B programs. ``grad_b`` is not
    read (the scales come later, :func:`complete_inputs`); fewer rows than ``batch``: not all were found."""
    gw = grad_w.double()
    sv, vh = torch.linalg.svd(gw, full_matrices=False)[1:]
    if not 2 <= batch <= min(gw.shape) or sv[batch - 1] <= 1e-9 * sv[0]:
        return gw[:0]
    v = vh[:batch].T
    program = ConeProgram(live_rows(v), simplex="primal")
    gen = torch.Generator().manual_seed(seed)
    floor = batch - 1 + 20 if min_zeros is None else min_zeros
    kept = torch.zeros(0, batch, dtype=torch.float64)
    counts: list[float] = []
    for _ in range(programs * batch):
        if len(kept) >= batch:
            break
        c = _vertex(program, kept, gen)
        need = max(floor, SURE_ZEROS * float(torch.tensor(counts).median())) if counts else floor
        if c is None or not _new(c, v, kept, need, zero_tol, sign_tol):
            continue
        kept = torch.cat([kept, c[None]])
        counts.append(float(zero_counts((c @ v.T)[None], zero_tol)[0]))
    return kept @ v.T


def _vertex(program: ConeProgram, kept: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """A vertex of {c : V c ≥ 0, 1ᵀ V c = 1} (``program``) maximising a random objective orthogonal to the rows
    of ``kept`` (any, where none is kept), as a unit vector; None where the program fails."""
    batch = program.batch
    q = torch.linalg.qr(kept.T, mode="complete").Q[:, len(kept):] if len(kept) else torch.eye(batch,
                                                                                              dtype=torch.float64)
    w = q @ torch.randn(q.shape[1], generator=gen, dtype=torch.float64)
    return program.minimise(-w)


def _new(c: torch.Tensor, v: torch.Tensor, kept: torch.Tensor, need: float, zero_tol: float, sign_tol: float
         ) -> bool:
    """Whether vertex ``c`` joins ``kept``: its input V c has ``need`` zeros, one sign, and is not kept already."""
    x = c @ v.T
    x = x / x.abs().max()
    return (float(zero_counts(x[None], zero_tol)[0]) >= need and not bool((x < -sign_tol).any())
            and not bool(((kept @ c) > 1 - 1e-4).any()))


def zero_counts(x: torch.Tensor, tol: float) -> torch.Tensor:
    """Entries of each row below ``tol`` of the row's largest magnitude."""
    return (x.abs() < tol * x.abs().amax(1, keepdim=True)).sum(1)


INPUT_ZEROS = 2  # search_inputs: a vertex with fewer than this many times the batch in zeros may mix inputs ...
SPARSE_OF_MOST = 0.5  # ... or with fewer than this fraction of the most zeros a vertex has (measured, search_inputs)


def search_inputs(grad_w: torch.Tensor, grad_b: torch.Tensor, batch: int, *, draws: int = 1_000_000, seed: int = 0,
                  zero_tol: float = 1e-4, sign_tol: float = 1e-3) -> tuple[torch.Tensor, int, int, int]:
    """The ``batch`` inputs of a Linear layer from its gradient (or a one-epoch round's summed update): one linear
    program per input (:func:`vertex_inputs`); where those miss some, or where fewer than ``batch`` of its vertices
    are sparse, with :data:`INPUT_ZEROS`·``batch`` zeros and :data:`SPARSE_OF_MOST` of the most a vertex has (every
    vertex has ``batch`` − 1; an input of a ReLU map has many more, a vertex that mixes inputs only the zeros they
    share: on the Fashion-MNIST round of N = 100, seed 1, the inputs have 862–1240 of 3136, the vertices within
    cosine 0.99 of one 332–1223 at the search's tolerance, the 86 others at most 401, and labels read off them were
    exact on no client), :func:`pursued_inputs` (the inputs it is sure of first, then its best other directions,
    which the caller doubts; taken over enough vertices only where it is sure of more rows than they have sparse
    ones), and where that finds no direction, :func:`linear_inputs`' search (random programs, then SPEAR's
    sampling, up to ``draws``).
    Returns ``(inputs, draws used, vertices found first, rows sure)``: the pursuit's rows after the first ``sure``
    are its best guesses, which the caller must doubt (on the trained round of docs/results/client-round.md, seed
    1, they passed the completion's zero test and spoiled every label: 25 of 50 read as one class); the other
    searches' rows count as sure (``batch``). Raises :class:`GIError` where none finds them all. The caller
    completes doubtful rows (:func:`complete_inputs`). On a Fashion-MNIST round of N = 100 (E = 1) the sampling
    found 38 of the 100 inputs in a million draws (728 CPU s); the pursuit is sure of 85."""
    inputs = vertex_inputs(grad_w, grad_b, batch, zero_tol=zero_tol, sign_tol=sign_tol, seed=seed)
    vertices = len(inputs)
    sparse = 0  # the vertices with the zeros of an input
    if vertices:
        zeros = zero_counts(inputs, zero_tol)
        sparse = int((zeros >= max(INPUT_ZEROS * batch, SPARSE_OF_MOST * float(zeros.max()))).sum())
    if vertices >= batch and sparse >= batch:
        return inputs, 0, vertices, batch
    try:
        pursued = pursued_inputs(grad_w, grad_b, batch, seed=seed)
        sure = batch if pursued.sure is None else int(pursued.sure)
        if vertices < batch or sure > sparse:  # enough vertices, but too few sparse: the pursuit where it is surer
            return pursued.inputs, 0, vertices, sure
    except GIError:
        pass
    if vertices >= batch:  # the pursuit failed or is no surer than the vertices (inputs with fewer zeros): those
        return inputs, 0, vertices, batch
    found = linear_inputs(grad_w, grad_b, batch, samples=draws, seed=seed, zero_tol=zero_tol, sign_tol=sign_tol)
    return found.inputs, found.draws, vertices, batch
