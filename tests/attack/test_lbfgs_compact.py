"""The compact L-BFGS direction (Byrd, Nocedal & Schnabel 1994, eq. 3.1) against the two-loop recursion, and the
ring memory of :class:`gi.attack.recon.optim.BatchedLBFGS` against torch.optim.LBFGS."""

from __future__ import annotations

import pytest
import torch

from gi.attack.recon.optim import BatchedLBFGS, compact_direction, two_loop_direction


def _pairs(num: int, m: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Curvature pairs of random SPD quadratics (y = A s), float64: (P, m, n) each."""
    a = torch.randn(num, n, n, generator=gen, dtype=torch.float64)
    a = a @ a.mT / n + 0.1 * torch.eye(n, dtype=torch.float64)
    s = torch.randn(num, m, n, generator=gen, dtype=torch.float64)
    return s, torch.einsum("pij,pmj->pmi", a, s)


def _compact_inputs(s: torch.Tensor, y: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """memory, R (unit pivots where not ok), Y'Y, D of pairs in order (s, y zeroed where not ok)."""
    keep = ok[..., None].to(s.dtype)
    s, y = s * keep, y * keep
    sy = s @ y.mT
    r = sy.triu() + torch.diag_embed((~ok).to(s.dtype))
    return torch.cat([s, y], 1), r, y @ y.mT, torch.diagonal(sy, dim1=1, dim2=2)


@pytest.mark.parametrize("m", [1, 5, 12])
def test_compact_direction_equals_two_loop_in_float64(m):
    gen = torch.Generator().manual_seed(m)
    num, n = 3, 20
    s, y = _pairs(num, m, n, gen)
    g = torch.randn(num, n, generator=gen, dtype=torch.float64)
    gamma = torch.rand(num, generator=gen, dtype=torch.float64) + 0.5
    ok = torch.ones(num, m, dtype=torch.bool)
    rho = 1.0 / (s * y).sum(2)
    ref = two_loop_direction(g, [(s[:, i], y[:, i], rho[:, i]) for i in range(m)], gamma)
    got = compact_direction(g, *_compact_inputs(s, y, ok), gamma)
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-10 * ref.abs().max())
    assert (got * g).sum(1).lt(0).all()  # a descent direction (H is SPD)


def test_compact_direction_skips_pairs_and_reads_the_ring_in_order():
    """A pair not in use (per problem) is skipped as the two-loop's ρ = 0 skips it, and ``order`` (slots oldest
    first) gives the same direction as the pairs stored in order."""
    gen = torch.Generator().manual_seed(7)
    num, m, n = 4, 6, 15
    s, y = _pairs(num, m, n, gen)
    g = torch.randn(num, n, generator=gen, dtype=torch.float64)
    gamma = torch.full((num,), 0.7, dtype=torch.float64)
    ok = torch.rand(num, m, generator=gen) > 0.4
    rho = torch.where(ok, 1.0 / (s * y).sum(2), torch.zeros(()))
    ref = two_loop_direction(g, [(s[:, i], y[:, i], rho[:, i]) for i in range(m)], gamma)
    slots = torch.tensor([2, 3, 4, 5, 0, 1])  # slot slots[j] of the ring holds the j-th oldest pair
    _, r, yy, d = _compact_inputs(s, y, ok)  # the small matrices are oldest first
    ring = torch.empty(num, 2 * m, n, dtype=s.dtype)
    ring[:, slots], ring[:, m + slots] = s * ok[..., None], y * ok[..., None]
    got = compact_direction(g, ring, r, yy, d, gamma, torch.cat([slots, slots + m]))
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-10 * ref.abs().max())
    none = compact_direction(g, *_compact_inputs(s, y, torch.zeros_like(ok)), gamma)
    assert torch.allclose(none, -gamma[:, None] * g)  # no pair in use: the scaled steepest descent


