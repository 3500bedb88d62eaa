"""gi defend: strict config, the cells, an end-to-end run on real Fashion-MNIST images (table, ε, plots) and its
resumption after an interruption."""

from __future__ import annotations

import json

import pytest

import gi.experiments.defend as defend
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.defend import BASELINE, DefendConfig
from gi.experiments.defend import cells, run_defend

TINY = ["federation.num_clients=3", "federation.samples=48", "federation.rounds=1", "federation.capture_round=1",
        "federation.eval_samples=40", "aux.per_class=2", "images.count=1", "images.batch_size=1", "attack.iterations=2",
        "protocol.batch_size=8", "label_batch=8", "labels.methods={rlu: update, posterior: gradient}",
        "defences=[{name: gaussian, strengths: [0.01]}, {name: dp-sgd, strengths: [1.0], label: dp}]"]


def test_study_config_has_six_defences_at_three_strengths_and_ten_rounds():
    cfg = load(DefendConfig, "configs/defend/fmnist.yaml")
    grid = cells(cfg)
    assert grid[0][0] == BASELINE and grid[0][2].defences == []
    assert len({c[0] for c in grid[1:]}) >= 6 and all(len(e["strengths"]) >= 3 for e in cfg.defences)
    assert cfg.federation.rounds >= 10 and cfg.images.count >= 4 and {"rlu", "posterior"} <= set(cfg.labels.methods)
    dp = [c for c in grid if c[0] == "dp-sgd"]
    assert [c[2].defences[-1]["strength"] for c in dp] == [0.5, 1.0, 2.0]
    assert {"label-smoothing", "mixup"} <= {c[0] for c in grid}


def test_study_images_are_attacked_by_the_default_job():
    from gi.attack.recon.presets import PRESETS

    cfg = load(DefendConfig, "configs/defend/fmnist.yaml")
    assert cfg.labels.mode == "recovered" and cfg.labels.method == "auto" and cfg.attack.labels == "fixed"
    assert cfg.attack.preset == "default"
    for key, value in PRESETS["default"].items():
        assert getattr(cfg.attack, key) == value, key
    quick = load(DefendConfig, "configs/defend/quick.yaml")  # preset auto, as every command: its keys win
    assert quick.attack.preset == "default" and quick.attack.optimizer == "adam" and quick.attack.iterations == 20
    assert quick.attack.schedule == "multistep" and quick.attack.cull_after == 0 and quick.attack.feature_weight == 0


