"""Count the aten ops of one attack step, ours vs breaching (Geiping et al.), on one image (issue 15).

A GPU step of one small image is bound by kernel launches and the Python/dispatcher work in front of them, so the
number of aten ops per step predicts how the two compare on a GPU before one is lent. Both run on the CPU under
``torch.profiler``; the per-step count is the difference between a run of ``2k`` and of ``k`` iterations,
divided by ``k`` (setup cancels). Same wiring as ``scripts/compare_breaching.py`` (one restart, cosine + TV,
signed Adam). ``--flat``: force the concatenated-vector objective (what a GPU step uses) on the CPU.

    PYTHONPATH=$PWD:/tmp/br python scripts/step_ops.py --model resnet18 [--flat] [--top 20]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
import compare_breaching  # noqa: E402


def ops(run, iterations: int) -> collections.Counter[str]:
    """aten op names and counts of ``run(iterations)``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(iterations)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def per_step(run, k: int) -> collections.Counter[str]:
    """aten ops per step: (ops of 2k iterations − ops of k) / k."""
    short, long = ops(run, k), ops(run, 2 * k)
    return collections.Counter({name: (long[name] - short[name]) / k for name in long})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--steps", type=int, default=5, help="k: runs of k and 2k iterations")
    ap.add_argument("--flat", action="store_true", help="force the concatenated objective (the GPU path)")
    ap.add_argument("--top", type=int, default=0, help="print the N ops with the largest difference")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import gi
    from gi.world.data import load
    from gi.world.models import build

    data = load("cifar10-samples")
    x, y = data.images[:1], data.labels[:1]
    model = build(args.model, 10, seed=0, **({"init": "uniform"} if args.model == "lenet" else {})).eval()
    capture, truth = gi.capture_gradients(model, x, torch.nn.functional.one_hot(y, 10).float(), gi.Protocol())
    ours = per_step(lambda k: compare_breaching.ours_seconds(capture, truth, k, 1, flat=args.flat or None), args.steps)
    theirs = per_step(lambda k: compare_breaching.breaching_seconds(capture, y, k, 1), args.steps)
    print(f"{args.model}: aten ops per step, ours {sum(ours.values()):.0f}"
          f"{' (flat)' if args.flat else ''}, breaching {sum(theirs.values()):.0f}")
    names = sorted(set(ours) | set(theirs), key=lambda n: theirs[n] - ours[n])
    for name in names[:args.top]:
        print(f"  {name:40s} ours {ours[name]:8.1f}  breaching {theirs[name]:8.1f}")


if __name__ == "__main__":
    main()
