"""Partitions of the `fedavg-client` scenario (Ramakrishna & Dán §6 simplex clients, Decaf table clients)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gi.core.errors import ConfigError
from gi.world.scenarios.fedavg_client import _simplex_partition, _table_partition
from labels.counts import largest_remainder

C = 10


def _labels(per_class: int) -> torch.Tensor:
    return torch.arange(C).repeat_interleave(per_class)[torch.randperm(C * per_class,
                                                                      generator=torch.Generator().manual_seed(1))]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(5, 60), st.integers(0, 60), st.integers(0, 2**31 - 1))
def test_simplex_partition_is_disjoint_and_sized(clients, low, extra, seed):
    """N_k ~ U[low, high], clients disjoint, every index of the right class pool."""
    labels = _labels(600)
    parts = _simplex_partition(labels, clients, (low, low + extra), C, torch.Generator().manual_seed(seed))
    assert len(parts) == clients
    sizes = [len(p) for p in parts]
    assert all(low <= n <= low + extra for n in sizes)
    flat = torch.cat(parts)
    assert len(torch.unique(flat)) == len(flat)  # disjoint, no repeats
    assert all(torch.equal(p, torch.sort(p).values) for p in parts)


def test_simplex_proportions_are_uniform_on_the_simplex():
    """Dirichlet(1) moments: E p_c = 1/C and E‖p − 1/C‖²/C = (C − 1)/(C²(C + 1)) = 0.00818 for C = 10 — the
    uniform-guess prop_mse (the paper's sum-MSE ≈ 0.082 is C times it)."""
    labels = _labels(6000)
    gen = torch.Generator().manual_seed(0)
    props = []
    for _ in range(30):
        parts = _simplex_partition(labels, 10, (900, 1000), C, gen)
        props += [torch.bincount(labels[p], minlength=C).double() / len(p) for p in parts]
    p = torch.stack(props)
    assert torch.allclose(p.mean(0), torch.full((C,), 0.1, dtype=torch.float64), atol=0.02)
    mse = float((p - 0.1).pow(2).mean())
    assert mse == pytest.approx((C - 1) / (C * C * (C + 1)), rel=0.12)


def test_simplex_partition_too_large_is_a_clear_error():
    with pytest.raises(ConfigError, match="too few samples"):
        _simplex_partition(_labels(20), 10, (150, 200), C, torch.Generator().manual_seed(0))


def test_table_partition_follows_the_compositions():
    labels = _labels(100)
    comps = [[10] * C, [0, 0, 33.33, 5, 0, 0, 26.67, 3.33, 0, 31.67], [0, 0, 0, 0, 0, 0, 0, 0.5, 0, 0]]
    parts = _table_partition(labels, comps, 80, C, torch.Generator().manual_seed(0))
    for row, part in zip(comps, parts):
        row = torch.tensor(row, dtype=torch.float64)
        assert torch.equal(torch.bincount(labels[part], minlength=C), largest_remainder(row / row.sum(), 80))
    flat = torch.cat(parts)
    assert len(torch.unique(flat)) == len(flat)
    with pytest.raises(ConfigError, match="too few samples"):  # class 7: 8 + 3 + 80 > 100
        _table_partition(labels, comps + [[0] * 7 + [1, 0, 0]], 80, C, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="non-negative"):
        _table_partition(labels, [[1, -1] + [0] * 8], 10, C, torch.Generator())


def test_dirichlet_subset_partitions_only_that_many_samples():
    """``samples``: a seeded random subset of the client data is split; parts index the full dataset."""
    from types import SimpleNamespace

    from gi.world.scenarios.fedavg_client import FedAvgClientSetup, _partition

    labels = _labels(300)
    setup = FedAvgClientSetup(samples=400, min_size=5, alpha=0.5)
    parts = _partition(setup, SimpleNamespace(labels=labels), torch.Generator().manual_seed(0))
    flat = torch.cat(parts)
    assert len(parts) == 10 and len(flat) == 400 and len(torch.unique(flat)) == 400
    assert int(flat.max()) < len(labels) and min(len(p) for p in parts) >= 5
    again = _partition(setup, SimpleNamespace(labels=labels), torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ConfigError, match="samples"):
        _partition(FedAvgClientSetup(samples=4000), SimpleNamespace(labels=labels), torch.Generator())
    with pytest.raises(ConfigError, match="samples"):
        FedAvgClientSetup(samples=400, partition="simplex")
