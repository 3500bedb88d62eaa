"""Probe: the E > 1 feature stage's refinement (null directions from each vertex's own zero pattern), scanned
over its zero threshold and iterations, against the true inputs at θ⁰: how many true inputs have a refined
candidate above cosine 0.99, and how many distinct images the best 50 candidates (smallest null ratio, distinct
at 0.98, as drifting_inputs keeps them) match. The vertices (400 linear programs) are found once.
  .venv/bin/python research/probe_round_refine.py SEED E [k|tol] [values...]   (k: the k·rank smallest
  coordinates of each candidate as its zeros; tol: its entries at most tol of its largest)
"""
import sys

import torch
from round_client import round_client

from fcn_analytic.disaggregate import _vertices, live_rows, null_directions, row_space, summed_layer

torch.set_num_threads(1)
seed, epochs = int(sys.argv[1]), int(sys.argv[2])
capture, truth, x0 = round_client(seed, epochs)
unit0 = torch.nn.functional.normalize(x0, dim=1)
summed = summed_layer(capture, "body.1")
n = summed.samples
basis = row_space(summed.weight.double())
top = basis[:, :n]
coeffs = _vertices(live_rows(top), n, 8 * n, torch.Generator().manual_seed(0), n - 1 + 20, 1e-2, 5e-2)
start = coeffs @ top.T
print(f"rank {basis.shape[1]}, {len(start)} vertices; zeros of the truth: "
      f"{(x0 <= 1e-6 * x0.amax(1, keepdim=True)).double().mean():.3f}")


def score(found: torch.Tensor, ratio: torch.Tensor) -> str:
    u = torch.nn.functional.normalize(found, dim=1)
    cos = u @ unit0.T
    kept: list[int] = []
    for i in ratio.argsort().tolist():
        if float(u[i].norm()) > 0 and all(float(u[i] @ u[j]) < 0.98 for j in kept):
            kept.append(i)
        if len(kept) == n:
            break
    best = cos.max(0).values
    kbest = cos[kept].max(0).values
    return (f"any > 0.99: {int((best > 0.99).sum())}, kept {len(kept)} > 0.99: {int((kbest > 0.99).sum())}, "
            f"kept match {len(set(cos[kept].argmax(1).tolist()))} images, median best {best.median():.4f}")


print("vertices:", score(start, torch.ones(len(start), dtype=torch.float64)), flush=True)
r = basis.shape[1]


def smallest(found: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One pursuit step: null_directions on each row's k smallest coordinates instead of its zeros."""
    return null_directions(basis, found, smallest=k)


mode = sys.argv[3] if len(sys.argv) > 3 else "k"
if mode == "mix":  # the N = 100 pursuit's starts: each vertex and 8·N flat-Dirichlet mixtures of 3 vertices
    from fcn_analytic.disaggregate import pursue
    gen = torch.Generator().manual_seed(1)
    unit_start = torch.nn.functional.normalize(start, dim=1)
    picks = torch.stack([torch.randperm(len(start), generator=gen)[:3] for _ in range(8 * n)])
    w = torch.distributions.Dirichlet(torch.ones(3, dtype=torch.float64)).sample((8 * n,))
    mixes = torch.einsum("sk,skd->sd", w, unit_start[picks])
    for f in [float(t) for t in sys.argv[4:]] or [2.0]:
        for steps in (8, 40):
            a, ra = pursue(basis, start, steps, f)
            print(f"vertices, k {f:g}, {steps} steps:", score(a, ra), flush=True)
            b, rb = pursue(basis, mixes, steps, f)
            print(f"mixtures, k {f:g}, {steps} steps:", score(b, rb), flush=True)
            print(f"pooled, k {f:g}, {steps} steps:", score(torch.cat([a, b]), torch.cat([ra, rb])), flush=True)
    sys.exit()
if mode == "pool":  # both refinements, 8 iterations each, their candidates pooled before the selection
    a, ra = start, None
    b, rb = start, None
    for _ in range(8):
        a, ra = null_directions(basis, a, 1e-2)
        b, rb = smallest(b, int(2.0 * r))
    print("tol 0.01:", score(a, ra))
    print("k 2:", score(b, rb))
    print("pooled:", score(torch.cat([a, b]), torch.cat([ra, rb])), flush=True)
    both = torch.nn.functional.normalize(torch.cat([a, b]), dim=1)
    for m in (r, 2 * r, 4 * r):  # the selection by each candidate's mass on its m smallest entries (negatives first)
        tail = both.kthvalue(m, dim=1, keepdim=True).values
        mass = torch.where(both <= tail, both, torch.zeros_like(both)).norm(dim=1)
        print(f"pooled, kept by the mass of its {m // r}·rank smallest entries:", score(both, mass), flush=True)
    sys.exit()
for f in [float(t) for t in sys.argv[4:]] or ([1.25, 1.5, 2.0, 3.0] if mode == "k" else [3e-3, 1e-2, 3e-2, 1e-1]):
    found, ratio = start, None
    for it in range(1, 33):
        found, ratio = smallest(found, int(f * r)) if mode == "k" else null_directions(basis, found, f)
        if it in (2, 8, 16, 32):
            print(f"{mode} {f:g}, {it} iterations:", score(found, ratio), flush=True)
