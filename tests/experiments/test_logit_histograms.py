"""`logit_histograms` of `gi labels` (RLU App. B.3, Figs. 4–9): the aux logits' class means and histograms."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gi.attack.stages import LabelTable
from gi.core.errors import ConfigError
from gi.experiments.config.labels import PAPER_LOGIT_PAIRS, LabelBenchConfig, LogitHistograms
from gi.experiments.labels import run_label_bench
from gi.world.data import ImageDataset
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from gi.world.scenarios import SCENARIOS, Trial, register_scenario
from labels.aux_stats import aux_forward

AUX = ImageDataset(torch.rand(30, 3, 32, 32, generator=torch.Generator().manual_seed(2)),
                   torch.arange(10).repeat(3), 10, name="toy aux")

if "test-logit-aux" not in SCENARIOS:

    @register_scenario("test-logit-aux")
    def one_sample_with_aux(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
        model = build("lenet", 10, init="uniform", seed=trial)
        x = torch.rand(1, 3, 32, 32, generator=generator)
        cap, truth = capture_gradients(model, x, torch.tensor([3]), Protocol())
        return [Trial(cap, truth, aux=None if setup.get("no_aux") else AUX)]


def _cfg(tmp_path, **kwargs) -> LabelBenchConfig:
    return LabelBenchConfig(name="h", scenario="test-logit-aux", trials=2, out=str(tmp_path / "h"),
                            labels=LabelTable(["idlg"]), progress=False, **kwargs)


def test_histograms_and_class_means_of_the_first_trials_aux_logits(tmp_path):
    out = run_label_bench(_cfg(tmp_path, grid={"x": [1, 2]}, logit_histograms=LogitHistograms(bins=5)))
    assert (out / "logits.png").stat().st_size > 1000
    means = json.loads((out / "logit-means.json").read_text())
    assert [m["point"] for m in means] == ["x=1", "x=2"]
    trial = SCENARIOS["test-logit-aux"]({}, torch.Generator().manual_seed(0), 0)[0]
    logits = aux_forward(trial.capture, AUX).logits
    mu = means[0]["mu"]
    assert len(mu) == 10 and len(mu[0]) == 10
    assert mu[1][5] == pytest.approx(float(logits[AUX.labels == 1, 5].mean()), rel=1e-9)
    assert means[0]["aux_acc"] == pytest.approx(float((logits.argmax(1) == AUX.labels).double().mean()))


def test_default_pairs_are_the_papers():
    assert LogitHistograms().pairs == PAPER_LOGIT_PAIRS and LogitHistograms().bins == 100


@pytest.mark.parametrize(("given", "match"), [
    ({"pairs": [[1]]}, r"logit_histograms.pairs=\[\[1\]\]: expected a non-empty list of \[n, j\]"),
    ({"pairs": [[-1, 2]]}, r"bad: \[\[-1, 2\]\]"),
    ({"pairs": []}, "non-empty"),
    ({"bins": 0}, r"logit_histograms.bins=0: expected >= 1"),
    ({"bins": 10**9}, r"logit_histograms.bins=1000000000: expected >= 1 and <= 10000"),
    ({"pairs": [[0, 1]] * 101}, r"101 pairs, at most 100"),
])
def test_bad_histogram_configs_are_one_line_errors(given, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig.from_mapping({"scenario": "test-logit-aux", "labels": {"methods": ["idlg"]},
                                       "logit_histograms": given})


def test_a_pair_beyond_the_models_classes_and_a_missing_aux_set_are_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"\[\[12, 0\]\] name classes the model lacks \(it has 10\)"):
        run_label_bench(_cfg(tmp_path, logit_histograms=LogitHistograms(pairs=[[12, 0]])))
    with pytest.raises(ConfigError, match="needs the attacker's aux set"):
        run_label_bench(_cfg(tmp_path, setup={"no_aux": True}, overwrite=True, logit_histograms=LogitHistograms()))


def test_a_bad_histogram_config_fails_without_torch():
    code = ("import sys\nfrom gi.core.errors import ConfigError\n"
            "from gi.experiments.config.labels import LogitHistograms\n"
            "try:\n    LogitHistograms(bins=0)\nexcept ConfigError:\n    pass\n"
            "else:\n    raise SystemExit('no error')\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
