"""The gradient-matching landscape around the truth (docs/results/realistic.md, S2): the cosine distance
1 − cos(s(x'), s*) of Inverting Gradients' objective, for images x' a known distance from the true batch x,
over all shared tensors and per third of the tensors (in the order the model lists them: shallow, middle, deep).

A landscape an optimiser can descend falls smoothly as x' nears x. The S2 net's does not: high-frequency
noise of 46 dB PSNR already costs as much as half the distance of a grey image (the shattered gradients of deep
ReLU nets at initialisation, Balduzzi et al. 2017), while a blurred truth is no closer than its mean colour.

    PYTHONPATH=$PWD python research/probe_landscape.py configs/ablate/s2-resnet32-bn.yaml trials=1 [KEY=VALUE ...]
"""

import sys

import torch
import torch.nn.functional as F

from gi.attack.recon.mismatch import simulated_share
from gi.core.config import load
from gi.experiments.config.ablate import AblateConfig
from gi.world.build import build_victim, capture_client


def one_minus_cos(share: dict[str, torch.Tensor], target: dict[str, torch.Tensor], names: list[str]) -> float:
    """1 − Σ⟨s_l, s*_l⟩ / (‖s‖ ‖s*‖) over the tensors ``names`` together (Inverting Gradients' cosine)."""
    dot = sum(float((share[k] * target[k]).sum()) for k in names)
    a = sum(float(share[k].norm() ** 2) for k in names) ** 0.5
    b = sum(float(target[k].norm() ** 2) for k in names) ** 0.5
    return 1.0 - dot / (a * b)


def main() -> None:
    torch.set_num_threads(1)
    cfg = load(AblateConfig, sys.argv[1], sys.argv[2:])
    dataset, model = build_victim(cfg)
    cap, truth = capture_client(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))
    x = truth.images.float()
    noise = torch.Generator().manual_seed(0)
    target = {k: v.float() for k, v in cap.shared.items()}
    names = list(target)
    third = len(names) // 3
    groups = {"all": names, "shallow": names[:third], "middle": names[third:2 * third], "deep": names[2 * third:]}
    candidates = {f"noise {t}": (x + t * torch.randn(x.shape, generator=noise)).clamp(0, 1)
                  for t in (0.002, 0.005, 0.02)}
    candidates.update({f"blend {a} with grey": a * x + (1 - a) * 0.5 for a in (0.9, 0.7, 0.5)})
    candidates.update({f"blur {k}x{k}": F.interpolate(F.avg_pool2d(x, k), scale_factor=k, mode="bilinear")
                       for k in (2, 4)})
    candidates["mean colour"] = x.mean(dim=(2, 3), keepdim=True).expand_as(x).clone()
    candidates["grey"] = torch.full_like(x, 0.5)
    print(f"{cfg.model.name}, B = {x.shape[0]}, {len(names)} shared tensors; 1 - cos by group")
    print("candidate".ljust(22), "PSNR".rjust(7), "".join(g.rjust(9) for g in groups))
    for name, image in candidates.items():
        share = simulated_share(cap, image, truth.targets)
        psnr = float(-10 * torch.log10(((image - x) ** 2).mean()))
        cols = "".join(f"{one_minus_cos(share, target, g):9.3f}" for g in groups.values())
        print(name.ljust(22), f"{psnr:7.2f}", cols, flush=True)


if __name__ == "__main__":
    main()
