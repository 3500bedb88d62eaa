"""S2 probe (docs/results/realistic.md, S2): the label-keyed last-layer disaggregation
(gi.attack.recon.problem.slot_features) against the true per-image last-layer features, and against the class
means grad_W_c / grad_b_c, on the captures of an ablate config.

    PYTHONPATH=$PWD python research/probe_slot_features.py configs/ablate/s2-resnet32-bn.yaml trials=3
"""

import sys
import time

import torch
from scipy.optimize import linear_sum_assignment

from gi.attack.recon.problem import slot_features
from gi.core.config import load
from gi.experiments.config.ablate import AblateConfig
from gi.world.build import build_victim, capture_client
from gi.world.models import features_and_logits


def main() -> None:
    torch.set_num_threads(1)
    cfg = load(AblateConfig, sys.argv[1], sys.argv[2:])
    dataset, model = build_victim(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    for t in range(cfg.trials):
        cap, truth = capture_client(cfg, dataset, model, gen)
        net = cap.model().double().train(cap.protocol.model_mode == "train")
        with torch.no_grad():
            h = features_and_logits(net, truth.images.double(), cap.last_layer_name)[0]
        soft = truth.targets.double()
        start = time.process_time()
        found = slot_features(cap, soft, 0)
        seconds = time.process_time() - start
        gw, gb = cap.last_layer(torch.float64)
        cls = soft.argmax(1)
        msg = f"trial {t} labels {cls.tolist()}"
        if gb is not None:
            rel = ((gw[cls] / gb[cls, None] - h).norm(dim=1) / h.norm(dim=1))
            msg += f" | class means: relative error median {rel.median():.3f} max {rel.max():.3f}"
        if found is None:
            print(msg, "| slot_features: none", f"{seconds:.2f} CPU s")
            continue
        cost = torch.cdist(found, h) + 1e6 * (cls[:, None] != cls[None, :])  # a class's samples in either order
        rows, cols = linear_sum_assignment(cost.numpy())
        err = (found[rows] - h[cols]).norm(dim=1) / h[cols].norm(dim=1)
        print(msg, f"| slot_features: median {err.median():.2e} max {err.max():.2e}", f"{seconds:.2f} CPU s")


if __name__ == "__main__":
    main()
