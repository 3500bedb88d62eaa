import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from labels.counts import largest_remainder, round_counts

estimates = st.lists(st.floats(-5, 50, allow_nan=False), min_size=2, max_size=20)


@settings(max_examples=200, deadline=None)
@given(estimates, st.integers(0, 300))
def test_counts_non_negative_and_sum_to_total(est, total):
    for counts in (largest_remainder(torch.tensor(est), total), round_counts(torch.tensor(est), total, False)):
        assert counts.dtype == torch.long and counts.min() >= 0 and int(counts.sum()) == total


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=2, max_size=15))
def test_exact_integer_estimates_are_kept(true):
    t = torch.tensor(true)
    total = int(t.sum())
    assert torch.equal(largest_remainder(t.double(), total), t)
    assert torch.equal(round_counts(t.double(), total, rescale=False), t)


@settings(max_examples=100, deadline=None)
@given(estimates, st.integers(1, 100))
def test_permutation_equivariance(est, total):
    x = torch.tensor(est)
    perm = torch.randperm(len(est), generator=torch.Generator().manual_seed(len(est)))
    a = largest_remainder(x, total)[perm]
    b = largest_remainder(x[perm], total)
    # equal up to ties in the remainders; the multiset is always equal
    assert torch.equal(torch.sort(a).values, torch.sort(b).values)


def test_largest_remainder_known_case():
    assert largest_remainder(torch.tensor([1.4, 1.4, 1.2]), 4).tolist() == [2, 1, 1]
    assert largest_remainder(torch.tensor([0.0, 0.0]), 3).tolist() == [2, 1]


def test_idlg_recovers_single_label_and_registry_lists_it():
    model = build("lenet", 10, init="uniform", seed=0)
    cap, truth = capture_gradients(model, torch.rand(1, 3, 32, 32), torch.tensor([7]), Protocol())
    res = labels.recover(cap, "idlg")
    assert res.ok and torch.equal(res.counts, truth.counts) and "idlg" in labels.METHODS
