"""Named attack recipes (``attack.preset``): partial :class:`~gi.attack.recon.config.ReconConfig` settings, a registry.

A preset fills the ``attack`` keys a config leaves out; every key given explicitly wins over it
(:func:`apply_preset`). ``gi run`` and ``gi attack`` use :data:`DEFAULT` (``auto``) unless ``attack.preset`` names
another; the Python API's ``ReconConfig()`` keeps its own defaults (``ReconConfig.from_preset(name, **keys)`` builds
one). ``auto`` is not a recipe of its own: it names the preset registered for the attacked zoo model
(:data:`MODEL_PRESETS`, :func:`register_model_preset`; ``resnet`` for the ResNets) and ``default`` for every other
model; the config records the preset it resolved to.

``default``: the recipe chosen by measurement on ``cifar10-samples`` and ``fashion-mnist`` only
(docs/results/default-job.md,
"Default job"): per-problem L-BFGS (lr 1, no line search) on the L2 gradient distance with a small TV prior,
4 starts culled after 25 iterations to the one with the lowest attack objective. ``fast``: one start, fewer
iterations. ``strong``: more restarts and iterations (not tuned). ``ig``: Inverting Gradients (Geiping et al.
2020): signed Adam on the cosine distance, multistep schedule, TV. ``fc-inputs``: a FedSGD batch of a conv net
with a fully-connected layer after its ReLU body: that layer's per-image inputs from its gradient (SPEAR's
sparsity, Dimitrov et al. 2024, on the input side), then the images fitted to them under an image prior from the
attacker's aux set (needs ``aux.per_class`` > 0).
"""

from __future__ import annotations

from typing import Any

from gi.core.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {}
MODEL_PRESETS: dict[str, str] = {}  # zoo model name -> the preset ``auto`` picks for it
AUTO = "auto"
DEFAULT = AUTO
FALLBACK = "default"  # what ``auto`` picks for a model without a registered preset


