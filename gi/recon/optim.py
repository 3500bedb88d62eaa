"""Optimisers of the image (and joint-label) parameters (registry): ``fn(groups, cfg) -> torch.optim.Optimizer``.

``lbfgs`` is DLG's optimiser (Zhu et al. 2019; the soft-label paper's L2 runs, L-BFGS with lr 1) made
*per problem*: every problem of the batched reconstruction (captures × restarts, the leading dim of each
parameter) keeps its own curvature pairs, step scaling and convergence test, so P problems optimised together
follow exactly the iterates of P separate runs. One ``step()`` is one L-BFGS iteration (one objective
evaluation), the same unit as an Adam step; like ``torch.optim.LBFGS`` without line search it takes the step
``t·d`` with ``t = lr`` (``min(1, 1/‖g‖₁)·lr`` on the first iteration).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gi.core.registry import registrar

Tensor = torch.Tensor
OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]], Any], torch.optim.Optimizer]] = {}


register_optimizer = registrar(OPTIMIZERS, "optimizer")


def select_rows(opt: torch.optim.Optimizer, rows: Tensor) -> None:
    """Keep only the problems ``rows`` (indices into the leading dimension of every parameter) in the
    optimiser's state, e.g. after culling restarts: :meth:`BatchedLBFGS.select_rows`, else every per-parameter
    state tensor shaped like its parameter (Adam's moments, SGD's momentum) is indexed."""
    if isinstance(opt, BatchedLBFGS):
        opt.select_rows(rows)
        return
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            for key, value in state.items():
                if isinstance(value, Tensor) and value.shape == p.shape:
                    state[key] = value[rows]


@register_optimizer("adam")
def _adam(groups: list[dict[str, Any]], cfg: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=cfg.lr)


@register_optimizer("sgd")
def _sgd(groups: list[dict[str, Any]], cfg: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9)


@register_optimizer("lbfgs")
def _lbfgs(groups: list[dict[str, Any]], cfg: Any) -> torch.optim.Optimizer:
    return BatchedLBFGS(groups, lr=cfg.lr)


class BatchedLBFGS(torch.optim.Optimizer):
    """L-BFGS (Nocedal 1980; ``torch.optim.LBFGS``'s two-loop recursion, no line search) run independently for
    every problem p = 0..P−1, the leading dimension of every parameter.

    ``step()`` reads the gradients of the current iterate (after ``backward``), updates each problem's memory
    with ``s = x_k − x_{k−1}`` and ``y = g_k − g_{k−1}`` and moves ``x`` along its direction. ``s`` is the
    displacement actually taken, so clamping the iterate (box constraint) between steps keeps the curvature pairs
    consistent. Unlike ``torch.optim.LBFGS`` every test is relative, so the iterates do not depend on the scale
    of the objective (a FedAvg update's cosine distance starts near 1e-4 with pixel gradients below 1e-7, where
    torch's absolute tolerances stop at once): a pair is kept where ``yᵀs > 1e-10‖y‖‖s‖``, a direction must have
    ``gᵀd < −1e-12‖g‖‖d‖``, and a problem stops once ``max|g| ≤ tolerance_grad · max|g₀|`` (its first gradient).
    """

    def __init__(self, params: Any, lr: float = 1.0, history_size: int = 100, tolerance_grad: float = 1e-7) -> None:
        super().__init__(params, dict(lr=lr))
        self.history_size, self.tol_grad = history_size, tolerance_grad
        self.mem_s: list[Tensor] = []
        self.mem_y: list[Tensor] = []
        self.mem_rho: list[Tensor] = []
        self.prev_x: Tensor | None = None
        self.prev_g: Tensor | None = None
        self.h_diag: Tensor | None = None
        self.active: Tensor | None = None
        self.g0: Tensor | None = None
        self.iterations = 0

    def select_rows(self, rows: Tensor) -> None:
        """Keep the problems ``rows`` only, each with its memory, step scaling and convergence state."""
        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[rows]

        self.mem_s, self.mem_y = [s[rows] for s in self.mem_s], [y[rows] for y in self.mem_y]
        self.mem_rho = [rho[rows] for rho in self.mem_rho]
        self.prev_x, self.prev_g, self.h_diag = pick(self.prev_x), pick(self.prev_g), pick(self.h_diag)
        self.active, self.g0 = pick(self.active), pick(self.g0)

    def _params(self) -> list[tuple[Tensor, float]]:
        return [(p, g["lr"]) for g in self.param_groups for p in g["params"]]

    def _flat(self, grads: bool) -> Tensor:
        parts = []
        for p, _ in self._params():
            t = p.grad if grads else p.detach()
            t = torch.zeros_like(p) if t is None else t
            parts.append(t.reshape(p.shape[0], -1))
        return torch.cat(parts, 1)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = closure() if closure is not None else None
        x, g = self._flat(False), self._flat(True)
        num = x.shape[0]
        gmax = g.abs().amax(1)
        if self.active is None:
            self.active = gmax > 0
            self.h_diag = torch.ones(num, dtype=x.dtype, device=x.device)
            self.g0 = gmax
        self.active &= gmax > self.tol_grad * self.g0
        if self.prev_x is not None:
            s, y = x - self.prev_x, g - self.prev_g
            ys = (y * s).sum(1)
            ok = (ys > 1e-10 * y.norm(dim=1) * s.norm(dim=1)) & (ys > 0) & self.active
            if len(self.mem_s) == self.history_size:
                self.mem_s.pop(0), self.mem_y.pop(0), self.mem_rho.pop(0)
            self.mem_s.append(s)
            self.mem_y.append(y)
            self.mem_rho.append(torch.where(ok, 1.0 / ys.where(ok, torch.ones_like(ys)), torch.zeros_like(ys)))
            self.h_diag = torch.where(ok, ys / (y * y).sum(1).clamp_min(1e-30), self.h_diag)
        # the two-loop recursion, one fused kernel per dot product and per update (it is a quarter of a packed
        # LeNet step with 100 pairs when written with separate multiply, sum and subtract)
        q = -g
        alphas = []
        for s_i, y_i, rho_i in zip(reversed(self.mem_s), reversed(self.mem_y), reversed(self.mem_rho)):
            a = torch.linalg.vecdot(s_i, q) * rho_i
            q.addcmul_(a[:, None], y_i, value=-1.0)
            alphas.append(a)
        d = q.mul_(self.h_diag[:, None])
        for s_i, y_i, rho_i, a in zip(self.mem_s, self.mem_y, self.mem_rho, reversed(alphas)):
            b = torch.linalg.vecdot(y_i, d) * rho_i
            d.addcmul_(s_i, (a - b)[:, None])
        descent = (g * d).sum(1) < -1e-12 * g.norm(dim=1) * d.norm(dim=1)
        d = torch.where((self.active & descent)[:, None], d, torch.zeros_like(d))
        first = self.iterations == 0
        scale = (1.0 / g.abs().sum(1).clamp_min(1e-30)).clamp_max(1.0) if first else torch.ones(num, device=x.device)
        self.prev_x, self.prev_g = x, g.clone()
        offset = 0
        for p, lr in self._params():
            n = p[0].numel()
            p.add_((d[:, offset:offset + n] * (scale * lr)[:, None]).view_as(p))
            offset += n
        self.active &= descent
        self.iterations += 1
        return loss
