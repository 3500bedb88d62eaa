"""Probe: does fitting each image through the conv layers at its own step's parameters lift the client round?

The hidden layer's inputs from a FedAvg update are each image's input at the step that saw it (θ_τ), while the
attack fits the images through the conv layers at θ⁰. Here θ_τ is guessed as θ⁰ + (τ/T)·Δθ (the update's drift,
linear in the steps), each image's step as the one whose conv map of the first fit is nearest its target, and the
images are refitted there. Reads a `gi run configs/fedavg-round.yaml` output directory.
  .venv/bin/python research/probe_round_drift.py RUN_DIR [steps]
"""
import sys

import torch
from scipy.optimize import linear_sum_assignment
from torch.func import functional_call

from gi.attack.recon.problem import feature_targets, labels_for_slots
from gi.capture import Capture, Truth
from labels import recover

torch.set_num_threads(1)
run, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
cap = Capture.load(f"{run}/capture.safetensors", trust_factory=True)
truth = Truth.load(f"{run}/truth.safetensors")
n, T = truth.images.shape[0], cap.meta["num_steps"]
labels = recover(cap, "ilrg-update")
soft = labels_for_slots(labels, n, 10) if int(labels.counts.sum()) == n else truth.targets
target = feature_targets(cap, labels, soft, "first-linear", draws=200_000).float()
model = cap.model()
conv = model.body[0]
names = [k for k, _ in conv.named_parameters()]
theta0 = {k: v.detach() for k, v in conv.named_parameters()}
delta = {k: cap.update[f"body.0.{k}"] for k in names}


def at(tau: float) -> dict:
    return {k: theta0[k] + tau / T * delta[k] for k in names}


def fit(params_of_slot: list[dict], start: torch.Tensor | None, iters: int) -> torch.Tensor:
    logit = (torch.zeros(n, *truth.images.shape[1:]) if start is None
             else torch.logit(start.clamp(1e-4, 1 - 1e-4))).requires_grad_(True)
    opt = torch.optim.Adam([logit], lr=0.1)
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(params_of_slot):
        groups.setdefault(id(p), []).append(i)
    for _ in range(iters):
        img = torch.sigmoid(logit)
        loss = 0.0
        for idx in groups.values():
            f = functional_call(conv, params_of_slot[idx[0]], (model.normalize(img[idx]),))
            loss = loss + ((f - target[idx]).pow(2).sum(1) / target[idx].pow(2).sum(1)).sum()
        tv = (img[..., 1:, :] - img[..., :-1, :]).abs().mean() + (img[..., 1:] - img[..., :-1]).abs().mean()
        opt.zero_grad()
        (loss + 1e-4 * n * tv).backward()
        opt.step()
    return torch.sigmoid(logit).detach()


def psnr(images: torch.Tensor) -> torch.Tensor:
    mse = ((images[:, None] - truth.images[None]) ** 2).flatten(2).mean(2)
    rows, cols = linear_sum_assignment(mse.numpy())
    return 10 * torch.log10(1 / mse[rows, cols])


first = fit([theta0] * n, None, steps)
p0 = psnr(first)
print(f"through θ⁰: mean {p0.mean():.2f} dB, ≥ 25 dB: {int((p0 >= 25).sum())} of {n}")
cands = [at(tau) for tau in range(T)]
with torch.no_grad():
    err = torch.stack([((functional_call(conv, c, (model.normalize(first),)) - target).pow(2).sum(1)
                        / target.pow(2).sum(1)) for c in cands])  # (T, n)
step = err.argmin(0)
print("steps chosen:", torch.bincount(step, minlength=T).tolist())
second = fit([cands[int(s)] for s in step], first, steps)
p1 = psnr(second)
print(f"through θ_τ: mean {p1.mean():.2f} dB, ≥ 25 dB: {int((p1 >= 25).sum())} of {n}")
again = fit([theta0] * n, first, steps)
p2 = psnr(again)
print(f"control, θ⁰ for as many more steps: mean {p2.mean():.2f} dB, ≥ 25 dB: {int((p2 >= 25).sum())} of {n}")
