"""Tune the default attack recipe (README "Default job"): the 20 cifar10-samples of ``configs/default.yaml``
(seed 0), each its own capture, labels ``soft-lambda`` (kind auto, what ``auto`` picks), reconstructed in one
batched problem with the given attack keys; prints PSNR mean / median (torch's: the lower middle value) / min,
wall and CPU seconds per image.

    PYTHONPATH=$PWD python scripts/tune_default.py all iterations=2000 restarts=1 feature_weight=1.0
    PYTHONPATH=$PWD python scripts/tune_default.py "[0, 3, 16]" restarts=2

Keys are ``ReconConfig`` fields over the ``default`` preset (values are Python literals).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import time

import torch

import labels
from gi.experiments.pipeline import build_victim, capture_client, load_run_config
from gi.metrics import psnr
from gi.recon import reconstruct_many
from gi.recon.config import ReconConfig


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    indices = list(range(20)) if argv[0] == "all" else list(ast.literal_eval(argv[0]))
    keys = argv[1:]
    cfg = load_run_config("configs/demo.yaml")
    dataset, model = build_victim(cfg)
    captures, truths = [], []
    for i in indices:
        one = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, indices=[i]))
        capture, truth = capture_client(one, dataset, model, torch.Generator().manual_seed(0))
        captures.append(capture)
        truths.append(truth)
    results = [labels.recover(c, "soft-lambda", kind="auto") for c in captures]
    settings = {"progress": False, "threads": 1}
    for key in keys:
        name, value = key.split("=", 1)
        settings[name] = ast.literal_eval(value)
    config = ReconConfig.from_preset("default", **settings)
    start, cpu = time.perf_counter(), time.process_time()
    recs = reconstruct_many(captures, results, None, config)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    values = torch.tensor([float(psnr(r.images, t.images).mean()) for r, t in zip(recs, truths)])
    n = len(indices)
    print(json.dumps(settings), f"n={n} wall_per={wall / n:.2f} cpu_per={cpu / n:.2f} mean={values.mean():.2f} "
          f"median={values.median():.2f} min={values.min():.2f}")
    print(" ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main(sys.argv[1:])
