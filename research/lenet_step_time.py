"""Milliseconds per L-BFGS step of the default job on ONE capture (docs/results/time-to-quality.md, issue 12):
the label and feature stages' CPU seconds, then the reconstruction's steady state (one start, memory full) split
into the objective with its backward pass and the optimiser step, for several L-BFGS variants, alternating rounds in
one process on one thread (process CPU time, so other jobs on a shared machine disturb it little).

    PYTHONPATH=$PWD python research/lenet_step_time.py
    PYTHONPATH=$PWD python research/lenet_step_time.py variants=old,compact,two-loop rounds=5 steps=100 image=3

Variants: ``compact`` / ``two-loop`` (this tree's BatchedLBFGS directions), ``old`` (BatchedLBFGS as it was at git
``ref``, default abd53e7: a list memory and the two-loop), ``hist=K`` (compact with K curvature pairs); a suffix
``+onednn`` keeps oneDNN convolutions (the step path before native small convolutions, ``small_convolutions``),
``+vmap`` keeps the vmap path for the one row (before the loop path took a single row after the cull):
``old+onednn+vmap`` is the step of the default preset on one capture after its cull as it was at abd53e7.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time
import types

import torch

from gi.attack.recon.module import GradientInversion
from gi.attack.recon.optim import BatchedLBFGS
from gi.attack.recon.problem import build_problem
from gi.attack.stages import feature_stage, label_stage
from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.world.build import build_victim, capture_all, make_aux


def old_lbfgs(ref: str) -> type:
    """BatchedLBFGS from gi/attack/recon/optim.py at git ``ref``."""
    src = subprocess.run(["git", "show", f"{ref}:gi/attack/recon/optim.py"], capture_output=True, text=True, check=True)
    mod = types.ModuleType("optim_at_" + ref)
    exec(compile(src.stdout, f"optim@{ref}", "exec"), mod.__dict__)
    return mod.BatchedLBFGS


def make_optimizer(variant: str, params: list[torch.Tensor], ref: str) -> torch.optim.Optimizer:
    variant = variant.split("+")[0]
    if variant == "old":
        return old_lbfgs(ref)(params, lr=1.0)
    if variant.startswith("hist="):
        return BatchedLBFGS(params, lr=1.0, history_size=int(variant[5:]))
    return BatchedLBFGS(params, lr=1.0, direction=variant)


def main(argv: list[str]) -> None:
    keys = dict(a.split("=", 1) for a in argv)
    variants = keys.get("variants", "old,compact").split(",")
    rounds, steps, warm = int(keys.get("rounds", 5)), int(keys.get("steps", 100)), int(keys.get("warm", 120))
    torch.set_num_threads(1)
    cfg = load(RunConfig, keys.get("config", "configs/default.yaml"),
                          [f"data.images=[{keys.get('image', 0)}]", f"seed={keys.get('seed', 0)}"])
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dataset, model = build_victim(cfg)
    captures, truths = capture_all(cfg, dataset, model, gen)
    aux = make_aux(cfg, dataset, gen, truths)
    attack = dataclasses.replace(cfg.attack, progress=False, threads=1, restarts=1, cull_after=0)
    for rep in range(2):  # the first pass pays the imports
        label_results, kind, lrec = label_stage(cfg.labels, captures, [None], aux)
        attack = dataclasses.replace(attack, labels=kind)
        features, _, frec = feature_stage(attack, captures, label_results)
        print(f"pass {rep}: labels {lrec['cpu_seconds']:.3f} CPU s ({lrec['method']}), "
              f"features {frec['cpu_seconds']:.3f} CPU s")
    problem = build_problem(captures, label_results, attack, features)
    modules = {}
    for v in variants:
        vmap = "+vmap" in v
        mod = GradientInversion(build_problem(captures, label_results, dataclasses.replace(attack, batching="vmap"),
                                              features) if vmap else problem, attack)
        if vmap:
            mod.vectorised = lambda: True  # this instance only: the vmap path although one row is left
        if "+onednn" in v:
            mod.macs_per_image = None  # unknown conv work: the default (oneDNN) convolutions
        opt = make_optimizer(v, [mod.images], keys.get("ref", "abd53e7"))
        mod.raw_optimizers, mod.raw_schedulers = [opt], [torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)]
        for i in range(warm):  # fill the memory
            mod.training_step(None, i)
        modules[v] = [mod, warm]
    per: dict[str, dict[str, list[float]]] = {v: {"step": [], "objective": [], "optimizer": []} for v in variants}
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            mod, done = modules[v]
            opt = mod.raw_optimizers[0]
            t_obj = t_opt = 0.0
            t0 = time.process_time()
            for _ in range(steps):
                a = time.process_time()
                opt.zero_grad(set_to_none=True)
                loss = mod.objective_and_backward()
                b = time.process_time()
                opt.step()
                c = time.process_time()
                t_obj, t_opt = t_obj + b - a, t_opt + c - b
                del loss
            total = time.process_time() - t0
            modules[v][1] = done + steps
            for name, val in (("step", total), ("objective", t_obj), ("optimizer", t_opt)):
                per[v][name].append(1e3 * val / steps)
    print(f"ms per step (CPU, 1 thread), median over {rounds} alternating rounds of {steps} steps after {warm}:")
    for v in variants:
        print(f"  {v:>10s}: step {statistics.median(per[v]['step']):6.2f}  objective+backward "
              f"{statistics.median(per[v]['objective']):6.2f}  optimiser {statistics.median(per[v]['optimizer']):6.2f}"
              f"   (rounds: {', '.join(f'{x:.2f}' for x in per[v]['step'])})")


if __name__ == "__main__":
    main(sys.argv[1:])
