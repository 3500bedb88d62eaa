"""The gradient-matching landscape of the decoupled BatchNorm attack (docs/results/batchnorm.md) against the
train-mode client's (docs/results/realistic.md, "Why nothing moves"): Inverting Gradients' cosine distance
1 − cos(s(x'), s*) for images x' a known distance from the true batch x, where s simulates the FedAvg client of
one local step either as it ran (BatchNorm in train mode: the batch's own statistics) or decoupled (the statistics
its buffers give, fixed, with the train-mode backward: gi.attack.recon.batchnorm_decoupled) or with those
statistics as eval-mode running statistics ("fixed": the same forward, the plain (γ/σ) backward, so not the
client's gradient even on the truth).

    PYTHONPATH=$PWD python research/probe_decoupled.py configs/batchnorm/stats.yaml trials=1 [KEY=VALUE ...]
"""

import sys

import torch
import torch.nn.functional as F

from gi.attack.recon.batchnorm_decoupled import decoupled_model
from gi.attack.recon.mismatch import simulated_share
from gi.attack.recon.problem import update_statistics
from gi.attack.recon.simulate import update_simulator
from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.world.build import build_victim, capture_client


def one_minus_cos(share: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> float:
    """1 − Σ⟨s_l, s*_l⟩ / (‖s‖ ‖s*‖) over every shared tensor together (Inverting Gradients' cosine)."""
    dot = sum(float((share[k] * target[k]).sum()) for k in target)
    a = sum(float(share[k].norm() ** 2) for k in target) ** 0.5
    b = sum(float(target[k].norm() ** 2) for k in target) ** 0.5
    return 1.0 - dot / (a * b)


def main() -> None:
    torch.set_num_threads(1)
    cfg = load(RunConfig, sys.argv[1], sys.argv[2:])
    dataset, model = build_victim(cfg)
    cap, truth = capture_client(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))
    x, y = truth.images.float(), truth.targets.float()
    target = {k: v.float() for k, v in cap.shared.items()}
    net = decoupled_model(cap.model(), update_statistics(cap, "decoupled"))
    for p in net.parameters():
        p.requires_grad_(False)
    decoupled = update_simulator(net, cap.protocol, list(target), num_samples=x.shape[0])
    frozen = cap.model().eval()  # the same fixed statistics as running statistics: eval-mode BatchNorm, no
    for name, (mean, var) in update_statistics(cap, "decoupled").items():  # train-mode correction backward
        frozen.get_submodule(name).running_mean.copy_(mean)
        frozen.get_submodule(name).running_var.copy_(var)
    for p in frozen.parameters():
        p.requires_grad_(False)
    fixed = update_simulator(frozen, cap.protocol, list(target), num_samples=x.shape[0])
    noise = torch.Generator().manual_seed(0)
    candidates = {"truth": x}
    candidates.update({f"noise {t}": (x + t * torch.randn(x.shape, generator=noise)).clamp(0, 1)
                       for t in (0.002, 0.005, 0.02)})
    candidates.update({f"blend {a} with grey": a * x + (1 - a) * 0.5 for a in (0.9, 0.5)})
    candidates["blur 2x2"] = F.interpolate(F.avg_pool2d(x, 2), scale_factor=2, mode="bilinear")
    candidates["mean colour"] = x.mean(dim=(2, 3), keepdim=True).expand_as(x).clone()
    candidates["grey"] = torch.full_like(x, 0.5)
    print(f"{cfg.model.name}, B = {x.shape[0]}, {len(target)} shared tensors; 1 - cos")
    print("candidate".ljust(22), "PSNR".rjust(7), "train".rjust(9), "decoupled".rjust(10), "fixed".rjust(9))
    for name, image in candidates.items():
        train = one_minus_cos(simulated_share(cap, image, y), target)
        ours = one_minus_cos(decoupled(image, y)[0], target)
        plain = one_minus_cos(fixed(image, y)[0], target)
        psnr = float(-10 * torch.log10(((image - x) ** 2).mean().clamp_min(1e-20)))
        print(name.ljust(22), f"{psnr:7.2f}", f"{train:9.3f}", f"{ours:10.3f}", f"{plain:9.3f}", flush=True)


if __name__ == "__main__":
    main()
