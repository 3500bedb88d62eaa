"""Does the gradient-matching objective's descent direction point at the truth (docs/results/batchnorm.md,
"GroupNorm")? For images x = truth + N(0, σ²) (clamped to [0, 1]) of a finished run's capture: the cosine
between −∇ₓ(1 − cos(s(x), s*)) and the direction to the truth, x* − x (also for the sign of the gradient,
signed Adam's step), and the objective along the straight line x + t (x* − x).

A descent an optimiser can follow has a clearly positive cosine near the truth; a random direction in the
B·3·32·32 pixels has about 1/√(B·3072) (0.006 at B = 8).

    PYTHONPATH=$PWD python research/probe_descent_direction.py RUN_DIR [SIGMA ...]
"""

import sys
from pathlib import Path

import torch

from gi.attack.recon.simulate import gradient_simulator
from gi.capture import Capture, Truth


def main() -> None:
    torch.set_num_threads(1)
    run = Path(sys.argv[1])
    sigmas = [float(a) for a in sys.argv[2:]] or [0.001, 0.005, 0.02, 0.1]
    cap, truth = Capture.load(run / "capture.safetensors"), Truth.load(run / "truth.safetensors")
    model = cap.model().cpu()
    model.train(cap.protocol.model_mode == "train")
    names = list(cap.shared)
    simulate = gradient_simulator(model, cap.protocol, names, autograd=True)
    target = {k: v.float() for k, v in cap.shared.items()}
    target_norm = sum((v ** 2).sum() for v in target.values()).sqrt()

    def objective(x: torch.Tensor) -> torch.Tensor:
        share, _ = simulate(x, truth.targets.float())
        dot = sum((share[k] * target[k]).sum() for k in names)
        return 1 - dot / (sum((share[k] ** 2).sum() for k in names).sqrt() * target_norm)

    x0 = truth.images.float()
    noise = torch.Generator().manual_seed(0)
    for sigma in sigmas:
        x = (x0 + sigma * torch.randn(x0.shape, generator=noise)).clamp(0, 1).requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(x), [x])
        d = (x0 - x).detach()
        cos = float((-grad * d).sum() / (grad.norm() * d.norm()))
        cos_sign = float((-grad.sign() * d).sum() / (grad.sign().norm() * d.norm()))
        line = [float(objective(x.detach() + t * d)) for t in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)]
        psnr = float(-10 * torch.log10((d ** 2).mean()))
        print(f"sigma {sigma}: {psnr:.1f} dB, cos(-grad, truth - x) {cos:.3f} (sign of the gradient {cos_sign:.3f});"
              " 1 - cos along the line at t = 0, .25, .5, .75, .9, 1: " + " ".join(f"{v:.4f}" for v in line),
              flush=True)


if __name__ == "__main__":
    main()
