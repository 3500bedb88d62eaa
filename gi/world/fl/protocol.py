"""The FL protocol a client follows, as the server knows it (docs/architecture.md, "Data flow").

A :class:`Protocol` travels inside every :class:`gi.Capture`, so an attack can interpret a gradient
or an update without guessing: which loss, which label augmentation, which optimiser, how many
local epochs or steps, which FL scheme (:mod:`gi.world.fl.schemes`) and its hyper-parameters, which defences
(:mod:`gi.world.fl.defences`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from gi.core.errors import ConfigError
from gi.world.fl.defences import at, check_entries
from gi.world.fl.optim import RULES
from gi.world.fl.schemes import SCHEMES, get_scheme

LOSS_NAMES = ("ce", "focal", "bce")
LABEL_AUGS = ("onehot", "smoothing", "smoothing-alt", "mixup")
MODEL_MODES = ("eval", "train")
DP_SCALES = ("update", "gradient", "step")
# Keys that older captures kept in a free-form ``extra`` mapping; now typed fields.
MAX_BATCH = 1_000_000  # samples in one client batch
MAX_LOCAL_EPOCHS = 10_000
MAX_LOCAL_STEPS = 1_000_000  # a client round of a million steps is no FL round; a capture saying so is refused
# The learning rate sizes every later division (the update-to-gradient view −Δθ/η of the label methods): an lr
# outside this range (∞, NaN, a denormal whose reciprocal overflows) would make every answer meaningless.
LR_RANGE = (1e-12, 1e6)
# Real-valued fields that must be finite numbers (a NaN or ∞ here makes a capture's update unexplainable).
_FINITE = ("focal_gamma", "temperature", "lr", "momentum", "adadelta_rho", "adadelta_eps", "weight_decay", "prox_mu",
           "feddyn_alpha", "feddc_alpha", "dp_sigma", "dp_clip", "label_eps")
_LEGACY_EXTRA = ("local_steps", "dp_scale", "share_bn_stats")


@dataclass
class Protocol:
    """What the client does with its data; everything here is known to the honest-but-curious server.

    Label augmentation kinds (soft-label paper §3 and posterior paper Table 3):
    ``onehot``; ``smoothing`` = ``(1−ε)·onehot + ε/C``; ``smoothing-alt`` = ``y⁺ = 1−ε, y⁻ = ε/(C−1)``;
    ``mixup`` = ``(1−λ)·y₁ + λ·y₂``. ``label_eps`` is the smoothing ε when the server knows it (the
    posterior attack's label embedding); ``None`` when it varies per sample (soft-label paper).

    ``local_steps`` caps local training at that many steps on fresh batches (RLU's "local epochs", its eq. 5
    and public code; epochs continue, reshuffled, until the cap); ``None`` runs ``local_epochs`` full passes.
    ``defences``: the client's defences in order, ``{name, strength, params}`` entries of
    :data:`gi.world.fl.defences.DEFENCES` (noise, clipping, DP-SGD, top-k, quantisation, dropout, oversampling, secure
    aggregation, label smoothing, mixup), e.g. ``[{name: dp-sgd, strength: 1.0, params: {max_grad_norm: 1.0}}]``.
    Legacy DP fields (mapped onto the registry before ``defences``, :func:`gi.world.fl.defences.specs`): clip the shared
    message's global L2 norm to ``dp_clip`` (``clip``) and add N(0, ``dp_sigma``²), where ``dp_scale`` says: on the
    update itself, on the gradient-like ``−Δθ/η`` (``gaussian``), or on every local step (``gaussian-step``).
    ``share_bn_stats``: the threat model grants the server the client's BatchNorm batch statistics.
    """

    scheme: str = "fedsgd"
    loss: str = "ce"
    focal_alpha: float | list[float] | None = None
    focal_gamma: float = 0.0
    temperature: float = 1.0
    label_aug: str = "onehot"
    label_eps: float | None = None
    batch_size: int = 1
    num_samples: int | None = None
    local_epochs: int = 1
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    adadelta_rho: float = 0.9
    adadelta_eps: float = 1e-6
    weight_decay: float = 0.0
    prox_mu: float = 0.0
    feddyn_alpha: float = 0.0
    feddc_alpha: float = 0.0
    drop_last: bool = True
    model_mode: str = "eval"
    local_steps: int | None = None
    dp_sigma: float = 0.0
    dp_clip: float | None = None
    dp_scale: str = "update"
    share_bn_stats: bool = False
    defences: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, allowed in (
            ("scheme", tuple(SCHEMES)),
            ("loss", LOSS_NAMES),
            ("label_aug", LABEL_AUGS),
            ("optimizer", tuple(RULES)),
            ("model_mode", MODEL_MODES),
            ("dp_scale", DP_SCALES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"protocol.{name}={value!r} is not allowed; valid: {list(allowed)}")
        for name, most in (("batch_size", MAX_BATCH), ("local_epochs", MAX_LOCAL_EPOCHS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ConfigError(f"protocol.{name} must be an int in [1, {most}], got {value!r}")
        for name in _FINITE:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise ConfigError(f"protocol.{name} must be a finite number, got {value!r}")
        if self.temperature <= 0:
            raise ConfigError(f"protocol.temperature must be > 0, got {self.temperature!r}")
        if not LR_RANGE[0] <= self.lr <= LR_RANGE[1]:
            raise ConfigError(f"protocol.lr must be in [{LR_RANGE[0]:g}, {LR_RANGE[1]:g}], got {self.lr!r}")
        if not 0.0 <= self.adadelta_rho < 1.0 or self.adadelta_eps <= 0:
            raise ConfigError(f"protocol.adadelta_rho must be in [0, 1) and adadelta_eps > 0, got "
                              f"{self.adadelta_rho!r}, {self.adadelta_eps!r}")
        steps = self.local_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or not 1 <= steps <= MAX_LOCAL_STEPS):
            raise ConfigError(f"protocol.local_steps must be an int in [1, {MAX_LOCAL_STEPS}] (or null), got "
                              f"{steps!r}")
        if self.label_eps is not None and not 0.0 <= self.label_eps < 1.0:
            raise ConfigError(f"protocol.label_eps must be in [0, 1), got {self.label_eps!r}")
        self.defences = check_entries(self.defences)
        per_example = at(self, "per-example")
        if len(per_example) > 1:
            raise ConfigError(f"protocol.defences: at most one per-example defence, got "
                              f"{[s.name for s in per_example]}")
        if per_example and self.model_mode == "train":
            raise ConfigError(f"protocol.defences: {per_example[0].name} needs per-sample gradients, which "
                              "model_mode='train' (BatchNorm mixes the samples) does not have; use model_mode=eval")

    @property
    def is_update(self) -> bool:
        """FedSGD shares a gradient; every other scheme shares ``θ_local − θ_global``."""
        return get_scheme(self.scheme).shares == "update"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Protocol:
        data = dict(data)
        legacy = data.pop("extra", None) or {}  # captures written before the extras became fields
        bad = sorted(set(legacy) - set(_LEGACY_EXTRA))
        if bad:
            raise ConfigError(f"unknown protocol.extra key(s) {bad}; these settings are fields now: "
                              f"{list(_LEGACY_EXTRA)}")
        from gi.core.config import from_dict  # typed: every value checked against its field's type

        return from_dict(cls, {**legacy, **data}, "protocol")