def register_preset(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Register a partial ReconConfig (``{field: value}``) under ``name``; a name registered twice is an error."""
    if name in PRESETS:
        raise ValueError(f"attack preset {name!r} registered twice")
    PRESETS[name] = dict(settings)
    return PRESETS[name]


def register_model_preset(model: str, name: str) -> None:
    """Make ``auto`` pick preset ``name`` for zoo model ``model`` (``gi.world.models.build``'s name); twice is an
    error."""
    if model in MODEL_PRESETS:
        raise ValueError(f"model preset for {model!r} registered twice")
    if name not in PRESETS:
        raise ValueError(f"model preset for {model!r}: {name!r} is not a preset")
    MODEL_PRESETS[model] = name


LBFGS = {"optimizer": "lbfgs", "lr": 1.0, "schedule": "constant", "objective": "l2", "signed": False,
         "init": "uniform", "labels": "fixed"}

# Measured on the 20 cifar10-samples, DLG LeNet, one image per capture, seeds 0 and 1 (docs/results/default-job.md,
# research/tune_default.py): one restart of 2000 iterations failed where L-BFGS (no line search) sat on a plateau
# (objective ~2e2, oscillating) for hundreds of iterations: 3 of 6 starts of image 12 (seed 0) did, the others
# fell 10x in 50 iterations. So: 4 starts, culled after 100 iterations to the one with the lowest objective
# (attack.cull_after; the objective separates plateau from descent by 10-30x there), which then runs alone;
# 2600 iterations lift the slowest converging images (PSNR still rising at 2000). Pooled over both seeds:
# 1 start x 2000: 36.7 / 34.6 / 11.5 dB (mean / median / min); 2 starts culled at 200, 2600: 41.2 / 39.6 /
# 12.7 dB; 4 starts culled at 100, 2600: 42.2 / 39.7 / 27.2 dB, 8.3-9.2 CPU s per image at load ~10.
# retries 1 (restart on a stall, docs/results/default-job.md): Fashion-MNIST seed 0, image 8 had all 4 starts on the
# plateau (kept 0.17 of its start; recovered images keep < 1e-6); one retry from 16 starts culled at 100 recovers
# it (min 6.64 -> 93.02 dB over the 10 images); a capture that does not stall costs nothing extra.
# cull_after 25 (was 100; chosen on time to 30 dB): the packed default job, seeds 0 and 1, kept
# its distribution (45.47 / 43.52 / 27.63 and 38.99 / 37.08 / 27.52 dB against 45.55 / 44.73 / 27.63 and
# 38.89 / 37.20 / 27.52), and one capture's 4-row phase (~32 ms per step against ~11 ms for one row) shrinks from
# 100 steps to 25: image 0 alone reaches 30 dB in 500 iterations either way (research/ttq_probe.py). One capture
# alone also gets 400 L-BFGS pairs (gi.attack.recon.optim.lbfgs_history): 500 instead of 725 iterations to 30 dB there.
# Fashion-MNIST seed 0: unchanged for nine images; image 8 stalls as before, and its retry (culled at 100, 100
# pairs, gi.attack.recon.api.RETRY_*) no longer rescues it, on the earlier step code either
# (docs/results/default-job.md).
register_preset("default", {**LBFGS, "iterations": 2600, "restarts": 4, "cull_after": 25, "retries": 1,
                            "regularizers": {"tv": 1.0e-4}, "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("fast", {**LBFGS, "iterations": 300, "restarts": 1, "regularizers": {"tv": 1.0e-4},
                         "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("strong", {**LBFGS, "iterations": 5000, "restarts": 8, "cull_after": 200,
                           "regularizers": {"tv": 1.0e-4}, "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("ig", {"optimizer": "adam", "lr": 0.1, "signed": True, "schedule": "multistep",
                       "objective": "cosine", "iterations": 4800, "restarts": 1, "regularizers": {"tv": 1.0e-4},
                       "init": "uniform", "feature_weight": 0.0, "last_layer_weight": 1.0})

# ResNets (docs/results/time-to-quality-resnet18.md): measured on cifar10-samples only (image 0 for the
# choices, research/probe_resnet.py), untrained CIFAR-stem ResNet-18, one image, one CPU thread (~0.4 s per iteration
# for either optimiser). The default's L-BFGS climbs slowly there (18.3 dB after 150 CPU-s with one start; its 4
# starts spend 100 iterations x 4 = a third of a 5-minute budget), L-BFGS on the cosine distance slower (15.8 dB).
# Signed Adam on the cosine distance (Inverting Gradients), lr 0.025 in pixels (= breaching's 0.1 in normalised
# space), TV 2e-3 (= its 5e-4 on normalised images), gaussian start: constant lr reaches 26.3 dB at ~390
# iterations and then stalls; decaying x0.1 there (multistep over 1067 iterations: 400, 667) gives 33.5 dB at
# 288 s. L-BFGS from the same state instead: 32.6 dB. The features term (beta = 1) slowed the climb (24.5 vs
# 26.3 dB at 480 iterations), so beta = 0 (f* is still computed and recorded). Its time-to-quality against
# breaching, whose schedule fitted alike makes it the same attack: docs/results/time-to-quality-resnet18.md. Tried
# against it
# and worse (docs/results/time-to-quality-resnet18.md, "Levers tried", research/probe_resnet_levers.py): a
# feature-inversion warm start (the untrained
# net's f* does not pin the image: 12.7 dB), matching fewer layers (1.8x cheaper steps, 13 dB), lr 0.01 / 0.05 /
# 0.1, a grey start, the layer-wise cosine, the first decay at 300 instead of 400 (30.9 vs 33.1 dB at 300 s).
# What did help: the captured output error (output_error auto: the dummy gradients use the capture's dL/dz = the
# last-layer bias gradient, not softmax(dummy logits) - labels). Same start, same loop, 300 CPU-s, cifar10-samples
# 0-3 (research/probe_output_error.py): image 1 19.19 -> 26.20 dB; image 0 even at 150 s (24.02
# vs 24.03 dB); images 2 and 3 ~27.2 and ~25.3 dB at 260 s against 24.3 and 24.6 dB for the simulated error.
# In the bench over cifar10-samples 0-9 (same start per image): simulated 24.94 / 25.56 / 13.74 dB (mean / median /
# min), captured 28.87 / 28.85 / 23.24 dB; the simulated error stalls at 14-19 dB on 3 images, the captured on
# none at seed 0 (at seed 1 it stalls on 2 of 10, near 18 dB). Against breaching:
# docs/results/time-to-quality-resnet18.md.
# The first decay at 533 instead of 400 under the captured error: not better (images 1 and 5,
# docs/results/time-to-quality-resnet18.md).
# TV 4e-3 instead of 2e-3 (2e-3 was tuned under the simulated error): ours alone, seed 0, cifar10-samples 0-9,
# 28.87 / 28.84 / 23.24 -> 29.52 / 29.10 / 25.10 dB (better on 7 of 10); against breaching side by side, the gain
# at seed 1 went from +1.55 / +1.46 / -6.75 to +3.13 / +1.99 / -0.28 dB (docs/results/time-to-quality-resnet18.md). Two
# restarts culled at iteration 100 did not lift the two seed-1 images that stall (1 and 6: 18.02, 25.49 dB).
register_preset("resnet", {"optimizer": "adam", "lr": 0.025, "signed": True, "schedule": "multistep",
                           "objective": "cosine", "iterations": 1067, "restarts": 1, "cull_after": 0,
                           "regularizers": {"tv": 4.0e-3}, "init": "gaussian", "feature_weight": 0.0,
                           "last_layer_weight": 1.0, "labels": "fixed", "output_error": "auto"})
# fc-inputs: a FedSGD batch of a conv net whose first fully-connected layer sees a ReLU / max-pool map (the zoo's
# cnn). Measured on fashion-mnist only (docs/results/realistic.md, S4: the trained BatchNorm cnn, batches of 8,
# seed 0, aux 50 per class): that layer's per-image inputs are recovered from its gradient
# (feature_layer first-linear, gi.attack.recon.problem.layer_inputs), and the images are fitted to them with the
# aux-span prior, starting from the aux mean. Relative feature distance (scale-free), Adam lr 0.05, 500 steps,
# multistep: seed 0 batches 0-1, 17.27 dB mean. Tried: a grey start instead of the aux mean 12.5 dB (the fit stays
# in the wrong basin); the prior's weight 0.1 / 1 / 10 (relative to the feature term) 16.1 / 17.3 / 15.1 dB;
# the gradient match added at match_weight 1e-4 17.45 dB (a gain within the images' spread, and tied to the
# gradients' scale, so off); the absolute feature distance with the gradient match at weight 1 (the default
# preset's objective) 12.1-14.5 dB. The inputs are found as vertices by linear programs (fcn_analytic.disaggregate;
# every S4 batch in < 1 CPU s), with SPEAR's sampling only for what they miss: 1e6 draws found 6 of 8 inputs of
# seed 1's batch 1 (its sparsest image has 12.9 % zeros: about 0.129^-7 = 1.6e6 draws per hit), 4e6 did not finish it.
# The schedule is multistep-cycle: plain multistep wherever the targets are not refreshed (every FedSGD batch and a
# one-epoch round), the multistep steps restarted at each refresh on a multi-epoch round's approximate inputs
# (docs/results/client-round.md, E = 5 on configs/fedavg-round.yaml's seeds 0 and 1: 31 of 100 recovered against
# 28 with the plain schedule at 4000 steps).
register_preset("fc-inputs", {"optimizer": "adam", "lr": 0.05, "signed": False, "schedule": "multistep-cycle",
                              "objective": "l2", "iterations": 500, "restarts": 1, "cull_after": 0, "retries": 0,
                              "regularizers": {"aux-span": 1.0}, "aux_rank": 200, "init": "aux-mean",
                              "feature_weight": 1.0, "feature_relative": True, "match_weight": 0.0,
                              "feature_layer": "first-linear", "labels": "fixed", "feature_refresh": 1000})
for _model in ("resnet18", "resnet32", "resnet50"):
    register_model_preset(_model, "resnet")


def resolve(name: str, model: str | None = None) -> str:
    """The preset ``name`` stands for: itself, or for ``auto`` the preset registered for ``model``
    (:data:`MODEL_PRESETS`; ``default`` for other models and when the model is unknown)."""
    return MODEL_PRESETS.get(model or "", FALLBACK) if name == AUTO else name


def preset(name: str, model: str | None = None) -> dict[str, Any]:
    """A copy of preset ``name``'s settings (``auto``: :func:`resolve`'s pick for ``model``); an unknown name is a
    ConfigError listing the presets."""
    name = resolve(name, model)
    if name not in PRESETS:
        raise ConfigError(f"attack.preset={name!r} is not a preset; valid: {sorted([*PRESETS, AUTO])}")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in PRESETS[name].items()}


def apply_preset(attack: dict[str, Any] | None, default: str | None = DEFAULT, model: str | None = None
                 ) -> dict[str, Any]:
    """The ``attack`` mapping with its preset (``attack["preset"]``, else ``default``; None: none; ``auto``: the
    one :func:`resolve` picks for zoo model ``model``) filled in under the explicit keys, which win. The resolved
    preset's name stays in the mapping (``config.yaml`` records it)."""
    attack = dict(attack or {})
    name = attack.get("preset", default)
    if name is None:
        return attack
    if not isinstance(name, str):
        raise ConfigError(f"attack.preset={name!r} must be a preset name; valid: {sorted([*PRESETS, AUTO])}")
    name = resolve(name, model)
    return {**preset(name), **attack, "preset": name}
