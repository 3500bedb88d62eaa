"""Does the attack return to the truth from near it (docs/results/batchnorm.md, "GroupNorm")? Fits a finished
run's capture with the ``resnet`` preset (keys overridden on the command line) from truth + N(0, σ²) (the start
given as the ``init=analytic`` image, true labels) and prints the start's and the result's PSNR.

    PYTHONPATH=$PWD python research/probe_basin.py RUN_DIR SIGMA ITERATIONS LR [optimizer=lbfgs] [tv=0.2]
"""

import sys
from pathlib import Path

import torch

from gi.attack.recon import ReconConfig
from gi.attack.recon.api import reconstruct_many
from gi.capture import Capture, Truth
from gi.label_result import LabelResult


def main() -> None:
    torch.set_num_threads(1)
    run, sigma, iterations, lr = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    keys: dict = {"init": "analytic", "iterations": iterations, "lr": lr, "progress": False, "retries": 0}
    for kv in sys.argv[5:]:
        key, value = kv.split("=", 1)
        keys.update({"regularizers": {"tv": float(value)}} if key == "tv" else {key: value})
    cap, truth = Capture.load(run / "capture.safetensors"), Truth.load(run / "truth.safetensors")
    x = truth.images.float()
    start = (x + sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)

    def psnr(a: torch.Tensor) -> float:
        return float(-10 * torch.log10(((a - x) ** 2).mean()))

    labels = LabelResult.from_counts("truth", truth.counts)
    rec = reconstruct_many([cap], [labels], None, ReconConfig.from_preset("resnet", **keys), priors=[start])[0]
    print(f"sigma {sigma}: start {psnr(start):.2f} dB -> {psnr(rec.images.float()):.2f} dB ({keys})", flush=True)


if __name__ == "__main__":
    main()
