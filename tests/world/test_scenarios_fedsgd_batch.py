"""The ``synthetic_classes`` option of the ``fedsgd-batch`` scenario (random labels for untrained models)."""

from __future__ import annotations

import pytest
import torch

from gi.core.errors import ConfigError
from gi.world.build import synthetic_labels
from gi.world.scenarios import get_scenario


def _setup(**extra):
    setup = {"dataset": "fashion-mnist", "victim_split": "test", "aux_split": "test", "batch_size": 64,
             "model": {"name": "linear"}, "aux": {"per_class": 3}, "synthetic_classes": 37}
    setup.update(extra)
    return setup


def test_synthetic_labels_are_balanced_in_range_and_seeded():
    a = synthetic_labels(1000, 37, 0, "test")
    assert a.dtype == torch.long and int(a.min()) == 0 and int(a.max()) == 36
    counts = torch.bincount(a, minlength=37)
    assert int(counts.max() - counts.min()) <= 1  # balanced: 1000 = 27·37 + 1
    assert torch.equal(a, synthetic_labels(1000, 37, 0, "test"))
    assert not torch.equal(a, synthetic_labels(1000, 37, 1, "test"))
    assert not torch.equal(a, synthetic_labels(1000, 37, 0, "train"))


def test_synthetic_classes_relabel_victim_and_aux_with_C_outputs():
    scenario = get_scenario("fedsgd-batch")
    trials = [t for i in range(2) for t in scenario(_setup(), torch.Generator().manual_seed(0), i)]
    again = scenario(_setup(), torch.Generator().manual_seed(0), 0)[0]
    relabelled = synthetic_labels(10_000, 37, 0, "test")
    for t in trials:
        assert t.capture.gradients["fc.weight"].shape[0] == 37 and t.capture.gradients["fc.bias"].shape == (37,)
        assert t.truth.counts.shape == (37,) and int(t.truth.counts.sum()) == 64
        assert int(t.truth.labels.min()) >= 0 and int(t.truth.labels.max()) < 37
        assert t.aux.num_classes == 37 and t.aux.per_class.tolist() == [3] * 37
    # the labels are the fixed relabelling: an image keeps its synthetic label wherever it is drawn
    from gi.world.data import load

    data = load("fashion-mnist", split="test")
    flat = data.images.flatten(1)
    t = trials[0]
    for images, labs in [(t.truth.images, t.truth.labels), (t.aux.images, t.aux.labels)]:
        idx = (images.flatten(1)[:, None, :] == flat[None]).all(-1).float().argmax(1)
        assert torch.equal(labs, relabelled[idx])
    assert torch.equal(again.truth.labels, trials[0].truth.labels)  # deterministic for a seed
    assert torch.equal(again.capture.gradients["fc.weight"], trials[0].capture.gradients["fc.weight"])


def test_synthetic_classes_refuse_training_and_bad_values():
    scenario = get_scenario("fedsgd-batch")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="untrained"):
        scenario(_setup(train={"epochs": 1, "samples": 64}), gen, 0)
    for bad in (1, 2.5, True, "100"):
        with pytest.raises(ConfigError, match="synthetic_classes"):
            scenario(_setup(synthetic_classes=bad), gen, 0)
