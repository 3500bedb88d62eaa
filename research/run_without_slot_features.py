"""Control for docs/results/default-job.md, "Batches end to end": `gi` with the label-keyed per-slot last-layer
features switched off (gi.attack.recon.problem.slot_features returning None), so every batch falls back to the
class means grad_W_c / grad_b_c as before that solve existed.

    PYTHONPATH=$PWD python research/run_without_slot_features.py --threads 1 run configs/batch8-default.yaml out=DIR
"""

import sys

import gi.attack.recon.problem as problem
from gi.cli import main

problem.slot_features = lambda *args, **kwargs: None

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
