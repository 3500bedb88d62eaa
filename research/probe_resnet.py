"""Probes behind the ``resnet`` attack preset (gi/attack/recon/presets.py; docs/results/time-to-quality.md,
ResNet-18): one ResNet-18 capture of ``configs/bench/ttq-resnet18.yaml``'s job, a shared *prefix* of signed-Adam
steps at a constant lr, then *branches* that continue from the same state (a lr decay, L-BFGS, another TV
weight), so a schedule's tail is compared without re-running its head. PSNR of the best iterate by the attack
objective against CPU seconds of the process (scoring excluded), every 10 iterations, one thread.

    PYTHONPATH=$PWD python research/probe_resnet.py OUT.json IMAGE 'NAME|{JSON}' ...

JSON: ``cfg`` (ReconConfig keys over the ``ig`` preset: objective terms, init), ``lr`` and ``prefix`` (signed-Adam
steps), ``branches`` ({name: [[optimizer, lr, steps, {"tv": weight}], ...]}, optimizer ``sadam`` (signed Adam,
continuing the prefix's moments) or ``lbfgs``). Tune on cifar10-samples only.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

import fcn_analytic
import labels
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.optim import BatchedLBFGS
from gi.attack.recon.problem import build_problem
from gi.core.config import load
from gi.experiments import ttq
from gi.experiments.config.ttq import TTQConfig


class Clock:
    """CPU seconds of the process since start, scoring excluded."""

    def __init__(self, already: float = 0.0) -> None:
        self.t0, self.excluded = time.process_time() - already, 0.0

    def now(self) -> float:
        return time.process_time() - self.t0 - self.excluded


def steps(mod: GradientInversion, opt: torch.optim.Optimizer, signed: bool, n: int, state: dict, curve: dict,
          clock: Clock, score) -> None:
    """``n`` steps of ``opt`` on the module's images (box [0, 1]); the best iterate by objective is scored."""
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss = float(mod.objective_and_backward()[0])
        if loss < state["best_loss"]:
            state["best_loss"], state["best"] = loss, mod.images.detach().clone()
        if signed:
            mod.images.grad.sign_()
        opt.step()
        with torch.no_grad():
            mod.images.clamp_(0, 1)
        state["it"] += 1
        if state["it"] % 10 == 0:
            a = time.process_time()
            curve["iterations"].append(state["it"])
            curve["cpu"].append(clock.now())
            curve["psnr"].append(score(state["best"][0].clamp(0, 1)))
            clock.excluded += time.process_time() - a


def main(out: str, image: int, specs: list[str]) -> None:
    torch.set_num_threads(1)
    cfg = load(TTQConfig, "configs/bench/ttq-resnet18.yaml", [f"select=[{image}]", "contenders=[gi]"])
    victim = ttq.build_victim_side(cfg)
    score, capture = ttq.scorer(victim.truths[0]), victim.captures[0]
    result = labels.recover(capture, "soft-lambda")
    features = fcn_analytic.last_layer_features(capture, result)
    results = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
    for spec in specs:
        name, text = spec.split("|", 1)
        d = json.loads(text)
        rc = ReconConfig.from_preset("ig", **d["cfg"], progress=False)
        mod = GradientInversion(build_problem([capture], [result], rc, [features]), rc)
        mod.net.train(False)
        curve: dict = {"iterations": [], "cpu": [], "psnr": []}
        state = {"it": 0, "best_loss": float("inf"), "best": None}
        clock = Clock()
        opt = torch.optim.Adam([mod.images], lr=d["lr"])
        steps(mod, opt, True, d["prefix"], state, curve, clock, score)
        head = clock.now()
        print(f"{name}: prefix {state['it']} it, {head:.1f} s, {curve['psnr'][-1]:.2f} dB", flush=True)
        results[f"{name}@{image}"] = {**curve, "spec": text}
        snap = (mod.images.detach().clone(), copy.deepcopy(state), copy.deepcopy(opt.state_dict()))
        terms = dict(mod.problem.terms)
        for branch, phases in d.get("branches", {}).items():
            mod.images.data.copy_(snap[0])
            bstate, bcurve, bclock = copy.deepcopy(snap[1]), {k: list(v) for k, v in curve.items()}, Clock(head)
            for kind, lr, n, *extra in phases:
                options = extra[0] if extra else {}
                mod.problem.terms.clear()
                mod.problem.terms.update({**terms, **({"tv": options["tv"]} if "tv" in options else {})})
                if "tv" in options:  # another objective: its best iterate starts afresh
                    bstate["best_loss"] = float("inf")
                if kind == "lbfgs":
                    o: torch.optim.Optimizer = BatchedLBFGS([{"params": [mod.images], "lr": lr}], lr=lr)
                else:
                    o = torch.optim.Adam([mod.images], lr=lr)
                    o.load_state_dict(snap[2])
                    for group in o.param_groups:
                        group["lr"] = lr
                steps(mod, o, kind == "sadam", n, bstate, bcurve, bclock, score)
            mod.problem.terms.clear()
            mod.problem.terms.update(terms)
            at = {t: ttq.psnr_at(bcurve["cpu"], bcurve["psnr"], t) for t in (250, 300)}
            print(f"  {name}/{branch}: {bstate['it']} it, {bcurve['cpu'][-1]:.1f} s, {bcurve['psnr'][-1]:.2f} dB "
                  f"(at 250 s {at[250]}, at 300 s {at[300]}), load {os.getloadavg()[0]:.1f}", flush=True)
            results[f"{name}/{branch}@{image}"] = {**bcurve, "spec": text}
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
