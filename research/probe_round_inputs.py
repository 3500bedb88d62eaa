"""Probe: a FedAvg client round's first-linear-layer update disaggregated into per-image inputs.

For SGD without momentum, ΔW₁ = −η Σ_τ (1/B) Σ_{i∈τ} δ_i(θ_τ) x_i(θ_τ)ᵀ: its rows lie (up to the drift of θ_τ)
in the span of the N conv features x_i, whatever the batch order or the number of epochs. Run:
  .venv/bin/python research/probe_round_inputs.py N B E lr hidden samples zero_tol sign_tol
"""
import sys
import time

import torch

from fcn_analytic.disaggregate import linear_inputs
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build

torch.set_num_threads(1)
n, b, e, lr, hidden = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ds = gdata.load("fashion-mnist")
model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[32, 64], hidden=hidden)
gen = torch.Generator().manual_seed(0)
idx = torch.randperm(len(ds.labels), generator=gen)[:n]
proto = Protocol(scheme="fedavg", batch_size=b, num_samples=n, local_epochs=e, lr=lr)
cap, truth = simulate_client(model, (ds.images[idx], ds.labels[idx]), proto, rng=gen)
dw, db = -cap.update["body.1.weight"].double(), -cap.update["body.1.bias"].double()
with torch.no_grad():
    x = model.body[0](model.normalize(ds.images[idx])).double()
sv = torch.linalg.svdvals(dw)
print("singular values around N:", [f"{v:.2e}" for v in sv[n - 3:n + 3].tolist()], "top", f"{sv[0]:.2e}")
t = time.process_time()
try:
    samples, zero_tol, sign_tol = int(sys.argv[6]), *(float(a) for a in sys.argv[7:9])
    found = linear_inputs(dw, db, n, samples=samples, seed=0, zero_tol=zero_tol, sign_tol=sign_tol).inputs
except Exception as exc:  # noqa: BLE001
    print("linear_inputs failed:", exc)
    sys.exit()
print(f"found {found.shape[0]} inputs in {time.process_time() - t:.1f} CPU s")
cos = torch.nn.functional.normalize(found, dim=1) @ torch.nn.functional.normalize(x, dim=1).T
best = cos.max(1).values
hit = len(set(cos.argmax(1).tolist()))
print(f"cosine to the nearest true input: mean {best.mean():.4f} min {best.min():.4f}; truths hit {hit} of {n}")
