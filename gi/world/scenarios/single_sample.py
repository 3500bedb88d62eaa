"""Single-sample FedSGD captures with augmented labels (soft-label paper, Wang, Liang & He 2024, §4.1, §5.2).

One scenario call builds one model (a fresh initialisation every ``reseed_every`` trials, or one
model throughout when ``model.seed`` fixes it), optionally trains it briefly (once per model), and
captures ``samples`` one-image gradients:

- ``protocol.label_aug: smoothing`` (or ``smoothing-alt``): a random image, ε ~ U(``eps``) per sample;
- ``protocol.label_aug: mixup``: two images of different classes, x = (1−λ)x₁ + λx₂ with λ ~ U(``mix``);
- ``protocol.label_aug: onehot``: a random image with its one-hot label.

The setup (:class:`SingleSampleSetup`) is the shared victim setup (:mod:`gi.world.setup`; ``data``
defaults to the CIFAR-10 samples, ``model`` to the bias-free ``lenet``, ``protocol`` to one-image FedSGD with
``label_aug: smoothing``; a given ``train`` section trains 1 epoch unless it says otherwise, none leaves the
model untrained) plus ``samples``, ``eps``, ``mix``, ``reseed_every``, ``noise`` and ``shared``.
``noise`` adds Gaussian or Laplace noise of the given variance to every last-layer gradient (§5.2).
``shared: last`` shares only the last layer (the label methods need nothing else; the body is frozen
so the capture is fast); ``all`` shares every gradient (what ``fcn_analytic`` and reconstruction need).

Old spellings (``dataset``, ``split``, ``size``, ``label_aug``, ``loss``, ``temperature``, ``model.reseed_every``,
``train.max_samples``) are read with a deprecation notice (:data:`SingleSampleSetup.LEGACY`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gi.core.config import require, to_dict
from gi.core.errors import ConfigError
from gi.world.build import build_model, key_of, load_data, train_on, trained_model
from gi.world.fl.protocol import Protocol
from gi.world.scenarios import Trial, register_scenario
from gi.world.setup import SCENARIO_LEGACY, SECTION, ModelConfig, TrainConfig, VictimSetup, section

if TYPE_CHECKING:
    import torch
    from torch import Tensor


SHARED = ("all", "last")


@dataclass
class NoiseConfig:
    """Noise of ``variance`` added to every last-layer gradient: ``gaussian`` or ``laplace``."""

    kind: str = "gaussian"
    variance: float = 0.0


@dataclass
class SingleSampleSetup(VictimSetup):
    """The ``single-sample`` setup (module docstring)."""

    LEGACY: ClassVar[dict[str, str]] = {**SCENARIO_LEGACY, "split": "data.split", "label_aug": "protocol.label_aug",
                                        "loss": "protocol.loss", "temperature": "protocol.temperature",
                                        "model.reseed_every": "reseed_every", "train.max_samples": "train.samples"}

    model: ModelConfig = section(ModelConfig, bias_last=False)
    # a given train section trains 1 epoch by default; none at all: untrained (epochs 0)
    train: TrainConfig = field(default_factory=TrainConfig, metadata={SECTION: {"epochs": 1.0}})
    protocol: Protocol = section(Protocol, label_aug="smoothing")
    samples: int = 20
    eps: list[float] = field(default_factory=lambda: [0.0, 0.5])
    mix: list[float] = field(default_factory=lambda: [0.0, 1.0])
    reseed_every: int = 1
    noise: NoiseConfig | None = None
    shared: str = "all"

    def __post_init__(self) -> None:
        require(self.samples >= 1, "setup.samples", self.samples, ">= 1")
        for key in ("eps", "mix"):
            bounds = getattr(self, key)
            require(len(bounds) == 2 and 0.0 <= bounds[0] <= bounds[1] <= 1.0, f"setup.{key}", bounds,
                    "[low, high] within [0, 1]")
        require(self.reseed_every >= 1, "setup.reseed_every", self.reseed_every, ">= 1")
        require(self.aux.per_class == 0, "setup.aux.per_class", self.aux.per_class, "0 (no aux set here)")
        require(self.shared in SHARED, "setup.shared", self.shared, f"one of {list(SHARED)}")
        if self.noise is not None:
            require(self.noise.kind in NOISES and self.noise.variance >= 0, "setup.noise", to_dict(self.noise),
                    f"kind in {sorted(NOISES)} and variance >= 0")
        if self.protocol.scheme != "fedsgd" or self.protocol.batch_size != 1 or self.protocol.label_eps is not None:
            raise ConfigError("setup.protocol: single-sample captures are one-image FedSGD gradients with a label ε "
                              "drawn per sample (eps); leave scheme, batch_size and label_eps out")

    @property
    def shares_model(self) -> bool:
        """One model serves several trials (derived): its seed is fixed, or it is re-seeded every k > 1 trials."""
        return self.model.seed is not None or self.reseed_every > 1


def _noise_gaussian(shape: torch.Size, variance: float, generator: torch.Generator) -> Tensor:
    import torch

    return torch.randn(shape, generator=generator) * math.sqrt(variance)


def _noise_laplace(shape: torch.Size, variance: float, generator: torch.Generator) -> Tensor:
    import torch

    # Laplace(0, b) has variance 2b²; inverse CDF of a uniform draw in (−½, ½)
    b = math.sqrt(variance / 2)
    u = torch.rand(shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12) - 0.5
    return (-b * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


NOISES = {"gaussian": _noise_gaussian, "laplace": _noise_laplace}
_SEEDS: dict[tuple[str, int], int] = {}  # (setup, trial // reseed_every) → model seed


def _uniform(bounds: list[float], n: int, generator: torch.Generator) -> Tensor:
    import torch

    lo, hi = (float(b) for b in bounds)
    return lo + (hi - lo) * torch.rand(n, generator=generator)


def _make_samples(ds: Any, s: SingleSampleSetup, generator: torch.Generator) -> tuple[Tensor, Tensor, dict]:
    """Images (n, C, H, W) in [0, 1], soft targets (n, C) and their draw parameters, all vectorised."""
    import torch

    from gi.world import data

    n, c, aug = s.samples, ds.num_classes, s.protocol.label_aug
    if aug == "mixup":
        i1, i2 = data.sample_mixup_pairs(ds, n, generator)
        lam = _uniform(s.mix, n, generator)
        x, y = data.mixup(ds.images[i1], ds.labels[i1], ds.images[i2], ds.labels[i2], lam, c)
        return x.clamp(0, 1), y, {"indices": torch.stack([i1, i2], 1).tolist(), "mix_lambda": lam.tolist()}
    idx = torch.randint(len(ds), (n,), generator=generator)
    if aug == "onehot":
        return ds.images[idx], data.onehot(ds.labels[idx], c), {"indices": idx.tolist()}
    eps = _uniform(s.eps, n, generator)
    y = data.smooth_labels(ds.labels[idx], c, eps, convention=aug)
    return ds.images[idx], y, {"indices": idx.tolist(), "eps": eps.tolist()}


def _train(model: torch.nn.Module, s: SingleSampleSetup, ds: Any, generator: torch.Generator) -> dict[str, Any]:
    """Brief SGD training (:func:`gi.world.build.train_on`) with the trial's generator; the record kept in
    ``capture.meta['trained']``."""
    t = s.train
    info = train_on(model, t, s.data, ds, generator)
    return {"epochs": t.epochs, "lr": t.lr, "momentum": t.momentum, "batch_size": t.batch_size,
            "max_samples": t.samples, **info}


@register_scenario("single-sample", setup=SingleSampleSetup)
def single_sample(s: SingleSampleSetup, generator: torch.Generator, trial: int) -> list[Trial]:
    """One model, ``samples`` single-image FedSGD captures with smoothing / mixup / one-hot labels."""
    import torch

    from gi.world.fl.victim import capture_gradients

    ds = load_data(s.data)
    every = s.reseed_every
    drawn = int(torch.randint(2**31 - 1, (1,), generator=generator))
    slot = (key_of(s), trial // every)
    seed = s.model.seed if s.model.seed is not None else _SEEDS.setdefault(slot, drawn)
    trained = None
    if s.train.epochs > 0 and s.shares_model:  # trained once per model, with the first trial's generator
        key = key_of("single-sample trained", s.model, seed, s.train, s.data)
        model, trained = trained_model(key, lambda: build_model(s.model, ds, seed),
                                       lambda m: _train(m, s, ds, generator), pin=True)
    else:
        model = build_model(s.model, ds, seed)
        if s.train.epochs > 0:
            trained = _train(model, s, ds, generator)
    model.eval()
    if s.shared == "last":
        for p in model.body.parameters():
            p.requires_grad_(False)

    images, targets, draws = _make_samples(ds, s, generator)
    protocol = s.protocol
    noise = s.noise
    variance = float(noise.variance) if noise else 0.0
    group = f"{s.model.name}/{'trained' if trained else 'untrained'}/{protocol.label_aug}"
    if variance > 0:
        group += f"/{noise.kind}:{variance:g}"
    trials = []
    state = None
    for i in range(images.shape[0]):
        capture, truth = capture_gradients(model, images[i:i + 1], targets[i:i + 1], protocol)
        # the model is in eval mode and unchanged between captures: share one copy of its state (a ResNet-18
        # state is 45 MB; 200 private copies would not fit in memory)
        state = state if state is not None else capture.model_state
        capture.model_state = state
        if variance > 0:
            for name in capture.last_layer_keys:
                if name in capture.gradients:
                    g = capture.gradients[name]
                    g += NOISES[noise.kind](g.shape, variance, generator).to(g.dtype)
        capture.meta.update(model_seed=int(seed), trained=trained, shared=s.shared)
        truth.meta.update({k: v[i] for k, v in draws.items()}, dataset=s.data.name, trial=trial,
                          noise=None if variance == 0 else {"kind": noise.kind, "variance": variance})
        trials.append(Trial(capture=capture, truth=truth, aux=None, group=group))
    return trials
