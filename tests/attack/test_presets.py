"""Attack presets picked by model (``attack.preset: auto``, gi/attack/recon/presets.py): ResNets get ``resnet``, every
other model ``default``, explicit keys still win, and the LeNet default job keeps its recipe."""

import json

import pytest

from gi.attack.recon.config import ReconConfig
from gi.attack.recon.presets import (
    AUTO,
    DEFAULT,
    MODEL_PRESETS,
    PRESETS,
    apply_preset,
    preset,
    register_model_preset,
    resolve,
)
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.run import RunConfig
from gi.experiments.run import run


def test_auto_picks_the_preset_registered_for_the_model():
    assert DEFAULT == AUTO
    assert {MODEL_PRESETS[m] for m in ("resnet18", "resnet32", "resnet50")} == {"resnet"}
    assert resolve(AUTO, "resnet18") == "resnet"
    assert resolve(AUTO, "lenet") == resolve(AUTO, None) == "default"
    assert resolve("fast", "resnet18") == "fast"  # a named preset is never replaced
    assert apply_preset({}, model="resnet18") == {**PRESETS["resnet"], "preset": "resnet"}
    assert apply_preset({}) == {**PRESETS["default"], "preset": "default"}
    assert apply_preset({"preset": "auto", "lr": 0.5}, model="resnet50")["lr"] == 0.5
    assert preset(AUTO, "resnet18") == PRESETS["resnet"]
    assert ReconConfig.from_preset(AUTO).optimizer == PRESETS["default"]["optimizer"]


def test_gi_run_picks_by_model_name_and_explicit_keys_win():
    lenet = load(RunConfig, "configs/default.yaml")
    assert lenet.attack.preset == "default"
    assert {k: getattr(lenet.attack, k) for k in PRESETS["default"]} == PRESETS["default"]
    resnet = load(RunConfig, "configs/default.yaml", ["model.name=resnet18", "attack.iterations=9"])
    assert resnet.attack.preset == "resnet" and resnet.attack.iterations == 9
    assert {k: getattr(resnet.attack, k) for k in PRESETS["resnet"] if k != "iterations"} == \
        {k: v for k, v in PRESETS["resnet"].items() if k != "iterations"}
    named = load(RunConfig, "configs/default.yaml", ["model.name=resnet18", "attack.preset=default"])
    assert named.attack.preset == "default" and named.attack.optimizer == "lbfgs"


def test_bad_preset_names_are_clear_errors():
    with pytest.raises(ConfigError, match="attack.preset='nope'.*'auto'"):
        load(RunConfig, "configs/default.yaml", ["model.name=resnet18", "attack.preset=nope"])
    with pytest.raises(ValueError, match="registered twice"):
        register_model_preset("resnet18", "resnet")
    with pytest.raises(ValueError, match="not a preset"):
        register_model_preset("my-net", "nope")
    assert "my-net" not in MODEL_PRESETS


@pytest.mark.slow
def test_resnet18_default_job_runs_the_resnet_preset(tmp_path):
    """End to end on a bundled CIFAR-10 image: labels -> features -> the resnet preset's signed Adam, a few steps;
    the attack objective falls below its start (~20 CPU-s: slow)."""
    cfg = load(RunConfig, "configs/default.yaml", [
        "model.name=resnet18", "model.init=null", "data.images=[0]", "attack.iterations=6", "attack.log_every=1",
        "attack.progress=false", "metrics.lpips_vgg=false", f"out={tmp_path / 'r'}"])
    result = run(cfg)
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    stages = metrics["stages"]
    assert [s["name"] for s in stages] == ["labels", "features", "reconstruct"]
    assert stages[2]["preset"] == "resnet" and stages[2]["optimizer"] == "adam"
    assert stages[1]["available"] and not stages[1]["matched"]  # f* computed, beta = 0 for ResNets
    objective = result.reconstructions[0].history["objective"]
    assert min(o[0] for o in objective[1:]) < objective[0][0]


def test_every_command_fills_its_attack_from_the_same_default_preset(tmp_path):
    """One default (preset auto) in gi run, gi attack, gi ablate and gi defend: the same attack keys in each."""
    from gi.experiments.config.ablate import AblateConfig
    from gi.experiments.config.attack import load_attack_config
    from gi.experiments.config.defend import DefendConfig

    path = tmp_path / "bare.yaml"
    path.write_text("model: {name: lenet}\nattack: {threads: 1}\nlabels: {mode: truth}\n")
    run = load(RunConfig, path).attack
    ablate = load(AblateConfig, path).attack
    defend = load(DefendConfig, path).attack
    attack = load_attack_config("runs/x.safetensors", ["attack.threads=1", "labels.mode=truth"]).attack
    assert run.preset == ablate.preset == defend.preset == attack.preset == "default"
    assert run == ablate == defend == attack
    for key, value in PRESETS["default"].items():
        assert getattr(run, key) == value, key
