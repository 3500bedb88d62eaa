"""Probe: which of a client round's inputs the linear programs find, and whether the duplicates can be told apart.

Reads a `gi run configs/fedavg-round.yaml` output directory (its capture and truth); prints, for every candidate
the vertex search keeps, the true input it is nearest to (at θ⁰) and two label-free checks: its zero count and how
much of its recovered output error falls on hidden units its own forward pass leaves inactive.
  .venv/bin/python research/probe_round_candidates.py RUN_DIR [programs_per_sample]
"""
import sys

import torch

from fcn_analytic.disaggregate import _valid, _vertices  # noqa: PLC2701 (a probe of the private search)
from gi.capture import Capture, Truth

torch.set_num_threads(1)
run = sys.argv[1]
per = int(sys.argv[2]) if len(sys.argv) > 2 else 8
cap = Capture.load(f"{run}/capture.safetensors", trust_factory=True)
truth = Truth.load(f"{run}/truth.safetensors")
n = truth.images.shape[0]
lr = cap.protocol.lr
gw, gb = -cap.update["body.1.weight"].double() / lr, -cap.update["body.1.bias"].double() / lr
model = cap.model().double()
with torch.no_grad():
    x0 = model.body[0](model.normalize(truth.images.double()))
_, sv, vh = torch.linalg.svd(gw, full_matrices=False)
v = vh[:n].T
norms = v.norm(dim=1)
live = norms > 1e-6 * norms.max()
vn = v[live] / norms[live, None]
gen = torch.Generator().manual_seed(0)
found = _vertices(vn, n, per * n, gen, n - 1 + 20, 1e-4, 1e-3)
cand = (found @ v.T)
cand = cand * torch.where(cand.sum(1) < 0, -1.0, 1.0)[:, None]
cos = torch.nn.functional.normalize(cand, dim=1) @ torch.nn.functional.normalize(x0, dim=1).T
best, which = cos.max(1)
print(f"{len(found)} candidates from {per * n} programs; truths hit (cos > 0.98): "
      f"{len(set(which[best > 0.98].tolist()))} of {n}; valid {int(_valid(cand, n + 19, 1e-4, 1e-3).sum())}")
for k in sorted(range(len(found)), key=lambda k: (int(which[k]), -float(best[k]))):
    x = cand[k]
    zeros = int((x.abs() < 1e-4 * x.abs().max()).sum())
    near = torch.nn.functional.normalize(cand, dim=1) @ torch.nn.functional.normalize(x, dim=0)
    near[k] = -1
    print(f"{k:3d} truth {int(which[k]):3d} cos {float(best[k]):.4f} zeros {zeros:5d} nearest other "
          f"{float(near.max()):.4f}")

# Realisability: can an image in [0, 1] produce each candidate's direction? (1 − cos after an Adam fit, all at once)
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # 0: no fit
if steps:
    body = model.body[0].float()
    target = torch.nn.functional.normalize(cand.float(), dim=1)
    logit = torch.zeros(len(cand), *truth.images.shape[1:], requires_grad=True)
    opt = torch.optim.Adam([logit], lr=0.1)
    for _ in range(steps):
        img = torch.sigmoid(logit)
        f = torch.nn.functional.normalize(body(model.normalize.float()(img)), dim=1)
        loss = (1 - (f * target).sum(1))
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    res = loss.detach()
    order = sorted(range(len(found)), key=lambda k: float(res[k]))
    print("rank candidate truth cos_to_truth fit_residual")
    for r, k in enumerate(order):
        print(f"{r:3d} {k:3d} truth {int(which[k]):3d} cos {float(best[k]):.4f} residual {float(res[k]):.2e}")

# Clustering the candidates into N groups (average linkage on the cosine distance), one medoid each
from scipy.cluster.hierarchy import fcluster, linkage  # noqa: E402

unit = torch.nn.functional.normalize(cand, dim=1)
for method in ("average", "complete", "single"):
    labels_ = fcluster(linkage(unit.numpy(), method=method, metric="cosine"), n, criterion="maxclust")
    picks = []
    for c in set(labels_.tolist()):
        members = [k for k in range(len(cand)) if labels_[k] == c]
        centre = torch.nn.functional.normalize(unit[members].mean(0), dim=0)
        picks.append(max(members, key=lambda k: float(unit[k] @ centre)))
    hit = {int(which[k]) for k in picks if best[k] > 0.98}
    print(f"{method}: {len(picks)} clusters, distinct truths hit by medoids {len(hit)}, "
          f"mean cos {float(best[picks].mean()):.4f}")


def consistency(set_: list[int]) -> torch.Tensor:
    """Per sample of a candidate set: how far its output error at the hidden layer is from what its own forward pass
    allows, ‖δ_i − P_i δ_i‖ / ‖δ_i‖ with P_i the projection on diag(mask_i) W₂ᵀ (mask_i: W₁x_i + b₁ > 0)."""
    c = found[set_].T
    deltas = gw @ v @ torch.linalg.inv(c.T)
    scale = torch.linalg.lstsq(deltas, gb[:, None]).solution.squeeze(1)
    xs = (v @ c / scale).T
    ds = (deltas * scale).T
    w2 = model.fc.weight.double()
    out = []
    for x, d in zip(xs, ds):
        mask = (w1 @ x + b1 > 0).double()
        basis = mask[:, None] * w2.T
        proj = basis @ torch.linalg.lstsq(basis, d[:, None]).solution
        out.append(float((d - proj.squeeze(1)).norm() / d.norm().clamp_min(1e-30)))
    return torch.tensor(out)


w1, b1 = model.body[1].weight, model.body[1].bias
zeros_all = torch.tensor([int((x.abs() < 1e-4 * x.abs().max()).sum()) for x in cand])
sparsest = zeros_all.argsort(descending=True)[:n].tolist()
oracle = [max((k for k in range(len(cand)) if int(which[k]) == t), key=lambda k: float(best[k]), default=None)
          for t in range(n)]
oracle = [k for k in oracle if k is not None]
for name, s in (("sparsest", sparsest), ("oracle-best", oracle)):
    r = consistency(s) if len(s) == n else None
    hit = len({int(which[k]) for k in s if best[k] > 0.98})
    print(name, len(s), "truths", hit, "residual mean/max", None if r is None else (float(r.mean()), float(r.max())))
    if r is not None:
        print("  per sample (truth cos, residual):", sorted(zip([round(float(best[k]), 4) for k in s],
                                                               [round(float(x), 3) for x in r]))[:12])

from scipy.linalg import qr  # noqa: E402

_, _, piv = qr(found.T.numpy(), pivoting=True, mode="economic")
volume = piv[:n].tolist()
r = consistency(volume)
print("pivoted-QR", "truths", len({int(which[k]) for k in volume if best[k] > 0.98}),
      "mean cos", round(float(best[volume].mean()), 4), "residual mean", round(float(r.mean()), 3))
