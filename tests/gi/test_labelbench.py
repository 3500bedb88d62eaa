import json

import pytest
import torch

from gi.capture import capture_gradients
from gi.core.errors import ConfigError
from gi.experiments.labelbench import LabelBenchConfig, grid_points, run_bench
from gi.fl.protocol import Protocol
from gi.models import build
from gi.scenarios import SCENARIOS, Trial, register_scenario

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
                      grid={"activation": ["sigmoid", "relu"]}, methods=["idlg", "yin"],
                      metrics=["ins_acc", "cls_acc"], paper={"*": {"idlg": 1.0}}, progress=False)
    out = run_bench(cfg)
    summary = json.loads((out / "summary.json").read_text())["rows"]
    assert len(summary) == 4  # 2 grid points × 2 methods
    idlg = [r for r in summary if r["method"] == "idlg"]
    assert all(r["ins_acc"] == 1.0 and r["paper_ins_acc"] == 1.0 for r in idlg)  # iDLG is exact for B=1
    for name in ("trials.csv", "summary.csv", "summary.md", "plot.png", "config.yaml"):
        assert (out / name).is_file()
    assert "activation=sigmoid" in (out / "summary.md").read_text()


def test_grid_expands_dotted_keys():
    cfg = LabelBenchConfig(scenario="test-single-onehot", methods=["idlg"], setup={"model": {"name": "a"}},
                      grid={"model.name": ["x", "y"], "b": [1, 2]})
    points = grid_points(cfg)
    assert [p for p, _ in points] == ["name=x, b=1", "name=x, b=2", "name=y, b=1", "name=y, b=2"]
    assert points[3][1] == {"model": {"name": "y"}, "b": 2}


@pytest.mark.parametrize("kwargs, match", [({"scenario": "nope", "methods": ["idlg"]}, "unknown scenario"),
                                           ({"scenario": "test-single-onehot", "methods": ["psychic"]},
                                            "unknown label method"),
                                           ({"scenario": "test-single-onehot", "methods": []}, "methods is empty")])
def test_bad_bench_configs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig(**kwargs)
