"""Least-squares inversion of one convolution layer from its weight gradient and its output (R-GAP).

Beyond the five papers: this is the recursive step of Zhu & Blaschko, "R-GAP: Recursive Gradient Attack on
Privacy" (ICLR 2021, §3), which the soft-label paper's fully-connected walk (§4.2, eq. 6–7) is the one-position
special case of. For a layer ``z = conv(x; W) + b`` followed by ``a = σ(z)``, with ``a`` and ``∂L/∂a`` known from
the layer above, and σ invertible (:data:`fcn_analytic.activations.ACTIVATION_INVERSES`):

    z = σ⁻¹(a),   δ = ∂L/∂z = ∂L/∂a ⊙ σ'(z)                              (eq. 6, per output position p)
    forward constraint:   conv(x; W) = z − b                               (O·P rows, where σ⁻¹ is defined)
    gradient constraint:  ∇W[o, i, k] = Σ_p δ[o, p] · x̃[i, s·p + k]        (O·C·k² rows; x̃ = x zero-padded)

Both are linear in the layer input ``x``. The forward rows are weighted by σ'(z) (``forward_weight``): z is read
from an output a known to float precision, and σ⁻¹ amplifies a's error by 1/σ'(z) (a sigmoid near 0 or 1), so
the weight makes every row's error that of a, which is the generalised least-squares answer. Unweighted, the DLG
LeNet's input came out at 29–87 dB on the cifar10-samples (the saturated rows dominate); weighted, at 95–112 dB.
Each block is then scaled by its right-hand side's norm, so neither swamps the other, and the stacked system is
solved by least squares: the normal equations are formed from the sparse
rows (every row touches one kernel window) and solved by Cholesky, falling back to an SVD-based solve when the
system is rank-deficient (dead ReLUs). ``∂L/∂x = convᵀ δ`` then feeds the layer below.

**A rank-deficient hidden layer.** Where the input is a ReLU's output (a hidden layer's), the minimum-norm answer
is off by a vector of the normal matrix's null space N (its eigenvectors below :data:`NULL_TOL` of the largest
eigenvalue), and that null space is small beside the input's zeros: on the ReLU LeNet's conv2 (3072 unknowns),
23–88 directions against ~1750 zeros (cifar10-samples, PyTorch's init, seed 1). So x ≥ 0 pins it, as a
nonnegative factor's sparsity pins the vertices of :mod:`fcn_analytic.disaggregate`: the coefficients c
minimising ‖min(x₀ + N c, 0)‖² (a convex problem in d = dim N unknowns) give the input to 2e-5 relative where
the minimum-norm x₀ was 0.13–0.15 off (:func:`nonnegative_null_fit`). The answer is pinned when the rows of N at
its zero entries have full column rank (smallest singular value above :data:`PINNED_TOL`): no direction of the null
space then keeps every zero nonnegative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gi.core.errors import GIError

Tensor = torch.Tensor


RELU_SNAP = 1e-5  # a recovered ReLU output below this fraction of its largest entry is a dead unit's zero
# ... or below this multiple of its most negative entry: a ReLU output is never negative, so the negative entries
# are the recovery's own error, which the dead units carry too (ReLU LeNet, seed 1, cifar10-samples 9: dead
# units up to 3.1e-4, negatives down to -2.8e-4, the smallest active unit 6.0e-4, where 1e-5 of the largest entry
# is 1.8e-5 and called 70 dead units active: docs/results/realistic.md, S1)
RELU_SNAP_NOISE = 1.5
NULL_TOL = 1e-9  # an eigenvalue of the normal matrix below this fraction of the largest spans the null space
PINNED_TOL = 1e-3  # smallest singular value of the null basis at the input's zeros above which x ≥ 0 pins it
NONNEGATIVE_STEPS = 500  # L-BFGS iterations of the null-space fit (d ≤ a few hundred unknowns, a convex objective)


@dataclass
class NullFit:
    """:func:`nonnegative_null_fit`'s answer: ``x`` the input, ``dim`` the null space's dimension, ``pinned``
    whether x ≥ 0 leaves no direction of it free, ``zeros`` the input's entries read as zeros."""

    x: Tensor
    dim: int
    pinned: bool
    zeros: int


