"""Which ReLU LeNet captures leave a hidden convolution rank-deficient (the walk's ``lstsq`` route, or its null
space pinned by the input's zeros), and what the walk's image scores: cifar10-samples images under the zoo's
lenet (activation relu) at an init and seeds.
  .venv/bin/python research/probe_walk_rank.py INIT SEED [SEED ...]     (INIT: uniform or null)
"""
import sys
import time

import torch

import gi
import labels
from fcn_analytic import invert
from gi.analysis.metrics import psnr

torch.set_num_threads(1)
init = None if sys.argv[1] == "null" else sys.argv[1]
data = gi.data.load("cifar10-samples")
for seed in [int(s) for s in sys.argv[2:]]:
    model = gi.models.build("lenet", 10, activation="relu", init=init, seed=seed)
    for i in range(len(data.images)):
        capture, truth = gi.capture_gradients(model, data.images[i:i + 1], data.labels[i:i + 1], gi.Protocol())
        t = time.process_time()
        inv = invert(capture, labels.recover(capture, "auto"))
        routes = {r.name: r.route for r in inv.layers}
        said = "; ".join(f"{n}: {r}" for n, r in routes.items()
                         if "null space" in r or ("lstsq" in r and n != "body.0"))
        print(f"seed {seed} image {i:2d}: {float(psnr(inv.image, truth.images)[0]):6.2f} dB "
              f"({time.process_time() - t:5.1f} s) {said or 'every hidden layer full rank'}", flush=True)
