"""Probe for docs/results/batch-counts.md (posterior paper Table 2, ResNet-50 with SELU): the last-layer features
and posteriors of the untrained SELU ResNet-50 (C = 100, ImageNet stem, 32 px) under each BatchNorm mode, input
scaling and image source, two initialisations each: the feature mean, the share of negative features, the share
of samples whose feature sum is negative (LLG's sign premise fails for those) and the mean top softmax
probability (near 1: saturated posteriors, which iLRG cannot use).

    PYTHONPATH=$PWD python research/probe_selu_features.py
"""

import torch

from gi.world.data import load
from gi.world.models import build

torch.set_num_threads(1)
fmnist = load("fashion-mnist", "train", size=32).images[:64].repeat(1, 3, 1, 1)
cifar = load("cifar10-samples", size=32).images
for name, x in (("fashion-mnist [0,1]", fmnist), ("fashion-mnist (x-.5)/.5", (fmnist - 0.5) / 0.5),
                ("cifar10-samples [0,1]", cifar), ("cifar10-samples (x-.5)/.5", (cifar - 0.5) / 0.5)):
    for mode in ("eval", "train"):
        for seed in (0, 1):
            model = build("resnet50", 100, activation="selu", in_shape=(3, 32, 32), seed=seed, stem="imagenet")
            model.train(mode == "train")
            with torch.no_grad():
                f, z = model.features(x), model(x)
            negative, flipped = float((f < 0).float().mean()), float((f.sum(1) < 0).float().mean())
            top = float(z.softmax(1).max(1).values.mean())
            print(f"{name:26s} {mode:5s} seed {seed}  feature mean {float(f.mean()):8.3g}  negative {negative:.2f}  "
                  f"samples with sum < 0 {flipped:.2f}  mean top probability {top:.3f}")