@dataclass
class ConvSolve:
    """``x`` (C, H, W) float64 the recovered layer input; ``residual`` the relative residual ‖∇W − G(x; δ)‖/‖∇W‖
    of the gradient constraint; ``forward_residual`` the relative residual of the forward constraint;
    ``rows`` / ``unknowns`` the system's size; ``solver`` ``cholesky`` | ``lstsq``; ``unread`` the input entries
    no kernel window reads (left at 0: nothing in the gradient determines them); ``null`` the nonnegative
    null-space fit of a rank-deficient solve of a nonnegative input (None where none ran)."""

    x: Tensor
    residual: float
    forward_residual: float
    rows: int
    unknowns: int
    solver: str
    unread: int = 0
    null: NullFit | None = None


def window_index(conv: nn.Conv2d, in_shape: tuple[int, int, int]) -> Tensor:
    """(C·k², P) flat input index read by each kernel tap at each output position (−1: zero padding)."""
    n = in_shape[0] * in_shape[1] * in_shape[2]
    ids = torch.arange(1, n + 1, dtype=torch.float64).view(1, *in_shape)
    cols = F.unfold(ids, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride)[0]
    return cols.round().long() - 1


def check_conv(conv: nn.Conv2d, name: str) -> None:
    """Raise :class:`GIError` for a convolution the route does not cover (groups, non-zero padding modes)."""
    if conv.groups != 1:
        raise GIError(f"{name}: grouped convolution (groups={conv.groups}) is not supported by the analytic inversion")
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise GIError(f"{name}: padding {conv.padding!r} / mode {conv.padding_mode!r} is not supported by the "
                      "analytic inversion (integer zero padding only)")


