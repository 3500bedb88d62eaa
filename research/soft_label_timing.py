"""Time ``soft-lambda`` on the exact captures of one ``gi labels`` config point, repeated.

``gi labels`` reports one wall-clock median per row; on a shared machine that is noisy. This rebuilds the captures
of every grid point of a config (same seeds as ``gi labels``), then runs ``labels.recover_many`` ``--reps`` times
on all of them at once and prints, per point, the median wall and CPU (thread) time per sample, top-1 accuracy and
mean L1 label error. One torch thread.

    python research/soft_label_timing.py configs/labels/softlabel-cifar10-lenet.yaml --reps 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import labels
from gi.core.config import load
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.world.scenarios import get_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--method", default="soft-lambda")
    ap.add_argument("--only", default="", help="run only grid points whose label contains this text")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load(LabelBenchConfig, args.config, args.overrides)
    options = cfg.labels.call(args.method)[1] if args.method in cfg.labels.methods else {}
    print(f"| point | n | top-1 | mean L1 | wall ms/sample (median of {args.reps}) | CPU ms/sample |")
    print("|---|---|---|---|---|---|")
    for index, (point, setup) in enumerate(grid_points(cfg)):
        if args.only not in point:
            continue
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + index)  # as gi.experiments.labels.run_label_bench
        trials = [t for i in range(cfg.trials) for t in get_scenario(cfg.scenario)(copy.deepcopy(setup), gen, i)]
        captures = [t.capture for t in trials]
        walls, cpus = [], []
        for _ in range(args.reps):
            w0, c0 = time.perf_counter(), time.thread_time()
            results = labels.recover_many(captures, args.method, **options)
            walls.append((time.perf_counter() - w0) / len(captures))
            cpus.append((time.thread_time() - c0) / len(captures))
        top1 = statistics.mean(float(r.ok and int(r.counts.argmax()) == int(t.truth.labels[0]))
                               for r, t in zip(results, trials))
        l1 = [float((r.soft - t.truth.targets.double()).abs().sum()) for r, t in zip(results, trials)
              if r.ok and r.soft is not None]
        print(f"| {point} | {len(captures)} | {top1:.4f} | {statistics.mean(l1) if l1 else float('nan'):.2e} | "
              f"{1e3 * statistics.median(walls):.2f} | {1e3 * statistics.median(cpus):.2f} |", flush=True)


if __name__ == "__main__":
    main()
