import json
import re

import pytest
import torch

from gi.attack.stages import LabelTable
from gi.core.errors import ConfigError
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.experiments.labels import run_label_bench, summarize_rows
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from gi.world.scenarios import SCENARIOS, Trial, register_scenario

if "test-single-onehot" not in SCENARIOS:

    @register_scenario("test-single-onehot")
    def _single(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
        model = build("lenet", 10, activation=setup.get("activation"), init="uniform", seed=trial)
        x = torch.rand(1, 3, 32, 32, generator=generator)
        y = torch.randint(0, 10, (1,), generator=generator)
        cap, truth = capture_gradients(model, x, y, Protocol())
        return [Trial(cap, truth)]


def test_bench_writes_tables_with_every_method_on_the_same_captures(tmp_path):
    cfg = LabelBenchConfig(name="t", scenario="test-single-onehot", trials=4, out=str(tmp_path / "b"),
                      grid={"activation": ["sigmoid", "relu"]}, labels=LabelTable(["idlg", "yin"]),
                      metrics=["ins_acc", "cls_acc"], paper={"*": {"idlg": 1.0}}, progress=False)
    out = run_label_bench(cfg)
    summary = json.loads((out / "summary.json").read_text())["rows"]
    assert len(summary) == 4  # 2 grid points × 2 methods
    idlg = [r for r in summary if r["method"] == "idlg"]
    assert all(r["ins_acc"] == 1.0 and r["paper_ins_acc"] == 1.0 for r in idlg)  # iDLG is exact for B=1
    for name in ("trials.csv", "summary.csv", "summary.md", "plot.png", "config.yaml"):
        assert (out / name).is_file()
    assert "activation=sigmoid" in (out / "summary.md").read_text()


def test_grid_expands_dotted_keys():
    cfg = LabelBenchConfig(scenario="test-single-onehot", labels=LabelTable(["idlg"]), setup={"model": {"name": "a"}},
                      grid={"model.name": ["x", "y"], "b": [1, 2]})
    points = grid_points(cfg)
    assert [p for p, _ in points] == ["name=x, b=1", "name=x, b=2", "name=y, b=1", "name=y, b=2"]
    assert points[3][1] == {"model": {"name": "y"}, "b": 2}


@pytest.mark.parametrize("data, match", [({"scenario": "nope", "labels": {"methods": ["idlg"]}}, "unknown scenario"),
                                         ({"scenario": "test-single-onehot", "labels": {"methods": ["psychic"]}},
                                          "unknown label method"),
                                         ({"scenario": "test-single-onehot", "labels": {"methods": []}},
                                          "labels.methods is empty")])
def test_bad_bench_configs(data, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig.from_mapping(data)


def test_variants_pool_and_proportion_plot(tmp_path):
    """A variant runs a method under its own name; pooled grid keys share a summary row; proportion_class adds
    p_true / p_hat per trial and proportions.png."""
    cfg = LabelBenchConfig(name="v", scenario="test-single-onehot", trials=2, out=str(tmp_path / "v"),
                           grid={"activation": ["sigmoid", "relu"]}, pool=["activation"],
                           labels=LabelTable(["idlg", "again"], {"again": {"method": "idlg"}}),
                           metrics=["ins_acc", "absent_recall"], proportion_class=0, progress=False)
    out = run_label_bench(cfg)
    summary = json.loads((out / "summary.json").read_text())["rows"]
    assert [(r["point"], r["method"], r["n"]) for r in summary] == [("all", "idlg", 4), ("all", "again", 4)]
    assert summary[0]["ins_acc"] == summary[1]["ins_acc"] == 1.0
    assert summary[0]["absent_recall"] == 1.0  # iDLG on one sample: 9 absent classes, every one called absent
    trials = (out / "trials.csv").read_text()
    assert "p_true" in trials and "activation=relu" in trials
    assert (out / "proportions.png").is_file()


def test_pooled_metrics_are_ratios_of_sums():
    cfg = LabelBenchConfig(scenario="test-single-onehot", labels=LabelTable(["idlg"]),
                           metrics=["absent_precision", "absent_recall", "cls_acc"])
    rows = [{"point": "p", "method": "idlg", "absent_hit": 3, "absent_called": 4, "absent_true": 3, "cls_acc": 0.9,
             "seconds": 0.0},
            {"point": "p", "method": "idlg", "absent_hit": 1, "absent_called": 1, "absent_true": 3, "cls_acc": 0.7,
             "seconds": 0.0},
            {"point": "q", "method": "idlg", "absent_hit": 0, "absent_called": 0, "absent_true": 0, "cls_acc": 1.0,
             "seconds": 0.0}]
    p, q = summarize_rows(cfg, rows)
    assert p["absent_precision"] == 4 / 5 and p["absent_recall"] == 4 / 6 and p["cls_acc"] == pytest.approx(0.8)
    assert q["absent_precision"] is None and q["absent_recall"] is None  # no decision, no absent class


@pytest.mark.parametrize("kwargs, match", [
    ({"labels": {"methods": ["idlg"], "variants": {"idlg": {"method": "yin"}}}}, "a variant named after a method"),
    ({"labels": {"methods": ["v"], "variants": {"v": {"method": "psychic"}}}}, "unknown label method"),
    ({"labels": {"methods": ["v"], "variants": {"v": {"options": {}}}}}, r"method: NAME"),
    ({"labels": {"methods": ["v"], "variants": {"v": {"method": "idlg", "options": 3}}}}, "expected a mapping"),
    ({"labels": {"methods": ["v"], "variants": {"v": {"method": "yin", "options": {"dtype": 1}}}}},
     r"labels.variants.v.method='yin' takes no option\(s\) \['dtype'\]; valid: \[\]"),
    ({"labels": {"methods": ["idlg"], "variants": {"idlg": {}, "v": {"method": "yin"}}}}, "not in labels.methods"),
    ({"pool": ["round"]}, "not grid keys"),
    ({"proportion_class": -1}, "proportion_class"),
    ({"metrics": ["absent_f1"]}, "unknown"),
    ({"timing_repeats": 0}, "timing_repeats=0"),
    ({"timing_repeats": 10_000}, "at most 100"),
])
def test_bad_variant_pool_and_metric_configs(kwargs, match):
    base = {"scenario": "test-single-onehot", "labels": {"methods": ["idlg"]}}
    with pytest.raises(ConfigError, match=match) as info:
        LabelBenchConfig.from_mapping({**base, **kwargs})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value, new", [("methods", ["idlg"], "labels.methods"),
                                             ("method_options", {"idlg": {}}, "labels.variants.NAME.options"),
                                             ("variants", {"v": {"method": "idlg"}}, "labels.variants")])
