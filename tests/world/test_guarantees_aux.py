"""Oracle hygiene: the attacker's auxiliary set never contains the victim's samples (checked by pixel equality),
in `gi run`, `gi ablate` and the label-benchmark scenarios that draw aux and victim from one split."""

from __future__ import annotations

import pytest
import torch

import gi.experiments.run as pipeline
import gi.world.data as gdata
from gi.core.config import load
from gi.experiments.ablate import _captures
from gi.experiments.config.ablate import AblateConfig, setting_config
from gi.experiments.config.run import RunConfig
from gi.experiments.run import run


def _shared_images(aux_images: torch.Tensor, victim_images: torch.Tensor) -> int:
    """How many aux images are pixel-identical to some victim image."""
    a = aux_images.reshape(aux_images.shape[0], -1).float()
    v = victim_images.reshape(victim_images.shape[0], -1).float()
    return int((a[:, None, :] == v[None, :, :]).all(-1).any(1).sum())


class _Stop(Exception):
    pass


def _aux_of_run(monkeypatch, tmp_path, overrides: list[str]):
    """The aux set and truth `gi run` hands to its label stage (the run stops there)."""
    seen = {}
    real = pipeline.capture_all

    def record(*args):
        captures, truths = real(*args)
        seen["truth"] = truths[0]
        return captures, truths

    def stop(lcfg, attack, captures, truths=None, aux=None):
        seen["aux"] = aux
        raise _Stop()

    monkeypatch.setattr(pipeline, "capture_all", record)
    monkeypatch.setattr(pipeline, "prepare_attack", stop)
    with pytest.raises(_Stop):
        run(load(RunConfig, "configs/demo.yaml", overrides + [f"out={tmp_path / 'run'}"]))
    return seen["aux"], seen["truth"]


def test_gi_run_aux_never_holds_the_victim_image(monkeypatch, tmp_path):
    """The issue's example: `gi run configs/demo.yaml labels.aux_per_class=2` put the victim image in the aux set."""
    aux, truth = _aux_of_run(monkeypatch, tmp_path, ["labels.aux_per_class=2"])
    assert aux is not None and aux.images.shape[0] > 0
    shared = _shared_images(aux.images, truth.images)
    assert shared == 0, f'{shared} aux image(s) equal a victim image'


@pytest.mark.parametrize("seed", range(6))
def test_gi_run_aux_excludes_random_batches(monkeypatch, tmp_path, seed):
    aux, truth = _aux_of_run(monkeypatch, tmp_path, ["labels.aux_per_class=2", "data.indices=null",
                                                     "protocol.batch_size=4", f"seed={seed}"])
    shared = _shared_images(aux.images, truth.images)
    assert shared == 0, f'{shared} aux image(s) equal a victim image'


def test_gi_run_aux_excludes_both_images_of_a_mixup(monkeypatch, tmp_path):
    aux, truth = _aux_of_run(monkeypatch, tmp_path, ["labels.aux_per_class=2", "data.indices=null",
                                                     "protocol.batch_size=3", "protocol.label_aug=mixup"])
    dataset = gdata.load("cifar10-samples", split="test")
    idx = torch.as_tensor(truth.meta["indices"])
    assert idx.numel() == 6  # the two images of every mixed sample
    shared = _shared_images(aux.images, dataset.images[idx])
    assert shared == 0, f'{shared} aux image(s) equal a victim image'


@pytest.mark.parametrize("seed", [3, 4])
def test_gi_ablate_aux_never_holds_a_victim_image(seed):
    """configs/ablate/rlu-fig3.yaml had 1-2 victim images in its aux set at seeds 3 and 4."""
    cfg = load(AblateConfig, "configs/ablate/rlu-fig3.yaml", [f"seed={seed}", "trials=4"])
    captures, truths, aux = _captures(setting_config(cfg, "base"))
    victims = torch.cat([t.images for t in truths])
    assert aux.images.shape[0] == 100 and victims.shape[0] == 36
    shared = _shared_images(aux.images, victims)
    assert shared == 0, f'{shared} aux image(s) equal a victim image'


def test_fedsgd_batch_scenario_with_one_split_keeps_aux_and_victims_apart():
    from gi.world.scenarios import get_scenario

    setup = {"victim_split": "test", "aux_split": "test", "batch_size": 64, "aux": {"per_class": 20}, "seed": 1}
    gen = torch.Generator().manual_seed(0)
    scenario = get_scenario("fedsgd-batch")
    trials = [t for i in range(3) for t in scenario(dict(setup), gen, i)]
    aux = trials[0].aux
    shared = _shared_images(aux.images, torch.cat([t.truth.images for t in trials]))
    assert shared == 0, f'{shared} aux image(s) equal a victim image'


def test_fedavg_client_scenario_with_one_split_keeps_aux_and_clients_apart():
    from gi.world.scenarios import get_scenario

    setup = {"split": "test", "aux_split": "test", "aux_per_class": 20, "num_clients": 3, "partition": "table",
             "client_size": 30, "compositions": [[1] * 10] * 3, "protocol": {"batch_size": 10}, "seed": 2}
    trials = get_scenario("fedavg-client")(setup, torch.Generator().manual_seed(0), 0)
    dataset = gdata.load("fashion-mnist", split="test")  # clients' truths carry their dataset indices, not images
    client_images = dataset.images[torch.cat([t.truth.extra["indices"].flatten() for t in trials]).unique()]
    assert client_images.shape[0] == 90
    shared = _shared_images(trials[0].aux.images, client_images)
    assert shared == 0, f'{shared} aux image(s) equal a victim image'
