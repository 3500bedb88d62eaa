"""Check the memory model of ``attack.pack: auto`` (gi/attack/recon/memory.py) against measured peak memory on the CPU.

For each case, two fresh processes fit ``lo`` and ``hi`` packed captures (a few iterations) and report their peak
resident memory growth during the fit (``ru_maxrss``); the slope is the measured bytes per capture, printed next to
:func:`gi.attack.recon.memory.bytes_per_capture`. Usage::

    PYTHONPATH=$PWD python research/pack_memory.py          # the cases of the table of docs/results/throughput-gpu.md
    PYTHONPATH=$PWD python research/pack_memory.py one resnet18 4 1 1 adam 2   # internal: one measurement
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

CASES = [  # model, batch, restarts, optimizer, iterations, (lo, hi) captures
    ("resnet18", 1, 1, "adam", 2, (1, 4)),
    ("resnet18", 8, 1, "adam", 2, (1, 2)),
    ("lenet", 1, 4, "lbfgs", 150, (4, 16)),
    ("lenet", 1, 4, "adam", 150, (4, 16)),
]


def one(name: str, n: int, restarts: int, batch: int, optimizer: str, iterations: int) -> dict:
    import torch

    from gi.attack.recon import ReconConfig, reconstruct_many
    from gi.attack.recon.memory import bytes_per_capture
    from gi.label_result import LabelResult
    from gi.world import data as gdata
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import build

    torch.set_num_threads(1)
    ds = gdata.load("cifar10-samples")
    model = build(name, 10, seed=0)
    caps, labels = [], []
    for i in range(n):
        start = (i * batch) % (len(ds.images) - batch + 1)
        c, t = capture_gradients(model, ds.images[start:start + batch], ds.labels[start:start + batch],
                                 Protocol(batch_size=batch))
        caps.append(c)
        labels.append(LabelResult.from_counts("truth", t.counts, soft=t.targets))
    cfg = ReconConfig(iterations=iterations, restarts=restarts, optimizer=optimizer, progress=False, threads=1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reconstruct_many(caps, labels, config=cfg)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"growth": (peak - before) * 1024, "estimate": bytes_per_capture(caps[0], cfg)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        name, n, restarts, batch, optimizer, iterations = sys.argv[2:8]
        print(json.dumps(one(name, int(n), int(restarts), int(batch), optimizer, int(iterations))))
        return
    mib = 2 ** 20
    print("| model | batch | restarts | optimiser | captures | measured MiB per capture | estimated | "
          "estimate / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for name, batch, restarts, optimizer, iterations, (lo, hi) in CASES:
        runs = [json.loads(subprocess.run([sys.executable, __file__, "one", name, str(n), str(restarts), str(batch),
                                           optimizer, str(iterations)], check=True, capture_output=True,
                                          text=True).stdout.strip().splitlines()[-1]) for n in (lo, hi)]
        measured = (runs[1]["growth"] - runs[0]["growth"]) / (hi - lo)
        estimate = runs[0]["estimate"]
        print(f"| {name} | {batch} | {restarts} | {optimizer} | {lo} → {hi} | {measured / mib:.1f} | "
              f"{estimate / mib:.1f} | {estimate / measured:.2f} |", flush=True)


if __name__ == "__main__":
    main()