@pytest.mark.parametrize("over, match", [
    (["defences=[{name: noise, strengths: [1]}]"], "not a defence"),
    (["defences=[{name: gaussian, strengths: []}]"], "non-empty list"),
    (["defences=[{name: gaussian, strengths: [-1]}]"], "must be >= 0"),
    (["defences=[{name: gaussian, strengths: [1], sigma: 2}]"], "unknown key"),
    (["defences=[{name: gaussian, strengths: [1]}, {name: gaussian, strengths: [2]}]"], "used twice"),
    (["labels.methods={rlu: weights}"], "'update' or 'gradient'"),
    (["labels.methods={psychic: update}"], "unknown label method"),
    (["labels.methods={}"], "labels.methods is empty"),
    (["labels.variants={rlu: {options: {nope: 1}}}"], r"labels.variants.rlu.method='rlu' takes no option\(s\)"),
    (["labels.variants={v: {method: rlu}}"], r"labels.variants \['v'\] are not in labels.methods"),
    (["labels.method=posterior", "labels.options={dtyp: float32}"], r"labels.method='posterior' takes no option"),
    (["label_methods={rlu: update}"], r"label_methods=\{rlu: update\}: renamed, write labels.methods instead"),
    (["method_options={rlu: {}}"], r"method_options=.*renamed, write labels.variants.NAME.options instead"),
    (["only=[nope]"], "only names unknown"),
    (["protocol.scheme=fedsgd"], "update scheme"),
    (["federation.capture_round=11"], "capture_round"),
    (["images.count=3"], "multiple of images.batch_size"),
    (["images.count=-2"], "multiple of images.batch_size"),
    (["workers=0"], "workers"),
    (["attack.preset=quick"], "not a preset"),
    (["attack.labels=joint"], "contradicts labels.mode"),
])
def test_bad_defend_configs_raise_clear_errors(over, match):
    with pytest.raises(ConfigError, match=match) as info:
        load(DefendConfig, "configs/defend/fmnist.yaml", over)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_defend_runs_end_to_end_and_resumes_after_an_interruption(tmp_path, monkeypatch):
    calls = []
    real = defend.run_cell

    def failing(cfg, setup, label, strength, protocol, grid):
        calls.append(label)
        if label == "dp":
            raise KeyboardInterrupt  # killed after two finished cells
        return real(cfg, setup, label, strength, protocol, grid)

    out = tmp_path / "d"
    monkeypatch.setattr(defend, "run_cell", failing)
    with pytest.raises(KeyboardInterrupt):
        run_defend(load(DefendConfig, "configs/defend/quick.yaml", TINY + [f"out={out}"]))
    assert not out.exists() and len(list((tmp_path / ".d.cells").glob("*.json"))) == 2
    calls.clear()
    monkeypatch.setattr(defend, "run_cell", real)
    run_defend(load(DefendConfig, "configs/defend/quick.yaml", TINY + [f"out={out}"]))
    assert not (tmp_path / ".d.cells").exists()
    table = json.loads((out / "metrics.json").read_text())["table"]
    assert [r["defence"] for r in table] == [BASELINE, "gaussian", "dp"]
    dp = table[2]
    assert dp["epsilon"] > 0 and dp["delta"] == 1e-5 and "epsilon" not in table[0]
    for row in table:
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["label_acc:rlu"] <= 1 and row["images"] == 1
        assert row["psnr_mean"] > 0
    for name in ("table.md", "table.csv", "results.csv", "clients.csv", "tradeoff-psnr_mean.png",
                 "tradeoff-label_acc-rlu.png", "tradeoff-label_acc-posterior.png", "grid-none-0.png", "report.html"):
        assert (out / name).exists(), name
    page = (out / "report.html").read_text()  # the table and the three trade-off plots
    assert page.count("<tbody>") == 1 and page.count("data:image/png;base64,") == 3 and "<td>gaussian</td>" in page


@pytest.mark.slow
def test_defend_workers_give_the_same_table_and_own_labels_are_scored_under_secagg(tmp_path):
    over = [o for o in TINY if not o.startswith("defences=")] + [
        "defences=[{name: secagg, strengths: [3]}]", "images.oracle=true"]
    tables = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_defend(load(DefendConfig, "configs/defend/quick.yaml", over + [f"out={out}", f"workers={workers}"]))
        tables.append(json.loads((out / "metrics.json").read_text())["table"])
    one, two = ([{k: v for k, v in r.items() if k != "seconds"} for r in t] for t in tables)
    assert one == two
    for row in one:
        assert row["psnr_mean:oracle"] > 0 and "lpips:oracle" in row
        for m in ("rlu", "posterior"):
            if row["defence"] != "secagg":  # no group: the client's own labels are the scored labels
                assert row[f"own_acc:{m}"] == row[f"label_acc:{m}"]
            assert 0 <= row[f"own_acc:{m}"] <= 1
    assert (tmp_path / "w1" / "tradeoff-psnr_mean-oracle.png").exists()


def test_defend_without_images_reports_labels_and_utility_only(tmp_path):
    out = tmp_path / "labels-only"
    run_defend(load(DefendConfig, "configs/defend/quick.yaml", TINY + [f"out={out}", "images.count=0", "only=[none]"]))
    (row,) = json.loads((out / "metrics.json").read_text())["table"]
    assert row["defence"] == BASELINE and 0 <= row["label_acc:posterior"] <= 1 and 0 <= row["accuracy"] <= 1
    assert "psnr_mean" not in row and not list(out.glob("grid-*.png"))
    assert not (out / "tradeoff-psnr_mean.png").exists() and (out / "tradeoff-label_acc-rlu.png").exists()


def test_cell_keys_ignore_the_output_and_the_worker_count():
    a = load(DefendConfig, "configs/defend/fmnist.yaml", ["workers=1", "out=x"])
    b = load(DefendConfig, "configs/defend/fmnist.yaml", ["workers=3", "out=y"])
    c = load(DefendConfig, "configs/defend/fmnist.yaml", ["seed=1"])
    assert [defend._cell_key(a, p) for *_, p in cells(a)] == [defend._cell_key(b, p) for *_, p in cells(b)]
    assert defend._cell_key(a, a.protocol) != defend._cell_key(c, c.protocol)
