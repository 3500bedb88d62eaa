"""Attack a saved capture: ``gi run`` writes one, ``gi attack`` re-runs the label-first attack on it.

The server side needs nothing but the capture file (and, to score, the truth file ``gi run`` keeps beside it):
``gi attack CAPTURE`` picks the label method from the capture (``labels.method: auto``), computes the last-layer
features, reconstructs, and writes the same self-contained output directory as ``gi run``. Same seed, same
machine: the same labels and images as the original run.

Run from the repository root::

    PYTHONPATH=. python examples/attack_saved_capture.py                    # 300 iterations, runs/ under a temp dir
    PYTHONPATH=. python examples/attack_saved_capture.py --iterations 2000 --out runs/example

The same on the command line::

    gi run configs/demo.yaml out=runs/demo
    gi attack runs/demo out=runs/demo-attack                  # unscored: the server has no truth
    gi attack runs/demo truth=runs/demo out=runs/demo-scored  # scored against the run's truth
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300,
                        help="attack iterations (the default preset's L-BFGS; only used where a capture is optimised: "
                        "the DLG LeNet of configs/demo.yaml is answered by the analytic inversion)")
    parser.add_argument("--out", help="parent folder of the two output directories (default: a temporary one)")
    args = parser.parse_args(argv)

    import torch

    from gi.core.config import load
    from gi.experiments.attack import run_attack
    from gi.experiments.config.attack import load_attack_config
    from gi.experiments.config.run import RunConfig
    from gi.experiments.run import run

    work = Path(args.out or tempfile.mkdtemp(prefix="gi-attack-example-"))
    keys = [f"attack.iterations={args.iterations}", "attack.progress=false", "metrics.lpips_vgg=false"]
    first = run(load(RunConfig, "configs/demo.yaml", keys + [f"out={work / 'run'}"]))   # victim + attack
    again = run_attack(load_attack_config(str(work / "run"), keys[:2] + [f"truth={work / 'run'}",
                                                                         f"out={work / 'attack'}"]))
    rec = again.outcome.reconstructions[0]
    summary = {"labels": json.loads((work / "attack" / "metrics.json").read_text())["labels"]["method"],
               "same_labels": bool(torch.equal(rec.labels, first.reconstruction.labels)),
               "same_images": bool(torch.equal(rec.images, first.reconstruction.images)),
               "psnr_run": first.metrics["psnr_mean"], "psnr_attack": again.metrics["psnr_mean"],
               "outputs": [str(work / "run"), str(work / "attack")]}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
