"""Time to 25 / 30 dB of attack-recipe variants of the default job on single captures (the ``gi`` contender of
``gi bench`` kind time-to-quality: labels auto -> features -> reconstruct on one capture, CPU seconds of one
thread, scoring paused), the variants alternating per capture and round in one process so that load hits all
alike. Tune only on ``cifar10-samples`` / ``fashion-mnist``.

    PYTHONPATH=$PWD python research/ttq_probe.py images=0,1 budget=12 rounds=2 \
        "base:" "cull25:cull_after=25" "h100:history=100"

Arguments: ``images`` (comma-separated indices of the job's data), ``budget`` (CPU seconds per attack),
``rounds``, ``every`` (iterations between scored checkpoints), ``job`` (a run config), ``seed``, and variants
``name:key=value,key=value`` (ReconConfig fields over the job's preset; values are Python literals; ``history``:
a fixed L-BFGS memory instead of ``gi.attack.recon.optim.lbfgs_history``'s rule).
"""

from __future__ import annotations

import ast
import dataclasses
import statistics
import sys

import torch

import gi.attack.recon.optim
from gi.experiments.config.ttq import TTQConfig
from gi.experiments.ttq import CONTENDERS, AttackClock, build_victim_side, scorer
from gi.experiments.ttq_curves import time_to

TUNE_DATA = ("cifar10-samples", "fashion-mnist")


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    name, _, rest = text.partition(":")
    keys: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        k, v = item.split("=", 1)
        try:
            keys[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            keys[k] = v
    return name, keys


def main(argv: list[str]) -> None:
    opts = {"images": "0", "budget": "12", "rounds": "1", "every": "25", "job": "configs/default.yaml", "seed": "0"}
    variants = []
    for arg in argv:
        if ":" in arg:
            variants.append(parse_variant(arg))
        else:
            k, v = arg.split("=", 1)
            opts[k] = v
    images = [int(i) for i in opts["images"].split(",")]
    cfg = TTQConfig(name="probe", job=opts["job"], job_overrides=[f"data.images={images}", f"seed={opts['seed']}"],
                    contenders=["gi"], budget=float(opts["budget"]), every=int(opts["every"]))
    torch.set_num_threads(1)
    victim = build_victim_side(cfg)
    if victim.job.data.name not in TUNE_DATA:
        raise SystemExit(f"tune only on {TUNE_DATA}")
    base_attack = victim.job.attack
    results: dict[str, list[tuple[int, float | None, float | None, float]]] = {n: [] for n, _ in variants}
    for rnd in range(int(opts["rounds"])):
        for k, index in enumerate(images):
            order = variants if (k + rnd) % 2 == 0 else variants[::-1]
            for name, keys in order:
                keys = dict(keys)
                hist = keys.pop("history", None)  # a fixed L-BFGS memory (default: lbfgs_history's rule)
                gi.attack.recon.optim.LBFGS_HISTORY = int(hist or 100)
                gi.attack.recon.optim.LBFGS_LONG_HISTORY = int(hist or 400)
                victim.job = dataclasses.replace(victim.job, attack=dataclasses.replace(base_attack, **keys))
                clock = AttackClock()
                clock.start()  # one run of ours, no restarts: the contender's run resumes a started clock
                curve = CONTENDERS["gi"].run(cfg, victim, k, clock, scorer(victim.truths[k]), 0)
                t25, t30 = (time_to(curve.cpu, curve.psnr, lvl) for lvl in (25, 30))
                results[name].append((index, t25, t30, curve.psnr[-1]))
                it30 = next((i for i, p in zip(curve.iterations, curve.psnr) if p >= 30), None)
                print(f"round {rnd} image {index:2d} {name:>12s}: 25 dB {t25 or float('nan'):5.2f} s, 30 dB "
                      f"{t30 or float('nan'):5.2f} s (it {it30}), {curve.psnr[-1]:6.2f} dB after {curve.cpu[-1]:5.1f} s"
                      f" ({curve.iterations[-1]} it)", flush=True)
    for name, rows in results.items():
        t30 = [r[2] if r[2] is not None else float("inf") for r in rows]
        print(f"{name:>12s}: time to 30 dB median {statistics.median(t30):.2f} max {max(t30):.2f}; "
              + " ".join(f"{r[0]}:{r[2] or float('nan'):.1f}" for r in rows), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
