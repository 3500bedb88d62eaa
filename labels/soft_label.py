"""Soft-label recovery from one sample's last-layer gradient (Wang, Liang & He, ICLR 2024, §3).

For one sample and cross-entropy the last-layer weight gradient is rank one, ``∇W = δ·xᵀ`` with
``δ = (p − y)/τ`` (eq. 2). Take the row ``g_r`` with the largest |row sum| and write the unknown feature
as ``x̂ = λ·g_r``; the pseudo-label of eq. 4 is

    ŷ(λ) = φ((λ·W g_r + b)/τ) − τ·ρ/λ,     ρ = ∇W g_r / ‖g_r‖²  (= δ/δ_r for an exact gradient),

which sums to one for every λ (Theorem 1) and equals the true label at ``λ* = 1/δ_r``. Because
``W·(λ g_r) = λ·(W g_r)`` each candidate λ costs a few C-vector operations, so the search is vectorised
over samples *and* candidates. λ is chosen by the variance loss of eq. 5 (all but the top-1 entries for
label smoothing, all but the top-2 for mixup), scaled by 1000 as in the reference code, and a search
succeeds when that loss is below 1e-9, judged by the loss alone.

Search stages (``stages``), each run only for the samples the previous ones left above the threshold:

- ``grid`` (default, ours): |λ| on both signs for all samples at once, uniform in 1/λ up to 10 then in
  log|λ| up to ``bound`` (:func:`lambda_grid`), evaluated in float32; golden-section refinement of each
  sample's best local minima, then Gauss–Newton polishing in float64 (the loss is a sum of squares with
  a zero residual at λ*).
- ``pso``: the paper's particle swarm (§3.3, Algorithm 2) over alternating positive/negative windows,
  with the reference's defaults (pop 500 × 40 iterations, w = 0.8, c1 = c2 = 0.5), vectorised over
  samples, windows and particles.
- ``lbfgs``: the reference L-BFGS search (Algorithm 1: lr 0.5, 200 outer steps, starts ±1 in units of
  ``g_r/coe``, plateau skips, bound 100); one sample at a time, kept for comparison.

Every stage's answer is polished by the same Gauss–Newton steps. A candidate at the search bound is the
loss decaying towards the saturated soft-max (appendix B.2), never a success.

With a last-layer bias the feature is read off directly, ``x = ∇Wᵀ∇b/‖∇b‖²`` (= ``∇W_r/∇b_r``), and
``y = p − τ∇b`` (the bias route, ``route="bias"``; Aono et al. 2017 as cited in §2).

Corner cases of appendix B.3: an all-zero gradient carries no information (``ok=False``); a gradient with
one exactly-zero row while every other row points the same way is the saturated "predict-correct"
one-hot case, where the label is the model's prediction on the feature direction (stage
``saturated-onehot``); a one-hot sample whose λ* lies beyond the bound (a nearly saturated correct
prediction, B.2) gets the same rule (stage ``prediction``); two valid labels at ±λ (the "i ≠ j" case)
are ambiguous (``ok=False``) unless the feature sign resolves them: features of ReLU / sigmoid nets are
non-negative, so when every entry of g_r has one sign only λ of that sign is a valid feature scale.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.label_result import LabelResult
from labels.base import register, register_batch

Tensor = torch.Tensor
METHOD = "soft-lambda"
LOSS_SCALE = 1000.0  # reference code: 1000 × population variance
THRESHOLD = 1e-9  # reference code: success iff the scaled loss < 1e-9 (variance < 1e-12)
LOWEST = 0.5  # smallest |λ|/τ searched: |λ*| = τ/|p_r − y_r| ≥ τ, with room for noise
_CHUNK = 1 << 21  # elements per (samples × candidates × classes) block

# kind → (entries excluded from the loss, loss form). Variance: eq. 5. Square (one-hot): appendix C's
# first loss, the mean square of the non-top entries, which must be 0 for a one-hot label.
KINDS: dict[str, tuple[int, str]] = {"onehot": (1, "square"), "smoothing": (1, "variance"), "mixup": (2, "variance")}
# the protocol's label augmentation → the loss kind that fits it
PROTOCOL_KINDS = {"onehot": "onehot", "smoothing": "smoothing", "smoothing-alt": "smoothing", "mixup": "mixup"}
AUTO_ORDER = ("onehot", "smoothing", "mixup")  # most to least restrictive
LINKS = {"ce": "softmax", "bce": "sigmoid"}  # loss → output activation φ of eq. 4
SEARCH_STAGES = ("grid", "pso", "lbfgs")
ROUTES = ("auto", "bias", "lambda")
ACCEPTS = ("threshold", "lowest")
RATIOS = ("projection", "column")
PSO_DEFAULTS: dict[str, Any] = {"pop": 500, "iters": 40, "w": 0.8, "c1": 0.5, "c2": 0.5, "coe": 4.0,
                                "interval": None, "bound": 70.0}
LBFGS_DEFAULTS: dict[str, Any] = {"lr": 0.5, "iterations": 200, "bound": 100.0, "coe": 4.0, "initial": 1.0}


# ----------------------------------------------------------------------------------------------- problem
_TENSORS = ("u", "bias", "rho", "tau", "rho_neg", "target")


@dataclass
class LambdaProblem:
    """The per-sample C-vectors of eq. 4, stacked: everything the λ search needs.

    ``u = W g_r`` (N, C); ``bias`` the model's last-layer bias or zeros (N, C); ``rho`` the ratios
    ``∇W_i / g_r`` (N, C) — by default the least-squares ``∇W g_r/‖g_r‖²`` (= δ/δ_r for an exact gradient);
    ``rho_neg`` (N, C) a separate ratio for λ < 0 (the reference's single column depends on the sign of λ),
    else None; ``tau`` the temperature (N, 1); ``link`` softmax | sigmoid; ``exclude`` the number of top
    entries left out of the loss; ``form`` variance | square | target; ``target`` (N, C) for ``target``.
    """

    u: Tensor
    bias: Tensor
    rho: Tensor
    tau: Tensor
    link: str = "softmax"
    exclude: int = 1
    form: str = "variance"
    target: Tensor | None = None
    rho_neg: Tensor | None = None

    def _map(self, fn) -> LambdaProblem:
        return replace(self, **{k: fn(getattr(self, k)) for k in _TENSORS if getattr(self, k) is not None})

    def take(self, idx: Tensor) -> LambdaProblem:
        return self._map(lambda t: t[idx])

    def to(self, dtype: torch.dtype) -> LambdaProblem:
        return self._map(lambda t: t.to(dtype))

    def with_kind(self, kind: str) -> LambdaProblem:
        exclude, form = KINDS[kind]
        return replace(self, exclude=exclude, form=form)

    @property
    def n(self) -> int:
        return self.u.shape[0]


# Internally candidates run along the last axis, (N, C, K): reductions over the C classes are then
# strided over a contiguous K axis, several times faster than over a short last axis.
def _yhat(lam: Tensor, prob: LambdaProblem, grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Eq. 4 for candidates ``lam`` (N, K): ``ŷ = φ((λu + b)/τ) − τρ/λ`` as (N, C, K), and dŷ/dλ if ``grad``."""
    lam3 = lam.unsqueeze(1)
    tau = prob.tau.unsqueeze(1)
    u = prob.u.unsqueeze(2)
    z = (lam3 * u + prob.bias.unsqueeze(2)) / tau
    rho = prob.rho.unsqueeze(2)
    if prob.rho_neg is not None:
        rho = torch.where(lam3 > 0, rho, prob.rho_neg.unsqueeze(2))
    rho = tau * rho
    if prob.link == "softmax":
        p = torch.softmax(z, 1)
        dp = p * (u - (p * u).sum(1, keepdim=True)) / tau if grad else None
    else:
        p = torch.sigmoid(z)
        dp = p * (1 - p) * u / tau if grad else None
    yhat = p - rho / lam3
    return yhat, (dp + rho / lam3**2 if grad else None)


def pseudo_label(lam: Tensor, prob: LambdaProblem) -> Tensor:
    """Eq. 4 for candidates ``lam`` (N, K): ``ŷ = φ((λu + b)/τ) − τρ/λ``, shape (N, K, C)."""
    return _yhat(lam, prob)[0].transpose(1, 2)


def _mask(yhat: Tensor, exclude: int) -> Tensor:
    """True for the entries of ŷ (N, C, K) that enter the loss: all but the top ``exclude`` of each column
    (entries tied with an excluded value are excluded too; the loss divides by the true count)."""
    mask = torch.ones_like(yhat, dtype=torch.bool)
    for _ in range(exclude):
        top = yhat.masked_fill(~mask, -math.inf).amax(1, keepdim=True)  # amax: far faster than argmax on dim 1
        mask &= yhat < top
    return mask


def _residual(yhat: Tensor, prob: LambdaProblem, dy: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """Residuals (N, C, K) whose sum of squares over C, divided by ``count`` (N, 1, K), is the loss; and
    their λ-derivative when ``dy`` is given."""
    if prob.form == "target":
        return yhat - prob.target.unsqueeze(2), dy, torch.full_like(yhat[:, :1], yhat.shape[1])
    mask = _mask(yhat.detach(), prob.exclude)
    count = mask.sum(1, keepdim=True).clamp_min(1).to(yhat.dtype)
    mask = mask.to(yhat.dtype)
    if prob.form == "square":
        return mask * yhat, None if dy is None else mask * dy, count
    res = mask * (yhat - (mask * yhat).sum(1, keepdim=True) / count)
    if dy is None:
        return res, None, count
    return res, mask * (dy - (mask * dy).sum(1, keepdim=True) / count), count


def _loss(yhat: Tensor, prob: LambdaProblem) -> Tensor:
    res, _, count = _residual(yhat, prob)
    return LOSS_SCALE * (res.pow(2).sum(1, keepdim=True) / count).squeeze(1)


def label_loss(yhat: Tensor, prob: LambdaProblem) -> Tensor:
    """Eq. 5 × 1000 for pseudo-labels ``yhat`` (N, K, C): the population variance of all but the top
    ``exclude`` entries, shape (N, K).

    ``square`` is the mean square of those entries (one-hot); ``target`` the mean square error to a
    given soft label (used to fit λ to a label recovered by another method).
    """
    return _loss(yhat.transpose(1, 2), prob)


def loss_at(lam: Tensor, prob: LambdaProblem) -> Tensor:
    """Loss (N, K) at candidates (N, K), evaluated in chunks of samples to bound memory."""
    per = max(1, _CHUNK // max(1, lam.shape[1] * prob.u.shape[1]))
    if prob.n <= per:
        out = _loss(_yhat(lam, prob)[0], prob)
    else:
        out = torch.empty_like(lam)
        for s in range(0, prob.n, per):
            idx = torch.arange(s, min(s + per, prob.n))
            sub = prob.take(idx)
            out[idx] = _loss(_yhat(lam[idx], sub)[0], sub)
    return torch.nan_to_num(out, nan=math.inf)


# ------------------------------------------------------------------------------------------ grid search
def lambda_grid(lo: float, hi: float, step: float = 0.002, switch: float = 10.0) -> Tensor:
    """Sorted |λ| grid (units of τ): uniform in μ = 1/λ (spacing ``step``) for |λ| ≤ ``switch``, then
    uniform in log|λ| (spacing ``5·step``) up to ``hi``.

    The valley of eq. 5 around λ* has a width ∝ λ² while the ρ/λ term of eq. 4 dominates (small |λ|,
    i.e. μ* = δ_r = p_r − y_r far from 0) and ∝ λ once the soft-max term does, so this spacing keeps a
    grid point inside every valley of the same depth.
    """
    switch = min(max(switch, lo), hi)
    mu = torch.arange(1.0 / switch, 1.0 / lo + step, step, dtype=torch.float64)
    small = (1.0 / mu).flip(0)
    n_log = max(2, int(math.ceil(math.log(hi / switch) / (5 * step))) + 1)
    large = torch.logspace(math.log10(switch), math.log10(hi), n_log, dtype=torch.float64)
    return torch.cat([small[small < switch], large])


def _grid_candidates(prob: LambdaProblem, lo: float, hi: float, step: float, keep: int) -> tuple[Tensor, Tensor,
                                                                                            Tensor]:
    """Evaluate :func:`lambda_grid` (× τ) on both signs for every sample; return the ``keep`` best local
    minima per sample as brackets ``(sign (N, M), t_lo (N, M), t_hi (N, M))`` in ``t = log|λ|``."""
    n = prob.n
    base = lambda_grid(lo, hi, step)
    points = base.numel()
    t = base.log().unsqueeze(0) + prob.tau.log()  # (N, K)
    lam = torch.cat([t.exp(), -t.exp()], 1)  # (N, 2K)
    # float32 is enough to see the valleys (they rise to ~1e-3 while float32 noise is ~1e-11); refinement
    # below runs in float64
    loss = loss_at(lam.float(), prob.to(torch.float32)).double().view(n, 2, points)
    inf = torch.full((n, 2, 1), math.inf, dtype=loss.dtype)
    left = torch.cat([inf, loss[..., :-1]], -1)
    right = torch.cat([loss[..., 1:], inf], -1)
    is_min = (loss <= left) & (loss <= right) & torch.isfinite(loss)
    score = torch.where(is_min, loss, torch.full_like(loss, math.inf)).view(n, -1)
    keep = min(keep, score.shape[1])
    best = torch.topk(score, keep, dim=1, largest=False).indices  # (N, M)
    fallback = torch.argmin(loss.view(n, -1), 1, keepdim=True).expand_as(best)
    best = torch.where(torch.isfinite(score.gather(1, best)), best, fallback)
    sign = torch.where(best < points, 1.0, -1.0).to(torch.float64)
    k = best % points
    t_lo = t.gather(1, (k - 1).clamp_min(0))
    t_hi = t.gather(1, (k + 1).clamp_max(points - 1))
    return sign, t_lo, t_hi


def _golden(prob: LambdaProblem, sign: Tensor, a: Tensor, b: Tensor, iters: int) -> Tensor:
    """Batched golden-section search of the loss on ``λ = sign·exp(t)``, t ∈ [a, b]; returns λ (N, M)."""
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss_at(sign * c.exp(), prob), loss_at(sign * d.exp(), prob)
    for _ in range(iters):
        left = fc < fd  # minimum in [a, d]
        a, b = torch.where(left, a, c), torch.where(left, d, b)
        c_new, d_new = b - g * (b - a), a + g * (b - a)
        x = torch.where(left, c_new, d_new)
        fx = loss_at(sign * x.exp(), prob)
        c, d, fc, fd = (torch.where(left, c_new, d), torch.where(left, c, d_new),
                        torch.where(left, fx, fc), torch.where(left, fc, fx))
    return sign * torch.where(fc < fd, c, d).exp()


def _gauss_newton(prob: LambdaProblem, lam: Tensor, steps: int = 4, lo: Tensor | None = None,
                  hi: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Gauss–Newton polishing of λ (N, M) on the zero-residual least squares; a step is kept only where it
    lowers the loss and keeps |λ| inside ``[lo, hi]``. Returns ``(λ, loss)``."""
    loss = loss_at(lam, prob)
    for _ in range(steps):
        yhat, dy = _yhat(lam, prob, grad=True)
        res, jac, _ = _residual(yhat, prob, dy)
        denom = jac.pow(2).sum(1)
        step = -(res * jac).sum(1) / torch.where(denom > 0, denom, torch.ones_like(denom))
        new = lam + step
        inside = torch.sign(new) == torch.sign(lam)
        if lo is not None:
            inside &= (new.abs() >= lo.unsqueeze(1)) & (new.abs() <= hi.unsqueeze(1))
        new_loss = loss_at(new, prob)
        better = inside & (new_loss < loss) & torch.isfinite(new_loss)
        lam, loss = torch.where(better, new, lam), torch.where(better, new_loss, loss)
    return lam, loss


def search_grid(prob: LambdaProblem, lo: float, hi: float, step: float = 0.002, keep: int = 6,
                golden_iters: int = 40) -> tuple[Tensor, Tensor]:
    """Grid → golden section → Gauss–Newton for every sample at once; |λ|/τ ∈ [lo, hi].

    Returns candidates ``(λ (N, M), loss (N, M))``: the ``keep`` best local minima of the grid, refined.
    """
    sign, t_lo, t_hi = _grid_candidates(prob, lo, hi, step, keep)
    lam = _golden(prob, sign, t_lo, t_hi, golden_iters)
    tau = prob.tau.squeeze(1)
    return _gauss_newton(prob, lam, lo=lo * tau, hi=hi * tau)


# ------------------------------------------------------------------------------------------------ PSO
def pso_windows(coe: float, interval: float, bound: float) -> list[tuple[float, float]]:
    """The reference's alternating windows in units of ``g_r/coe`` (Algorithm 2): ``[pl−0.3, pu]`` then
    ``[−pu−0.3, −pl]``, starting at pl = 1, pu = 6, growing pu by interval/5 once, then by interval,
    while pu < bound. Returned in units of ``g_r`` (divided by ``coe``)."""
    wins: list[tuple[float, float]] = []
    pl, pu, first = 1.0, 6.0, True
    while pu < bound:
        wins += [((pl - 0.3) / coe, pu / coe), ((-pu - 0.3) / coe, -pl / coe)]
        pl, pu = pu, pu + (interval / 5 if first else interval)
        first = False
    return wins


def search_pso(prob: LambdaProblem, windows: Sequence[tuple[float, float]], pop: int = 500, iters: int = 40,
               w: float = 0.8, c1: float = 0.5, c2: float = 0.5,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Particle swarm (Kennedy & Eberhart 1995) in every window for every sample at once (§3.3).

    scikit-opt's update (the reference's library): ``v ← w v + c1 r1 (pbest − x) + c2 r2 (gbest − x)``,
    ``x ← clip(x + v, lb, ub)``, initial velocities ``U(−(ub − lb), ub − lb)``. Windows are scaled by τ.
    Returns per window the best ``(λ (N, W), loss (N, W))``.
    """
    n, nw = prob.n, len(windows)
    bounds = torch.tensor(windows, dtype=torch.float64)  # (W, 2)
    lb = (bounds[:, 0].view(1, nw, 1) * prob.tau.view(n, 1, 1)).expand(n, nw, pop)
    ub = (bounds[:, 1].view(1, nw, 1) * prob.tau.view(n, 1, 1)).expand(n, nw, pop)
    span = ub - lb

    def rand() -> Tensor:
        return torch.rand((n, nw, pop), generator=generator, dtype=torch.float64)

    def f(x: Tensor) -> Tensor:
        safe = torch.where(x == 0, torch.full_like(x, 1e-12), x)
        return loss_at(safe.reshape(n, nw * pop), prob).view(n, nw, pop)

    x = lb + rand() * span
    v = (2 * rand() - 1) * span
    fx = f(x)
    pbest, pbest_f = x.clone(), fx.clone()
    g_idx = pbest_f.argmin(-1, keepdim=True)
    gbest, gbest_f = pbest.gather(-1, g_idx), pbest_f.gather(-1, g_idx)
    for _ in range(iters):
        v = w * v + c1 * rand() * (pbest - x) + c2 * rand() * (gbest - x)
        x = torch.minimum(torch.maximum(x + v, lb), ub)
        fx = f(x)
        better = fx < pbest_f
        pbest, pbest_f = torch.where(better, x, pbest), torch.where(better, fx, pbest_f)
        g_idx = pbest_f.argmin(-1, keepdim=True)
        cand, cand_f = pbest.gather(-1, g_idx), pbest_f.gather(-1, g_idx)
        take = cand_f < gbest_f
        gbest, gbest_f = torch.where(take, cand, gbest), torch.where(take, cand_f, gbest_f)
    return gbest.squeeze(-1), gbest_f.squeeze(-1)


# ---------------------------------------------------------------------------------------------- L-BFGS
def search_lbfgs(prob: LambdaProblem, threshold: float, lr: float = 0.5, iterations: int = 200, bound: float = 100.0,
                 coe: float = 4.0, initial: float = 1.0) -> tuple[Tensor, Tensor]:
    """The reference L-BFGS search (Algorithm 1), one sample at a time: λ in units of ``g_r/coe``, start +1
    for ``iterations/2`` outer steps, then −1; stop below ``threshold``; leave a side when |λ| > ``bound``;
    on a plateau (last three losses within mean/1000) jump by 0.5, 1, 2, … away from zero."""
    lams = torch.full((prob.n, 1), math.nan, dtype=torch.float64)
    losses = torch.full((prob.n, 1), math.inf, dtype=torch.float64)
    for i in range(prob.n):
        sub = prob.take(torch.tensor([i]))
        for sign in (1.0, -1.0):
            lam = torch.tensor([[sign * initial]], dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([lam], lr=lr)

            def closure(lam=lam, opt=opt, sub=sub) -> Tensor:
                opt.zero_grad()
                loss = label_loss(pseudo_label(lam / coe, sub), sub).sum()
                loss.backward()
                return loss

            history: list[float] = []
            skip = 0.5
            for _ in range(iterations // 2):
                with torch.no_grad():
                    loss = float(label_loss(pseudo_label(lam / coe, sub), sub))
                if loss < losses[i, 0]:
                    lams[i, 0], losses[i, 0] = float(lam.detach()) / coe, loss
                if loss < threshold or not math.isfinite(float(lam.detach())) or abs(float(lam.detach())) > bound:
                    break
                history = (history + [loss])[-3:]
                if len(history) == 3 and max(history) - min(history) < sum(history) / 3 / 1000:
                    with torch.no_grad():
                        lam += sign * skip
                    skip *= 2
                    history = []
                opt.step(closure)
            if losses[i, 0] < threshold:
                break
    return lams, losses


# ------------------------------------------------------------------------------------------- selection
@dataclass
class _Choice:
    lam: Tensor  # (N,)
    loss: Tensor  # (N,)
    stage: list[str]
    ambiguous: Tensor  # (N,) bool


def _first_below(table: Tensor, threshold: float) -> Tensor:
    """Per row the first column below ``threshold``, else the column of the lowest value (N,)."""
    below = table < threshold
    return torch.where(below.any(1), below.to(torch.uint8).argmax(1), table.argmin(1))


def _choose(prob: LambdaProblem, lam: Tensor, loss: Tensor, stages: list[str], threshold: float, sign: Tensor,
            hi: Tensor) -> _Choice:
    """Pick per sample the lowest-loss candidate (N, M) that is an interior minimum below ``threshold``.

    A candidate at the search bound is the loss decaying towards the saturated soft-max (appendix B.2),
    not a root, so it is chosen only when nothing else is left (and then reported out of bound). Among
    valid candidates whose labels differ, the one whose feature ``λ·g_r`` is non-negative wins when every
    entry of g_r has one sign (``sign`` ±1; features of ReLU/sigmoid nets are non-negative); with mixed
    signs two valid labels with comparable losses are flagged ambiguous (appendix B.3).
    """
    loss = torch.nan_to_num(loss, nan=math.inf)
    interior = lam.abs() < hi.unsqueeze(1) * (1 - 1e-6)
    valid = (loss < threshold) & interior
    sign_ok = (lam * sign.unsqueeze(1) > 0) | (sign == 0).unsqueeze(1)
    prefer = valid & sign_ok
    has_pref = prefer.any(1, keepdim=True)
    has_interior = interior.any(1, keepdim=True)
    pool = torch.where(has_pref, prefer, torch.where(has_interior, interior, torch.ones_like(interior)))
    best = torch.where(pool, loss, torch.full_like(loss, math.inf)).argmin(1)
    rows = torch.arange(prob.n)
    lam_b, loss_b = lam[rows, best], loss[rows, best]
    labels = pseudo_label(lam, prob).argmax(-1)  # (N, M)
    rival = prefer & (labels != labels[rows, best].unsqueeze(1)) & (loss <= 100 * loss_b.unsqueeze(1) + 1e-18)
    ambiguous = rival.any(1) & (loss_b < threshold)
    return _Choice(lam_b, loss_b, [stages[int(b)] for b in best], ambiguous)


# ----------------------------------------------------------------------------------------- preparation
@dataclass
class _Sample:
    """One capture reduced to the vectors the search needs (O(C + D) memory, whatever the batch size)."""

    row: int  # r: the row of ∇W with the largest |row sum|
    g: Tensor  # g_r (D,)
    u: Tensor  # W g_r (C,)
    rho: Tensor  # ∇W_i / g_r (C,), see LambdaProblem
    rho_neg: Tensor | None
    bias: Tensor  # the model's last-layer bias or zeros (C,)
    x_bias: Tensor | None  # the feature ∇Wᵀ∇b/‖∇b‖² when ∇b is shared (D,)
    saturated: int | None  # appendix B.3 predict-correct one-hot: the predicted class
    tau: float
    link: str
    warnings: list[str]


def _column_ratio(gw: Tensor, g: Tensor, positive: bool) -> Tensor:
    """The reference's ratio: the column ``a`` of ∇W at the largest entry of ``x̂ = λ g_r`` (argmin when that
    largest entry is 0), ``ρ_i = ∇W[i, a]/g_r[a]``; for λ > 0 (``positive``) or λ < 0."""
    x = g if positive else -g
    a = int(x.argmin()) if float(x.max()) == 0 else int(x.argmax())
    return gw[:, a] / g[a]


def _saturated_onehot(gw: Tensor, rho: Tensor, u: Tensor, w: Tensor, b: Tensor | None,
                      x_bias: Tensor | None) -> int | None:
    """Appendix B.3, first case in float arithmetic: p_i rounds to 1 = y_i, so row i of ∇W is exactly zero
    while every other row is p_j·x with p_j > 0 (all pointing the same way). Returns the model's prediction
    on the feature (its direction is +g_r since δ_r = p_r > 0), or None when the gradient has another shape."""
    zero = ~(gw != 0).any(1)
    if int(zero.sum()) != 1 or not bool((rho[~zero] > 0).all()):
        return None
    logits = u if x_bias is None else w @ x_bias
    return int((logits + (b if b is not None and x_bias is not None else 0.0)).argmax())


def _finite(t: Tensor) -> bool:
    """No NaN or Inf (a float64 sum propagates both and costs far less than ``isfinite(t).all()``)."""
    return math.isfinite(float(t.sum()))


def _read(capture: Capture, ratio: str = "projection", cache: dict | None = None) -> _Sample | str:
    """Read and check one capture and reduce it to vectors. Bad inputs raise :class:`CaptureError`; a sample
    the method cannot decide returns the reason as a string. ``cache`` keeps float64 copies of last-layer
    weights shared by several captures (one global model, many clients)."""
    if not isinstance(capture, Capture):
        raise CaptureError(f"soft-lambda needs gi.Capture objects, got {type(capture).__name__}")
    LAST_WEIGHT, LAST_BIAS = capture.last_layer_keys  # the last layer's names, per capture
    gw, gb = capture.last_layer(torch.float64)  # checked: float, finite, the global model's shapes
    state = capture.model_state
    if LAST_WEIGHT not in state:
        raise CaptureError(f"capture model_state has no {LAST_WEIGHT!r}; the λ search needs the global weights")
    cache = {} if cache is None else cache
    key = id(state[LAST_WEIGHT])
    if key not in cache:
        cache[key] = (state[LAST_WEIGHT], state[LAST_WEIGHT].to(torch.float64))  # keeps the id's tensor alive
        if not _finite(cache[key][1]):
            raise CaptureError(f"model_state {LAST_WEIGHT!r} contains NaN or Inf; the global model is broken")
    w = cache[key][1]
    b = state[LAST_BIAS].to(torch.float64) if LAST_BIAS in state else None
    c = capture.num_classes
    if gw.shape != w.shape or gw.shape[0] != c:
        raise CaptureError(f"shared {LAST_WEIGHT} has shape {tuple(gw.shape)} but the model's is {tuple(w.shape)} "
                           f"with {c} classes: capture and model differ")
    if gb is not None and (b is None or gb.shape != b.shape):
        raise CaptureError(f"shared {LAST_BIAS} has shape {tuple(gb.shape)} but the model's last bias is "
                           f"{None if b is None else tuple(b.shape)}: capture and model differ")
    if b is not None and not _finite(b):
        raise CaptureError(f"model_state {LAST_BIAS!r} contains NaN or Inf; the global model is broken")
    protocol = capture.protocol
    if protocol.loss not in LINKS:
        return f"soft-lambda supports the losses {sorted(LINKS)}; this capture uses {protocol.loss!r}"
    n = capture.num_samples
    if n != 1:
        return f"soft-lambda recovers the label of one sample; this capture holds {n}"
    warnings = []
    if capture.is_update and protocol.local_epochs > 1:
        warnings.append("update over several local steps: −Δθ/η is not one gradient, the search is approximate")
    if not torch.any(gw != 0):
        return "last-layer gradient is zero (appendix B.3: prediction equals a one-hot label; nothing to read)"
    row = int(gw.sum(1).abs().argmax())
    if not torch.any(gw[row] != 0):
        row = int(gw.abs().sum(1).argmax())
    g = gw[row].clone()
    u = w @ g
    rho_neg = None
    if ratio == "column":
        rho, rho_neg = _column_ratio(gw, g, True), _column_ratio(gw, g, False)
    else:
        rho = gw @ g / g.dot(g)
    x_bias = gw.T @ gb / gb.dot(gb) if gb is not None and torch.any(gb != 0) else None
    saturated = _saturated_onehot(gw, gw @ g / g.dot(g), u, w, b, x_bias)
    bias = b if b is not None else torch.zeros(c, dtype=torch.float64)
    return _Sample(row, g, u, rho, rho_neg, bias, x_bias, saturated, float(protocol.temperature),
                   LINKS[protocol.loss], warnings)


def _problem(samples: list[_Sample], kind: str) -> tuple[LambdaProblem, Tensor, Tensor]:
    """Stack the samples' vectors; returns the problem, g_r (N, D) and the feature-sign flags (N,): ±1 when
    every non-zero entry of g_r has that sign (λ of that sign gives non-negative features), else 0."""
    g = torch.stack([s.g for s in samples])
    rho_neg = None if samples[0].rho_neg is None else torch.stack([s.rho_neg for s in samples])
    exclude, form = KINDS[kind]
    prob = LambdaProblem(torch.stack([s.u for s in samples]), torch.stack([s.bias for s in samples]),
                   torch.stack([s.rho for s in samples]), torch.tensor([[s.tau] for s in samples], dtype=torch.float64),
                   samples[0].link, exclude, form, rho_neg=rho_neg)
    nz = (g != 0).sum(1) >= 2
    sign = torch.zeros(len(samples), dtype=torch.float64)
    sign = torch.where(nz & (g >= 0).all(1), 1.0, sign)
    sign = torch.where(nz & (g <= 0).all(1), -1.0, sign)
    return prob, g, sign


# -------------------------------------------------------------------------------------------- recovery
def _check_options(kind: str | None, route: str, stages: Sequence[str], accept: str, ratio: str) -> None:
    if ratio not in RATIOS:
        raise ConfigError(f"soft-lambda ratio={ratio!r} is not allowed; valid: {list(RATIOS)}")
    if kind is not None and kind not in (*KINDS, "auto"):
        raise ConfigError(f"soft-lambda kind={kind!r} is not allowed; valid: {[*KINDS, 'auto']}")
    if route not in ROUTES:
        raise ConfigError(f"soft-lambda route={route!r} is not allowed; valid: {list(ROUTES)}")
    bad = [s for s in stages if s not in SEARCH_STAGES]
    if bad or not stages:
        raise ConfigError(f"soft-lambda stages={list(stages)!r}: each must be one of {list(SEARCH_STAGES)}")
    if accept not in ACCEPTS:
        raise ConfigError(f"soft-lambda accept={accept!r} is not allowed; valid: {list(ACCEPTS)}")


def _search(prob: LambdaProblem, sign: Tensor, stages: Sequence[str], threshold: float, bound: float, grid_step: float,
            candidates: int, pso: dict[str, Any], lbfgs: dict[str, Any], generator: torch.Generator,
            kind: str) -> _Choice:
    """Run the stages in order; each later stage only sees the samples still above the threshold."""
    lo, hi = LOWEST, bound  # |λ*| = τ/|p_r − y_r| ≥ τ; in units of τ
    tau = prob.tau.squeeze(1)
    lam = torch.full((prob.n, 1), math.nan, dtype=torch.float64)
    loss = torch.full((prob.n, 1), math.inf, dtype=torch.float64)
    names: list[str] = []
    for stage in stages:
        todo = torch.nonzero(~(loss.min(1).values < threshold)).flatten()
        if todo.numel() == 0:
            break
        sub = prob.take(todo)
        if stage == "grid":
            cl, cf = search_grid(sub, lo, hi, grid_step, candidates)
        elif stage == "pso":
            interval = pso["interval"] if pso["interval"] is not None else (50.0 if kind == "mixup" else 20.0)
            wins = [(max(a, -hi), min(b, hi)) for a, b in pso_windows(pso["coe"], interval, pso["bound"])]
            wins = [(a, b) for a, b in wins if a < b]  # windows clipped to the search bound
            if not wins:
                continue
            cl, cf = search_pso(sub, wins, pso["pop"], pso["iters"], pso["w"], pso["c1"], pso["c2"], generator)
            first = _first_below(cf, threshold).unsqueeze(1)  # Algorithm 2: the first window that succeeds
            cl, cf = _gauss_newton(sub, cl.gather(1, first), lo=lo * tau[todo], hi=hi * tau[todo])
        else:
            cl, cf = search_lbfgs(sub, threshold, **lbfgs)
            cl, cf = _gauss_newton(sub, torch.nan_to_num(cl, nan=1.0), lo=lo * tau[todo], hi=hi * tau[todo])
        block_l = torch.full((prob.n, cl.shape[1]), math.nan, dtype=torch.float64)
        block_f = torch.full((prob.n, cl.shape[1]), math.inf, dtype=torch.float64)
        block_l[todo], block_f[todo] = cl, torch.nan_to_num(cf, nan=math.inf)
        lam, loss = torch.cat([lam, block_l], 1), torch.cat([loss, block_f], 1)
        names += [stage] * cl.shape[1]
    lam, loss = lam[:, 1:], loss[:, 1:]
    lam = torch.nan_to_num(lam, nan=1.0)
    return _choose(prob, lam, loss, names, threshold, sign, hi * tau)


def _result(kind: str, s: _Sample, lam: float, loss: float, stage: str, yhat: Tensor, ok: bool,
            reason: str | None, extra: dict[str, Any]) -> LabelResult:
    c = yhat.shape[-1]
    info = {"lambda": lam, "loss": loss, "stage": stage, "kind": kind, "row": s.row, "route": extra.pop("route"),
            "temperature": s.tau, **extra}
    if s.warnings:
        info["warnings"] = list(s.warnings)
    if not ok:
        return LabelResult.failure(METHOD, c, reason or "search failed", **info)
    counts = torch.zeros(c, dtype=torch.long)
    counts[int(yhat.argmax())] = 1
    predicted = stage in ("saturated-onehot", "prediction")
    features = s.x_bias if predicted and s.x_bias is not None else lam * s.g
    if predicted and s.x_bias is None:
        features = None  # only the direction of the feature is known
    return LabelResult.from_counts(METHOD, counts, soft=yhat.view(1, c),
                                   features=None if features is None else features.view(1, -1), info=info)


def _search_options(pso: dict[str, Any] | None, lbfgs: dict[str, Any] | None, bound: float
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The swarm's and L-BFGS's options over their defaults; unknown keys and a bound ≤ 1 are ConfigErrors."""
    for name, given, valid in (("pso", pso, PSO_DEFAULTS), ("lbfgs", lbfgs, LBFGS_DEFAULTS)):
        unknown = sorted(set(given or {}) - set(valid))
        if unknown:
            raise ConfigError(f"unknown soft-lambda {name} option(s) {unknown}; valid: {sorted(valid)}")
    if bound <= 1:
        raise ConfigError(f"soft-lambda bound must be > 1 (|λ*| ≥ τ), got {bound}")
    return {**PSO_DEFAULTS, **(pso or {})}, {**LBFGS_DEFAULTS, **(lbfgs or {})}


def _rejection(lam: float, yhat: Tensor, out_of_bound: bool, ambiguous: bool, unconverged: bool, bound: float,
               unconverged_reason: str) -> str | None:
    """Why a searched λ is not accepted (appendix B.2–B.3), or None when it is."""
    if not math.isfinite(lam) or not torch.isfinite(yhat).all():
        return "no finite λ found"
    if out_of_bound:
        return f"λ reached the search bound |λ| = {bound}·τ (appendix B.2)"
    if ambiguous:
        return ("two different labels reach the threshold at ±λ and the feature sign cannot tell them apart "
                "(appendix B.3)")
    return unconverged_reason if unconverged else None


def recover_soft_labels(captures: Sequence[Capture], aux: Any = None, kind: str | None = None, route: str = "auto",
                        stages: Sequence[str] = ("grid", "pso"), accept: str = "threshold",
                        threshold: float = THRESHOLD, bound: float = 1e6, grid_step: float = 0.002,
                        candidates: int = 6, pso: dict[str, Any] | None = None, lbfgs: dict[str, Any] | None = None,
                        ratio: str = "projection", seed: int = 0) -> list[LabelResult]:
    """Soft labels and last-layer features of many single-sample captures at once (§3.1–3.3, eq. 3–5).

    ``kind``: ``smoothing`` | ``mixup`` | ``onehot`` | ``auto`` (each kind, the most restrictive one that
    reaches the threshold, else the lowest loss); default from ``capture.protocol.label_aug``.
    ``route``: ``auto`` (bias route when ∇b is shared, else the λ search), ``bias``, ``lambda``.
    ``stages``: search stages in order (``grid``, ``pso``, ``lbfgs``; see the module docstring).
    ``accept``: ``threshold`` (ok only below ``threshold``, the reference rule) or ``lowest`` (the lowest-loss
    λ even above it, as the paper's noisy-gradient study does; ``info['converged']`` tells which).
    ``bound``: |λ| ≤ bound·τ in units of g_r (the reference's 100 in units of g_r/coe is 25 here).
    ``pso`` / ``lbfgs``: overrides of :data:`PSO_DEFAULTS` / :data:`LBFGS_DEFAULTS`. ``ratio``: how ρ = ∇W_i/g_r
    is read, ``projection`` (least squares over all columns) or ``column`` (the reference's one column).
    ``seed`` seeds the swarm.
    """
    stages = [stages] if isinstance(stages, str) else list(stages)
    _check_options(kind, route, stages, accept, ratio)
    pso_opts, lbfgs_opts = _search_options(pso, lbfgs, bound)
    generator = torch.Generator().manual_seed(int(seed))
    results: list[LabelResult | None] = [None] * len(captures)
    groups: dict[tuple, list[int]] = {}
    samples: dict[int, _Sample] = {}
    cache: dict = {}
    for i, capture in enumerate(captures):
        read = _read(capture, ratio, cache)
        k = kind or PROTOCOL_KINDS[capture.protocol.label_aug]
        if isinstance(read, str):
            results[i] = LabelResult.failure(METHOD, capture.num_classes, read, kind=k)
            continue
        samples[i] = read
        if read.saturated is not None and k in ("onehot", "auto"):
            yhat = torch.zeros(capture.num_classes, dtype=torch.float64)
            yhat[read.saturated] = 1.0
            results[i] = _result(k, read, math.nan, 0.0, "saturated-onehot", yhat, True, None,
                                 {"route": "prediction", "converged": True})
            continue
        if route == "bias" and read.x_bias is None:
            results[i] = LabelResult.failure(METHOD, capture.num_classes, "route='bias' but the capture shares no "
                                             "(non-zero) last-layer bias gradient", kind=k)
            continue
        how = "bias" if read.x_bias is not None and route in ("auto", "bias") else "lambda"
        groups.setdefault((how, read.g.shape[0], read.u.shape[0], read.link, k), []).append(i)
    for (how, _, _, _, k), idx in groups.items():
        batch = [samples[i] for i in idx]
        kind_list = list(AUTO_ORDER) if k == "auto" else [k]
        prob, g, sign = _problem(batch, kind_list[0])
        if how == "bias":
            lam, losses, stage_names, ambiguous, chosen = _bias_route(batch, prob, g, kind_list, threshold)
        else:
            lam, losses, stage_names, ambiguous, chosen = _lambda_route(prob, sign, kind_list, stages, threshold,
                                                                        bound, grid_step, candidates, pso_opts,
                                                                        lbfgs_opts, generator)
        beyond = _beyond_bound_onehot(prob, sign, lam, losses, bound, threshold) if how == "lambda" and \
            kind_list == ["onehot"] else torch.zeros(len(idx), dtype=torch.bool)
        for j, i in enumerate(idx):
            if bool(beyond[j]):
                yhat = torch.zeros(prob.u.shape[1], dtype=torch.float64)
                yhat[int((sign[j] * prob.u[j]).argmax())] = 1.0
                results[i] = _result(k, samples[i], math.nan, float(losses[j]), "prediction", yhat, True, None,
                                     {"route": how, "converged": False, "note": "λ* lies beyond the bound: the "
                                      "model's prediction on the feature direction (appendix B.3)"})
                continue
            kk = chosen[j]
            p = prob.with_kind(kk).take(torch.tensor([j]))
            yhat = pseudo_label(lam[j].view(1, 1), p).view(-1)
            converged = bool(losses[j] < threshold)
            out_of_bound = bool(abs(float(lam[j])) >= bound * samples[i].tau * (1 - 1e-9))
            reason = _rejection(float(lam[j]), yhat, out_of_bound, bool(ambiguous[j]),
                                not converged and accept == "threshold" and how != "bias", bound,
                                f"loss {float(losses[j]):.3g} ≥ threshold {threshold:g} after stages {stages}")
            ok = reason is None
            extra = {"route": how, "converged": converged, "out_of_bound": out_of_bound, "requested_kind": k}
            results[i] = _result(kk, samples[i], float(lam[j]), float(losses[j]), stage_names[j], yhat, ok, reason,
                                 extra)
    return results  # type: ignore[return-value]


def _beyond_bound_onehot(prob: LambdaProblem, sign: Tensor, lam: Tensor, loss: Tensor, bound: float,
                         threshold: float) -> Tensor:
    """One-hot samples whose λ* lies beyond the bound (appendix B.2–B.3): the prediction is right and nearly
    saturated (p_y → 1), so the loss keeps falling towards |λ| → ∞ on the side where the feature ``λ·g_r`` is
    non-negative and no interior λ reaches the threshold. There the label is the model's prediction (the paper's
    rule for a predict-correct one-hot sample). Needs a known feature sign (``sign`` ≠ 0)."""
    edge = (sign * bound * prob.tau.squeeze(1)).unsqueeze(1)
    edge_loss = loss_at(torch.where(sign.unsqueeze(1) != 0, edge, torch.ones_like(edge)),
                        prob.with_kind("onehot")).squeeze(1)
    return (sign != 0) & ~(loss < threshold) & (edge_loss <= loss)


def _bias_route(batch: list[_Sample], prob: LambdaProblem, g: Tensor, kinds: list[str],
                threshold: float) -> tuple[Tensor, Tensor, list[str], Tensor, list[str]]:
    """x = ∇Wᵀ∇b/‖∇b‖², λ = ⟨x, g_r⟩/‖g_r‖²; the label ``φ(Wx + b) − τ∇b`` equals ŷ(λ) (eq. 4)."""
    x = torch.stack([s.x_bias for s in batch])
    lam = (x * g).sum(1) / g.pow(2).sum(1)
    losses, chosen = _kind_losses(prob, lam.unsqueeze(1), kinds, threshold)
    return lam, losses, ["bias"] * len(batch), torch.zeros(len(batch), dtype=torch.bool), chosen


def _kind_losses(prob: LambdaProblem, lam: Tensor, kinds: list[str], threshold: float) -> tuple[Tensor, list[str]]:
    """Loss of each kind at λ (N, 1); per sample the most restrictive kind below threshold, else the lowest."""
    table = torch.cat([loss_at(lam, prob.with_kind(k)) for k in kinds], 1)  # (N, K)
    first = _first_below(table, threshold)
    return table.gather(1, first.unsqueeze(1)).squeeze(1), [kinds[int(f)] for f in first]


def _lambda_route(prob: LambdaProblem, sign: Tensor, kinds: list[str], stages: list[str], threshold: float,
                  bound: float,
                  grid_step: float, candidates: int, pso: dict[str, Any], lbfgs: dict[str, Any],
                  generator: torch.Generator) -> tuple[Tensor, Tensor, list[str], Tensor, list[str]]:
    """Search every kind; with several kinds (``auto``) the first stage runs for all of them first and the
    later, costly stages only for the samples that no kind solved."""

    def run(p: LambdaProblem, sgn: Tensor, which: list[str]) -> list[_Choice]:
        return [_search(p.with_kind(k), sgn, which, threshold, bound, grid_step, candidates, pso, lbfgs, generator,
                        k) for k in kinds]

    per_kind = run(prob, sign, stages[:1] if len(kinds) > 1 else stages)
    lam = torch.stack([c.lam for c in per_kind], 1)
    loss = torch.stack([c.loss for c in per_kind], 1)
    ambiguous = torch.stack([c.ambiguous for c in per_kind], 1)
    names = [[c.stage[j] for c in per_kind] for j in range(prob.n)]
    todo = torch.nonzero(~(loss < threshold).any(1)).flatten()
    if len(kinds) > 1 and len(stages) > 1 and todo.numel():
        again = run(prob.take(todo), sign[todo], stages)
        lam[todo] = torch.stack([c.lam for c in again], 1)
        loss[todo] = torch.stack([c.loss for c in again], 1)
        ambiguous[todo] = torch.stack([c.ambiguous for c in again], 1)
        for j, i in enumerate(todo.tolist()):
            names[i] = [c.stage[j] for c in again]
    first = _first_below(loss, threshold)
    rows = torch.arange(prob.n)
    stage_names = [names[j][int(f)] for j, f in enumerate(first)]
    return lam[rows, first], loss[rows, first], stage_names, ambiguous[rows, first], [kinds[int(f)] for f in first]


@register(METHOD, "Wang, Liang & He 2024: soft label (smoothing / mixup / one-hot) and feature λ·g_r of one sample")
def recover_soft_label(capture: Capture, aux: Any = None, **options: Any) -> LabelResult:
    """One capture: :func:`recover_soft_labels` with a batch of one (same options)."""
    return recover_soft_labels([capture], aux=aux, **options)[0]


recover_soft_label.__signature__ = inspect.signature(recover_soft_labels)  # its options, for labels.recover's check


@register_batch(METHOD)
def _recover_soft_labels_batch(captures: Sequence[Capture], aux: Any = None, **options: Any) -> list[LabelResult]:
    return recover_soft_labels(captures, aux=aux, **options)


def fit_lambda(capture: Capture, soft: Tensor, bound: float = 1e6, grid_step: float = 0.002) -> tuple[float, float]:
    """λ whose pseudo-label (eq. 4) best matches a given soft label ``soft`` (C,) of this capture, by the mean
    square error; returns ``(λ, loss)``. Lets any label method hand a feature ``λ·g_r`` to ``fcn_analytic``."""
    read = _read(capture)
    if isinstance(read, str):
        raise CaptureError(f"cannot fit λ: {read}")
    prob, _, _ = _problem([read], "smoothing")
    prob.form, prob.exclude = "target", 0
    prob.target = soft.reshape(1, -1).to(torch.float64)
    if prob.target.shape != prob.u.shape:
        raise CaptureError(f"soft label has {prob.target.shape[1]} classes, the capture {prob.u.shape[1]}")
    lam, loss = search_grid(prob, LOWEST, bound, grid_step)
    best = int(loss[0].argmin())
    return float(lam[0, best]), float(loss[0, best])


def label_landscape(capture: Capture, lambdas: Tensor, kind: str = "smoothing") -> tuple[Tensor, Tensor]:
    """The λ landscape of one sample's capture (soft-label paper Figs. 1, 2 and 7): at every λ of ``lambdas``
    (K,), L_label (eq. 5 × 1000 for ``kind``'s loss: one-hot, smoothing or mixup) and the pseudo-label ŷ(λ) of
    eq. 4; returns (K,) and (K, C). A capture the method cannot read raises :class:`CaptureError` with the
    reason."""
    if kind not in KINDS:
        raise ConfigError(f"label_landscape kind={kind!r} is not allowed; valid: {list(KINDS)}")
    read = _read(capture)
    if isinstance(read, str):
        raise CaptureError(f"no λ landscape: {read}")
    prob, _, _ = _problem([read], kind)
    lam = lambdas.to(torch.float64).reshape(1, -1)
    return loss_at(lam, prob)[0], pseudo_label(lam, prob)[0]


def row_of(capture: Capture) -> int:
    """The row r of ∇W the features are expressed in (largest |row sum|)."""
    read = _read(capture)
    if isinstance(read, str):
        raise CaptureError(read)
    return read.row
