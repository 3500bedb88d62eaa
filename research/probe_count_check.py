"""Probe for docs/results/realistic.md (S4, "Counts checked against the gradient"): a label method's batch counts
before and after `labels.slot_check.check_counts`, against the true counts, on an ablate config's captures.

    GI_CACHE_DIR=.cache PYTHONPATH=$PWD python research/probe_count_check.py configs/ablate/s4-fmnist-bn.yaml \
        trials=6 [--method posterior]
"""

import sys
import time

import torch

import labels
from gi.core.config import load
from gi.experiments.config.ablate import AblateConfig
from gi.world.build import build_victim, capture_client, make_aux
from labels.slot_check import check_counts


def main(argv: list[str]) -> None:
    """Print, per capture, the samples off before and after the check, its moves, mismatches and CPU seconds."""
    torch.set_num_threads(1)
    method = argv[argv.index("--method") + 1] if "--method" in argv else "posterior"
    cfg = load(AblateConfig, argv[0], [a for a in argv[1:] if "=" in a])
    dataset, model = build_victim(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    captures = [capture_client(cfg, dataset, model, gen) for _ in range(cfg.trials)]
    aux = make_aux(cfg, dataset, gen, [t for _, t in captures])
    exact = [0, 0]
    for capture, truth in captures:
        found = labels.recover(capture, method, aux=aux)
        start = time.process_time()
        checked = check_counts(capture, found)
        seconds = time.process_time() - start
        true = truth.counts.long()
        off = [int((r.counts - true).abs().sum()) // 2 for r in (found, checked)]
        exact = [e + (o == 0) for e, o in zip(exact, off)]
        g = checked.info["gradient_check"]
        print(f"samples off {off[0]} -> {off[1]}; moves {g.get('moved')} mismatch "
              f"{g.get('recovered_residual', float('nan')):.1e} -> {g.get('residual', float('nan')):.1e}; "
              f"{g.get('tried')} tried, {seconds:.1f} CPU s {g.get('reason', '')}")
    print(f"exact counts: {exact[0]}/{len(captures)} -> {exact[1]}/{len(captures)}")


if __name__ == "__main__":
    main(sys.argv[1:])
