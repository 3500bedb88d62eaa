"""The attacker's auxiliary data: a few labelled samples per class, disjoint from the victim's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class AuxData:
    """Auxiliary images ``(N, C, H, W)`` in [0, 1] with labels ``(N,)``; ``num_classes`` classes."""

    images: Tensor
    labels: Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(f"{self.images.shape[0]} aux images but {self.labels.shape[0]} labels")

    def of_class(self, c: int) -> Tensor:
        return self.images[self.labels == c]

    @property
    def per_class(self) -> Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)
