"""The pursuit on a one-epoch round of N images (configs/fedavg-round.yaml at SEED with ``protocol.num_samples=N``):
how many of the hidden layer's true inputs (at θ⁰, cosine > 0.99) :func:`fcn_analytic.disaggregate.vertex_inputs`'
vertices and :func:`fcn_analytic.disaggregate.pursued_inputs` find, how many inputs the pursuit is sure of and
whether each is one, and its CPU seconds; with ``factors F …``, also :func:`fcn_analytic.disaggregate.pursue` from
the vertices themselves (8 steps) taking each candidate's F·N smallest entries as its zeros
(docs/results/client-round.md, "N = 100: the pursuit").

    python research/probe_round_pursuit.py SEED N [factors F ...]
"""
import sys
import time

import torch
from round_client import round_client

from fcn_analytic.disaggregate import pursue, pursued_inputs, vertex_inputs

torch.set_num_threads(1)
seed, n = int(sys.argv[1]), int(sys.argv[2])
capture, _, x0 = round_client(seed, 1, n)
gw, gb = capture.shared["body.1.weight"].double(), capture.shared["body.1.bias"].double()
truth = torch.nn.functional.normalize(x0.flatten(1), dim=1)


def covered(found: torch.Tensor) -> torch.Tensor:
    """Each found row's best cosine to a true input, and each true input's best cosine to a found row."""
    cos = torch.nn.functional.normalize(found, dim=1) @ truth.T
    return cos.amax(1), cos.amax(0)


start = time.process_time()
vertices = vertex_inputs(gw, gb, n)
print(f"vertex_inputs: {len(vertices)} vertices in {time.process_time() - start:.0f} CPU s, "
      f"{int((covered(vertices)[1] > 0.99).sum())} of {n} true inputs within cosine 0.99")
if sys.argv[3:4] == ["factors"]:
    v = torch.linalg.svd(gw, full_matrices=False)[2][:n].T
    for factor in (float(f) for f in sys.argv[4:]):
        ends = pursue(v, vertices, 8, factor)[0]
        print(f"pursue from the vertices, the {int(factor * n)} smallest entries as zeros: "
              f"{int((covered(ends)[1] > 0.99).sum())} of {n} true inputs within cosine 0.99")
start = time.process_time()
found = pursued_inputs(gw, gb, n)
rows, inputs = covered(found.inputs)
lowest = float(rows[:found.sure].min()) if found.sure else float("nan")
print(f"pursued_inputs: sure of {found.sure} of {n} in {time.process_time() - start:.0f} CPU s; of those, "
      f"{int((rows[:found.sure] > 0.99).sum())} within cosine 0.99 of a true input (lowest {lowest:.4f}); "
      f"{int((inputs > 0.99).sum())} of {n} true inputs found; the rows not sure of: "
      f"{int((rows[found.sure:] > 0.99).sum())} of {n - found.sure} within 0.99")
