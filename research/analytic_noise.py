"""How the analytic inversion's largest layer residual tracks its image quality under gradient noise.

The default job answers a capture with ``fcn_analytic.invert``'s image when that residual is below
``attack.analytic_tol`` (1e-2); this prints, for cifar10-samples images and Gaussian noise of a fraction of each
shared gradient's std, the inversion's PSNR and residual (docs/results/default-job.md: how the tolerance was chosen).

    PYTHONPATH=$PWD python research/analytic_noise.py [images=0,1,2] [scales=1e-5,1e-4,1e-3,1e-2] [seed=0]
"""

from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> None:
    import fcn_analytic
    import labels
    from gi.analysis.metrics import psnr
    from gi.attack.stages import inversion_residual
    from gi.capture import Capture
    from gi.world import data as gdata
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import build

    opts = dict(a.split("=", 1) for a in argv)
    images = [int(i) for i in opts.get("images", "0,1,2").split(",")]
    scales = [float(s) for s in opts.get("scales", "1e-5,1e-4,1e-3,1e-2").split(",")]
    torch.set_num_threads(1)
    ds = gdata.load("cifar10-samples")
    model = build("lenet", 10, init="uniform", seed=int(opts.get("seed", 0)))  # configs/default.yaml's victim
    print("image  noise/std  PSNR dB  largest layer residual")
    for i in images:
        cap, _ = capture_gradients(model, ds.images[i:i + 1], ds.labels[i:i + 1], Protocol())
        for scale in [0.0, *scales]:
            g = torch.Generator().manual_seed(0)
            noisy = {k: v + scale * v.std() * torch.randn(v.shape, generator=g) for k, v in cap.gradients.items()}
            c = Capture(cap.model_spec, cap.model_state, cap.protocol, gradients=noisy, meta=cap.meta)
            inv = fcn_analytic.invert(c, labels.recover(c, "auto"))
            print(f"{i:5d}  {scale:9.0e}  {float(psnr(inv.image, ds.images[i:i + 1])):7.1f}  "
                  f"{inversion_residual(inv):.1e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
