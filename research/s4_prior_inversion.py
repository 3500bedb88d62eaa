"""Probe: images of a trained BatchNorm CNN's FedSGD batch (setting S4 of docs/results/realistic.md) from the
gradient alone, in two steps, with no labels and no truth used by the attack.

1. The per-image inputs X (B × 1568) of the first fully-connected layer (``body.1``), from that layer's weight and
   bias gradients by :func:`fcn_analytic.disaggregate.linear_inputs` (SPEAR's sparsity sampling on the input side).
2. The images x with f(x) = X, f the conv / BatchNorm (train mode: batch statistics, all B images jointly) / ReLU /
   max-pool body, by Adam on ``‖f(x) − X‖² / ‖X‖² + λ · ‖(I − PᵀP)(x − μ)‖² / B``: the second term is an image
   prior fitted on the attacker's aux set (μ its mean image, P its top-K principal directions), the distance of x
   from the aux images' K-dimensional affine span. The feature alone does not pin the image (realistic.md, S4);
   the prior keeps x near images of the kind the aux set holds.

Scored per image against the truth after matching (PSNR, SSIM, LPIPS-alex) beside the trivial guesses (each
image's mean colour, flat grey), the prior with no gradient (the aux mean image μ) and the prior's own ceiling:
the truth projected onto the aux span.

    GI_CACHE_DIR=.cache PYTHONPATH=$PWD python research/s4_prior_inversion.py SEED [TRIALS=3] [PER_CLASS=50]
        [K=200] [WEIGHT=1.0] [LR=0.05] [ITERATIONS=500]
"""

from __future__ import annotations

import sys
import time

import torch

from fcn_analytic.disaggregate import linear_inputs
from gi.analysis.metrics import score
from gi.analysis.verdict import trivial_baselines
from gi.core.config import load
from gi.experiments.config.ablate import AblateConfig
from gi.world.build import build_victim, capture_client, make_aux

CONFIG = "configs/ablate/s4-fmnist-bn.yaml"
LAYER = "body.1"


def invert(model: torch.nn.Module, x_target: torch.Tensor, shape: tuple[int, ...], mu: torch.Tensor, p: torch.Tensor,
           weight: float, lr: float, iterations: int) -> torch.Tensor:
    """Images (B, *shape) whose ``LAYER`` input is ``x_target`` under the aux-span prior (module docstring, step 2)."""
    layer = model.get_submodule(LAYER)
    seen: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    b = x_target.shape[0]
    x = mu.repeat(b, 1).clone().requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [iterations * 3 // 8, iterations * 5 // 8,
                                                       iterations * 7 // 8], 0.3)
    scale = (x_target ** 2).sum()
    for _ in range(iterations):
        opt.zero_grad()
        seen.clear()
        model(x.view(b, *shape))
        d = x - mu
        off = d - (d @ p.T) @ p
        loss = ((seen[0].flatten(1) - x_target) ** 2).sum() / scale + weight * (off ** 2).sum() / b
        loss.backward()
        opt.step()
        sched.step()
    hook.remove()
    return x.detach().view(b, *shape).clamp(0, 1)


def main(argv: list[str]) -> None:
    seed = int(argv[0])
    trials, per_class, k = (int(a) for a in (argv[1:4] + ["3", "50", "200"][len(argv[1:4]):]))
    weight, lr = (float(a) for a in (argv[4:6] + ["1.0", "0.05"][len(argv[4:6]):]))
    iterations = int(argv[6]) if len(argv) > 6 else 500
    cfg = load(AblateConfig, CONFIG, [f"seed={seed}", f"trials={trials}", f"aux.per_class={per_class}"])
    dataset, victim = build_victim(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    pairs = [capture_client(cfg, dataset, victim, gen) for _ in range(cfg.trials)]
    aux = make_aux(cfg, dataset, gen, [t for _, t in pairs])
    flat = aux.images.reshape(aux.images.shape[0], -1).double()
    mu = flat.mean(0)
    p = torch.linalg.svd(flat - mu, full_matrices=False)[2][:k]
    rows = []
    for n, (capture, truth) in enumerate(pairs):
        torch.manual_seed(seed)
        start = time.process_time()
        found = linear_inputs(capture.shared[f"{LAYER}.weight"], capture.shared[f"{LAYER}.bias"],
                              capture.num_samples, seed=seed)
        step1 = time.process_time() - start
        model = capture.model().train(capture.protocol.model_mode == "train")
        images = invert(model, found.inputs.float(), tuple(truth.images.shape[1:]), mu.float(), p.float(), weight,
                        lr, iterations)
        step2 = time.process_time() - start - step1
        sc = score(images, truth.images, match=True, vgg=False)
        t = truth.images.reshape(truth.images.shape[0], -1).double()
        ceiling = score((mu + (t - mu) @ p.T @ p).clamp(0, 1).float().view_as(truth.images), truth.images,
                        match=False, vgg=False)
        trivial = trivial_baselines(truth.images)
        prior_only = score(mu.float().view(1, *truth.images.shape[1:]).expand_as(truth.images).contiguous(),
                           truth.images, match=False, vgg=False)  # the aux mean image: the prior with no gradient
        for i in range(truth.images.shape[0]):
            rows.append((sc["psnr"][i], sc["ssim"][i], sc["lpips_alex"][i], ceiling["psnr"][i],
                         prior_only["psnr"][i], trivial["mean_colour_psnr"][i], trivial["grey_psnr"][i]))
        print(f"batch {n}: {found.draws} draws, step 1 {step1:.1f} CPU s, step 2 {step2:.1f} CPU s, PSNR "
              f"{sum(sc['psnr']) / len(sc['psnr']):.2f} dB", flush=True)
    cols = torch.tensor(rows, dtype=torch.float64)
    names = ("PSNR", "SSIM", "LPIPS-alex", "aux-span ceiling PSNR", "aux mean image PSNR", "mean colour PSNR",
             "grey PSNR")
    print(f"seed {seed}, {cols.shape[0]} images, aux {per_class}/class, K {k}, weight {weight}, lr {lr}, "
          f"{iterations} iterations")
    for j, name in enumerate(names):
        c = cols[:, j]
        print(f"  {name:>22s}: mean {c.mean():.3f} median {c.median():.3f} min {c.min():.3f} max {c.max():.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
