"""One gi run makes at most ``data.max_captures`` captures (docs/guarantees.md, "Bad configs fail before any
work"): ``trials``, ``data.images`` lists and ``data.images: all`` of a dataset of fixed size are refused at config
load, a folder's ``all`` once it is read and before any model is built; nothing is written. ``gi labels`` refuses
more trials per grid point than the same cap."""

from __future__ import annotations

import pytest

from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments import run as gi_run
from gi.experiments.config.run import MAX_CAPTURES, RunConfig
from gi.world import build as victim

ONE_BATCH = ["data.indices=null"]  # configs/demo.yaml attacks one given image


def one_line(exc: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_the_cap_is_a_thousand_captures():
    assert MAX_CAPTURES == 1000
    assert load(RunConfig, "configs/demo.yaml").data.max_captures == MAX_CAPTURES


def test_trials_over_the_cap_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"trials=1001 asks for 1001 captures \(batches of "
                                          r"protocol.batch_size=1\), more than data.max_captures=1000: .*list the "
                                          r"images to attack .*or raise data.max_captures") as exc:
        load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "trials=1001"])
    one_line(exc)
    assert load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "trials=1000"]).trials == 1000
    cfg = load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "trials=1001", "data.max_captures=1001"])
    assert cfg.trials == 1001
    with pytest.raises(ConfigError, match="data.max_captures"):
        load(RunConfig, "configs/demo.yaml", ["data.max_captures=0"])


def test_a_long_data_images_list_is_refused_at_load_by_its_batches():
    listed = f"data.images=[{','.join(str(i) for i in range(2002))}]"  # indices past the dataset: not read yet
    with pytest.raises(ConfigError, match=r"data.images lists 2002 images asks for 1001 captures \(batches of "
                                          r"protocol.batch_size=2\)") as exc:
        load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, listed, "protocol.batch_size=2"])
    one_line(exc)
    load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, f"data.images=[{','.join(str(i) for i in range(2000))}]",
                                          "protocol.batch_size=2"])  # 1000 captures: allowed


def test_data_images_all_on_fashion_mnist_is_refused_at_load_before_any_data_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(victim, "load_data", lambda *a, **k: pytest.fail("the dataset was read"))
    with pytest.raises(ConfigError, match=r"data.images=all \(60000 images of fashion-mnist/train\) asks for 60000 "
                                          r"captures .*more than data.max_captures=1000") as exc:
        load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "data.name=fashion-mnist", "data.split=train",
                                              "data.images=all", "model.name=fcn3", f"out={tmp_path / 'run'}"])
    one_line(exc)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match=r"10000 images of cifar10/test\) asks for 5000 captures"):
        load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "data.name=cifar10", "data.images=all",
                                              "protocol.batch_size=2"])


def test_the_fixed_dataset_sizes_are_those_of_the_datasets_read(fashion_mnist):
    from gi.core.names import DATASET_SIZES
    from gi.world.data import DATASETS
    from gi.world.data import load as load_dataset

    assert {name for name, _ in DATASET_SIZES} == set(DATASETS) - {"folder"}
    for name, split in [*(k for k in DATASET_SIZES if k[0].endswith("-samples")), ("fashion-mnist", "test"),
                        ("fashion-mnist", "train")]:
        assert len(load_dataset(name, split)) == DATASET_SIZES[name, split], (name, split)


def test_data_images_all_of_a_folder_is_refused_once_read_before_any_model_and_writes_nothing(tmp_path,
                                                                                               monkeypatch):
    from PIL import Image

    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(root / c / f"{i}.png")
    monkeypatch.setattr(victim, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    out = tmp_path / "run"
    cfg = load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "data.name=folder", f"data.root={root}",
                                                "data.images=all", "data.max_captures=5", "model.name=fcn3",
                                                "model.num_classes=2", f"out={out}"])
    with pytest.raises(ConfigError, match=r"data.images=all \(6 images of folder/test\) asks for 6 captures .*more "
                                          r"than data.max_captures=5") as exc:
        gi_run.run(cfg)
    one_line(exc)
    assert not out.exists()


def test_gi_labels_refuses_more_trials_than_the_cap():
    from gi.experiments.config.labels import LabelBenchConfig

    with pytest.raises(ConfigError, match=r"trials=1001: must be >= 1 and at most 1000") as exc:
        load(LabelBenchConfig, "configs/labels/rlu-table2.yaml", ["trials=1001"])
    one_line(exc)
    assert load(LabelBenchConfig, "configs/labels/rlu-table2.yaml", ["trials=1000"]).trials == 1000


def test_raising_the_cap_lets_data_images_all_through(fashion_mnist):
    raised = load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "data.name=fashion-mnist", "data.split=train",
                                                   "data.images=all", "data.max_captures=60000"])
    dataset = victim.load_data(raised.data)
    assert len(victim.victim_batches(raised, dataset)) == 60000  # raised explicitly: every image its own capture


def test_data_images_all_on_a_small_dataset_is_every_image():
    cfg = load(RunConfig, "configs/demo.yaml", [*ONE_BATCH, "data.images=all"])
    assert victim.victim_batches(cfg, victim.load_data(cfg.data)) == [[i] for i in range(20)]
