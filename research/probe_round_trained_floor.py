"""Which samples of the trained round leave a trace above the update's float32 floor (a probe).

For each of the config round's clients on the trained model (``train={epochs: 1}``): the rank of the first Linear
layer's summed update at :data:`fcn_analytic.disaggregate.RANK_TOL` against its N samples, the smallest output
error ‖softmax(z_i) − y_i‖ at θᵗ, how many are below 1e-4, and the model's accuracy on the client's images. A
sample whose error is below the floor adds nothing the update keeps: its input, and so its label, cannot be read.

    python research/probe_round_trained_floor.py SEED [CLIENTS]
"""
import sys

import torch
from round_client import round_clients

from fcn_analytic.disaggregate import RANK_TOL, summed_layer

torch.set_num_threads(1)
seed = int(sys.argv[1])
clients = int(sys.argv[2]) if len(sys.argv) > 2 else 6
captures, truths = round_clients(seed, ("train={epochs: 1}", f"trials={clients}"))
for c, t in zip(captures, truths):
    s = summed_layer(c, "body.1")
    sv = torch.linalg.svdvals(s.weight)
    with torch.no_grad():
        p = torch.softmax(c.model()(t.images), 1)
    g = (p - torch.nn.functional.one_hot(t.labels, c.num_classes)).norm(dim=1)
    rank, acc = int((sv > RANK_TOL * sv[0]).sum()), float((p.argmax(1) == t.labels).double().mean())
    print(f"seed {seed}: rank {rank} of {s.samples}, smallest error {float(g.min()):.1e}, "
          f"{int((g < 1e-4).sum())} below 1e-4, accuracy at θᵗ {acc:.2f}", flush=True)
