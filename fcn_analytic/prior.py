"""The input layer when its constraints leave a null space: the least-squares equations plus a total-variation prior.

Beyond the five papers. For one sample of a ReLU conv body (the DLG LeNet with ``activation=relu``) the walk of
:mod:`fcn_analytic.invert` recovers every hidden layer's input exactly (docs/results/realistic.md, S1), but the
first convolution reads the image (C·H·W unknowns) through fewer independent rows than unknowns: its weight
gradient gives ``C·O·k²`` rows (900 for 3×32×32 → 12 channels 5×5) and the forward rows exist only where the ReLU
is active (about half of its outputs). The minimum-norm least-squares answer fills that null space with zeros
(in normalised space: ~18 dB on CIFAR-10). Here the same equations are kept, as penalties, together with what the
minimum-norm solve ignores:

    E(p) = ‖(conv(x) − (z − b)) ⊙ ω‖² / ‖(z − b) ⊙ ω‖²          forward rows at active units (ω = σ'(z) · valid)
         + ‖relu(conv(x) + b + ε) ⊙ dead‖² / ‖(z − b) ⊙ ω‖²      a dead ReLU's pre-activation is ≤ −ε
         + ‖G(x; δ) − ∇W‖² / ‖∇W‖²                               the weight-gradient rows
         + ‖p − clip(p, 0, 1)‖²                                   pixels in [0, 1]
         + λ · TV(p)                                              smoothed isotropic total variation

with ``x = (p − mean)/std`` the normalised input, minimised over the pixels ``p`` by L-BFGS from the least-squares
answer. No network is run: one step costs two small convolutions.

The margin ε (:data:`HINGE_MARGIN` times the RMS of the active units' ``z − b``) keeps the dead units dead in the
network itself: a penalty without it leaves some of them at about +1e-4, where the forward pass then lets them
through, flips the ReLU mask and changes δ of the layer, so an image at ~34 dB reproduced the shared gradient only
to a relative mismatch of 0.02–0.03 and read "does not explain" (docs/results/realistic.md, S1). The reported
``hinge`` stays the violation of ``pre-activation ≤ 0`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor
TV_WEIGHT = 1e-3  # λ: tuned on cifar10-samples 0–2 (1e-5: 21 dB, 1e-3: 35 dB, 1e-2: 34 dB; realistic.md)
ITERATIONS = 1000  # L-BFGS iterations (300: 22 dB, 1000: 35 dB at λ = 1e-3)
TV_EPS = 1e-3  # the smoothing of |∇p| (pixels in [0, 1])
# ε / RMS(z − b at the active units): measured on cifar10-samples (docs/results/realistic.md, S1, "The dead units'
# margin"): 1e-2 took the recovered images' mismatch from 0.02–0.03 to 2e-4–4e-4 at the same PSNR
HINGE_MARGIN = 1e-2


@dataclass
class PriorSolve:
    """``x`` (C, H, W) float64 the normalised layer input; ``residual`` / ``forward_residual`` the relative residuals
    of the gradient and forward rows (as :class:`fcn_analytic.conv.ConvSolve`); ``hinge`` the relative violation
    of the dead units' ``pre-activation ≤ 0``; ``iterations`` the L-BFGS function evaluations."""

    x: Tensor
    residual: float
    forward_residual: float
    hinge: float
    iterations: int


def dead_margin(values: Tensor, active: Tensor, margin: float = HINGE_MARGIN) -> float:
    """The dead units' ε (module docstring): ``margin`` times the RMS of ``values`` at the ``active`` units (0 when
    none is active)."""
    return margin * float(values.double()[active].pow(2).mean().sqrt()) if bool(active.any()) else 0.0


def smoothed_tv(p: Tensor, eps: float = TV_EPS) -> Tensor:
    """Mean isotropic total variation ``√(dx² + dy² + eps²)`` of a (C, H, W) image."""
    dx = p[:, :-1, 1:] - p[:, :-1, :-1]
    dy = p[:, 1:, :-1] - p[:, :-1, :-1]
    return torch.sqrt(dx * dx + dy * dy + eps * eps).mean()


def refine_input(conv: nn.Conv2d, weight: Tensor, bias: Tensor | None, z_minus_b: Tensor, valid: Tensor,
                 dead: Tensor, delta: Tensor, grad_weight: Tensor, mean: Tensor, std: Tensor, start: Tensor,
                 forward_weight: Tensor | None = None, tv_weight: float = TV_WEIGHT,
                 iterations: int = ITERATIONS, margin: float = HINGE_MARGIN) -> PriorSolve:
    """Minimise the module docstring's E over the pixels, from ``start`` (C, H, W) normalised (float64).

    ``z_minus_b`` / ``valid`` / ``dead`` / ``delta`` / ``forward_weight``: (O, H', W') over the layer's outputs (dead:
    the units whose pre-activation is known to be ≤ 0, a ReLU's zeros); ``weight`` / ``grad_weight`` (O, C, k, k);
    ``mean`` / ``std`` (C, 1, 1) the model's normalisation. ``margin``: the dead units' ε over the RMS of the
    active units' ``z_minus_b`` (module docstring; 0: the bare ``≤ 0``).
    """
    kw = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    w, gw = weight.double(), grad_weight.double()
    b = None if bias is None else bias.double()
    om = (torch.ones_like(z_minus_b) if forward_weight is None else forward_weight.double()) * valid
    target = z_minus_b.double() * om
    nf = float(target.norm()) or 1.0
    ng = float(gw.norm()) or 1.0
    d = delta.double()[None]
    deadf = dead.double()
    eps = dead_margin(z_minus_b, om != 0, margin)

    def terms(p: Tensor, eps: float = eps) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x = ((p - mean) / std)[None]
        z = F.conv2d(x, w, **kw)[0]
        forward = ((z * om - target) ** 2).sum() / nf ** 2
        pre = z if b is None else z + b.view(-1, 1, 1)
        hinge = ((F.relu(pre + eps) * deadf) ** 2).sum() / nf ** 2
        grad = ((torch.nn.grad.conv2d_weight(x, w.shape, d, **kw) - gw) ** 2).sum() / ng ** 2
        box = ((p - p.clamp(0, 1)) ** 2).sum()
        return forward, hinge, grad, box

    p = (start.double() * std + mean).clamp(0, 1).requires_grad_(True)
    calls = 0
    if iterations > 0:
        opt = torch.optim.LBFGS([p], lr=1, max_iter=iterations, history_size=50, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-12, tolerance_change=1e-15)

        def closure() -> Tensor:
            nonlocal calls
            calls += 1
            opt.zero_grad()
            loss = sum(terms(p)) + tv_weight * smoothed_tv(p)
            loss.backward()
            return loss

        opt.step(closure)
    with torch.no_grad():
        out = p.detach().clamp(0, 1)
        forward, hinge, grad, _ = terms(out, 0.0)
    return PriorSolve((out - mean) / std, float(grad) ** 0.5, float(forward) ** 0.5, float(hinge) ** 0.5, calls)
