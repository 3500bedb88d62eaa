"""Counts at E > 1 from the bias identity with the client's confidences simulated (a lever measured, not kept).

With a linear local optimiser and cross-entropy, the last-layer bias update reads u = (Δb + h)/η = −Σ_τ ρ_τ g_τ with
g_τ = (1/B_τ) Σ_{i∈τ} (p_i^τ − y_i) (RLU eq. 16). Every sample is visited once per epoch, so for plain SGD with equal
batches Σ_τ (1/B) Σ_{i∈τ} y_i = E·c/B and c = N (u + P) / Σ_τ ρ_τ, P = Σ_τ ρ_τ (1/B_τ) Σ_{i∈τ} p_i^τ. Here P is read
off surrogate clients: N aux images drawn to hold the true counts, trained exactly as the protocol says. The probe
prints the true P (from the client's own steps), the surrogate's P̂ and the counts each reads; a count is exact only
where |P − P̂| < Σρ / (2N).

    python research/probe_round_sim_counts.py SEED E [DRAWS] [CONFIG OVERRIDES...]
"""
import sys

import torch

from gi.capture import Capture
from gi.core.config import load
from gi.core.counts import largest_remainder
from gi.experiments.config.run import RunConfig
from gi.experiments.run import capture_all
from gi.world.build import build_victim, make_aux
from labels.rlu import recover_rlu, update_view

Tensor = torch.Tensor


def surrogate_confidence(capture: Capture, model: torch.nn.Module, images: Tensor, labels: Tensor,
                         counts: Tensor, draws: int, generator: torch.Generator, rho: Tensor,
                         sizes: list[int]) -> Tensor:
    """``P̂`` (C,) of the docstring: the mean over ``draws`` surrogate clients of ``Σ_τ ρ_τ (g_τ + Y_τ)``,
    each client N aux images drawn (with replacement, per class) to hold ``counts``, trained as the capture's
    protocol says from θᵗ with its history."""
    from gi.world.fl.victim import simulate_client

    c = capture.num_classes
    by_class = [torch.nonzero(labels == k).flatten() for k in range(c)]
    total = torch.zeros(c, dtype=torch.float64)
    size = torch.tensor(sizes, dtype=torch.float64).unsqueeze(1)
    for _ in range(draws):
        picks = [by_class[k][torch.randint(len(by_class[k]), (int(n),), generator=generator)]
                 for k, n in enumerate(counts.tolist()) if n]
        idx = torch.cat(picks)
        _, truth = simulate_client(model, (images[idx], labels[idx]), capture.protocol, rng=generator,
                                   history=capture.history or None, keep_images=False,
                                   last_layer=capture.last_layer_name)
        grad = truth.extra["step_bias_grad"]  # (S, C): the clean mean cross-entropy gradient of each step
        steps = truth.extra["step_counts"].double() / size  # Y_τ
        total += (rho.unsqueeze(1) * (grad + steps)).sum(0)
    return total / draws


seed, epochs = int(sys.argv[1]), int(sys.argv[2])
draws = int(sys.argv[3]) if len(sys.argv) > 3 else 8
cfg = load(RunConfig, "configs/fedavg-round.yaml", [f"seed={seed}", f"protocol.local_epochs={epochs}", *sys.argv[4:]])
torch.manual_seed(cfg.seed)
dataset, model = build_victim(cfg)
gen = torch.Generator().manual_seed(cfg.seed)
captures, truths = capture_all(cfg, dataset, model, gen)[:2]
aux = make_aux(cfg, dataset, gen, truths)
capture, truth = captures[0], truths[0]
view = update_view(capture)
size = torch.tensor(view.batch_sizes, dtype=torch.float64).unsqueeze(1)
y = truth.extra["step_counts"].double() / size
p_true = (view.rho.unsqueeze(1) * (truth.extra["step_bias_grad"] + y)).sum(0)
n, rho_sum = view.distinct, float(view.rho.sum())
print("true counts      ", truth.counts.tolist())
print("identity (true P)", [round(v, 3) for v in (n * (view.bias + p_true) / rho_sum).tolist()])
print("RLU              ", recover_rlu(capture, aux).counts.tolist())
net = capture.model()
g = torch.Generator().manual_seed(0)
p_hat = surrogate_confidence(capture, net, aux.images, aux.labels, truth.counts, draws, g, view.rho,
                             view.batch_sizes)
print("P true           ", [round(v, 2) for v in p_true.tolist()])
print("P surrogate      ", [round(v, 2) for v in p_hat.tolist()])
print("counts from P̂    ", [round(v, 2) for v in (n * (view.bias + p_hat) / rho_sum).tolist()])
print("tolerance per class (half a count in P):", rho_sum / n / 2)
found = largest_remainder(n * (view.bias + p_hat) / rho_sum, n)
print("exact counts from P̂:", bool(torch.equal(found, truth.counts)), "largest |P - P̂|:",
      round(float((p_true - p_hat).abs().max()), 3))
