"""Victim scenarios for the label benchmark (``gi labels``): each makes the captures of one trial.

A scenario is ``fn(setup, generator: torch.Generator, trial: int) -> list[Trial]`` registered with
:func:`register_scenario` together with its setup class: a :class:`gi.world.setup.VictimSetup` subclass
(the shared ``data`` / ``model`` / ``train`` / ``aux`` / ``protocol`` sections plus the scenario's own fields).
Calling the registered scenario with the config's ``setup`` mapping builds that class first (typed checks,
an unknown key is a :class:`gi.ConfigError`, old spellings are mapped with a deprecation notice); a scenario
registered without a class gets the mapping as it is. Every module of this package is imported here, so
dropping a file in registers its scenarios.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gi.core.errors import ConfigError
from gi.core.registry import import_members, registrar
from gi.world.setup import upgrade, upgrade_key

if TYPE_CHECKING:  # the scenarios load torch when they run, not when a config names them
    import torch

    from gi.capture import Capture, Truth


@dataclass
class Trial:
    """One attacked message: what the server sees, the ground truth, and the attacker's aux data.

    ``group`` names the row of the results table the trial belongs to (e.g. ``"lenet/sigmoid"``).
    Trials that share the same ``aux`` object (and ``group``) are recovered together in one batched call.
    ``history``: the same message's captures of earlier rounds (oldest first), when the scenario attaches them
    for a multi-round attack (fedavg-client ``average_from``; :func:`labels.recover_rounds`); empty otherwise.
    """

    capture: Capture
    truth: Truth
    aux: Any = None
    group: str = ""
    history: list[Capture] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    """A registered scenario: ``fn`` and the dataclass of its ``setup`` (None: a plain mapping)."""

    name: str
    fn: Callable[[Any, torch.Generator, int], list[Trial]]
    setup: type | None = None

    def resolve(self, setup: Any) -> Any:
        """``setup`` (a mapping, or already the setup class) as the scenario's setup class."""
        if self.setup is None or isinstance(setup, self.setup):
            return setup
        where = f"setup of scenario {self.name!r}"
        if isinstance(setup, dict):
            upgraded = copy.deepcopy(setup)
            upgrade(upgraded, self.setup.LEGACY, "setup")
            unknown = sorted(set(upgraded) - {f.name for f in dataclasses.fields(self.setup)})
            if unknown:
                raise ConfigError(f"unknown key(s) {unknown} in {where}; valid: "
                                  f"{sorted(f.name for f in dataclasses.fields(self.setup))}")
        return self.setup.from_mapping(setup, "setup")

    def key(self, dotted: str) -> str:
        """The new spelling of a dotted setup key (a grid key) of this scenario."""
        return dotted if self.setup is None else upgrade_key(dotted, self.setup.LEGACY)

    def __call__(self, setup: Any, generator: torch.Generator, trial: int) -> list[Trial]:
        return self.fn(self.resolve(setup), generator, trial)


SCENARIOS: dict[str, Scenario] = {}
_register = registrar(SCENARIOS, "scenario")


def register_scenario(name: str, setup: type | None = None) -> Callable[[Callable[..., list[Trial]]],
                                                                         Callable[..., list[Trial]]]:
    """Decorator: register ``fn(setup, generator, trial)`` as scenario ``name`` with setup class ``setup``."""

    def wrap(fn: Callable[..., list[Trial]]) -> Callable[..., list[Trial]]:
        _register(name)(Scenario(name, fn, setup))
        return fn

    return wrap


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    return SCENARIOS[name]


import_members(__name__, __path__)