def solve_conv(conv: nn.Conv2d, in_shape: tuple[int, int, int], weight: Tensor, z_minus_b: Tensor, valid: Tensor,
               delta: Tensor, grad_weight: Tensor, forward_weight: Tensor | None = None,
               nonnegative: bool = False) -> ConvSolve:
    """Solve the stacked forward + gradient constraints for the layer input (module docstring).

    ``z_minus_b`` / ``valid`` / ``delta``: (O, P) of the layer's output positions; ``weight`` / ``grad_weight`` the
    layer's (O, C, kh, kw) weight and its shared gradient; ``forward_weight`` (O, P) each forward row's weight
    (σ'(z); None: 1). ``nonnegative``: the input is a ReLU's output, so a rank-deficient solve's null space is
    fixed by x ≥ 0 (module docstring, :func:`nonnegative_null_fit`). float64 throughout.
    """
    idx = window_index(conv, in_shape)  # (K, P), K = C·kh·kw
    k, p = idx.shape
    o = weight.shape[0]
    n = in_shape[0] * in_shape[1] * in_shape[2]
    if z_minus_b.shape != (o, p) or delta.shape != (o, p):
        raise GIError(f"conv output has {tuple(z_minus_b.shape)} entries, the layer gives {(o, p)}")
    w = weight.reshape(o, k).double()
    gw = grad_weight.reshape(o, k).double()
    om = torch.ones_like(z_minus_b, dtype=torch.float64) if forward_weight is None else forward_weight.double()
    om = om * valid
    rf = z_minus_b.double() * om
    sf = 1.0 / float(rf.norm()) if float(rf.norm()) > 0 else 0.0
    ng = float(gw.norm())
    if ng == 0:
        raise GIError("the layer's weight gradient is zero: its input cannot be recovered (δ = 0)")
    sg = 1.0 / ng
    tap = idx >= 0
    jdx = torch.where(tap, idx, n)  # a zero-padding tap reads a dummy unknown n, dropped before the solve
    c, hw = in_shape[0], in_shape[1] * in_shape[2]
    taps = k // c  # kernel taps per input channel (the rows of idx are channel-major: unfold's order)
    # normal equations AᵀA x = Aᵀr, summed row by row (each row touches one kernel window).
    # forward rows (o, p) hold W[o, k] at idx[k, p]:  Σ_o valid·W[o, k]·W[o, k'] added at (idx[k, p], idx[k', p])
    vw = om * om * sf * sf  # (O, P)
    m_f = torch.einsum("op,ok,ol->pkl", vw, w, w)  # (P, K, K)
    cols_f = jdx.T  # (P, K)
    full = torch.zeros((n + 1) * (n + 1), dtype=torch.float64)
    full.index_add_(0, (cols_f[:, :, None] * (n + 1) + cols_f[:, None, :]).reshape(-1), m_f.reshape(-1))
    gram = full.view(n + 1, n + 1)[:n, :n]
    # gradient rows (o, k) hold δ[o, p] at idx[k, p]:  (δᵀδ)[p, p'] added at (idx[k, p], idx[k, p']). A row reads
    # one input channel, at the same pixels for every channel, so this part is one (HW, HW) block repeated on
    # the channel diagonal
    d = delta.double() * sg
    t0 = torch.where(tap[:taps], idx[:taps], hw)  # channel 0's taps: pixel indices within the channel
    block = torch.zeros((hw + 1) * (hw + 1), dtype=torch.float64)
    block.index_add_(0, (t0[:, :, None] * (hw + 1) + t0[:, None, :]).reshape(-1),
                     (d.T @ d).expand(taps, p, p).reshape(-1))
    block = block.view(hw + 1, hw + 1)[:hw, :hw]
    for ch in range(c):
        gram[ch * hw:(ch + 1) * hw, ch * hw:(ch + 1) * hw] += block
    rhs = torch.zeros(n + 1, dtype=torch.float64)
    rhs.index_add_(0, cols_f.reshape(-1), ((rf * om * sf).T @ (w * sf)).reshape(-1))
    rhs.index_add_(0, jdx.reshape(-1), ((gw * sg).T @ d).reshape(-1))
    rhs = rhs[:n]
    read = gram.diagonal() > 0  # an input pixel no kernel window reads (stride / no padding) is not determined
    keep = read.nonzero()[:, 0]
    normal = (gram if bool(read.all()) else gram[keep][:, keep]).contiguous()  # a copy the Cholesky overwrites
    x = torch.zeros(n, dtype=torch.float64)
    x[keep], solver = solve_normal_equations(normal.clone() if nonnegative else normal, rhs[keep])
    null = None
    if nonnegative and solver == "lstsq":
        null = nonnegative_null_fit(normal, x[keep])
        x[keep] = null.x
    xs = x.view(1, *in_shape)
    kw = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    fwd = F.conv2d(xs, weight.double(), **kw)[0].reshape(o, p)
    grad = torch.nn.grad.conv2d_weight(xs, weight.shape, delta.double().view(1, o, *fwd_shape(conv, in_shape)),
                                       **kw).reshape(o, k)
    f_res = float(((fwd - z_minus_b.double()) * om).norm() / max(float(rf.norm()), 1e-300))
    g_res = float((grad - gw).norm() / ng)
    rows = int(valid.sum()) + o * k
    return ConvSolve(x.view(in_shape), g_res, f_res, rows, n, solver, int((~read).sum()), null)


def zero_bound(a: Tensor) -> float:
    """The largest value of a recovered ReLU output ``a`` that reads as a dead unit's zero: :data:`RELU_SNAP` of
    its largest magnitude, or :data:`RELU_SNAP_NOISE` times its largest negative magnitude (the recovery's own
    error, from float32 gradients amplified by the layers above), whichever is larger."""
    return max(RELU_SNAP * float(a.abs().max()), RELU_SNAP_NOISE * float((-a).clamp(min=0).max()))