@pytest.mark.parametrize("direction", ["compact", "two-loop"])
def test_ring_memory_follows_torch_lbfgs(direction):
    """With more iterations than history slots (the ring wraps), both directions follow torch.optim.LBFGS
    (no line search, float64) on a quadratic step for step."""
    gen = torch.Generator().manual_seed(3)
    n, hist = 8, 3
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    a = a @ a.T / n + torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    x0 = torch.randn(n, generator=gen, dtype=torch.float64)

    def grad_of(x: torch.Tensor) -> torch.Tensor:
        return a @ x - b

    ours = x0.clone()[None].requires_grad_(True)
    opt = BatchedLBFGS([ours], lr=0.5, history_size=hist, direction=direction)
    ref = x0.clone().requires_grad_(True)
    topt = torch.optim.LBFGS([ref], lr=0.5, max_iter=1, history_size=hist, tolerance_grad=0, tolerance_change=0)
    for _ in range(12):
        ours.grad = grad_of(ours.detach()[0])[None]
        opt.step()

        def closure() -> torch.Tensor:
            topt.zero_grad()
            loss = 0.5 * ref @ a @ ref - b @ ref
            loss.backward()
            return loss

        topt.step(closure)
        assert torch.allclose(ours.detach()[0], ref.detach(), rtol=1e-9, atol=1e-10)


def test_bad_direction_and_history_are_errors():
    x = torch.zeros(1, 3, requires_grad=True)
    with pytest.raises(ValueError, match="direction"):
        BatchedLBFGS([x], direction="three-loop")
    with pytest.raises(ValueError, match="history_size"):
        BatchedLBFGS([x], history_size=0)


def test_compact_and_two_loop_follow_the_same_path_on_a_real_image(monkeypatch):
    """On a bundled CIFAR-10 image (DLG LeNet, true labels, L2 + TV, one start) the two directions give the same
    objective path up to float32 rounding (which the chaotic attack amplifies slowly) and end within 0.5 dB."""
    from gi.analysis.metrics import psnr
    from gi.attack.recon import ReconConfig, reconstruct
    from gi.attack.recon.optim import OPTIMIZERS
    from gi.world.data import load
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import build
    from labels import LabelResult

    data = load("cifar10-samples")
    image, label = data[0]
    model = build("lenet", 10, init="uniform", seed=0)
    capture, truth = capture_gradients(model, image[None], torch.tensor([label]), Protocol(batch_size=1))
    known = LabelResult.from_counts("truth", truth.counts, soft=truth.targets)
    cfg = ReconConfig(optimizer="lbfgs", lr=1.0, objective="l2", schedule="constant", signed=False,
                      regularizers={"tv": 1e-4}, iterations=60, restarts=1, progress=False, threads=1, log_every=1)
    runs = {}
    for direction in ("compact", "two-loop"):
        monkeypatch.setitem(OPTIMIZERS, "lbfgs", lambda groups, c, d=direction: BatchedLBFGS(groups, lr=c.lr,
                                                                                             direction=d))
        rec = reconstruct(capture, known, config=cfg)
        runs[direction] = (torch.tensor(rec.history["objective"]).flatten(), float(psnr(rec.images, truth.images)))
    (obj_a, psnr_a), (obj_b, psnr_b) = runs["compact"], runs["two-loop"]
    assert obj_a[-1] < 0.1 * obj_a[0]  # it optimises
    rel = ((obj_a - obj_b).abs() / obj_b.abs()).tolist()
    assert max(rel[:15]) < 1e-4 and max(rel) < 0.2, rel  # ~1e-6 on any CPU kernel; 1 % off: 1.6e-3
    assert abs(psnr_a - psnr_b) < 0.5, (psnr_a, psnr_b)


def test_lbfgs_for_picks_compact_for_a_small_memory_and_the_list_two_loop_beyond():
    from gi.attack.recon.config import ReconConfig
    from gi.attack.recon.optim import OPTIMIZERS, TwoLoopLBFGS, lbfgs_for, select_rows

    one = torch.zeros(1, 1, 3, 32, 32, requires_grad=True)
    many = torch.zeros(80, 1, 3, 32, 32, requires_grad=True)
    assert isinstance(lbfgs_for([{"params": [one]}], 1.0), BatchedLBFGS)
    assert isinstance(lbfgs_for([{"params": [torch.zeros(4, 1, 3, 32, 32)]}], 1.0), BatchedLBFGS)  # 9.8 MB
    opt = OPTIMIZERS["lbfgs"]([{"params": [many], "lr": 1.0}], ReconConfig(optimizer="lbfgs", lr=1.0))
    assert isinstance(opt, TwoLoopLBFGS)
    many.grad = torch.ones_like(many)
    opt.step()
    select_rows(opt, torch.tensor([3]))
    assert opt.prev_x.shape[0] == 1 and opt.g0.shape == (1,)


