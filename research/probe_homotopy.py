"""Gaussian homotopy on the gradient match (docs/results/realistic.md, S2): signed Adam on
1 − cos(s(x + σε), s*) + λ·TV(x) with fresh noise ε each step, σ annealed linearly from σ0 to 0 over the first
80 % of the steps (the lr × 0.1 after), from a grey or a Gaussian start; oracle labels, the first capture of an
ablate config. σ0 = 0 is the plain match. PSNR of the batch's pooled squared error.

    PYTHONPATH=$PWD python research/probe_homotopy.py configs/ablate/s2-resnet32-bn.yaml SIGMA0 STEPS LR TV INIT \\
        trials=1 [KEY=VALUE ...]          # e.g. 0.05 600 0.01 1e-3 grey
"""

import sys
import time

import torch

from gi.attack.recon.simulate import gradient_simulator
from gi.core.config import load
from gi.experiments.config.ablate import AblateConfig
from gi.world.build import build_victim, capture_client


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(-10 * torch.log10(((a - b) ** 2).mean()))


def tv(a: torch.Tensor) -> torch.Tensor:
    return (a[..., 1:, :] - a[..., :-1, :]).abs().mean() + (a[..., :, 1:] - a[..., :, :-1]).abs().mean()


def main() -> None:
    torch.set_num_threads(1)
    sigma0, steps, lr, tv_weight, init = (float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                                          float(sys.argv[5]), sys.argv[6])
    cfg = load(AblateConfig, sys.argv[1], sys.argv[7:])
    dataset, model = build_victim(cfg)
    cap, truth = capture_client(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))
    net = cap.model().train(cap.protocol.model_mode == "train")
    for p in net.parameters():
        p.requires_grad_(False)
    names = list(cap.shared)
    target = {k: v.float() for k, v in cap.shared.items()}
    target_norm = sum(float(v.norm() ** 2) for v in target.values()) ** 0.5
    simulate = gradient_simulator(net, cap.protocol, names, autograd=True)
    x0, y = truth.images.float(), truth.targets.float()
    gen = torch.Generator().manual_seed(1)
    start = torch.full_like(x0, 0.5) if init == "grey" else (0.5 + 0.25 * torch.randn(x0.shape, generator=gen))
    x = start.clamp(0, 1).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    t0 = time.process_time()
    for it in range(steps):
        frac = it / steps
        sigma = sigma0 * max(0.0, 1 - frac / 0.8)
        for group in opt.param_groups:
            group["lr"] = lr * (0.1 if frac > 0.8 else 1.0)
        share, _ = simulate(x + sigma * torch.randn(x.shape, generator=gen) if sigma > 0 else x, y)
        dot = sum((share[k] * target[k]).sum() for k in names)
        norm = torch.sqrt(sum((share[k] ** 2).sum() for k in names))
        loss = 1 - dot / (norm * target_norm) + tv_weight * tv(x)
        opt.zero_grad()
        loss.backward()
        x.grad.sign_()
        opt.step()
        with torch.no_grad():
            x.clamp_(0, 1)
        if it % max(1, steps // 10) == 0 or it == steps - 1:
            print(f"it {it} sigma {sigma:.4f} objective {float(loss.detach()):.4f} PSNR {psnr(x.detach(), x0):.2f} "
                  f"CPU s {time.process_time() - t0:.0f}", flush=True)
    colour = x0.mean(dim=(2, 3), keepdim=True).expand_as(x0)
    print(f"final {psnr(x.detach(), x0):.2f} dB; mean colour {psnr(colour, x0):.2f}, "
          f"grey {psnr(torch.full_like(x0, 0.5), x0):.2f}")


if __name__ == "__main__":
    main()
