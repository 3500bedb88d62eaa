"""Named attack recipes (``attack.preset``): partial :class:`~gi.recon.config.ReconConfig` settings, a registry.

A preset fills the ``attack`` keys a config leaves out; every key given explicitly wins over it
(:func:`apply_preset`). ``gi run`` and ``gi attack`` use :data:`DEFAULT` unless ``attack.preset`` names another;
the Python API's ``ReconConfig()`` keeps its own defaults (``ReconConfig.from_preset(name, **keys)`` builds one).

``default``: the recipe chosen by measurement on ``cifar10-samples`` and ``fashion-mnist`` only (README,
"Default job"): per-problem L-BFGS (lr 1, no line search) on the L2 gradient distance with a small TV prior,
4 starts culled after 100 iterations to the one with the lowest attack objective. ``fast``: one start, fewer
iterations. ``strong``: more restarts and iterations (not tuned). ``ig``: Inverting Gradients (Geiping et al.
2020): signed Adam on the cosine distance, multistep schedule, TV.
"""

from __future__ import annotations

from typing import Any

from gi.core.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {}
DEFAULT = "default"


def register_preset(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Register a partial ReconConfig (``{field: value}``) under ``name``; a name registered twice is an error."""
    if name in PRESETS:
        raise ValueError(f"attack preset {name!r} registered twice")
    PRESETS[name] = dict(settings)
    return PRESETS[name]


LBFGS = {"optimizer": "lbfgs", "lr": 1.0, "schedule": "constant", "objective": "l2", "signed": False,
         "init": "uniform", "labels": "fixed"}

# Measured on the 20 cifar10-samples, DLG LeNet, one image per capture, seeds 0 and 1 (README "Default job",
# scripts/tune_default.py): one restart of 2000 iterations failed where L-BFGS (no line search) sat on a plateau
# (objective ~2e2, oscillating) for hundreds of iterations: 3 of 6 starts of image 12 (seed 0) did, the others
# fell 10x in 50 iterations. So: 4 starts, culled after 100 iterations to the one with the lowest objective
# (attack.cull_after; the objective separates plateau from descent by 10-30x there), which then runs alone;
# 2600 iterations lift the slowest converging images (PSNR still rising at 2000). Pooled over both seeds:
# 1 start x 2000: 36.7 / 34.6 / 11.5 dB (mean / median / min); 2 starts culled at 200, 2600: 41.2 / 39.6 /
# 12.7 dB; 4 starts culled at 100, 2600: 42.2 / 39.7 / 27.2 dB, 8.3-9.2 CPU s per image at load ~10.
register_preset("default", {**LBFGS, "iterations": 2600, "restarts": 4, "cull_after": 100,
                            "regularizers": {"tv": 1.0e-4}, "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("fast", {**LBFGS, "iterations": 300, "restarts": 1, "regularizers": {"tv": 1.0e-4},
                         "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("strong", {**LBFGS, "iterations": 5000, "restarts": 8, "cull_after": 200,
                           "regularizers": {"tv": 1.0e-4}, "feature_weight": 1.0, "last_layer_weight": 1.0})
register_preset("ig", {"optimizer": "adam", "lr": 0.1, "signed": True, "schedule": "multistep",
                       "objective": "cosine", "iterations": 4800, "restarts": 1, "regularizers": {"tv": 1.0e-4},
                       "init": "uniform", "feature_weight": 0.0, "last_layer_weight": 1.0})


def preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s settings; an unknown name is a ConfigError listing the presets."""
    if name not in PRESETS:
        raise ConfigError(f"attack.preset={name!r} is not a preset; valid: {sorted(PRESETS)}")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in PRESETS[name].items()}


def apply_preset(attack: dict[str, Any] | None, default: str | None = DEFAULT) -> dict[str, Any]:
    """The ``attack`` mapping with its preset (``attack["preset"]``, else ``default``; None: none) filled in under
    the explicit keys, which win. The preset's name stays in the mapping (``config.yaml`` records it)."""
    attack = dict(attack or {})
    name = attack.get("preset", default)
    if name is None:
        return attack
    if not isinstance(name, str):
        raise ConfigError(f"attack.preset={name!r} must be a preset name; valid: {sorted(PRESETS)}")
    return {**preset(name), **attack, "preset": name}
