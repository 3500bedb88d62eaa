"""Are the cone's vertices the images' inputs at N images a round? The config round's client at SEED with
``protocol.num_samples=N`` (E = 1): the hidden layer's update's singular values around rank N, the inputs' zeros,
how far the inputs at θᵗ lie outside the update's top-N row space, and ``vertex_inputs``' N vertices (zero
tolerance 1e-4 and 1e-3) against those inputs; with ``drift``, also ``drifting_inputs`` (the E > 1 search: vertices
refined in the whole row space, the pursuit) (docs/results/client-round.md, "What is left").

    python research/probe_round_n_vertices.py SEED N [drift]
"""
import sys
import time

import torch
from round_client import round_client

from fcn_analytic.disaggregate import drifting_inputs, vertex_inputs

seed, n = int(sys.argv[1]), int(sys.argv[2])
capture, _, x0 = round_client(seed, 1, n)
gw, gb = capture.shared["body.1.weight"].double(), capture.shared["body.1.bias"].double()
x0 = x0.flatten(1)
sv = torch.linalg.svdvals(gw)
print("singular values n-3 .. n+2 over the largest:", [f"{v:.1e}" for v in (sv[n - 3:n + 3] / sv[0]).tolist()])
print("zeros per input (min, median) of", x0.shape[1], ":", int((x0 == 0).sum(1).min()), int((x0 == 0).sum(1).median()))
v = torch.linalg.svd(gw, full_matrices=False)[2][:n].T
outside = (x0 - (x0 @ v) @ v.T).norm(dim=1) / x0.norm(dim=1)
q = torch.tensor([0.0, 0.5, 1.0], dtype=outside.dtype)
print("inputs at θᵗ outside the top-n row space (min, median, max):", [round(float(t), 4) for t in outside.quantile(q)])
for tol in (1e-4, 1e-3):
    start = time.process_time()
    found = vertex_inputs(gw, gb, n, zero_tol=tol)
    best = (torch.nn.functional.normalize(x0, dim=1) @ torch.nn.functional.normalize(found, dim=1).T).max(1).values
    print(f"zero_tol {tol:g}: {len(found)} vertices in {time.process_time() - start:.0f} CPU s; each input's best "
          f"cosine (min, median, max): {[round(float(t), 3) for t in best.quantile(q)]}")
if sys.argv[3:] == ["drift"]:
    start = time.process_time()
    found = drifting_inputs(gw, gb, n).inputs
    best = (torch.nn.functional.normalize(x0, dim=1) @ torch.nn.functional.normalize(found, dim=1).T).max(1).values
    spread = [round(float(t), 3) for t in best.quantile(q)]
    print(f"drifting_inputs: {len(found)} inputs in {time.process_time() - start:.0f} CPU s; each input's best cosine "
          f"(min, median, max): {spread}, {int((best > 0.99).sum())} above 0.99")
