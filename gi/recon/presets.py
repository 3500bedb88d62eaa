"""Named attack recipes (``attack.preset``): partial :class:`~gi.recon.config.ReconConfig` settings, a registry.

A preset fills the ``attack`` keys a config leaves out; every key given explicitly wins over it
(:func:`apply_preset`). ``gi run`` and ``gi attack`` use :data:`DEFAULT` unless ``attack.preset`` names another;
the Python API's ``ReconConfig()`` keeps its own defaults (``ReconConfig.from_preset(name, **keys)`` builds one).

``default``: the recipe chosen by measurement on ``cifar10-samples`` and ``fashion-mnist`` only (README,
"Default job"): per-problem L-BFGS (lr 1, no line search) on the L2 gradient distance with a small TV prior,
restarts ranked by the attack objective. ``fast``: the same with fewer restarts and iterations. ``strong``: more
restarts and iterations. ``ig``: Inverting Gradients (Geiping et al. 2020): signed Adam on the cosine distance,
multistep schedule, TV.
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

# Measured on the 20 cifar10-samples, DLG LeNet, one image per capture (README "Default job"): at 1000 iterations,
# restarts 1 → 2 lifted the minimum from 9.0 to 20.4 dB and the feature term of eq. 8 (β = 1, α = 1) the mean by
# 1.8 dB at one restart; one restart of 2000 iterations with features (39.5 dB mean, 25.0 min, 7.1 CPU s per
# image) beat two restarts of 1000 (28.7 dB mean, 20.7 min, 5.9 CPU s): the iterations matter more.
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
