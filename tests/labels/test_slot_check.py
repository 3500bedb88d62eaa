"""labels.slot_check: batch counts checked against the last layer's gradient (soft-label paper eq. 2 for a
batch) and moved sample by sample where a neighbour explains it clearly better."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gi.attack.stages import LabelConfig, attack_labels, label_stage
from gi.label_result import LabelResult
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from labels.slot_check import check_counts, neighbours, slot_targets


@pytest.fixture(scope="module")
def batch():
    """Six CIFAR-10 samples with a repeated class, the zoo's small ReLU CNN, the float32 FedSGD gradient."""
    data = load("cifar10-samples")
    idx = [i for i in range(20) if int(data.labels[i]) in (0, 1, 2, 3, 6)][:6]
    model = build("cnn", 10, in_shape=(3, 32, 32), seed=0, activation="relu", channels=(8,), hidden=32)
    capture, truth = capture_gradients(model, data.images[idx], data.labels[idx], Protocol(batch_size=6))
    return capture, truth.counts.long()


def test_right_counts_are_kept_and_a_count_one_sample_off_is_moved_back(batch):
    capture, counts = batch
    right = check_counts(capture, LabelResult.from_counts("m", counts))
    assert torch.equal(right.counts, counts)
    check = right.info["gradient_check"]
    assert check["applied"] and check["moved"] == [] and check["residual"] < 1e-4
    present = int(counts.argmax())
    absent = int((counts == 0).nonzero()[0])
    off = counts.clone()
    off[present] -= 1
    off[absent] += 1  # one sample of the repeated class called another class
    fixed = check_counts(capture, LabelResult.from_counts("m", off))
    assert torch.equal(fixed.counts, counts) and fixed.info["gradient_check"]["moved"] == [[absent, present]]
    assert fixed.info["gradient_check"]["recovered_residual"] > 100 * fixed.info["gradient_check"]["residual"]
    assert torch.allclose(fixed.proportions, counts.double() / 6)


def test_neighbours_are_the_moves_the_bias_gradient_allows_likeliest_first():
    counts = torch.tensor([2, 1, 0, 1])
    summed = torch.tensor([1.5, 0.6, 0.3, 1.2])  # class 1 cannot lose its sample: 0.6 − 1 < 0
    estimate = torch.tensor([1.0, 1.0, 1.0, 1.0])  # class 0 has one too many, class 2 one too few
    moves = neighbours(counts, summed, estimate)
    assert sorted(moves) == [(0, 1), (0, 2), (0, 3), (3, 0), (3, 1), (3, 2)]
    assert moves[0] == (0, 2)
    assert not any(a in (1, 2) for a, _ in moves)  # class 2 has no sample; class 1's summed probability is < 1


@settings(max_examples=20, deadline=None, derandomize=True)
@given(counts=st.lists(st.integers(0, 3), min_size=2, max_size=8))
def test_slot_targets_are_one_hot_rows_class_by_class(counts):
    t = slot_targets(torch.tensor(counts))
    assert t.shape == (sum(counts), len(counts)) and torch.equal(t.sum(0).long(), torch.tensor(counts))
    assert torch.equal(t.argmax(1), t.argmax(1).sort().values) if len(t) else True


def test_where_the_check_does_not_apply_the_result_is_kept_with_the_reason(batch, monkeypatch):
    capture, counts = batch
    failed = LabelResult.failure("m", 10, "no aux")
    assert check_counts(capture, failed).info["gradient_check"] == {"applied": False,
                                                                   "reason": "the label method failed"}
    soft = LabelResult.from_counts("m", counts, soft=slot_targets(counts).float())
    assert "soft labels" in check_counts(capture, soft).info["gradient_check"]["reason"]
    short = counts.clone()
    short[int(counts.argmax())] -= 1  # five counted samples for a capture of six
    kept = check_counts(capture, LabelResult.from_counts("m", short))
    assert torch.equal(kept.counts, short) and "sum to 5 but the capture has 6" in kept.info["gradient_check"]["reason"]
    big = check_counts(capture, LabelResult.from_counts("m", counts), starts=12)
    assert big.info["gradient_check"]["applied"]
    monkeypatch.setattr("labels.slot_check.CHECK_BYTES", 1024)  # a bound below this 6-sample system
    assert "above the check's" in check_counts(capture, LabelResult.from_counts("m", counts)).info[
        "gradient_check"]["reason"]
    model = build("cnn", 10, in_shape=(3, 32, 32), seed=0, activation="relu", channels=(8,), hidden=32)
    data = load("cifar10-samples")
    one, truth = capture_gradients(model, data.images[:1], data.labels[:1], Protocol(batch_size=1))
    kept = check_counts(one, LabelResult.from_counts("m", truth.counts))
    assert torch.equal(kept.counts, truth.counts) and not kept.info["gradient_check"]["applied"]


def test_the_label_stage_checks_recovered_counts_unless_told_not_to(batch):
    capture, counts = batch
    on, _ = attack_labels(LabelConfig(method="ilrg-robust"), capture, None)
    off, _ = attack_labels(LabelConfig(method="ilrg-robust", check=False), capture, None)
    assert on.info["gradient_check"]["applied"] and "gradient_check" not in off.info
    assert torch.equal(on.counts, counts)
    _, _, record = label_stage(LabelConfig(method="ilrg-robust"), [capture], [None], None)
    assert record["gradient_check"]["checked"] == 1 and record["gradient_check"]["changed"] == 0


def test_checked_is_a_label_method_of_its_own(batch):
    """`checked` runs the named method and the check, so a `gi labels` table can hold both rows."""
    import labels

    capture, counts = batch
    got = labels.recover(capture, "checked", base="ilrg-robust")
    plain = labels.recover(capture, "ilrg-robust")
    assert got.method == "checked" and got.info["checked_method"] == "ilrg-robust"
    assert got.info["gradient_check"]["applied"] and torch.equal(got.counts, counts)
    assert torch.equal(got.counts, check_counts(capture, plain).counts)


@pytest.mark.parametrize("options, match", [
    ({"base": "checked"}, "cannot be checked itself"),
    ({"base": "nope"}, "base='nope': unknown label method"),
    ({"base": "posterior", "options": {"x": 1}}, r"'posterior' takes no option\(s\) \['x'\]"),
    ({"bad": 1}, r"'checked' takes no option\(s\) \['bad'\]"),
])
def test_checked_options_are_checked_at_load(options, match):
    from gi.core.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        LabelConfig(method="checked", options=options)
