"""Probe: over E > 1 local epochs, are a round's E·N visits (one input per image and epoch) found as inputs?

Each epoch sees every image once at other parameters, so −ΔW₁/η spans up to E·N inputs (a hidden layer at least
that wide). Disaggregating E·N "samples" then grouping them by image would give each image E targets.
  .venv/bin/python research/probe_round_visits.py N B E lr hidden programs_per_visit
"""
import sys
import time

import torch

from fcn_analytic.disaggregate import UPDATE_TOLERANCES, linear_inputs
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build


def round_layer(n: int, b: int, e: int, lr: float, hidden: int):
    """A FedAvg round of the client-round CNN (3×3 convs of 32 and 64, a hidden layer of ``hidden``) over ``n``
    Fashion-MNIST test images, ``e`` epochs of reshuffled batches of ``b`` at ``lr``: the hidden layer's −ΔW/η,
    −Δb/η and its true inputs at the global model (float64)."""
    ds = gdata.load("fashion-mnist")
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[32, 64], hidden=hidden)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(ds.labels), generator=gen)[:n]
    proto = Protocol(scheme="fedavg", batch_size=b, num_samples=n, local_epochs=e, lr=lr)
    cap, _ = simulate_client(model, (ds.images[idx], ds.labels[idx]), proto, rng=gen)
    dw, db = -cap.update["body.1.weight"].double() / lr, -cap.update["body.1.bias"].double() / lr
    with torch.no_grad():
        x = model.body[0](model.normalize(ds.images[idx])).double()
    return dw, db, x


def main() -> None:
    torch.set_num_threads(1)
    n, b, e, lr, hidden, per = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                                int(sys.argv[5]), int(sys.argv[6]))
    dw, db, x = round_layer(n, b, e, lr, hidden)
    sv = torch.linalg.svdvals(dw)
    visits = e * n
    print("singular values around N:", [f"{v:.2e}" for v in sv[n - 2:n + 2].tolist()],
          "around E·N:", [f"{v:.2e}" for v in sv[visits - 2:visits + 2].tolist()])
    t = time.process_time()
    try:
        found = linear_inputs(dw, db, visits, samples=1, programs=per * visits, seed=0, **UPDATE_TOLERANCES).inputs
    except Exception as exc:  # noqa: BLE001
        print("linear_inputs failed:", exc)
        sys.exit()
    print(f"found {found.shape[0]} inputs in {time.process_time() - t:.1f} CPU s")
    cos = torch.nn.functional.normalize(found, dim=1) @ torch.nn.functional.normalize(x, dim=1).T
    best, which = cos.max(1)
    hits = torch.bincount(which[best > 0.95], minlength=n)
    print(f"cosine to the nearest true input: mean {best.mean():.4f} min {best.min():.4f}; images hit "
          f"{int((hits > 0).sum())} of {n}; visits per image {sorted(hits.tolist())}")


if __name__ == "__main__":
    main()
