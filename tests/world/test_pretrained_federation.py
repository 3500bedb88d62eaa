"""``setup.train`` in the ``fedavg-client`` scenario: every trial's federation starts from one pre-trained model,
the same checkpoint (``gi.world.build.pretrained_model``) the ``fedsgd-batch`` scenario attacks."""

from __future__ import annotations

import pytest
import torch

from gi.core.errors import ConfigError
from gi.core.lru import LRU
from gi.world.scenarios import get_scenario

TRAIN = {"epochs": 4, "lr": 0.05, "momentum": 0.9, "batch_size": 16, "samples": 128}
MODEL = {"name": "cnn", "activation": "relu", "options": {"hidden": 16}}
SETUP = {"data": {"name": "fashion-mnist"}, "partition": "table", "num_clients": 2, "client_size": 24,
         "compositions": [[10] * 10, [0, 0, 50, 50, 0, 0, 0, 0, 0, 0]], "model": MODEL,
         "protocol": {"batch_size": 8, "lr": 0.01, "local_steps": 1}, "eval_samples": 0, "aux": {"per_class": 2}}


def _start(trials) -> dict[str, torch.Tensor]:
    """θ¹, the global model the round-1 clients received (every client of a round shares it)."""
    states = [t.capture.model_state for t in trials]
    assert all(s.keys() == states[0].keys() and all(torch.equal(s[k], states[0][k]) for k in s) for s in states)
    return states[0]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_every_trial_starts_from_the_one_pretrained_model(monkeypatch, tmp_path):
    from gi.world import build

    monkeypatch.setenv("GI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "TRAINED", LRU(4))  # no checkpoint of an earlier test in this process
    scenario = get_scenario("fedavg-client")
    warm = [_start(scenario({**SETUP, "train": TRAIN}, torch.Generator(), trial)) for trial in (0, 1)]
    cold = [_start(scenario(SETUP, torch.Generator(), trial)) for trial in (0, 1)]
    assert _same(warm[0], warm[1])  # one pre-trained model for every trial
    assert not _same(cold[0], cold[1])  # untrained: each trial its own initialisation
    assert not _same(warm[0], cold[0])
    # the checkpoint the batch scenario attacks for the same model / train / data / seed, kept on disk once
    batch = get_scenario("fedsgd-batch")({"data": {"name": "fashion-mnist"}, "model": MODEL, "train": TRAIN,
                                           "protocol": {"batch_size": 4}, "aux": {"per_class": 1}},
                                          torch.Generator().manual_seed(0), 0)
    attacked = batch[0].capture.model_state
    assert _same({k: attacked[k] for k in warm[0]}, warm[0])
    assert len(list((tmp_path / "trained").glob("*.safetensors"))) == 1


def test_pretraining_moves_the_model():
    """The warm start is a trained model: its loss on its own training samples is below the initial model's."""
    from gi.world.build import build_model, load_data, pretrained_model
    from gi.world.setup import DataConfig, ModelConfig, TrainConfig

    data, model, train = DataConfig(name="fashion-mnist", split="train"), ModelConfig(**MODEL), TrainConfig(**TRAIN)
    dataset = load_data(data)
    trained, info = pretrained_model(model, train, data, dataset, 0)
    initial = build_model(model, dataset, 0)
    x, y = dataset.images[:512], dataset.labels[:512]
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(m.eval()(x), y).item() for m in (initial, trained)]
    assert losses[1] < 0.9 * losses[0], (losses, info)


def test_bad_train_section_is_a_clear_error():
    with pytest.raises(ConfigError, match="train.epochs"):
        get_scenario("fedavg-client")({**SETUP, "train": {"epochs": -1}}, torch.Generator(), 0)