def test_the_old_label_spellings_are_refused_naming_the_new_key(key, value, new):
    """gi labels spells its methods as every command does (docs/usage.md, "The labels section")."""
    with pytest.raises(ConfigError, match=rf"^{key}=.*renamed, write {re.escape(new)} instead") as info:
        LabelBenchConfig.from_mapping({"scenario": "test-single-onehot", "labels": {"methods": ["idlg"]}, key: value})
    assert "\n" not in str(info.value)


def test_a_variant_named_after_its_method_sets_the_methods_options():
    table = LabelTable(["posterior", "idlg"], {"posterior": {"options": {"dtype": "float32"}}})
    assert table.call("posterior") == ("posterior", {"dtype": "float32"}) and table.call("idlg") == ("idlg", {})


def test_line_axis_is_the_last_unpooled_numeric_key():
    from gi.experiments.labels_output import line_axis

    def cfg(grid, pool=()):
        return LabelBenchConfig(scenario="test-single-onehot", labels=LabelTable(["idlg"]), grid=grid, pool=list(pool))

    assert line_axis(cfg({"round": [1, 2, 3], "avg": [1, None]})) == "round"
    assert line_axis(cfg({"round": [1, 2, 3], "aux.per_class": [2, 5, 10.5]})) == "aux.per_class"
    assert line_axis(cfg({"round": [1, 2, 3], "aux.per_class": [2, 5, 10]}, pool=["aux.per_class"])) == "round"
    assert line_axis(cfg({"round": [1, 2]})) is None  # too few points for a line
    assert line_axis(cfg({"flag": [True, False, True]})) is None
    assert line_axis(cfg({"activation": ["sigmoid", "relu", "tanh"]})) is None


