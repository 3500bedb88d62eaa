"""Why a rank-deficient conv2 of the ReLU LeNet can be pinned (docs/results/realistic.md, S1, "A rank-deficient
conv2"): for cifar10-samples images under the zoo's lenet (activation relu, PyTorch's init), conv2's normal matrix
as the walk forms it, its null space's dimension, the true x1's zeros, how far the minimum-norm answer is from x1
and how much of that error lies in the null space, and x1's error after minimising the violation of x ≥ 0 over the
null space (a linear program, and the least-squares hinge of fcn_analytic.conv.nonnegative_null_fit).
  .venv/bin/python research/probe_walk_null.py SEED IMAGE[,IMAGE...]
"""
import sys

import numpy as np
import torch
from scipy.optimize import linprog

import fcn_analytic.conv as conv_module
import gi
import labels
from fcn_analytic import invert
from fcn_analytic.conv import NULL_TOL, nonnegative_null_fit

torch.set_num_threads(1)
seed, images = int(sys.argv[1]), [int(a) for a in sys.argv[2].split(",")]
data = gi.data.load("cifar10-samples")
model = gi.models.build("lenet", 10, activation="relu", init=None, seed=seed)
systems = []
solve = conv_module.solve_normal_equations
conv_module.solve_normal_equations = lambda gram, rhs: (systems.append((gram.clone(), rhs.clone())),
                                                        solve(gram, rhs))[1]
for i in images:
    systems.clear()
    capture, truth = gi.capture_gradients(model, data.images[i:i + 1], data.labels[i:i + 1], gi.Protocol())
    invert(capture, labels.recover(capture, "auto"))
    with torch.no_grad():
        x1 = model.body[1](model.body[0](model.normalize(truth.images))).double().reshape(-1)
    normal, rhs = systems[1]  # the walk's solves, top first: conv3, conv2, conv1
    ev, vec = torch.linalg.eigh(normal)
    null = vec[:, ev < NULL_TOL * float(ev.max())]
    x0 = torch.linalg.lstsq(normal, rhs[:, None], driver="gelsd").solution[:, 0]
    err = x1 - x0
    n, d = null.shape
    lp = linprog(np.concatenate([np.zeros(d), np.ones(n)]), A_ub=np.hstack([-null.numpy(), -np.eye(n)]),
                 b_ub=x0.numpy(), bounds=[(None, None)] * d + [(0, None)] * n, method="highs")
    x_lp = x0 + null @ torch.from_numpy(lp.x[:d])
    fit = nonnegative_null_fit(normal, x0)
    print(f"image {i}: {n} unknowns, null space {d}, true zeros {int((x1 == 0).sum())}, minimum-norm error "
          f"{float(err.norm() / x1.norm()):.3f} ({float((null.T @ err).norm() / err.norm()):.5f} of it in the null "
          f"space); after x >= 0: LP {float((x_lp - x1).norm() / x1.norm()):.1e}, hinge "
          f"{float((fit.x - x1).norm() / x1.norm()):.1e} (pinned {fit.pinned})", flush=True)
