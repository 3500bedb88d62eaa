"""Labels at E > 1 from each image's own hidden-layer error (a probe).

Over E epochs each image visits the first Linear layer E times at drifting parameters, so −ΔW/η ≈ Σ_i ē_i x_iᵀ with
x_i the image's input at θᵗ and ē_i = Σ_e e_i^e its errors summed over its visits. Given inputs X (the true ones at
θᵗ, or the feature stage's candidates), ē = (−ΔW/η) X⁺, and Σ_e g_i^e = Σ_e p_i^e − E·y_i is read from ē_i as at
E = 1 (labels.fc_inputs.hidden_errors); its one negative entry is the label.

    python research/probe_round_e5_labels.py SEED E [OVERRIDES...]
"""
import sys

import torch
from round_client import layer_labels, round_client

from fcn_analytic.disaggregate import drifting_inputs, first_linear, summed_layer

torch.set_num_threads(1)
seed, epochs = int(sys.argv[1]), int(sys.argv[2])
capture, truth, x0 = round_client(seed, epochs, extra=tuple(sys.argv[3:]))
summed = summed_layer(capture, first_linear(capture.model()))
labels = truth.labels
hard, fit, by_soft = layer_labels(capture, x0)
print("oracle x, argmax(p - g/E)", torch.bincount(by_soft, minlength=10).tolist(), "ins_acc",
      float((by_soft == labels).double().mean()))
print("true counts ", torch.bincount(labels, minlength=10).tolist())
print("oracle x    ", torch.bincount(hard, minlength=10).tolist(), "ins_acc", float((hard == labels).double().mean()),
      "fit median", float(fit.median()))
if epochs == 1:
    sys.exit()
cand = drifting_inputs(summed.weight, summed.bias, summed.samples, seed=0).inputs
cos = torch.nn.functional.normalize(cand, dim=1) @ torch.nn.functional.normalize(x0, dim=1).T
best = cos.argmax(1)
hard_c, fit_c, _ = layer_labels(capture, cand)
print("candidates  ", torch.bincount(hard_c, minlength=10).tolist(), "label of nearest true input agrees",
      float((hard_c == labels[best]).double().mean()), "cands > 0.99:", int((cos.max(1).values > 0.99).sum()))
