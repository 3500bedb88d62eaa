"""How a federation's data is split among its clients: Dirichlet(α) label skew (Hsu et al. 2019), as RLU §4.1 and
Ramakrishna & Dán §6 partition their clients."""

from __future__ import annotations

import numpy as np
import torch

from gi.core.errors import ConfigError
from gi.world.data import class_order

Tensor = torch.Tensor


def dirichlet_partition(labels: Tensor, num_clients: int, alpha: float, generator: torch.Generator,
                        min_size: int = 1, balance: bool = False, max_tries: int = 1000) -> list[Tensor]:
    """Split sample indices over clients with per-class Dirichlet(α) proportions (RLU paper, App. B.5).

    For each class j, ``p⁽ʲ⁾ ~ Dir_K(α)`` (eq. 93) and client k gets ``N_k⁽ʲ⁾ ≈ p_k⁽ʲ⁾·N⁽ʲ⁾`` (eq. 94,
    rounded without bias, see :func:`_split_counts`) of the class's samples, shuffled. Redrawn until every
    client holds ``>= min_size`` samples. ``balance=True`` adds the reference code's rule (Yurochkin et
    al. / FedML): a client already expected to hold more than N/K samples gets proportion 0 for the next
    classes. Deterministic given ``generator``; returns ``num_clients`` sorted LongTensors that are
    disjoint and cover ``range(N)``. Small α → few classes per client; large α → every client close to
    the global class mix.
    """
    labels = torch.as_tensor(labels).long().reshape(-1)
    n = labels.shape[0]
    if num_clients < 1 or not alpha > 0 or min_size < 0:
        raise ConfigError(f"dirichlet_partition: need num_clients >= 1, alpha > 0, min_size >= 0; got "
                          f"{num_clients}, {alpha}, {min_size}")
    if min_size * num_clients > n:
        raise ConfigError(f"dirichlet_partition: {num_clients} clients × min_size {min_size} exceeds {n} samples")
    num_classes = int(labels.max()) + 1 if n else 0
    class_counts = torch.bincount(labels, minlength=num_classes).numpy()
    seed = int(torch.randint(2**62, (1,), generator=generator))
    rng = np.random.default_rng(seed)  # torch has no seeded Dirichlet sampler
    for _ in range(max_tries):
        props = rng.dirichlet(np.full(num_clients, float(alpha)), size=num_classes)  # (C, K)
        if balance:
            held = np.zeros(num_clients)
            for j in range(num_classes):  # sequential by construction: loops over classes, not samples
                p = props[j] * (held < n / num_clients)
                props[j] = p / p.sum() if p.sum() > 0 else props[j]
                held += props[j] * class_counts[j]
        counts = _split_counts(props, class_counts, rng.random(num_classes))  # (C, K)
        if counts.sum(0).min() >= min_size:
            break
    else:
        raise ConfigError(f"dirichlet_partition: no draw in {max_tries} gave every client >= {min_size} samples "
                          f"(alpha={alpha}); lower min_size or raise alpha")
    order = class_order(labels, generator)  # class blocks, shuffled inside
    client_sorted = torch.repeat_interleave(torch.arange(num_clients).repeat(num_classes),
                                            torch.from_numpy(counts.reshape(-1)))
    client = torch.empty(n, dtype=torch.long)
    client[order] = client_sorted
    by_client = torch.argsort(client, stable=True)  # ascending indices within each client
    sizes = torch.bincount(client, minlength=num_clients).tolist()
    return list(torch.split(by_client, sizes))


def _split_counts(props: np.ndarray, class_counts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-class integer shares ``(C, K)`` of ``p_k⁽ʲ⁾·N⁽ʲ⁾`` by systematic rounding.

    Share k is the difference of ``⌊cumsum(p)·N⁽ʲ⁾ + u_j⌋`` with ``u_j ~ U(0, 1)``: unbiased
    (``E[N_k⁽ʲ⁾] = p_k⁽ʲ⁾·N⁽ʲ⁾``) and never off by a whole sample. The reference code's plain floor
    (``np.split`` at ``⌊cumsum⌋``) hands every remainder to the last client, which matters for small classes.
    """
    bounds = np.floor(np.cumsum(props, axis=1) * class_counts[:, None] + offsets[:, None]).astype(np.int64)
    bounds = np.clip(bounds, 0, class_counts[:, None])
    bounds[:, -1] = class_counts
    bounds = np.maximum.accumulate(bounds, axis=1)
    return np.diff(bounds, axis=1, prepend=0)
