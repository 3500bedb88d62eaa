"""Tune the default attack recipe (docs/results/default-job.md) on the captures of a run config (default:
``configs/default.yaml``, the 20 cifar10-samples, each its own capture), run through the pipeline's own attack
stages (labels auto -> features -> reconstruct, one batched problem) with the given attack keys over the preset.
Prints, per seed, PSNR mean / median (torch's: the lower middle value) / min, CPU and wall seconds per image, and
the per-image PSNR; with several seeds also the pooled distribution.

    PYTHONPATH=$PWD python research/tune_default.py seeds=0,1
    PYTHONPATH=$PWD python research/tune_default.py seeds=0 images=[3,16] restarts=2 iterations=1000
    PYTHONPATH=$PWD python research/tune_default.py config=configs/default.yaml data.name=fashion-mnist \
        images=[0,1,2,3,4,5,6,7,8,9] seeds=0,1

Keys: ``seeds`` (comma-separated run seeds), ``config`` (a run config), ``images`` (data.images: a list or
``all``), ``data.*`` / ``model.*`` (run-config overrides), anything else a ``ReconConfig`` field over the
config's preset (values are Python literals). Tune only on ``cifar10-samples`` and ``fashion-mnist``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import time

import torch

from gi.analysis.metrics import match_images, psnr
from gi.attack.stages import attack_stages
from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.world.build import build_victim, capture_all, make_aux

TUNE_DATA = ("cifar10-samples", "fashion-mnist")


def literal(value: str) -> object:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def run_seed(path: str, overrides: list[str], keys: dict[str, object], seed: int) -> tuple[torch.Tensor, float, float]:
    """Per-image PSNR, CPU and wall seconds of the attack stages on the captures of ``path`` at ``seed``."""
    cfg = load(RunConfig, path, [*overrides, f"seed={seed}"])
    if cfg.data.name not in TUNE_DATA:
        raise SystemExit(f"tune only on {TUNE_DATA}, not {cfg.data.name}")
    attack = dataclasses.replace(cfg.attack, progress=False, threads=1, **keys)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dataset, model = build_victim(cfg)
    captures, truths = capture_all(cfg, dataset, model, gen)
    aux = make_aux(cfg, dataset, gen, truths)
    start, cpu = time.perf_counter(), time.process_time()
    outcome = attack_stages(cfg.labels, attack, captures, truths if cfg.labels.mode == "truth" else None, aux)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    values = []
    for rec, truth in zip(outcome.reconstructions, truths):
        perm = match_images(rec.images, truth.images) if rec.images.shape[0] > 1 else [0]
        values.append(psnr(rec.images[perm], truth.images))
    for w in outcome.warnings:
        print("  warning:", w[:160])
    objective = [float(r.objective.min()) for r in outcome.reconstructions]
    print("  objective " + " ".join(f"{o:.1e}" for o in objective))
    first = [min(r.history["objective"][0]) if r.history.get("objective") else float("nan")
             for r in outcome.reconstructions]
    print("  kept      " + " ".join(f"{o / f:.1e}" for o, f in zip(objective, first)))
    values = torch.cat(values)
    return values, cpu / len(values), wall / len(values)


def summary(values: torch.Tensor) -> str:
    return f"n={len(values)} mean={values.mean():.2f} median={values.median():.2f} min={values.min():.2f}"


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    path, seeds, overrides, keys = "configs/default.yaml", [0], [], {}
    for arg in argv:
        name, value = arg.split("=", 1)
        if name == "config":
            path = value
        elif name == "seeds":
            seeds = [int(s) for s in value.split(",")]
        elif name == "images":
            overrides.append(f"data.images={value}")
        elif "." in name:
            overrides.append(arg)
        else:
            keys[name] = literal(value)
    pooled = []
    for seed in seeds:
        values, cpu, wall = run_seed(path, overrides, keys, seed)
        pooled.append(values)
        print(json.dumps({"seed": seed, **keys}), overrides, f"{summary(values)} cpu_per={cpu:.2f} "
              f"wall_per={wall:.2f}", flush=True)
        print("  " + " ".join(f"{v:.1f}" for v in values), flush=True)
    if len(seeds) > 1:
        print("pooled", summary(torch.cat(pooled)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
