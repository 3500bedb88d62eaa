"""Issue 15: packed problems give every capture the images it gets alone, the packed bench entry, the training
cache, the trained-ResNet scenario's setup, and the raw per-step path."""

from __future__ import annotations

import json

import pytest
import torch

from gi.analysis.metrics import psnr
from gi.attack.recon import ReconConfig, reconstruct, reconstruct_many
from gi.attack.recon.config import compile_mode
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import build_problem
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.bench import entries, measure_packed
from gi.experiments.config.bench import BenchConfig
from gi.world.train import train_model, training_key


def test_every_packed_problem_starts_from_the_image_it_starts_from_alone(lenet_captures):
    caps = lenet_captures(3)
    for cfg in (ReconConfig(iterations=2, progress=False), ReconConfig(iterations=2, restarts=2, init="gaussian",
                                                                       labels="joint", progress=False)):
        label_results = [result if cfg.labels == "fixed" else None for _, result, _ in caps]
        packed = GradientInversion(build_problem([c for c, _, _ in caps], label_results, cfg), cfg)
        for i, (c, _, _) in enumerate(caps):
            alone = GradientInversion(build_problem([c], [label_results[i]], cfg), cfg)
            r = cfg.restarts
            assert torch.equal(packed.images[i * r:(i + 1) * r], alone.images)
            if cfg.labels == "joint":
                assert torch.equal(packed.label_logits[i * r:(i + 1) * r], alone.label_logits)


def test_reconstruct_many_gives_each_capture_the_images_it_gets_alone(lenet_captures):
    caps = lenet_captures(2)
    cfg = ReconConfig(iterations=12, lr=0.01, regularizers={"tv": 2e-3}, progress=False, threads=1)
    packed = reconstruct_many([c for c, _, _ in caps], [result for _, result, _ in caps], config=cfg)
    for (c, label_result, truth), rec in zip(caps, packed):
        alone = reconstruct(c, label_result, config=cfg)
        # vmap vs plain autograd differ by float rounding only; signed Adam turns a rounding-level gradient into a
        # full step of a few pixels, so the images agree on average, not bit for bit
        assert (alone.images - rec.images).abs().mean() < 2e-3
        assert abs(float(psnr(alone.images, truth.images).mean()) - float(psnr(rec.images, truth.images).mean())) < 0.05


def test_the_step_uses_raw_torch_optimisers_and_compiles_only_the_vmap_path(lenet_captures):
    (c, label_result, _), = lenet_captures(1)
    module = GradientInversion(build_problem([c], [label_result], ReconConfig(compile=True)), ReconConfig(compile=True))
    assert module.step_objective == module.objective  # one problem: the loop path (autograd.grad), never compiled
    rec = reconstruct(c, label_result, config=ReconConfig(iterations=3, progress=False))
    assert rec.iterations == 3 and len(rec.history["step"]) == 2  # step 0 and the last step


@pytest.mark.parametrize("value, mode", [(True, "default"), ("reduce-overhead", "reduce-overhead"),
                                         ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_attack_compile_names_the_torch_compile_mode_of_the_vmap_objective(lenet_captures, monkeypatch, value, mode):
    modes = []

    def record(fn, mode=None):
        modes.append(mode)
        return fn

    monkeypatch.setattr(torch, "compile", record)
    caps = lenet_captures(2)
    cfg = ReconConfig(compile=value, batching="vmap")
    GradientInversion(build_problem([c for c, _, _ in caps], [result for _, result, _ in caps], cfg), cfg)
    assert modes == [mode]


def test_compile_mode_maps_a_setting_to_the_torch_compile_mode():
    assert compile_mode(False) is None and compile_mode(True) == "default"
    assert compile_mode("max-autotune") == "max-autotune"
    with pytest.raises(ConfigError, match="packed.compile='fast' is not a torch.compile mode"):
        compile_mode("fast", "packed.compile")


def test_the_packed_entry_carries_its_compile_mode():
    cfg = load(BenchConfig, "configs/bench/packed.yaml", ["packed.compile=reduce-overhead", "devices=[cpu]"])
    (entry,) = [e for e in entries(cfg) if e.get("kind") == "packed"]
    assert entry["compile"] == "reduce-overhead"
    (plain,) = [e for e in entries(load(BenchConfig, "configs/bench/packed.yaml", ["devices=[cpu]"]))
                if e.get("kind") == "packed"]
    assert plain["compile"] is False


def test_packed_bench_entry_reports_throughput_and_psnr_both_ways(tmp_path):
    cfg = load(BenchConfig, "configs/bench/packed.yaml", ["packed.captures=2", "packed.iterations=4",
                                                          "packed.rounds=1"])
    (entry,) = [e for e in entries(cfg) if e.get("kind") == "packed"]
    assert [e for e in entries(cfg) if e.get("kind") != "packed"] == []
    (row,) = measure_packed(entry)
    assert row["captures"] == 2 and len(row["packed_psnr"]) == len(row["single_psnr"]) == 2
    assert row["speedup"] == pytest.approx(row["single_seconds"] / row["packed_seconds"])
    assert row["packed_per_cpu_core_hour"] == pytest.approx(2 / row["packed_seconds"] * 3600)
    assert row["psnr_max_abs_diff"] < 0.05
    json.dumps(row)


@pytest.mark.parametrize("over, match", [
    (["packed.captures=-1"], "packed.captures"), (["packed.iterations=2"], "packed.iterations"),
    (["packed.rounds=0"], "packed.rounds"), (["packed.captures=2", "packed.model=nonet"], "nonet"),
    (["packed.compile=fastest"], "packed.compile.*reduce-overhead"), (["packed.compile=3"], "packed.compile"),
])
def test_bad_packed_configs_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        load(BenchConfig, "configs/bench/packed.yaml", over)


def test_packed_entry_is_off_by_default():
    assert all(e.get("kind") != "packed" for e in entries(BenchConfig(devices=["cpu"])))


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))


