"""S2 probe (docs/results/realistic.md, S2): breaching's ConvNet layout (conv / BN / ReLU x 8, two 3x3 max-pools,
width W), untrained (PyTorch's init, seed 0), BatchNorm in train mode, cifar10-samples 0-7: Adam on the relative
distance to the exact per-image last-layer features (what slot_features recovers) plus TV, from a grey start,
against the trivial guesses: does the feature pin the image?

    PYTHONPATH=$PWD python research/probe_convnet_features.py 64 200 1e-2 0.05     # width steps tv lr
"""

import sys
import time

import torch
from torch import nn

from gi.analysis.metrics import psnr
from gi.analysis.verdict import trivial_baselines
from gi.world.data import load


def block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w, steps, tv, lr = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    body = nn.Sequential(*block(3, w), *block(w, 2 * w), *block(2 * w, 2 * w), *block(2 * w, 4 * w),
                         *block(4 * w, 4 * w), *block(4 * w, 4 * w), nn.MaxPool2d(3), *block(4 * w, 4 * w),
                         *block(4 * w, 4 * w), nn.MaxPool2d(3), nn.Flatten()).train()
    x = load("cifar10-samples").images[:8]
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.247, 0.243, 0.261]).view(1, 3, 1, 1)

    def features(im: torch.Tensor) -> torch.Tensor:
        return body((im - mean) / std)

    with torch.no_grad():
        h = features(x)
    print("feature", tuple(h.shape), "zero fraction", float((h == 0).float().mean()))
    z = torch.full_like(x, 0.5).requires_grad_()
    opt = torch.optim.Adam([z], lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(steps * 0.6), int(steps * 0.85)], 0.1)
    start = time.process_time()
    for s in range(steps):
        opt.zero_grad()
        im = z.clamp(0, 1)
        loss = ((features(im) - h) ** 2).sum() / (h ** 2).sum()
        smooth = (im[..., 1:, :] - im[..., :-1, :]).abs().mean() + (im[..., :, 1:] - im[..., :, :-1]).abs().mean()
        (loss + tv * smooth).backward()
        opt.step()
        sched.step()
        if s % max(1, steps // 6) == 0 or s == steps - 1:
            p = psnr(z.detach().clamp(0, 1), x)
            print(f"step {s} loss {loss.item():.3e} PSNR mean {p.mean():.2f} min {p.min():.2f} "
                  f"{time.process_time() - start:.0f} CPU s", flush=True)
    guesses = trivial_baselines(x)
    print(f"trivial: grey {sum(guesses['grey_psnr']) / 8:.2f}, mean colour {sum(guesses['mean_colour_psnr']) / 8:.2f}")


if __name__ == "__main__":
    main()
