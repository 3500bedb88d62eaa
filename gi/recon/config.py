"""Settings of one reconstruction (the ``attack`` section of a run config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gi.errors import ConfigError

INITS = ("uniform", "gaussian", "constant")
SCHEDULES = ("multistep", "none", "cosine")
OPTIMIZERS = ("adam", "sgd")


@dataclass
class ReconConfig:
    """Inverting-Gradients defaults (frameworks.md §4) expressed in pixel space [0, 1].

    ``regularizers`` maps registry names to weights (``{"tv": 1e-4}``); ``layer_weights`` optionally
    maps parameter names to weights in the objective (missing names weigh 1; weight 0 drops a layer).
    """

    iterations: int = 1000
    lr: float = 0.1
    optimizer: str = "adam"
    objective: str = "cosine"
    regularizers: dict[str, float] = field(default_factory=lambda: {"tv": 1e-4})
    layer_weights: dict[str, float] = field(default_factory=dict)
    restarts: int = 1
    init: str = "uniform"
    signed: bool = True
    boxed: bool = True
    schedule: str = "multistep"
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    log_every: int = 50

    def __post_init__(self) -> None:
        from gi.recon.objectives import OBJECTIVES
        from gi.recon.regularizers import REGULARIZERS

        checks = (("objective", self.objective, OBJECTIVES), ("init", self.init, INITS),
                  ("schedule", self.schedule, SCHEDULES), ("optimizer", self.optimizer, OPTIMIZERS))
        for key, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(f"attack.{key}={value!r} is not allowed; valid: {sorted(allowed)}")
        for name in self.regularizers:
            if name not in REGULARIZERS:
                raise ConfigError(f"attack.regularizers has unknown {name!r}; valid: {sorted(REGULARIZERS)}")
        if self.iterations < 1 or self.restarts < 1:
            raise ConfigError("attack.iterations and attack.restarts must be >= 1")
        if self.lr <= 0:
            raise ConfigError(f"attack.lr must be > 0, got {self.lr}")
