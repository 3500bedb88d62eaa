"""Defences in the client's training itself: its data (random oversampling), its targets (label smoothing,
mixup) and its model (dropout).

- ``oversample`` (Ramakrishna & Dán 2022 §6.3): every class present on the client is topped up by sampling with
  replacement from it, by the fraction ρ of its gap to the largest class (ρ = 1: the paper's full balance), so
  the update reflects the balanced set instead of the client's distribution. The client trains on (and reports)
  the oversampled set.
- ``label-smoothing``: every step's targets become ``(1 − ε)·y + ε/C`` (the soft-label paper's smoothing, here
  as the client's private choice).
- ``mixup`` (Zhang et al. 2018): every sample of a step is mixed with a random partner of the same batch,
  ``x = (1 − λ)x + λ·x_π``, targets alike, λ ~ U(0, λ_max) per sample.
- ``dropout`` (Srivastava et al. 2014; Decaf §VII-E, Table XI): inverted dropout of rate p on the input of the
  model's ``layer`` (default the last layer ``fc``) during local training.
"""

from __future__ import annotations

from typing import Any

from gi.world.fl.defences.base import Context, Spec, register_defence


@register_defence("oversample", "data", "random oversampling of every present class towards the largest "
                  "(Ramakrishna & Dán §6.3)", "ρ, the fraction of the gap to the largest class filled",
                  valid=lambda s: 0 <= s <= 1, valid_text="in [0, 1]")
def oversample(labels: Any, spec: Spec, ctx: Context) -> Any:
    """Indices into the client's samples (the originals first, then the drawn duplicates)."""
    import torch

    counts = torch.bincount(labels)
    top = int(counts.max())
    extra = []
    for c in torch.nonzero(counts).flatten().tolist():
        need = int(round(spec.strength * (top - int(counts[c]))))
        if need:
            pool = torch.nonzero(labels == c).flatten()
            extra.append(pool[torch.randint(len(pool), (need,), generator=ctx.generator)])
    return torch.cat([torch.arange(len(labels)), *extra])


@register_defence("label-smoothing", "batch", "targets (1 − ε)·y + ε/C on every step", "ε",
                  valid=lambda s: 0 <= s < 1, valid_text="in [0, 1)")
def label_smoothing(batch: tuple[Any, Any], spec: Spec, ctx: Context) -> tuple[Any, Any]:
    images, targets = batch
    return images, (1 - spec.strength) * targets + spec.strength / targets.shape[1]


@register_defence("mixup", "batch", "mix every sample with a random partner of its batch, λ ~ U(0, λ_max)", "λ_max",
                  valid=lambda s: 0 <= s <= 1, valid_text="in [0, 1]")
def mix_partners(batch: tuple[Any, Any], spec: Spec, ctx: Context) -> tuple[Any, Any]:
    import torch

    images, targets = batch
    b = images.shape[0]
    if b < 2 or spec.strength == 0:
        return images, targets
    perm = torch.randperm(b, generator=ctx.generator)
    lam = torch.rand(b, generator=ctx.generator, dtype=images.dtype) * spec.strength
    li, lt = lam.view(-1, *[1] * (images.ndim - 1)), lam.view(-1, 1).to(targets.dtype)
    return (1 - li) * images + li * images[perm], (1 - lt) * targets + lt * targets[perm]


@register_defence("dropout", "model", "inverted dropout on the input of the model's `layer` during local training "
                  "(Decaf Table XI)", "p, the drop rate", valid=lambda s: 0 <= s < 1, valid_text="in [0, 1)",
                  layer="fc")
def dropout(model: Any, spec: Spec, ctx: Context) -> list[Any]:
    import torch

    modules = dict(model.named_modules())
    name, p = spec.params["layer"], spec.strength
    if name not in modules:
        from gi.core.errors import ConfigError

        raise ConfigError(f"dropout params.layer={name!r} is not a module of the model; e.g. "
                          f"{[n for n in modules if n][-3:]}")
    if p == 0:
        return []

    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        keep = (torch.rand(x.shape, generator=ctx.generator, dtype=x.dtype) >= p).to(x.dtype)
        return (x * keep / (1 - p), *args[1:])

    return [modules[name].register_forward_pre_hook(hook)]
