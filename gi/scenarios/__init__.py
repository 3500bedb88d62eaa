"""Victim scenarios for the label benchmark (``gi labels``): each makes the captures of one trial.

A scenario is ``fn(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]`` registered
with :func:`register_scenario`; ``setup`` is the config's ``setup`` mapping (the scenario validates its
own keys and raises :class:`gi.ConfigError` on unknown ones). Every module of this package is
imported here, so dropping a file in registers its scenarios.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gi.capture import Capture, Truth
from gi.core.errors import ConfigError
from gi.core.registry import registrar


@dataclass
class Trial:
    """One attacked message: what the server sees, the ground truth, and the attacker's aux data.

    ``group`` names the row of the results table the trial belongs to (e.g. ``"lenet/sigmoid"``).
    Trials that share the same ``aux`` object (and ``group``) are recovered together in one batched call.
    """

    capture: Capture
    truth: Truth
    aux: Any = None
    group: str = ""


Scenario = Callable[[dict, torch.Generator, int], list[Trial]]
SCENARIOS: dict[str, Scenario] = {}


register_scenario = registrar(SCENARIOS, "scenario")


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    return SCENARIOS[name]


def check_keys(setup: dict, allowed: dict[str, Any], where: str) -> dict[str, Any]:
    """``allowed`` maps key → default; unknown keys raise :class:`ConfigError` listing the valid ones."""
    unknown = sorted(set(setup) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {where}; valid: {sorted(allowed)}")
    return {**allowed, **setup}


for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"gi.scenarios.{_mod.name}")
