"""The test accuracy of the trained global model of `configs/fedavg-round.yaml` with a `train` override (the
checkpoint `gi run` trains, read from $GI_CACHE_DIR when it is there).
  GI_CACHE_DIR=DIR .venv/bin/python research/round_test_accuracy.py "train={epochs: 1}" seed=0
"""
import sys

import torch

from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.world.build import build_victim

torch.set_num_threads(1)
cfg = load(RunConfig, "configs/fedavg-round.yaml", sys.argv[1:])
dataset, model = build_victim(cfg)
model.eval()
with torch.no_grad():
    pred = torch.cat([model(dataset.images[i:i + 1000]).argmax(1) for i in range(0, len(dataset.labels), 1000)])
print(f"test accuracy {float((pred == dataset.labels).double().mean()):.4f} over {len(dataset.labels)} images "
      f"({cfg.data.name}/{cfg.data.split})")
