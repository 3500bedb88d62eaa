"""Probes of the levers of issue 12's ResNet-18 line (docs/results/time-to-quality-resnet18.md, "Levers
tried"): on one capture of ``configs/bench/ttq-resnet18.yaml``'s job, signed Adam on the ``resnet`` preset's
objective with some of it changed, PSNR of the best iterate by the attack objective against CPU seconds of the
process (labels and features included, scoring excluded), every 10 iterations, one thread, until ``BUDGET`` CPU
seconds or the schedule's end.

    PYTHONPATH=$PWD python research/probe_resnet_levers.py run OUT.json IMAGE BUDGET NAME '{JSON}'
    PYTHONPATH=$PWD python research/probe_resnet_levers.py steps ROUNDS

``run`` JSON: ``resnet`` preset keys (``schedule``, ``lr``, ``init``, ``objective``, ...), ``keep`` (a list of
parameter-name prefixes: only those layers' gradients are matched, ``layer_weights`` 0 for the rest: cheaper
steps) and ``featinv`` (``{"steps", "lr", "tv", "kind": "cos" | "l2"}``: a first phase that fits the image to the
exact last-layer features f* (``fcn_analytic.last_layer_features``) plus TV by signed Adam, one plain backward per
step, before gradient matching). ``steps``: CPU ms of one objective + backward for layer subsets and a
channels-last net, alternating in one process (median of ``ROUNDS`` rounds of 3 steps). Tune on cifar10-samples
only.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fcn_analytic
import labels
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import build_problem
from gi.core.config import load
from gi.experiments import ttq
from gi.experiments.config.ttq import TTQConfig
from gi.world.models import features_and_logits

SUBSETS = {"all": None, "convs+fc": ("body.0.conv", "body.0.layer", "fc"),
           "conv1+layer1+fc": ("body.0.conv1", "body.0.bn1", "body.0.layer1", "fc"),
           "conv1+fc": ("body.0.conv1", "fc"), "layer4+fc": ("body.0.layer4", "fc")}


def setup(image: int) -> tuple[Any, Any, Any, torch.Tensor]:
    """The capture ``image`` of the bench's job, its scorer, soft-λ labels and exact features f*."""
    torch.set_num_threads(1)
    cfg = load(TTQConfig, "configs/bench/ttq-resnet18.yaml", [f"select=[{image}]", "contenders=[gi]"])
    victim = ttq.build_victim_side(cfg)
    capture = victim.captures[0]
    result = labels.recover(capture, "soft-lambda")
    return capture, ttq.scorer(victim.truths[0]), result, fcn_analytic.last_layer_features(capture, result)


def module(capture: Any, result: Any, features: torch.Tensor, spec: dict[str, Any]) -> GradientInversion:
    """The ``resnet`` preset's module with ``spec``'s keys; ``keep``: match only those layers."""
    spec = dict(spec)
    keep = spec.pop("keep", None)
    if keep:
        spec["layer_weights"] = {n: float(n.startswith(tuple(keep))) for n in capture.gradients}
    rc = ReconConfig.from_preset("resnet", progress=False, **spec)
    mod = GradientInversion(build_problem([capture], [result], rc, [features]), rc)
    mod.net.train(False)
    return mod


def feature_inversion(mod: GradientInversion, features: torch.Tensor, steps: int, lr: float, tv: float,
                      kind: str = "cos") -> None:
    """Fit the images to f* (cosine or relative L2) plus anisotropic TV by signed Adam, boxed to [0, 1]."""
    target = features.reshape(1, -1).float()
    opt = torch.optim.Adam([mod.images], lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        x = mod.images[0]
        f, _ = features_and_logits(mod.net, x)
        if kind == "cos":
            loss = 1 - torch.nn.functional.cosine_similarity(f, target).sum()
        else:
            loss = ((f - target) ** 2).sum() / (target ** 2).sum()
        smooth = (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()
        (loss + tv * smooth).backward()
        mod.images.grad.sign_()
        opt.step()
        with torch.no_grad():
            mod.images.clamp_(0, 1)


def run(out: str, image: int, budget: float, name: str, text: str) -> None:
    start, excluded = time.process_time(), 0.0  # the clock includes labels and features
    capture, score, result, features = setup(image)
    spec = json.loads(text)
    fi = spec.pop("featinv", None)
    mod = module(capture, result, features, spec)
    if fi:
        feature_inversion(mod, features, **fi)
    opt = torch.optim.Adam([mod.images], lr=mod.cfg.lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(mod.cfg.iterations * k / 8) for k in (3, 5, 7)], 0.1) \
        if mod.cfg.schedule == "multistep" else torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    best_loss, best, it = float("inf"), mod.images.detach().clone(), 0
    curve: dict[str, list[float]] = {"iterations": [], "cpu": [], "psnr": []}
    while time.process_time() - start - excluded < budget and it < mod.cfg.iterations:
        opt.zero_grad(set_to_none=True)
        loss = float(mod.objective_and_backward()[0])
        if loss < best_loss:
            best_loss, best = loss, mod.images.detach().clone()
        if mod.cfg.signed:
            mod.images.grad.sign_()
        opt.step()
        sched.step()
        with torch.no_grad():
            mod.images.clamp_(0, 1)
        it += 1
        if it % 10 == 0:
            a = time.process_time()
            curve["iterations"].append(it)
            curve["cpu"].append(a - start - excluded)
            curve["psnr"].append(score(best[0].clamp(0, 1)))
            excluded += time.process_time() - a
    print(f"{name}@{image}: {it} it, {curve['cpu'][-1]:.1f} s, {curve['psnr'][-1]:.2f} dB, "
          f"{1000 * curve['cpu'][-1] / it:.0f} ms/it, load {os.getloadavg()[0]:.1f}", flush=True)
    results = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
    results[f"{name}@{image}"] = {**curve, "spec": text}
    Path(out).write_text(json.dumps(results))


def steps(rounds: int) -> None:
    capture, _, result, features = setup(0)
    mods = {k: module(capture, result, features, {"keep": list(v)} if v else {}) for k, v in SUBSETS.items()}
    mods["channels_last"] = module(capture, result, features, {})
    mods["channels_last"].net.to(memory_format=torch.channels_last)
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(rounds):
        for k, m in mods.items():
            t = time.process_time()
            for _ in range(3):
                m.images.grad = None
                m.objective_and_backward()
            times[k].append((time.process_time() - t) / 3 * 1000)
    for k, v in times.items():
        print(f"{k} ({len(mods[k].names)} tensors matched): median {statistics.median(v):.0f} ms", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        steps(int(sys.argv[2]))
