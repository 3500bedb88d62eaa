"""A batch's per-sample inputs of one Linear layer from that layer's summed gradient, by sparsity.

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
found twice are kept once. With C = [c_1 … c_B], Δ = ∇W V C⁻ᵀ up to one scale per sample, and ∇b = Δ s gives
those scales (least squares), so x_j = V c_j / s_j and the output errors come with them.

Vertices. The same directions are the extreme rays of the cone {x = V c : x ≥ 0} when, as for ReLU maps, no
sample's support contains another's (then x_j − ε x_k leaves the cone for every k ≠ j): they are the vertices of
its cross-section {c : V c ≥ 0, 1ᵀ V c = 1}, a polytope in B dimensions, and a linear program with a random
objective ends on one of them. Random objectives find every vertex in a few dozen programs of n constraints and B
variables (the S4 layers: all 8 inputs of each batch in 20–23 programs, 0.3–0.5 CPU s, including a batch whose
sparsest input has 12.9 % zeros and which 4 million draws of the sampling below did not finish). A vertex is kept
under the same sparsity and sign test as a sampled candidate.

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


@dataclass
class LinearInputs:
    """What :func:`linear_inputs` recovered: ``inputs`` (B × n, one row per sample, in no particular order),
    ``output_errors`` (B × m, ∂L/∂z of each sample, the same order), ``draws`` (samples drawn), and ``residual``
    (‖∇W − Δ Xᵀ‖ / ‖∇W‖ and ‖∇b − Δ 1‖ / ‖∇b‖, the larger: how well the answer explains the gradient)."""

    inputs: torch.Tensor
    output_errors: torch.Tensor
    draws: int
    residual: float


METHODS = ("auto", "lp", "sample")


def _valid(x: torch.Tensor, need: int, zero_tol: float, sign_tol: float) -> torch.Tensor:
    """Which candidate inputs (rows of ``x``, each scaled to a largest entry of 1) are sparse and one-signed."""
    x = x / x.abs().amax(1, keepdim=True)
    sparse = (x.abs() < zero_tol).sum(1) >= need
    return sparse & (((x > sign_tol).sum(1) == 0) | ((x < -sign_tol).sum(1) == 0))


def _vertices(vn: torch.Tensor, batch: int, programs: int, gen: torch.Generator, need: int, zero_tol: float,
              sign_tol: float) -> torch.Tensor:
    """Unit coefficient vectors c (k × B) of the vertices of {c : V c ≥ 0, 1ᵀ V c = 1} that ``programs`` random
    linear objectives reach (HiGHS), kept when V c is sparse and one-signed, each direction once."""
    import numpy as np
    from scipy.optimize import linprog

    a = vn.numpy()
    found = torch.zeros(0, batch, dtype=vn.dtype)
    objectives = torch.randn(programs, batch, generator=gen, dtype=torch.float64).numpy()
    for r in objectives:
        res = linprog(r, A_ub=-a, b_ub=np.zeros(a.shape[0]), A_eq=a.sum(0, keepdims=True), b_eq=[1.0],
                      bounds=[(None, None)] * batch, method="highs")
        if res.status != 0:
            continue
        c = torch.from_numpy(res.x).to(vn.dtype)
        c = c / c.norm()
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
    norms = v.norm(dim=1)
    live = norms > 1e-6 * norms.max()  # coordinates that are zero in every sample carry nothing
    vn = v[live] / norms[live, None]
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
    if len(found) > batch:  # more one-signed sparse directions than samples: keep the sparsest
        zeros = ((found @ vn.T).abs() < zero_tol * (found @ vn.T).abs().amax(1, keepdim=True)).sum(1)
        found = found[zeros.argsort(descending=True)[:batch]]
    c = found.T
    deltas = grad_w @ v @ torch.linalg.inv(c.T)
    scale = torch.linalg.lstsq(deltas, grad_b[:, None]).solution.squeeze(1)
    inputs = (v @ c / scale).T
    output_errors = (deltas * scale).T
    res_w = (grad_w - output_errors.T @ inputs).norm() / grad_w.norm()
    res_b = (grad_b - output_errors.sum(0)).norm() / grad_b.norm().clamp_min(1e-30)
    return LinearInputs(inputs, output_errors, draws, float(max(res_w, res_b)))


def first_linear(model: torch.nn.Module) -> str | None:
    """The name of the model's first ``nn.Linear`` in module order (after a conv body: the layer that sees its
    flattened map), None when it has none."""
    return next((n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)), None)


def sample_errors(capture: Capture, layer: str, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's logits z_i and output error δ_i = ∂ℓ_i/∂z_i (B × C each, float64, the rows of ``inputs``' order)
    from the B inputs of the Linear layer ``layer`` (:func:`linear_inputs`).

    The inputs are fed to ``layer`` together (a forward pre-hook; the layers before it see zeros and are
    overridden), so the rest of the net runs as the client's forward did (BatchNorm in the protocol's mode), and
    the last layer's input h_i of every sample is read. The last layer's gradient of the batch's mean loss is
    ``∇W_L = (1/B) Σ_i δ_i h_iᵀ``, which least squares solves for the δ_i when the h_i are independent (B ≤ their
    dimension)."""
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
    errors = b * torch.linalg.lstsq(seen["h"].T, last_w.T).solution  # (B, C): ∇W_Lᵀ = (1/B) Hᵀ Δ
    return logits.flatten(1), errors
