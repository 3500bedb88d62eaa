"""Side-by-side cost of one gradient-inversion iteration: this toolkit vs breaching (Geiping et al.).

Same machine, same process, same torch threads, same model weights and capture (one CIFAR-10 sample, FedSGD,
oracle labels), same kind of attack (cosine distance + TV, signed Adam, boxed); the two loops alternate in
``--rounds`` rounds so that load changes on a shared machine hit both alike; medians of the per-iteration
wall times are reported. breaching is wired as its authors wire it (:func:`gi.experiments.ttq.breaching_setup`:
the model without our ``Normalize`` layer, the CIFAR mean/std in its metadata, its candidate in normalised space,
TV 5e-4 by default: its CIFAR notebook's value).

This script measures the cost of a step only. Time to a PSNR level (which recipe gets there first) is
``gi bench configs/bench/ttq-lenet.yaml`` (and ``ttq-resnet18.yaml``, ``ttq-batch8.yaml``):
docs/results/time-to-quality.md. breaching is not a dependency of this project: install its wheel (and hydra-core) into
a
separate folder and put it on PYTHONPATH, e.g.

    pip download --no-deps breaching==0.1.2 -d /tmp/w && pip install --no-deps --target /tmp/br /tmp/w/*.whl
    pip install --target /tmp/br hydra-core
    PYTHONPATH=$PWD:/tmp/br GI_THREADS=1 python scripts/compare_breaching.py --model lenet --iterations 200

Ours runs through ``gi.reconstruct`` (Lightning loop included); R restarts are one batched problem for us and
R sequential trials for breaching (its only mode). ``--layered`` adds a third contender in the same rounds: ours
with the per-layer objective forced (``GradientInversion.flat`` off), which is what a GPU step of a large net ran
before it matched one concatenated vector (the before / after of that change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def breaching_seconds(capture, labels: torch.Tensor, iterations: int, restarts: int, device: str = "cpu",
                      tv: float = 5e-4) -> float:
    """Wall seconds per iteration of breaching's invertinggradients attack (its defaults except iterations and TV)."""
    from gi.experiments.ttq import breaching_setup

    attacker, payload, shared, _, _ = breaching_setup(capture, labels, tv, iterations, device)
    attacker.cfg.restarts.num_trials = restarts
    _sync(device)
    start = time.perf_counter()
    attacker.reconstruct(payload, shared, {}, dryrun=False)
    _sync(device)
    return (time.perf_counter() - start) / iterations


def ours_seconds(capture, truth, iterations: int, restarts: int, device: str = "cpu", flat: bool | None = None
                 ) -> float:
    """Wall seconds per iteration of ``gi.reconstruct``; ``flat``: force the concatenated (True) or the per-layer
    (False) objective, ``GradientInversion.flat``; None: its own rule for the device."""
    import labels as label_methods
    from gi.attack.recon import ReconConfig, reconstruct
    from gi.attack.recon.module import GradientInversion

    cfg = ReconConfig(iterations=iterations, restarts=restarts, objective="cosine", optimizer="adam", lr=0.1,
                      signed=True, regularizers={"tv": 2e-3}, progress=False, log_every=10**9, threads=None,
                      device=device)
    result = label_methods.recover(capture, "idlg")
    rule = GradientInversion.flat
    if flat is not None:
        GradientInversion.flat = lambda self: flat
    try:
        _sync(device)
        start = time.perf_counter()
        reconstruct(capture, result, config=cfg)
        _sync(device)
    finally:
        GradientInversion.flat = rule
    return (time.perf_counter() - start) / iterations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lenet", help="gi.world.models name (lenet, resnet18, ...)")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--restarts", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both attacks run there; timings synchronise)")
    ap.add_argument("--tv", type=float, default=5e-4, help="breaching's TV scale (normalised space)")
    ap.add_argument("--layered", action="store_true", help="also time ours with the per-layer objective forced")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("GI_THREADS", "1")))

    import gi
    from gi.world.data import load
    from gi.world.models import build

    data = load("cifar10-samples")
    x, y = data.images[:1], data.labels[:1]
    model = build(args.model, 10, seed=0, **({"init": "uniform"} if args.model == "lenet" else {})).eval()
    capture, truth = gi.capture_gradients(model, x, torch.nn.functional.one_hot(y, 10).float(), gi.Protocol())
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for r in args.restarts:
            times.setdefault(f"ours R={r}", []).append(ours_seconds(capture, truth, args.iterations, r, args.device))
            if args.layered:
                times.setdefault(f"ours layered R={r}", []).append(
                    ours_seconds(capture, truth, args.iterations, r, args.device, flat=False))
            times.setdefault(f"breaching R={r}", []).append(
                breaching_seconds(capture, y, args.iterations, r, args.device, args.tv))
    rows = {k: statistics.median(v) for k, v in times.items()}
    report = {"model": args.model, "breaching_wiring": "normalised space (model without Normalize)", "tv": args.tv,
              "iterations": args.iterations, "threads": torch.get_num_threads(),
              "load_average": os.getloadavg(), "torch": torch.__version__, "device": args.device,
              "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "ms_per_iteration": {k: 1000 * v for k, v in rows.items()},
              "all_ms": {k: [1000 * t for t in v] for k, v in times.items()}}
    for k, v in rows.items():
        print(f"{args.model:>9s} {k:>14s}: {1000 * v:8.2f} ms/iteration")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
