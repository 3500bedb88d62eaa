"""One typed victim-setup schema: gi run, gi ablate, gi sweep and the gi labels scenarios share
gi.world.setup's sections; derived settings are derived, never stored over a user's value; old spellings
still load, with a notice, to the same settings."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import pytest
import torch
import yaml

import gi.experiments.run as pipeline
import gi.world.build as builders
import gi.world.setup as setup
from gi.core.config import load, to_dict
from gi.core.errors import ConfigError
from gi.experiments.config.ablate import AblateConfig
from gi.experiments.config.defend import DefendConfig
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.experiments.config.run import RunConfig, RunDataConfig
from gi.experiments.config.sweep import SweepConfig
from gi.world.fl.protocol import Protocol
from gi.world.scenarios import get_scenario
from gi.world.scenarios.fedavg_client import FedAvgClientSetup
from gi.world.scenarios.fedsgd_batch import FedSGDBatchSetup
from gi.world.scenarios.single_sample import SingleSampleSetup

SECTIONS = {"data": setup.DataConfig, "model": setup.ModelConfig, "train": setup.TrainConfig,
            "aux": setup.AuxConfig, "protocol": Protocol}
USERS = [RunConfig, AblateConfig, DefendConfig, FedSGDBatchSetup, FedAvgClientSetup, SingleSampleSetup]
CONFIGS = sorted(p for p in Path("configs").rglob("*.yaml") if not any(part.startswith("_") for part in p.parts))
CLASSES = {"labels": LabelBenchConfig, "ablate": AblateConfig, "sweep": SweepConfig, "defend": DefendConfig}


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.parts[1] != "bench"], ids=str)
def test_every_config_loads_in_the_one_spelling(path, caplog):
    """Every shipped run / ablate / sweep / labels config loads (every grid point's setup typed and checked) and
    uses no old spelling."""
    with caplog.at_level(logging.WARNING, logger="gi.setup"):
        cfg = load(CLASSES.get(path.parts[1] if len(path.parts) > 2 else "", RunConfig), path)
        if path.parts[1] == "labels":
            scenario = get_scenario(cfg.scenario)
            assert all(isinstance(scenario.resolve(s), scenario.setup) for _, s in grid_points(cfg))
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()], caplog.text


@pytest.mark.parametrize("cls", USERS, ids=lambda c: c.__name__)
def test_the_shared_sections_are_the_one_definition(cls):
    """RunConfig, AblateConfig and every scenario setup are VictimSetups whose sections are the shared classes
    (gi run's data section extends the shared one with how it draws its batch)."""
    assert issubclass(cls, setup.VictimSetup)
    hints = typing.get_type_hints(cls)
    for name, shared in SECTIONS.items():
        if cls in (RunConfig, AblateConfig) and name == "data":
            assert hints[name] is RunDataConfig and issubclass(RunDataConfig, setup.DataConfig)
        else:
            assert hints[name] is shared, (cls, name)
    own = {f.name for f in dataclasses.fields(cls)} - set(SECTIONS)
    assert not own & {"dataset", "aux_per_class", "aux_split", "victim_split", "train_split", "local_steps",
                      "batch_size", "label_aug", "train_epochs", "train_lr"}  # no second spelling of a section key


def test_gi_run_and_the_scenarios_use_the_same_classes():
    assert issubclass(RunDataConfig, setup.DataConfig)
    assert typing.get_type_hints(RunConfig)["model"] is setup.ModelConfig
    assert {get_scenario(n).setup for n in ("fedsgd-batch", "fedavg-client", "single-sample")} == \
        {FedSGDBatchSetup, FedAvgClientSetup, SingleSampleSetup}
    assert issubclass(AblateConfig, RunConfig)
    assert not {"data", "model", "train", "aux", "protocol", "labels", "attack"} & set(AblateConfig.__annotations__)


def test_attack_labels_is_derived_and_an_explicit_contradiction_is_a_config_error():
    assert load(RunConfig, "configs/demo.yaml", ["labels.mode=joint"]).attack.labels == "joint"
    assert load(RunConfig, "configs/demo.yaml", ["labels.mode=joint", "attack.labels=joint"]).attack.labels == "joint"
    assert load(RunConfig, "configs/demo.yaml").attack.labels == "fixed"
    for over in (["labels.mode=joint", "attack.labels=fixed"], ["attack.labels=joint"]):
        with pytest.raises(ConfigError, match="attack.labels.*labels.mode"):
            load(RunConfig, "configs/demo.yaml", over)
    with pytest.raises(ConfigError, match="attack.labels"):  # ablate: each row's mode decides
        load(AblateConfig, "configs/ablate/table4.yaml", ["attack.labels=fixed"])
    with pytest.raises(ConfigError, match="unknown attack key"):
        load(AblateConfig, "configs/ablate/table4.yaml", ["attack_variants={v: {labels: joint}}"])


def test_config_yaml_written_by_gi_run_is_what_ran(tmp_path, monkeypatch):
    import gi.attack.recon

    seen = {}
    real = gi.attack.recon.reconstruct_many

    def spy(captures, labels, features=None, config=None, callbacks=(), **kw):
        seen["attack"] = config
        return real(captures, labels, features=features, config=config, callbacks=callbacks, **kw)

    monkeypatch.setattr(gi.attack.recon, "reconstruct_many", spy)
    cfg = load(RunConfig, "configs/demo.yaml", ["labels.mode=joint", "attack.iterations=2", "attack.progress=false",
                                                "metrics.lpips_vgg=false", f"out={tmp_path / 'run'}"])
    pipeline.run(cfg)
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written == to_dict(cfg)
    assert written["attack"] == to_dict(seen["attack"]) and seen["attack"].labels == "joint"
    assert to_dict(load(RunConfig, tmp_path / "run" / "config.yaml")) == written  # re-loads as-is


def test_old_spellings_load_to_the_same_settings_with_a_notice(caplog, monkeypatch):
    monkeypatch.setattr(setup, "_WARNED", set())  # the notice comes once per process
    old = load(RunConfig, "configs/demo.yaml", ["model.train_epochs=2", "model.train_lr=0.5",
                                                "labels.aux_per_class=3"])
    new = load(RunConfig, "configs/demo.yaml", ["train.epochs=2", "train.lr=0.5", "aux.per_class=3"])
    assert to_dict(old) == to_dict(new)
    assert "model.train_epochs is deprecated: write train.epochs" in caplog.text
    with pytest.raises(ConfigError, match="labels.aux_per_class"):  # an error names the key as written
        load(RunConfig, "configs/demo.yaml", ["labels.aux_per_class=-1"])
    with pytest.raises(ConfigError, match="both given"):
        load(RunConfig, "configs/demo.yaml", ["model.train_epochs=2", "train.epochs=3"])
    flat = {"dataset": "fashion-mnist", "victim_split": "test", "aux_split": "test", "batch_size": 8,
            "train_split": "test", "aux": {"per_class": 2}, "model": {"name": "linear"}}
    nested = {"data": {"name": "fashion-mnist", "split": "test"}, "aux": {"per_class": 2, "split": "test"},
              "protocol": {"batch_size": 8}, "train": {"split": "test"}, "model": {"name": "linear"}}
    scenario = get_scenario("fedsgd-batch")
    assert scenario.resolve(flat) == scenario.resolve(nested)
    fedavg = get_scenario("fedavg-client")
    assert fedavg.resolve({"aux_per_class": 3, "local_steps": 2}) == \
        fedavg.resolve({"aux": {"per_class": 3}, "protocol": {"local_steps": 2}})
    single = get_scenario("single-sample")
    assert single.resolve({"label_aug": "mixup", "model": {"reseed_every": 5}}) == \
        single.resolve({"protocol": {"label_aug": "mixup"}, "reseed_every": 5})


def test_section_defaults_are_per_command_and_derived_settings_are_not_stored():
    s = FedSGDBatchSetup.from_mapping({"model": {"activation": "relu"}, "train": {"epochs": 1}, "reinit": 4})
    assert (s.model.name, s.train.lr, s.aux.per_class, s.aux.split, s.protocol.batch_size) == \
        ("lenet5", 0.001, 100, "test", 32)
    assert s.models is False and s.reinit == 4  # a trained model is trained once; reinit is kept as written
    assert FedSGDBatchSetup.from_mapping({"reinit": 4}).models == 4
    assert FedAvgClientSetup.from_mapping({}).protocol.scheme == "fedavg"
    assert SingleSampleSetup.from_mapping({}).train.epochs == 0  # no train section: untrained
    assert SingleSampleSetup.from_mapping({"train": {"lr": 0.1}}).train.epochs == 1.0  # a train section: 1 epoch
    assert SingleSampleSetup.from_mapping({}).model.bias_last is False and RunConfig().model.bias_last is True
    with pytest.raises(ConfigError, match="unknown key"):
        get_scenario("single-sample")({"epsilon": [0, 1]}, torch.Generator(), 0)
    with pytest.raises(ConfigError, match="scheme"):
        FedSGDBatchSetup.from_mapping({"protocol": {"scheme": "fedavg"}})


def test_grid_keys_in_the_old_spelling_set_the_new_keys_and_keep_their_labels(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"scenario": "fedavg-client", "labels": {"methods": ["rlu"]},
                                    "setup": {"aux_per_class": 5}, "grid": {"aux_per_class": [1, 2]}}))
    points = grid_points(load(LabelBenchConfig, path))
    assert [p for p, _ in points] == ["aux_per_class=1", "aux_per_class=2"]
    assert [s["aux"] for _, s in points] == [{"per_class": 1}, {"per_class": 2}]


def test_one_place_trains_and_caches(monkeypatch):
    calls = []

    def train(model):
        calls.append(1)
        with torch.no_grad():
            model.fc.bias.fill_(0.5)
        return {"steps": 1}

    def build():
        return builders.build_model(setup.ModelConfig(name="linear"), _Data(), seed=3)

    a, info = builders.trained_model("test-key", build, train)
    b, _ = builders.trained_model("test-key", build, train)
    assert calls == [1] and info == {"steps": 1} and a is not b
    assert torch.equal(a.fc.bias, b.fc.bias) and float(b.fc.bias[0]) == 0.5


class _Data:
    images = torch.zeros(2, 1, 4, 4)
    num_classes = 3
