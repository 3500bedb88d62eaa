"""A one-epoch round with the fit's feature refresh on (a probe, not wired in): the E > 1 refresh of the feature
targets from the images' zeros (``attack.feature_refresh``) against the update's exact row space, by making
``gi.attack.recon.problem.drifting_layer`` return one-epoch rounds too; ``base`` runs the same command unchanged.

    python research/probe_round_refresh_e1.py refresh|base SEED [OVERRIDES...]   (e.g. protocol.num_samples=100)
"""
import sys

import gi.attack.recon.problem as problem
from fcn_analytic.disaggregate import summed_layer
from gi.cli import main


def every_round(capture, layer):
    return None if layer is None else summed_layer(capture, layer)


if sys.argv[1] == "refresh":
    problem.drifting_layer = every_round
sys.exit(main(["--threads", "1", "run", "configs/fedavg-round.yaml", f"seed={sys.argv[2]}", *sys.argv[3:]]))
