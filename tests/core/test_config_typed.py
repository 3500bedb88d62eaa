"""Typed configuration: every value is checked against its field's type hint at load time,
with one-line ConfigErrors that name the key, the value and the expected type; YAML 1.2 floats; dotted keys in
grids; bounded aliases; value ranges; ``defaults:`` composition; every shipped config loads."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from gi.cli import main
from gi.core.config import apply_overrides, from_dict, load, load_yaml, parse_override, to_dict
from gi.core.errors import ConfigError
from gi.experiments.config.ablate import AblateConfig, setting_config
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.experiments.config.run import RunConfig
from gi.experiments.config.sweep import SweepConfig, expand_jobs

DEMO = "configs/demo.yaml"


def _error(overrides: list[str], path: str = DEMO, cls: type = RunConfig) -> str:
    with pytest.raises(ConfigError) as info:
        load(cls, path, overrides)
    text = str(info.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("override, parts", [
    ("seed=abc", ["seed", "abc", "int", "str"]),
    ("attack.iterations=1.5", ["attack.iterations", "1.5", "int", "float"]),
    ("attack.iterations=true", ["attack.iterations", "true", "int", "bool"]),
    ("attack=5", ["attack", "5", "ReconConfig", "int"]),
    ("metrics.match='yes'", ["metrics.match", "yes", "bool", "str"]),
    ("model.name=7", ["model.name", "7", "str", "int"]),
    ("data.indices=[0, a]", ["data.indices[1]=a", "int", "str"]),
    ("protocol.focal_alpha=abc", ["protocol.focal_alpha", "abc", "float | list[float] | None", "str"]),
    ("attack.regularizers.tv=abc", ["attack.regularizers.tv=abc", "float", "str"]),
    ("protocol.focal_alpha=[0.5, x]", ["protocol.focal_alpha=[0.5, x]", "float | list[float] | None", "'x'"]),
    ("model.options=[1]", ["model.options", "dict[str, Any]", "list"]),
])
def test_wrong_types_are_one_line_errors_naming_key_value_and_type(override, parts):
    text = _error([override])
    for part in parts:
        assert part in text, (part, text)


def test_values_of_the_right_type_pass_and_ints_count_as_floats():
    cfg = load(RunConfig, DEMO, ["attack.lr=1", "protocol.focal_alpha=[0.25, 1]", "data.indices=null",
                                 "model.options={width: 4}", "out=null"])
    assert cfg.attack.lr == 1 and cfg.protocol.focal_alpha == [0.25, 1] and cfg.data.indices is None
    assert load(RunConfig, DEMO, ["protocol.focal_alpha=0.5"]).protocol.focal_alpha == 0.5


def test_yaml_1_2_floats_in_overrides_and_files(tmp_path):
    cfg = load(RunConfig, DEMO, ["attack.lr=1e-3", "attack.regularizers.tv=1e-3", "protocol.lr=5E+2"])
    assert cfg.attack.lr == 0.001 and isinstance(cfg.attack.lr, float)
    assert cfg.attack.regularizers == {"tv": 0.001} and cfg.protocol.lr == 500.0
    path = tmp_path / "c.yaml"
    path.write_text("attack: {lr: 1e-3, regularizers: {tv: 2e-4}, label_lr: 1.0e5}\nmodel: {name: '1e-3'}\n")
    data = load_yaml(path)
    assert data["attack"] == {"lr": 0.001, "regularizers": {"tv": 0.0002}, "label_lr": 1e5}
    assert data["model"]["name"] == "1e-3"  # quoted stays a string
    assert parse_override("a.b=1e-3") == (["a", "b"], 0.001)
    assert parse_override("a=1_000") == (["a"], 1000) and parse_override("a='1e-3'") == (["a"], "1e-3")


def test_non_utf8_config_file_is_a_config_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="UTF-8") as info:
        load(RunConfig, path)
    assert "\n" not in str(info.value)


def test_alias_expansion_is_bounded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
              for i in range(1, 7)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nmodel: {options: {x: *a6}}\n")
    assert path.stat().st_size < 1000
    with pytest.raises(ConfigError, match="alias") as info:
        load(RunConfig, path)
    assert "\n" not in str(info.value)


def test_small_aliases_still_work_and_are_not_shared(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text("model: {options: &o {width: 4}}\nlabels: {options: *o}\n")
    data = apply_overrides(load_yaml(path), ["model.options.width=8"], RunConfig)
    assert data["model"]["options"] == {"width": 8} and data["labels"]["options"] == {"width": 4}


@pytest.mark.parametrize("override, key", [
    ("data.indices=[-1]", "data.indices"), ("labels.aux_per_class=-3", "labels.aux_per_class"),
    ("data.size=0", "data.size"), ("data.eps=1.5", "data.eps"), ("data.eps_max=-0.1", "data.eps_max"),
    ("data.mixup_lam=2", "data.mixup_lam"), ("model.num_classes=0", "model.num_classes"),
    ("model.train_epochs=-1", "model.train_epochs"), ("model.train_lr=0", "model.train_lr"),
    ("attack.init_noise=-1", "attack.init_noise"), ("attack.layer_weights={fc.weight: -1}", "attack.layer_weights"),
    ("attack.regularizers={tv: -1}", "attack.regularizers"),
])
def test_value_ranges_are_checked_at_load_time(override, key):
    text = _error([override])
    assert key in text, text


@pytest.mark.parametrize("override", ["restarts=[0]", "iterations.lenet=0", "timing_repeats=0", "threads=0",
                                      "restarts=[5000]", "iterations.lenet=100000000", "timing_repeats=1001",
                                      "threads=2000"])
def test_bench_counts_are_checked_at_load_time(override):
    from gi.core.config import load
    from gi.experiments.config.bench import BenchConfig

    with pytest.raises(ConfigError, match=override.split("=")[0].split(".")[0] + r".*ints in \[1, \d+\]"):
        load(BenchConfig, None, [override])


def test_dotted_keys_in_grids_and_overrides():
    cfg = load(SweepConfig, "configs/sweep/demo-cpu.yaml", ["grid.model.activation=[relu]"])
    assert cfg.grid["model.activation"] == ["relu"] and "model" not in cfg.grid
    assert "model.activation=relu" in expand_jobs(cfg)[0].overrides
    labels = load(LabelBenchConfig, "configs/labels/rlu-table4-sgdm.yaml", ["grid.model.activation=[relu, tanh]"])
    assert labels.grid["model.activation"] == ["relu", "tanh"]
    points = grid_points(labels)
    assert len(points) == 8 and points[0][1]["model"] == {"name": "lenet5", "activation": "relu"}
    run = load(RunConfig, DEMO, ["attack.layer_weights.conv1.weight=0.5"])
    assert run.attack.layer_weights == {"conv1.weight": 0.5}
    abl = load(AblateConfig, "configs/ablate/table4.yaml", [f"settings.{_first_setting()}.protocol.batch_size=2"])
    assert setting_config(abl, _first_setting()).protocol.batch_size == 2


def _first_setting() -> str:
    return next(iter(load(AblateConfig, "configs/ablate/table4.yaml").settings))


def test_a_grid_written_as_nested_mapping_is_a_type_error_not_a_loop_over_its_keys():
    text = _error(["grid.model={activation: [relu]}"], "configs/labels/rlu-table4-sgdm.yaml", LabelBenchConfig)
    assert "grid.model" in text and "list" in text


def test_sweep_jobs_are_validated_before_any_job_runs():
    with pytest.raises(ConfigError, match=r"attack\.iterations.*int"):
        load(SweepConfig, "configs/sweep/demo-cpu.yaml", ["grid.attack.iterations=[10, 1.5]"])


def test_ablation_variants_are_type_checked():
    with pytest.raises(ConfigError, match=r"attack_variants\.v\.lr.*float"):
        load(AblateConfig, "configs/ablate/table4.yaml", ["attack_variants={v: {lr: abc}}"])


def test_cli_answers_a_bad_value_with_one_line_and_a_nonzero_exit(capsys, tmp_path):
    code = main(["run", DEMO, "attack.iterations=1.5", f"out={tmp_path / 'o'}"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.count("\n") == 0 and "attack.iterations=1.5" in err
    assert not (tmp_path / "o").exists()


def test_defaults_compose_with_deep_merge_and_the_including_file_wins(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yaml").write_text("name: a\nmodel: {name: lenet, options: {w: 1, d: 2}}\nseed: 1\n")
    (tmp_path / "b.yaml").write_text("defaults: [sub/a.yaml]\nmodel: {options: {d: 3}}\nseed: 2\n")
    (tmp_path / "c.yaml").write_text("defaults: [b.yaml, sub/a.yaml]\nname: c\n")
    assert load_yaml(tmp_path / "b.yaml") == {"name": "a", "model": {"name": "lenet", "options": {"w": 1, "d": 3}},
                                              "seed": 2}
    c = load_yaml(tmp_path / "c.yaml")  # a.yaml comes after b.yaml, so it wins over b
    assert c == {"name": "c", "model": {"name": "lenet", "options": {"w": 1, "d": 2}}, "seed": 1}


def test_defaults_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("defaults: [y.yaml]\n")
    (tmp_path / "y.yaml").write_text("defaults: [x.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_yaml(tmp_path / "x.yaml")
    (tmp_path / "m.yaml").write_text("defaults: [missing.yaml]\n")
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_yaml(tmp_path / "m.yaml")
    (tmp_path / "s.yaml").write_text("defaults: x.yaml\n")
    with pytest.raises(ConfigError, match="defaults"):
        load_yaml(tmp_path / "s.yaml")


def _loader(path: Path):
    from gi.experiments.config.bench import BenchConfig
    from gi.experiments.config.defend import DefendConfig

    if any(part.startswith("_") for part in path.parts):  # fragments composed by `defaults:`, not configs
        return load_yaml
    kind = path.parts[1] if len(path.parts) > 2 else ""
    cls = {"labels": LabelBenchConfig, "ablate": AblateConfig, "sweep": SweepConfig, "bench": BenchConfig,
           "defend": DefendConfig}.get(kind, RunConfig)
    return functools.partial(load, cls)


CONFIGS = sorted(Path("configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p) for p in CONFIGS])
def test_every_shipped_config_loads(path):
    assert to_dict(_loader(path)(path))


def test_the_posterior_table2_family_is_composed_from_shared_fragments():
    cfg = load(LabelBenchConfig, "configs/labels/posterior-table2-cifar10-samples.yaml")
    assert cfg.scenario == "fedsgd-batch" and cfg.trials == 20 and len(cfg.labels.methods) == 10
    assert cfg.labels.call("posterior") == ("posterior", {"dtype": "float32", "missing": "prior"})
    c100 = load(LabelBenchConfig, "configs/labels/posterior-table2-resnet50-c100.yaml")
    assert c100.labels.methods == ["posterior", "ilrg", "ilrg-robust", "llg*"]  # lists are replaced, not merged


def test_from_dict_keeps_checking_unknown_keys():
    with pytest.raises(ConfigError, match=r"valid keys of attack"):
        from_dict(RunConfig, {"attack": {"iterationz": 1}})


@pytest.mark.parametrize("overrides, match", [
    (["labels.method=posterior", "labels.options={dtyp: float32}"],
     r"labels.method='posterior' takes no option\(s\) \['dtyp'\]; valid: \['dtype', 'missing', 'weighting'\]"),
    (["labels.method=auto", "labels.options={threshold: 1}"],
     r"labels.method='auto' takes no option\(s\) \['threshold'\]"),
    (["labels.method=psychic"], r"labels.method='psychic': unknown label method"),
])
def test_the_label_method_and_its_options_are_checked_at_load(overrides, match):
    """docs/usage.md, "The labels section": before any data, model or capture work."""
    assert re.search(match, _error(overrides))
    assert re.search(match, _error(overrides, "configs/ablate/table4.yaml", AblateConfig))


@pytest.mark.parametrize("overrides, match", [
    (["data.captures=3"], r"^data.captures=3: renamed, write trials instead"),
    (["trials=2", "data.indices=[0]"], r"^trials=2 with data.images or data.indices"),
    (["trials=2", "data.indices=null", "data.images=[0, 1]"], r"^trials=2 with data.images or data.indices"),
    (["trials=0"], r"^trials=0: expected >= 1"),
])
def test_trials_is_the_one_name_for_the_client_batches(overrides, match):
    """gi run draws `trials` batches as gi labels and gi ablate do (docs/usage.md, "Config keys")."""
    assert re.search(match, _error(overrides))


def test_trials_draws_that_many_batches():
    from gi.world.build import victim_batches

    cfg = load(RunConfig, DEMO, ["trials=3", "data.indices=null"])
    assert cfg.trials == 3 and victim_batches(cfg, None) == [None, None, None]
