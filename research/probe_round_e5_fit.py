"""Probe: over E = 5 local epochs, how good are the images fitted to the round's approximate hidden-layer inputs?

The E·N visits of a round (each image once an epoch, at drifting conv parameters) make the hidden layer's
−ΔW/η span more than N inputs with no gap at N (research/probe_round_e5.py). This fits images through the conv
body at the global model θ⁰ to (a) the true inputs at θ⁰ (the ceiling), (b) the vertices of the top-N subspace's
nonnegative cone, and then (c) refines (b) by the images' distance to the top-k right singular subspace
(order-free and label-free: every visit of every image lies in the full span). PSNR matched one to one.
  .venv/bin/python research/probe_round_e5_fit.py E steps k1,k2,...
"""
import sys
import time

import torch
from scipy.optimize import linear_sum_assignment

from fcn_analytic.disaggregate import linear_inputs
from gi.analysis.metrics import psnr
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build

torch.set_num_threads(1)
e, steps = int(sys.argv[1]), int(sys.argv[2])
ks = [int(k) for k in sys.argv[3].split(",")] if len(sys.argv) > 3 else []
n, b, lr, hidden = 50, 5, 0.01, 256
ds = gdata.load("fashion-mnist")
model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[32, 64], hidden=hidden)
gen = torch.Generator().manual_seed(0)
idx = torch.randperm(len(ds.labels), generator=gen)[:n]
truth = ds.images[idx]
cap, _ = simulate_client(model, (truth, ds.labels[idx]), Protocol(scheme="fedavg", batch_size=b, num_samples=n,
                                                                  local_epochs=e, lr=lr), rng=gen)
dw, db = -cap.update["body.1.weight"].double() / lr, -cap.update["body.1.bias"].double() / lr
body = lambda im: model.body[0](model.normalize(im))  # noqa: E731
with torch.no_grad():
    x0 = body(truth).double()
_, sv, vh = torch.linalg.svd(dw, full_matrices=False)
mean_colour = float(psnr(truth.mean((1, 2, 3), keepdim=True).expand_as(truth), truth).mean())


def score(rec: torch.Tensor, label: str, t0: float) -> torch.Tensor:
    p = -10 * torch.log10(((rec.double()[:, None] - truth.double()[None]) ** 2).mean((2, 3, 4)))  # rec × truth
    r, c = linear_sum_assignment(-p.numpy())
    best = p[r, c]
    print(f"{label}: mean {best.mean():.2f} median {best.median():.2f} min {best.min():.2f} dB, "
          f">= 25 dB {int((best >= 25).sum())} of {n}, {time.process_time() - t0:.0f} CPU s", flush=True)
    return rec[torch.argsort(torch.as_tensor(c))] if len(c) == n else rec


def fit(target_loss, start: torch.Tensor, iters: int) -> torch.Tensor:
    z = start.clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(iters * f) for f in (3 / 8, 5 / 8, 7 / 8)], 0.1)
    for _ in range(iters):
        opt.zero_grad()
        im = z
        tv = (im[..., 1:, :] - im[..., :-1, :]).abs().mean() + (im[..., :, 1:] - im[..., :, :-1]).abs().mean()
        loss = target_loss(body(im).flatten(1)) + 1e-4 * tv * im.shape[0]
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            z.clamp_(0, 1)  # projected, as the attack's boxed images
    return z.detach()


def to_targets(t: torch.Tensor):
    t = t.float()
    return lambda f: (((f - t) ** 2).sum(1) / (t ** 2).sum(1)).sum()


start = ds.images[torch.randperm(len(ds.labels), generator=gen)[:500]].mean(0, keepdim=True).expand(n, -1, -1, -1)
print(f"E = {e}: singular values at 1, N, N+1, 2N, E·N: "
      f"{[f'{sv[i]:.2e}' for i in (0, n - 1, n, 2 * n - 1, min(e * n, len(sv)) - 1)]}; mean colour "
      f"{mean_colour:.2f} dB", flush=True)
t0 = time.process_time()
score(fit(to_targets(x0), start, steps), "(a) fitted to the true inputs at θ⁰", t0)
t0 = time.process_time()
found = linear_inputs(dw, db, n, samples=1, programs=400, seed=0, method="lp", zero_tol=1e-2, sign_tol=5e-2).inputs
cos = (torch.nn.functional.normalize(found, dim=1) @ torch.nn.functional.normalize(x0, dim=1).T).max(0).values
print(f"vertices: {found.shape[0]} in {time.process_time() - t0:.0f} CPU s; true inputs at cos > 0.99 "
      f"{int((cos > 0.99).sum())}, > 0.95 {int((cos > 0.95).sum())}", flush=True)
t0 = time.process_time()
rec_b = score(fit(to_targets(found), start, steps), "(b) fitted to the top-N vertices", t0)
for k in ks:
    v = vh[:k].float()

    def off_span(f: torch.Tensor, v=v) -> torch.Tensor:
        return (((f - (f @ v.T) @ v) ** 2).sum(1) / (f ** 2).sum(1).clamp_min(1e-12)).sum()

    t0 = time.process_time()
    score(fit(off_span, rec_b, steps), f"(c) (b) refined by the distance to the top-{k} subspace", t0)