def test_numeric_grid_is_plotted_as_lines(tmp_path, monkeypatch):
    """plot.png is a line plot over the numeric key: one line per method and value of the other keys."""
    import gi.experiments.labels_output as lb

    seen = {}
    monkeypatch.setattr(lb, "save_line_plot", lambda path, x, series, xlabel, ylabel, title="": seen.update(
        x=list(x), series=series, xlabel=xlabel) or path.write_bytes(b"png"))
    cfg = LabelBenchConfig(name="l", scenario="test-single-onehot", trials=1, out=str(tmp_path / "l"),
                           grid={"activation": ["sigmoid", "relu"], "steps": [1, 2, 3]}, labels=LabelTable(["idlg"]),
                           metrics=["ins_acc"], progress=False)
    out = run_label_bench(cfg)
    assert (out / "plot.png").is_file()
    assert seen["x"] == [1, 2, 3] and seen["xlabel"] == "steps"
    rows = {r["point"]: r["ins_acc"] for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert seen["series"] == {f"idlg activation={a}": [rows[f"activation={a}, steps={k}"] for k in (1, 2, 3)]
                              for a in ("sigmoid", "relu")}
    assert seen["series"]["idlg activation=sigmoid"] == [1.0, 1.0, 1.0]  # iDLG is exact with sigmoid, B = 1


def test_a_three_key_grid_is_plotted_as_one_panel_per_value_of_the_first_other_key(tmp_path, monkeypatch):
    import gi.experiments.labels_output as lb

    seen = {}
    monkeypatch.setattr(lb, "save_line_panels", lambda path, x, panels, xlabel, ylabel, title="": seen.update(
        x=list(x), panels=panels) or path.write_bytes(b"png"))
    cfg = LabelBenchConfig(name="l", scenario="test-single-onehot", trials=1, out=str(tmp_path / "l"),
                           grid={"activation": ["sigmoid", "relu"], "extra": ["u", "v"], "steps": [1, 2, 3]},
                           labels=LabelTable(["idlg"]), metrics=["ins_acc"], progress=False)
    out = run_label_bench(cfg)
    rows = {r["point"]: r["ins_acc"] for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert seen["x"] == [1, 2, 3]
    assert seen["panels"] == {f"activation={a}": {f"idlg extra={e}": [rows[f"activation={a}, extra={e}, steps={k}"]
                                                                     for k in (1, 2, 3)] for e in ("u", "v")}
                              for a in ("sigmoid", "relu")}


def test_timing_repeats_run_every_method_again_on_the_same_captures(tmp_path, monkeypatch):
    """Each repeat re-runs the method on the group's captures; the rows carry the median wall and CPU seconds per
    capture and the first run's labels; the summary adds median_cpu_ms."""
    import labels

    calls = []
    real = labels.recover_many

    def counted(caps, method, **kw):
        calls.append((len(caps), method))
        return real(caps, method, **kw)

    monkeypatch.setattr(labels, "recover_many", counted)
    cfg = LabelBenchConfig(name="t", scenario="test-single-onehot", trials=3, out=str(tmp_path / "r"),
                           labels=LabelTable(["idlg"]), timing_repeats=3, progress=False)
    out = run_label_bench(cfg)
    assert calls == [(3, "idlg")] * 3
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["ins_acc"] == 1.0 and row["median_cpu_ms"] > 0 and row["median_ms"] > 0


if "test-global-acc" not in SCENARIOS:

    @register_scenario("test-global-acc")
    def _with_accuracy(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
        (t,) = _single(setup, generator, trial)
        t.capture.meta = {**t.capture.meta, "global_acc": 0.25 + trial / 8}
        return [t]


def test_trials_carry_the_scenarios_global_accuracy(tmp_path):
    """A capture's meta ``global_acc`` (fedavg-client ``eval_samples``: the test accuracy of θᵗ) is a trials.csv
    column, so a table on a trained round can say how trained the model was."""
    import csv

    cfg = LabelBenchConfig(name="a", scenario="test-global-acc", trials=2, out=str(tmp_path / "a"),
                           labels=LabelTable(["idlg"]), progress=False)
    out = run_label_bench(cfg)
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["global_acc"]) for r in rows] == [0.25, 0.375]


SEEDED = sorted(p for p in __import__("pathlib").Path("configs/labels").glob("*.yaml")
                if re.search(r"^scenario: (fedavg-client|fedsgd-batch|trained-resnet18)", p.read_text(), re.M))


@pytest.mark.parametrize("path", SEEDED, ids=lambda p: p.stem)
def test_seed_seeds_every_seeded_scenario_or_is_refused(path):
    """seed=1 either reaches every grid point's setup.seed, or the config is refused naming setup.seed."""
    from gi.core.config import load

    try:
        cfg = load(LabelBenchConfig, path, ["seed=1"])
    except ConfigError as exc:
        assert "setup.seed" in str(exc) and "would not reach" in str(exc)
        return
    assert all(setup["seed"] == 1 for _, setup in grid_points(cfg))
    assert all(setup["seed"] == 0 for _, setup in grid_points(load(LabelBenchConfig, path)))


def test_two_seeds_give_two_federations():
    from gi.world.scenarios import get_scenario

    setups = [grid_points(LabelBenchConfig(scenario="fedavg-client", seed=s, labels=LabelTable(["rlu"]),
                                           setup={"num_clients": 2, "partition": "simplex",
                                                  "client_size": [20, 20], "aux": {"per_class": 1},
                                                  "protocol": {"batch_size": 10, "local_steps": 1},
                                                  "model": {"name": "linear"}, "eval_samples": 0}))[0][1]
              for s in (0, 1)]
    first = [get_scenario("fedavg-client")(s, torch.Generator(), 0)[0] for s in setups]
    assert not torch.equal(first[0].capture.update["fc.weight"], first[1].capture.update["fc.weight"])
    assert not torch.equal(first[0].truth.counts, first[1].truth.counts) or \
        not torch.equal(first[0].capture.model_state["fc.weight"], first[1].capture.model_state["fc.weight"])
    with pytest.raises(ConfigError, match=r"seed=3 would not reach .*: setup.seed=0 fixes them"):
        LabelBenchConfig(scenario="fedavg-client", seed=3, labels=LabelTable(["rlu"]), setup={"seed": 0})


def test_without_out_each_run_gets_its_own_folder_and_the_latest_link_names_the_newest(tmp_path, monkeypatch):
    """docs/usage.md "Where a run writes": gi labels without out= writes runs/labels/<name>-<stamp> (never an
    existing folder) and points runs/labels/<name>-latest at the newest."""
    monkeypatch.chdir(tmp_path)
    cfg = LabelBenchConfig(name="a", scenario="test-global-acc", trials=1, labels=LabelTable(["idlg"]),
                           progress=False)
    first, second = run_label_bench(cfg), run_label_bench(cfg)
    assert first != second and first.is_dir() and second.is_dir()
    latest = tmp_path / "runs" / "labels" / "a-latest"
    assert latest.is_symlink() and latest.resolve() == second.resolve()
    assert sorted(p.name for p in latest.iterdir()) == sorted(p.name for p in second.iterdir())
