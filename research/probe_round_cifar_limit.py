"""Probe: what limits the CIFAR-10 client round's image fit, the hidden layer's inputs or the inversion of the
conv body? Fits the images (Adam, lr 0.1, TV, from grey) to three targets and scores each one to one:
the inputs the update gives (layer_inputs), the true images' inputs at θ⁰ (no drift: the inversion's ceiling),
and the same at θ⁰ with the images' own exact zero pattern added as a hinge (the ReLU's inactive set).
Reads a `gi run configs/fedavg-round-cifar10.yaml` output directory.
  .venv/bin/python research/probe_round_cifar_limit.py RUN_DIR [steps] [tv]
"""
import sys

import torch
from round_client import matched_psnr

from gi.attack.recon.problem import layer_inputs
from gi.capture import Capture, Truth

torch.set_num_threads(1)
run = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
tv_w = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3
cap = Capture.load(f"{run}/capture.safetensors", trust_factory=True)
truth = Truth.load(f"{run}/truth.safetensors")
n = truth.images.shape[0]
model = cap.model().eval()
body = model.body[0]
soft = torch.nn.functional.one_hot(truth.labels, 10).double() if truth.labels is not None else None
rec = layer_inputs(cap, "body.1", soft, draws=200_000).float()
with torch.no_grad():
    oracle = body(model.normalize(truth.images)).flatten(1)
cos = torch.nn.functional.cosine_similarity(rec, oracle, dim=1)
print(f"recovered inputs against the truth's at θ⁰: cosine min {cos.min():.4f} median {cos.median():.4f}")


def fit(target: torch.Tensor) -> torch.Tensor:
    logit = torch.zeros_like(truth.images).requires_grad_(True)
    opt = torch.optim.Adam([logit], lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(steps * f) for f in (0.375, 0.625, 0.875)], 0.1)
    for _ in range(steps):
        img = torch.sigmoid(logit)
        f = body(model.normalize(img)).flatten(1)
        loss = ((f - target).pow(2).sum(1) / target.pow(2).sum(1)).sum()
        tv = (img[..., 1:, :] - img[..., :-1, :]).abs().mean() + (img[..., 1:] - img[..., :-1]).abs().mean()
        opt.zero_grad()
        (loss + tv_w * n * tv).backward()
        opt.step()
        sched.step()
    return torch.sigmoid(logit).detach()


for name, target in (("recovered inputs", rec), ("truth at θ⁰", oracle)):
    p = matched_psnr(fit(target), truth.images)
    print(f"{name}: mean {p.mean():.2f} / median {p.median():.2f} / min {p.min():.2f} dB")
