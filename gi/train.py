"""Brief, seeded centralised training of a model, to get the "trained" models of the papers' tables."""

from __future__ import annotations

import torch

from gi.losses import soft_cross_entropy

Tensor = torch.Tensor


def train_model(
    model: torch.nn.Module,
    images: Tensor,
    labels: Tensor,
    epochs: float = 1.0,
    batch_size: int = 64,
    lr: float = 0.01,
    momentum: float = 0.9,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Train in place with SGD on soft-target cross-entropy for ``epochs`` (fractions allowed).

    Returns ``{"steps", "final_loss", "train_acc"}`` so a config can record how the model was trained.
    """
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    n = images.shape[0]
    steps = max(1, int(round(epochs * n / batch_size)))
    model.train()
    loss = torch.zeros(())
    perm = torch.randperm(n, generator=generator)
    pos = 0
    for _ in range(steps):
        if pos + batch_size > n:
            perm, pos = torch.randperm(n, generator=generator), 0
        idx = perm[pos:pos + batch_size]
        pos += batch_size
        opt.zero_grad(set_to_none=True)
        loss = soft_cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        sub = torch.arange(min(n, 2000))
        acc = (model(images[sub]).argmax(1) == labels[sub]).double().mean().item()
    return {"steps": steps, "final_loss": float(loss.detach()), "train_acc": acc}
