"""The table of the objective's terms (docs/architecture.md "How to add", "An objective term or regulariser"):
``fn(images (P, B, C, H, W), ev) -> (P,)`` by name; ``match`` and ``features`` weigh by their own config keys,
every other term by ``attack.regularizers`` (λ_k of the soft-label paper's eq. 8 plus priors). Registered into by
:mod:`gi.attack.recon.terms` and :mod:`gi.attack.recon.regularizers`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from gi.core.registry import registrar

Tensor = torch.Tensor
Term = Callable[[Tensor, Any], Tensor]
TERMS: dict[str, Term] = {}
OWN_WEIGHT = ("match", "features")  # weighted by their own config keys, not by attack.regularizers

register_term = registrar(TERMS, "objective term")


class _Regularizers(Mapping):
    """The terms ``attack.regularizers`` may weigh: every term but ``match`` and ``features`` (a view of TERMS)."""

    def __getitem__(self, name: str) -> Term:
        if name in OWN_WEIGHT:
            raise KeyError(name)
        return TERMS[name]

    def __iter__(self) -> Iterator[str]:
        return (name for name in TERMS if name not in OWN_WEIGHT)

    def __len__(self) -> int:
        return sum(1 for _ in self)


REGULARIZERS: Mapping[str, Term] = _Regularizers()
register_regularizer = register_term  # a regulariser is a term weighted by attack.regularizers
