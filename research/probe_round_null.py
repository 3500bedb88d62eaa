"""Probe: over E local epochs, how close do the update's row-space directions come to each image's input at θᵗ?

For the client of ``configs/fedavg-round.yaml`` at a seed and E: the null direction of each true input's zero
pattern (``fcn_analytic.disaggregate.null_directions``, the ceiling of the refresh) and the best cosine of the
feature stage's candidates (``drifting_inputs``) to each true input.
  .venv/bin/python research/probe_round_null.py SEED E        (e.g. 0 5, 1 5)
"""
import sys

import torch
from round_client import round_client

from fcn_analytic.disaggregate import drifting_inputs, null_directions, row_space, summed_layer

torch.set_num_threads(1)
seed, epochs = int(sys.argv[1]), int(sys.argv[2])
capture, truth, x0 = round_client(seed, epochs)
unit = torch.nn.functional.normalize(x0, dim=1)
summed = summed_layer(capture, "body.1")
basis = row_space(summed.weight)


def quantiles(t: torch.Tensor) -> list[str]:
    return [f"{v:.4f}" for v in t.quantile(torch.tensor([0, .25, .5, .75, 1.], dtype=t.dtype)).tolist()]


print(f"rank {basis.shape[1]}")
ceiling = (null_directions(basis, x0, 1e-6)[0] * unit).sum(1)
print("null directions of the true zero patterns, cosine to the input:", quantiles(ceiling))
found = drifting_inputs(summed.weight, summed.bias, summed.samples).inputs
cos = torch.nn.functional.normalize(found, dim=1) @ unit.T
print("feature stage's candidates, best cosine per true input:", quantiles(cos.max(0).values),
      f"> 0.99: {int((cos.max(0).values > 0.99).sum())}; images matched {len(set(cos.argmax(1).tolist()))}")
