"""``seed=`` changes every random choice of a run, or the config refuses it and names the key that does
(docs/guarantees.md, "Seeds"): every config under ``configs/`` is loaded at two seeds, and every one whose victim
builds without training a model first is built at both seeds and must give other captures."""

import pathlib

import pytest
import torch

from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.ablate import AblateConfig
from gi.experiments.config.bench import BenchConfig
from gi.experiments.config.defend import DefendConfig
from gi.experiments.config.labels import LabelBenchConfig, grid_points, seeded
from gi.experiments.config.run import RunConfig
from gi.experiments.config.sweep import SweepConfig

COMMANDS = {"labels": LabelBenchConfig, "ablate": AblateConfig, "defend": DefendConfig, "sweep": SweepConfig,
            "bench": BenchConfig}  # a config's folder names its command; any other folder holds gi run configs
CONFIGS = sorted(p for p in pathlib.Path("configs").rglob("*.yaml") if "_base" not in p.parts)
REFUSALS = ("is not a key here", "would not reach")  # the two ways a config names the key that seeds it


def command(path: pathlib.Path) -> type:
    return COMMANDS.get(path.parent.name, RunConfig)


def test_every_folder_of_configs_is_known():
    assert CONFIGS, "no configs found: run the tests from the repository root"
    assert {p.parent.name for p in CONFIGS} - set(COMMANDS) <= {"configs", "batchnorm"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to("configs")))
def test_seed_reaches_the_run_or_is_refused_naming_the_key(path):
    """Loaded at seed=1 a config either carries seed 1 (and every seeded grid point's setup.seed is 1), or its
    ConfigError names the key that seeds what seed= would not reach."""
    cls = command(path)
    try:
        cfg = load(cls, path, ["seed=1"])
    except ConfigError as exc:
        assert any(r in str(exc) for r in REFUSALS), str(exc)
        return
    assert cfg.seed == 1
    if cls is LabelBenchConfig:
        from gi.world.scenarios import get_scenario

        if seeded(get_scenario(cfg.scenario)) and "seed" not in cfg.grid:
            assert all(setup["seed"] == 1 for _, setup in grid_points(cfg))


def test_a_pinned_model_seed_refuses_another_run_seed():
    with pytest.raises(ConfigError, match=r"seed=1 would not reach the model's initialisation: model.seed=3"):
        load(RunConfig, "configs/demo.yaml", ["model.seed=3", "seed=1"])
    assert load(RunConfig, "configs/demo.yaml", ["model.seed=3"]).model.seed == 3  # seed 0: the default
    assert load(RunConfig, "configs/demo.yaml", ["model.seed=3", "seed=3"]).seed == 3
    with pytest.raises(ConfigError, match=r"seeds=\[0,1\] runs one job per seed"):
        load(SweepConfig, "configs/sweep/demo-cpu.yaml", ["seed=1"])
    with pytest.raises(ConfigError, match=r"job_overrides' seed=N"):
        load(BenchConfig, "configs/bench/ttq-lenet.yaml", ["seed=1"])


def tensors(capture) -> list[torch.Tensor]:
    grads = capture.update if capture.is_update else capture.gradients
    return list(grads.values()) if isinstance(grads, dict) else list(grads)


def trains(cfg) -> bool:
    """Whether building the victim trains a model first (minutes on CPU: those configs are checked by the rule
    above, their generators seeded from ``seed`` like every other's)."""
    return bool(cfg.train.epochs)


RUN_CONFIGS = [p for p in CONFIGS if command(p) in (RunConfig, AblateConfig)]


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: str(p.relative_to("configs")))
def test_two_seeds_give_two_victims(path):
    from gi.experiments.run import capture_all
    from gi.world.build import build_victim

    cls = command(path)
    base = load(cls, path)
    if trains(base):
        pytest.skip(f"{path} trains its model first (minutes); the rule test covers its seed")
    few = ["data.images=[0]"] if base.data.images == "all" else []  # one capture of each seed's model is enough
    captures = []
    for seed in (0, 1):
        cfg = load(cls, path, [f"seed={seed}", *few])
        torch.manual_seed(cfg.seed)
        dataset, model = build_victim(cfg)
        captures.append(capture_all(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))[0][0])
    assert not all(torch.equal(a, b) for a, b in zip(tensors(captures[0]), tensors(captures[1])))