def test_compact_direction_over_the_filled_slots_equals_the_whole_ring():
    """``used`` = k < m: the products over the k filled slots give the direction of the whole ring, whose other
    slots are zero pairs with unit pivots (not in use)."""
    gen = torch.Generator().manual_seed(3)
    num, m, k, n = 3, 8, 5, 16
    s, y = _pairs(num, m, n, gen)
    ok = torch.zeros(num, m, dtype=torch.bool)
    ok[:, :k] = True
    ok[1, 2] = False  # a rejected pair among the filled slots
    g = torch.randn(num, n, generator=gen, dtype=torch.float64)
    gamma = torch.rand(num, generator=gen, dtype=torch.float64) + 0.5
    inputs = _compact_inputs(s, y, ok)
    whole = compact_direction(g, *inputs, gamma)
    filled = compact_direction(g, *inputs, gamma, used=k)
    assert torch.allclose(filled, whole, rtol=1e-12, atol=1e-12 * whole.abs().max())
    rho = torch.where(ok, 1.0 / (s * y).sum(2), torch.zeros(()))
    ref = two_loop_direction(g, [(s[:, i], y[:, i], rho[:, i]) for i in range(k)], gamma)
    assert torch.allclose(filled, ref, rtol=1e-10, atol=1e-10 * ref.abs().max())


def test_long_memory_ring_matches_torch_lbfgs_before_and_after_it_fills():
    """BatchedLBFGS reading only the filled slots (and the whole ring once it wraps) follows torch.optim.LBFGS'
    iterates on a quadratic, float64, for more steps than its memory holds."""
    gen = torch.Generator().manual_seed(11)
    n, hist = 12, 4
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    a = a @ a.T / n + 0.2 * torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    x0 = torch.randn(1, n, generator=gen, dtype=torch.float64)
    ours, ref = x0.clone().requires_grad_(True), x0[0].clone().requires_grad_(True)
    opt = BatchedLBFGS([ours], lr=0.5, history_size=hist)
    topt = torch.optim.LBFGS([ref], lr=0.5, max_iter=1, history_size=hist, tolerance_grad=0, tolerance_change=0)

    def f(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x @ a @ x - b @ x

    for _ in range(3 * hist):
        opt.zero_grad()
        f(ours[0]).backward()
        opt.step()

        def closure() -> torch.Tensor:
            topt.zero_grad()
            loss = f(ref)
            loss.backward()
            return loss

        topt.step(closure)
        assert torch.allclose(ours[0], ref, rtol=1e-8, atol=1e-10)


def test_lbfgs_history_is_long_for_one_capture_and_100_for_packed_captures():
    from gi.attack.recon.config import ReconConfig
    from gi.attack.recon.optim import LBFGS_HISTORY, LBFGS_LONG_HISTORY, OPTIMIZERS, lbfgs_history

    assert lbfgs_history(1, 3 * 32 * 32) == LBFGS_LONG_HISTORY == 400  # 9.8 MB
    assert lbfgs_history(20, 3 * 32 * 32) == LBFGS_HISTORY == 100
    assert lbfgs_history(1, 8 * 28 * 28) == LBFGS_HISTORY  # a batch of 8 Fashion-MNIST images: 20 MB
    cfg = ReconConfig(optimizer="lbfgs", lr=1.0, restarts=4, cull_after=100, iterations=2600)
    one = OPTIMIZERS["lbfgs"]([{"params": [torch.zeros(4, 1, 3, 32, 32)], "lr": 1.0}], cfg)  # 1 row after the cull
    packed = OPTIMIZERS["lbfgs"]([{"params": [torch.zeros(80, 1, 3, 32, 32)], "lr": 1.0}], cfg)  # 20 rows after
    uncull = OPTIMIZERS["lbfgs"]([{"params": [torch.zeros(4, 1, 3, 32, 32)], "lr": 1.0}],
                                 ReconConfig(optimizer="lbfgs", lr=1.0, restarts=4, cull_after=0))
    assert (one.history_size, one.direction) == (400, "compact")
    assert packed.history_size == 100 and uncull.history_size == 100
