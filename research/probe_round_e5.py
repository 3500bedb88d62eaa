"""Probe: over E > 1 local epochs, how close are the candidates of the top-N subspace to the round's N inputs?

The hidden layer's −ΔW/η of a round of E epochs spans up to E·N visits (each image once an epoch, at drifting
parameters). This searches the top-N right singular vectors for nonnegative sparse vertices at loose tolerances and
scores each true input (the hidden layer's input at the global model) by its best candidate's cosine.
  .venv/bin/python research/probe_round_e5.py E zero_tol sign_tol programs      (e.g. 5 1e-2 5e-2 400)
"""
import sys
import time

import torch
from probe_round_visits import round_layer  # research/ is on the path when a script of it runs

from fcn_analytic.disaggregate import linear_inputs

torch.set_num_threads(1)
n, b, e, lr, hidden = 50, 5, int(sys.argv[1]), 0.01, 256
zt, st = float(sys.argv[2]), float(sys.argv[3])
dw, db, x = round_layer(n, b, e, lr, hidden)
sv = torch.linalg.svdvals(dw)
picks = [0, n - 2, n - 1, n, n + 1, 2 * n] + ([e * n - 1] if e * n < 256 else [])
print("sv", [f"{v:.2e}" for v in sv[picks].tolist()])
t = time.process_time()
try:
    c = linear_inputs(dw, db, n, samples=1, programs=int(sys.argv[4]), seed=0, method="lp", zero_tol=zt,
                      sign_tol=st).inputs
except Exception as ex:  # noqa: BLE001
    print("fail", ex)
    sys.exit()
best = ((c / c.norm(dim=1, keepdim=True)) @ (x / x.norm(dim=1, keepdim=True)).T).max(0).values
print(f"found {c.shape[0]} in {time.process_time() - t:.1f}s; true inputs with a candidate at cos > 0.99: "
      f"{int((best > 0.99).sum())}, > 0.95: {int((best > 0.95).sum())}, median best cos {best.median():.4f}")
