"""Probe of the captured output error on ResNet-18 (docs/results/time-to-quality-resnet18.md): one capture
of ``configs/bench/ttq-resnet18.yaml``'s job, the dummy gradients simulated with the protocol's cross-entropy of the
recovered soft labels (``ce``) or with the captured ∂L/∂z = ∇b frozen (``delta``,
``gi.world.losses.output_error_loss``),
matched by the cosine or the relative L2 distance plus TV 2e-3, optimised by signed Adam (the ``resnet`` preset's
lr 0.025 and multistep decays at 400 / 667 / 933) or by torch's L-BFGS (lr 1, 100 pairs, no line search), or Adam
switching to L-BFGS at ``SWITCH`` (``hyb``). PSNR of the current iterate against CPU seconds of the process (setup
included, scoring excluded), every 10 iterations, one thread, until ``BUDGET`` CPU seconds. Tune on cifar10-samples
only.

    PYTHONPATH=$PWD python research/probe_output_error.py IMAGE MODE BUDGET SEED [OUT.json]

``MODE`` is ``{ce|delta}-{cos|l2}-{adam|lbfgs|hyb}``; environment: ``TV``, ``LR``, ``MILESTONES`` (Adam's
decays, ``400,667,933``), ``SWITCH`` (400), ``OBJ2`` (``l2``: the distance after the switch).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_resnet_levers as levers  # noqa: E402  (the bench capture, scorer and labels)


def main(image: int, mode: str, budget: float, seed: int, out: str | None) -> None:
    torch.set_num_threads(1)
    start = time.process_time()
    capture, score, result, features = levers.setup(image)
    net = levers.module(capture, result, features, {}).net.eval()
    params = {k: v.detach() for k, v in net.named_parameters()}
    names = [k for k in params if k in capture.gradients]
    target = [capture.gradients[k].float() for k in names]
    tn2 = sum((t ** 2).sum() for t in target)
    delta = capture.gradients[capture.last_layer_keys[1]].float().reshape(1, -1)
    soft = result.soft.float().reshape(1, -1)
    frozen, distance, method = mode.split("-")
    tv_weight, switch = float(os.environ.get("TV", "2e-3")), int(os.environ.get("SWITCH", "400"))

    def objective(x: torch.Tensor) -> torch.Tensor:
        ps = {k: v.clone().requires_grad_(k in names) for k, v in params.items()}
        z = functional_call(net, ps, (x,))
        loss = (z * delta).sum() if frozen == "delta" else torch.nn.functional.cross_entropy(z, soft)
        gs = torch.autograd.grad(loss, [ps[k] for k in names], create_graph=True)
        if distance == "l2":
            d = sum(((g - t) ** 2).sum() for g, t in zip(gs, target)) / tn2
        else:
            num = sum((g * t).sum() for g, t in zip(gs, target))
            d = 1 - num / (sum((g ** 2).sum() for g in gs).sqrt() * tn2.sqrt())
        tv = (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()
        return d + tv_weight * tv

    def lbfgs() -> torch.optim.Optimizer:
        return torch.optim.LBFGS([x], lr=1, max_iter=1, history_size=100)

    torch.manual_seed(seed)
    x = (0.5 + 0.25 * torch.randn(1, 3, 32, 32)).clamp(0, 1).requires_grad_()  # the gaussian init
    if method == "lbfgs":
        opt: torch.optim.Optimizer = lbfgs()
    else:
        opt = torch.optim.Adam([x], lr=float(os.environ.get("LR", "0.025")))
        milestones = [int(m) for m in os.environ.get("MILESTONES", "400,667,933").split(",")]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, 0.1)
    curve: list[tuple[int, float, float, float]] = []
    it, excluded = 0, 0.0
    while time.process_time() - start - excluded < budget:
        if method == "hyb" and it == switch:
            method, distance, opt = "lbfgs", os.environ.get("OBJ2", "l2"), lbfgs()
        if method == "lbfgs":
            def closure(opt: torch.optim.Optimizer = opt) -> torch.Tensor:
                opt.zero_grad()
                loss = objective(x)
                loss.backward(inputs=[x])
                return loss
            value = float(opt.step(closure))
        else:
            opt.zero_grad()
            loss = objective(x)
            loss.backward(inputs=[x])
            x.grad.sign_()
            opt.step()
            sched.step()
            value = float(loss)
        with torch.no_grad():
            x.clamp_(0, 1)
        it += 1
        if it % 10 == 0:
            a = time.process_time()
            curve.append((it, a - start - excluded, score(x.detach().clamp(0, 1)), value))
            excluded += time.process_time() - a
            if it % 50 == 0:
                print(mode, image, seed, curve[-1], flush=True)
    print("FINAL", mode, image, seed, curve[-1], flush=True)
    if out:
        results = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
        results[f"{mode}@{image}/{seed}"] = curve
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4]),
         sys.argv[5] if len(sys.argv) > 5 else None)
