"""Probe: the body polish (fcn_analytic.polish) on the ReLU LeNet's walk, at a chosen step size and length, on
captures the walk answers and on those it does not (a rank-deficient conv2), where ``invert`` itself skips it.

    python research/probe_polish.py INIT SEED LR ITERATIONS IMAGE [IMAGE ...]

INIT: ``uniform`` (DLG's) or ``null`` (PyTorch's); cifar10-samples images. Prints, per image, the walk's PSNR and
shared-gradient mismatch, and the polished image's (docs/results/realistic.md, S1, "The body polish").
"""

from __future__ import annotations

import sys
import time

import torch

import fcn_analytic
import labels
from fcn_analytic.features import output_gradient
from fcn_analytic.invert import polish_layers
from fcn_analytic.polish import polish
from gi.analysis.metrics import psnr
from gi.attack.recon.mismatch import shared_mismatch
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def main() -> None:
    torch.set_num_threads(1)
    init, seed, lr, iterations = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    ds = gdata.load("cifar10-samples")
    sys.modules["fcn_analytic.invert"].polishable = lambda reports: False  # the walk's own image, polished below
    for img in (int(a) for a in sys.argv[5:]):
        model = build("lenet", 10, activation="relu", init=None if init == "null" else init, seed=seed)
        y = torch.zeros(1, 10)
        y[0, int(ds.labels[img])] = 1
        cap, truth = capture_gradients(model, ds.images[img:img + 1], y, Protocol())
        inv = fcn_analytic.invert(cap, labels.recover(cap, "auto"))
        with torch.device("meta"):
            layers = fcn_analytic.analytic_layers(cap.architecture())
        known = polish_layers(layers, inv.features, inv.layers)
        top = cap.model_state["fc.weight"].double().T @ output_gradient(cap, inv.features["fc"])
        mean = cap.model_state["normalize.mean"].double().reshape(-1, 1, 1)
        std = cap.model_state["normalize.std"].double().reshape(-1, 1, 1)
        t = time.process_time()
        done = polish(cap.model(), known, cap.shared, top, inv.raw, mean, std, iterations=iterations, lr=lr)
        image = done.raw.clamp(0, 1).float()
        print(f"{init} seed {seed} image {img}: walk {float(psnr(inv.image, truth.images)):.2f} dB, mismatch "
              f"{shared_mismatch(cap, inv.image, y):.2e} -> polished {float(psnr(image, truth.images)):.2f} dB, "
              f"mismatch {shared_mismatch(cap, image, y):.2e}; objective {done.objective[0]:.3e} -> "
              f"{done.objective[1]:.3e}, {time.process_time() - t:.1f} CPU s, "
              f"{sum(k.output is not None for k in known)} layers' outputs known", flush=True)


if __name__ == "__main__":
    main()