def nonnegative_null_fit(normal: Tensor, x: Tensor, tol: float = NULL_TOL, steps: int = NONNEGATIVE_STEPS) -> NullFit:
    """The nonnegative input among the least-squares answers ``x + N c`` of a rank-deficient normal system
    ``normal`` (module docstring, "A rank-deficient hidden layer"): N the eigenvectors of ``normal`` below ``tol``
    of its largest eigenvalue, c minimising ‖min(x + N c, 0)‖² by L-BFGS from 0. The zeros are the entries at or
    below :func:`zero_bound` (as :func:`fcn_analytic.invert.snap_dead` reads a recovered ReLU output), and the
    answer is pinned when N's rows there have full column rank (smallest singular value above
    :data:`PINNED_TOL`)."""
    ev, vec = torch.linalg.eigh(normal)
    basis = vec[:, ev < tol * float(ev.max())]
    d = basis.shape[1]
    if d == 0:
        return NullFit(x, 0, True, int((x <= zero_bound(x)).sum()))
    c = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([c], max_iter=steps, history_size=min(d, 50), line_search_fn="strong_wolfe",
                            tolerance_grad=1e-14, tolerance_change=1e-18)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = torch.relu(-(x + basis @ c)).pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    out = (x + basis @ c).detach()
    zero = out <= zero_bound(out)
    pinned = int(zero.sum()) >= d and float(torch.linalg.svdvals(basis[zero]).min()) > PINNED_TOL
    return NullFit(out, d, pinned, int(zero.sum()))


def solve_normal_equations(gram: Tensor, rhs: Tensor) -> tuple[Tensor, str]:
    """Solve ``gram x = rhs`` (float64) for a symmetric positive semi-definite normal matrix: LAPACK's Cholesky
    (scipy, in place; about 3× torch's ``cholesky_ex``, which also copies a triangle, on one CPU thread for
    n = 3072), else a least-squares solve (rank-deficient: e.g. dead ReLUs) that returns the minimum-norm answer.
    Returns ``(x, "cholesky" | "lstsq")``. ``gram`` must be C-contiguous; it is overwritten (the factor)."""
    import numpy as np
    import scipy.linalg as sl
    from threadpoolctl import threadpool_limits

    g, diagonal = gram.numpy(), gram.diagonal().clone()
    # LAPACK as many threads as torch has (``gi --threads 1`` timings stay one thread)
    with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
        try:  # a symmetric C-ordered matrix is its own Fortran-ordered transpose: factor it without a copy
            factor = sl.cho_factor(g.T, lower=True, overwrite_a=True, check_finite=False)
            x = sl.cho_solve(factor, rhs.numpy(), check_finite=False)
            if np.isfinite(x).all():
                return torch.from_numpy(x), "cholesky"
        except (np.linalg.LinAlgError, ValueError):
            pass
    # the factorisation overwrote the diagonal and one triangle in place: rebuild the matrix from the other one
    lower = torch.tril(gram, -1)
    gram = lower + lower.T + torch.diag(diagonal)
    # gelsy (complete orthogonal factorisation): the same minimum-norm answer as gelsd's SVD in about half the time
    return torch.linalg.lstsq(gram, rhs.unsqueeze(1), driver="gelsy").solution[:, 0], "lstsq"


def fwd_shape(conv: nn.Conv2d, in_shape: tuple[int, int, int]) -> tuple[int, int]:
    """The (H', W') of the convolution's output for an input of ``in_shape``."""
    out = []
    for size, k, s, p, d in zip(in_shape[1:], conv.kernel_size, conv.stride, conv.padding, conv.dilation):
        out.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    return out[0], out[1]


def conv_input_gradient(conv: nn.Conv2d, in_shape: tuple[int, int, int], weight: Tensor, delta: Tensor) -> Tensor:
    """∂L/∂x = convᵀ δ (eq. 6 for a convolution), (C, H, W) float64; ``delta`` (O, H', W')."""
    return torch.nn.grad.conv2d_input((1, *in_shape), weight.double(), delta.double().unsqueeze(0),
                                      stride=conv.stride, padding=conv.padding, dilation=conv.dilation)[0]