def test_training_is_cached_by_content_and_leaves_the_generator_as_training_would(tmp_path, monkeypatch):
    x, y = torch.rand(40, 3, 2, 2), torch.randint(0, 3, (40,))
    plain, gen = _tiny(), torch.Generator().manual_seed(5)
    monkeypatch.delenv("GI_CACHE_DIR", raising=False)
    stats = train_model(plain, x, y, epochs=2, batch_size=8, generator=gen)
    after = torch.rand(3, generator=gen)
    monkeypatch.setenv("GI_CACHE_DIR", str(tmp_path))
    for expect_cached in (False, True):
        model, g = _tiny(), torch.Generator().manual_seed(5)
        got = train_model(model, x, y, epochs=2, batch_size=8, generator=g)
        assert got.get("cached", False) is expect_cached and got["steps"] == stats["steps"]
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))
        assert torch.equal(torch.rand(3, generator=g), after)
    assert len(list((tmp_path / "train").glob("*.safetensors"))) == 1 and not list((tmp_path / "train").glob(".*"))
    base = training_key(_tiny(), x, y, {"lr": 0.01}, torch.Generator().manual_seed(5))
    assert base != training_key(_tiny(), x, y, {"lr": 0.02}, torch.Generator().manual_seed(5))
    assert base != training_key(_tiny(1), x, y, {"lr": 0.01}, torch.Generator().manual_seed(5))
    assert base != training_key(_tiny(), x, 2 - y, {"lr": 0.01}, torch.Generator().manual_seed(5))
    assert base != training_key(_tiny(), x, y, {"lr": 0.01}, torch.Generator().manual_seed(6))


@pytest.mark.parametrize("setup, match", [
    ({"train": {"epochs": 0}}, "train.epochs"), ({"protocol": {"scheme": "fedavg"}}, "scheme"),
    ({"shared": "some"}, "setup.shared"), ({"nope": 1}, "nope"),
    ({"aux": {"per_class": 5, "split": "test"}}, "aux.split"),
])
def test_trained_resnet_scenario_refuses_bad_setups(setup, match):
    from gi.world.scenarios import get_scenario

    with pytest.raises(ConfigError, match=match):
        get_scenario("trained-resnet18").resolve(setup)


@pytest.mark.slow
def test_trained_resnet_scenario_trains_like_gi_run_and_shares_the_last_layer(tmp_path, monkeypatch):
    from gi.world.build import TRAINED
    from gi.world.scenarios import get_scenario

    monkeypatch.setenv("GI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(TRAINED, "items", type(TRAINED.items)())
    setup = {"model": {"name": "lenet"}, "train": {"epochs": 1.0, "samples": 32, "batch_size": 16},
             "protocol": {"batch_size": 4}}
    (trial,) = get_scenario("trained-resnet18")(setup, torch.Generator().manual_seed(0), 0)
    assert trial.capture.num_samples == 4 and trial.group == "lenet/trained"
    assert set(trial.capture.gradients) == {"fc.weight", "fc.bias"}
    assert trial.capture.meta["train"]["train_samples"] == 32 and int(trial.truth.counts.sum()) == 4
    import labels

    assert int(labels.recover(trial.capture, "llg").counts.sum()) == 4  # the last layer is a usable label input
