"""`diagnostics:` of `gi labels`: the registry of aux figures per grid point, the posterior paper's Fig. 2 box plots
(`posteriors`) and RLU App. B.3 Figs. 4–9's logit histograms (`logit_histograms`)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
import yaml

from gi.attack.stages import LabelTable
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.diagnostics import (
    DIAGNOSTIC_OPTIONS,
    LANDSCAPE_KINDS,
    PAPER_LOGIT_PAIRS,
    LabelLandscape,
    LogitHistograms,
    PosteriorBoxes,
)
from gi.experiments.config.labels import LabelBenchConfig
from gi.experiments.labels import run_label_bench
from gi.experiments.labels_diagnostics import DIAGNOSTICS
from gi.experiments.labels_diagnostics_output import PLOTS
from gi.world.data import ImageDataset
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from gi.world.scenarios import SCENARIOS, Trial, register_scenario
from labels.aux_stats import aux_forward, class_posteriors

AUX = ImageDataset(torch.rand(30, 3, 32, 32, generator=torch.Generator().manual_seed(2)),
                   torch.arange(10).repeat(3), 10, name="toy aux")

if "test-diagnostics-aux" not in SCENARIOS:

    @register_scenario("test-diagnostics-aux")
    def one_sample_with_aux(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
        model = build("lenet", 10, init="uniform", seed=trial)
        x = torch.rand(1, 3, 32, 32, generator=generator)
        cap, truth = capture_gradients(model, x, torch.tensor([3]), Protocol())
        return [Trial(cap, truth, aux=None if setup.get("no_aux") else AUX)]


if "test-batch-aux" not in SCENARIOS:

    @register_scenario("test-batch-aux")
    def batch_with_aux(setup: dict, generator: torch.Generator, trial: int) -> list[Trial]:
        model = build("lenet", 10, activation="sigmoid", init="uniform", seed=0)
        x = torch.rand(4, 3, 32, 32, generator=generator)
        y = torch.randint(0, 10, (4,), generator=generator)
        cap, truth = capture_gradients(model, x, y, Protocol(batch_size=4))
        aux_gen = torch.Generator().manual_seed(1)
        aux = ImageDataset(torch.rand(30, 3, 32, 32, generator=aux_gen), torch.arange(30) % 10, 10, "noise")
        return [Trial(cap, truth, aux=aux)]


BASE = {"scenario": "test-diagnostics-aux", "labels": {"methods": ["idlg"]}}


def _cfg(tmp_path, **kwargs) -> LabelBenchConfig:
    return LabelBenchConfig(name="h", scenario="test-diagnostics-aux", trials=2, out=str(tmp_path / "h"),
                            labels=LabelTable(["idlg"]), progress=False, **kwargs)


def test_every_diagnostic_has_its_options_data_and_plot():
    """The three homes of a diagnostic (options schema, data, files) name the same diagnostics, and a name without
    an options class cannot be registered."""
    from gi.experiments.labels_diagnostics import Diagnostic, register_diagnostic

    assert set(DIAGNOSTICS) == set(DIAGNOSTIC_OPTIONS) == set(PLOTS)
    with pytest.raises(ConfigError, match="no options class"):
        register_diagnostic("no-such-diagnostic")(Diagnostic(lambda *a: None, ()))
    assert "no-such-diagnostic" not in DIAGNOSTICS


def test_every_registered_diagnostic_writes_its_files_and_round_trips_through_config_yaml(tmp_path):
    out = run_label_bench(_cfg(tmp_path, grid={"x": [1, 2]}, diagnostics={name: {} for name in DIAGNOSTICS}))
    for entry in DIAGNOSTICS.values():
        for name in entry.files:
            assert (out / name).stat().st_size > 0, name
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["diagnostics"] == {"posteriors": {}, "logit_histograms": {"pairs": PAPER_LOGIT_PAIRS, "bins": 100},
                                      "label_landscape": {"kind": "auto", "lambdas": [-10.0, 10.0], "points": 4001}}
    again = LabelBenchConfig.from_mapping(written)
    assert again.diagnostics == {"posteriors": PosteriorBoxes(), "logit_histograms": LogitHistograms(),
                                 "label_landscape": LabelLandscape()}


def test_posteriors_are_the_positive_and_negative_posteriors_per_class(tmp_path):
    """Posterior paper Fig. 2: per class j, p_j over the aux samples of class j and of the others; their means are
    the method's p̂⁺ / p̂⁻ (eq. 3)."""
    cfg = LabelBenchConfig(name="p", scenario="test-batch-aux", trials=2, out=str(tmp_path / "p"),
                           labels=LabelTable(["posterior"]), diagnostics={"posteriors": {}}, progress=False)
    out = run_label_bench(cfg)
    assert (out / "posteriors.png").is_file()
    rows = list(csv.DictReader((out / "posteriors.csv").open()))
    assert len(rows) == 10 * 2 and {r["side"] for r in rows} == {"positive", "negative"}
    trial = SCENARIOS["test-batch-aux"]({}, torch.Generator().manual_seed(0), 0)[0]
    pos, neg = class_posteriors(aux_forward(trial.capture, trial.aux))
    for r in rows:
        assert int(r["n"]) == (3 if r["side"] == "positive" else 27)
        expect = (pos if r["side"] == "positive" else neg)[int(r["class"])]
        assert float(r["mean"]) == pytest.approx(float(expect), rel=1e-9)
        assert float(r["q1"]) <= float(r["median"]) <= float(r["q3"])


def test_logit_histograms_and_class_means_of_the_first_trials_aux_logits(tmp_path):
    out = run_label_bench(_cfg(tmp_path, grid={"x": [1, 2]}, diagnostics={"logit_histograms": {"bins": 5}}))
    assert (out / "logits.png").stat().st_size > 1000
    means = json.loads((out / "logit-means.json").read_text())
    assert [m["point"] for m in means] == ["x=1", "x=2"]
    trial = SCENARIOS["test-diagnostics-aux"]({}, torch.Generator().manual_seed(0), 0)[0]
    logits = aux_forward(trial.capture, AUX).logits
    mu = means[0]["mu"]
    assert len(mu) == 10 and len(mu[0]) == 10
    assert mu[1][5] == pytest.approx(float(logits[AUX.labels == 1, 5].mean()), rel=1e-9)
    assert means[0]["aux_acc"] == pytest.approx(float((logits.argmax(1) == AUX.labels).double().mean()))


def test_default_pairs_are_the_papers():
    assert LogitHistograms().pairs == PAPER_LOGIT_PAIRS and LogitHistograms().bins == 100


@pytest.mark.parametrize(("given", "match"), [
    ({"pairs": [[1]]}, r"diagnostics.logit_histograms.pairs=\[\[1\]\]: expected a non-empty list of \[n, j\]"),
    ({"pairs": [[-1, 2]]}, r"bad: \[\[-1, 2\]\]"),
    ({"pairs": []}, "non-empty"),
    ({"bins": 0}, r"diagnostics.logit_histograms.bins=0: expected >= 1"),
    ({"bins": 10**9}, r"logit_histograms.bins=1000000000: expected >= 1 and <= 10000"),
    ({"pairs": [[0, 1]] * 101}, r"101 pairs, at most 100"),
    ({"bins": "many"}, r"diagnostics.logit_histograms.bins=many: expected int, got str"),
    ({"colour": "red"}, r"unknown config key\(s\) \['diagnostics.logit_histograms.colour'\]"),
    (5, r"diagnostics.logit_histograms=5: expected a mapping"),
])
def test_bad_histogram_options_are_one_line_errors_at_load(given, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig.from_mapping({**BASE, "diagnostics": {"logit_histograms": given}})


@pytest.mark.parametrize(("diagnostics", "match"), [
    ({"posteriors": {"x": 1}}, r"diagnostics.posteriors=\{x: 1\}: takes no options; write `posteriors: \{\}`"),
    ({"posteriors": True}, r"diagnostics.posteriors=true: takes no options"),
    ({"histograms": {}},
     r"diagnostics.histograms: unknown diagnostic; valid: \['label_landscape', 'logit_histograms', 'posteriors'\]"),
    ([{"posteriors": {}}], r"diagnostics=\[\{posteriors: \{\}\}\]: expected dict"),
])
def test_unknown_names_and_options_of_an_optionless_diagnostic_are_errors(diagnostics, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig.from_mapping({**BASE, "diagnostics": diagnostics})


def test_posteriors_takes_no_options_or_an_empty_mapping():
    for given in (None, {}):
        cfg = LabelBenchConfig.from_mapping({**BASE, "diagnostics": {"posteriors": given}})
        assert cfg.diagnostics == {"posteriors": PosteriorBoxes()}


@pytest.mark.parametrize(("key", "value", "match"), [
    ("posterior_plot", True, r"posterior_plot=true: replaced by the diagnostics key; write "
                             r"`diagnostics: \{posteriors: \{\}\}` instead"),
    ("posterior_plot", False, r"posterior_plot=false: .* write nothing \(no diagnostics is the default\)"),
    ("logit_histograms", {"bins": 5}, r"logit_histograms=\{bins: 5\}: replaced by the diagnostics key; write "
                                      r"`diagnostics: \{logit_histograms: \{bins: 5\}\}` instead"),
    ("logit_histograms", None, r"logit_histograms=null: .* write nothing"),
])
def test_the_replaced_keys_are_refused_naming_the_diagnostics_entry(key, value, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig.from_mapping({**BASE, key: value})


def test_a_replaced_key_given_as_an_override_is_refused_too():
    with pytest.raises(ConfigError, match=r"write `diagnostics: \{posteriors: \{\}\}`"):
        load(LabelBenchConfig, None, ["scenario=test-diagnostics-aux", "labels.methods=[idlg]", "posterior_plot=true"])
    cfg = load(LabelBenchConfig, None, ["scenario=test-diagnostics-aux", "labels.methods=[idlg]",
                                        "diagnostics.logit_histograms.bins=7"])
    assert cfg.diagnostics == {"logit_histograms": LogitHistograms(bins=7)}


@pytest.mark.parametrize("name", sorted(n for n, d in DIAGNOSTICS.items() if d.needs_aux))
def test_a_grid_point_without_aux_data_is_an_error_before_any_method_runs(tmp_path, monkeypatch, name):
    import labels

    calls = []
    monkeypatch.setattr(labels, "recover_many", lambda *a, **k: calls.append(a) or [])
    cfg = _cfg(tmp_path, setup={"no_aux": True}, diagnostics={name: {}})
    with pytest.raises(ConfigError, match=rf"diagnostics.{name} needs the attacker's aux data; grid point 'all' "
                                          r"has none \(set setup.aux.per_class >= 1\)"):
        run_label_bench(cfg)
    assert calls == []


def test_a_pair_beyond_the_models_classes_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"\[\[12, 0\]\] name classes the model lacks \(it has 10\)"):
        run_label_bench(_cfg(tmp_path, diagnostics={"logit_histograms": LogitHistograms(pairs=[[12, 0]])}))


def test_bad_diagnostics_fail_without_torch():
    code = ("import sys\nfrom gi.core.errors import ConfigError\n"
            "from gi.experiments.config.diagnostics import LogitHistograms, diagnostic_options\n"
            "for bad in (lambda: LogitHistograms(bins=0), lambda: diagnostic_options({'nope': {}}),\n"
            "            lambda: diagnostic_options({'label_landscape': {'points': 1}}),\n"
            "            lambda: diagnostic_options({'logit_histograms': {'bins': 0}})):\n"
            "    try:\n        bad()\n    except ConfigError:\n        pass\n"
            "    else:\n        raise SystemExit('no error')\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_landscape_is_lowest_at_the_true_labels_lambda_without_aux(tmp_path):
    """Soft-label Figs. 1, 2, 7 on a one-hot capture of the DLG LeNet: the grid's lowest L_label sits within one
    grid step of λ* (the λ whose ŷ is the true label, fitted independently), ŷ there is the true label, and the
    search's own λ lands there too; no aux set is needed."""
    import json

    import labels

    out = run_label_bench(_cfg(tmp_path, setup={"no_aux": True},
                               diagnostics={"label_landscape": {"lambdas": [-5.0, 5.0], "points": 2001}}))
    data = json.loads((out / "label-landscape.json").read_text())
    assert [d["point"] for d in data] == ["all"] and data[0]["kind"] == "onehot"
    entry = data[0]
    assert abs(entry["grid_lambda"] - entry["true_lambda"]) <= 0.005 + 1e-9 and entry["true_fit"] < 1e-6
    trial = SCENARIOS["test-diagnostics-aux"]({}, torch.Generator().manual_seed(0), 0)[0]
    from labels.soft_label import label_landscape

    lam = torch.tensor([entry["true_lambda"]])
    loss, yhat = label_landscape(trial.capture, lam, "onehot")
    assert yhat.shape == (1, 10) and int(yhat[0].argmax()) == 3 and float(loss[0]) < 1e-3
    found = labels.recover(trial.capture, "soft-lambda", kind="onehot").info["lambda"]
    assert abs(found - entry["true_lambda"]) < 1e-3 * max(1.0, abs(found))


@pytest.mark.parametrize("given, match", [
    ({"kind": "focal"}, r"label_landscape.kind='focal': expected auto or one of"),
    ({"lambdas": [1.0, -1.0]}, r"lambdas=\[1.0, -1.0\]: expected \[lo, hi\] with lo < hi"),
    ({"lambdas": [1.0]}, "expected \\[lo, hi\\]"),
    ({"points": 1}, "points=1: expected >= 2"),
    ({"points": 100_001}, "<= 100000"),
])
def test_bad_landscape_options_are_one_line_errors_at_load(given, match):
    with pytest.raises(ConfigError, match=match):
        LabelBenchConfig(name="h", scenario="test-diagnostics-aux", labels=LabelTable(["idlg"]),
                         diagnostics={"label_landscape": given})


def test_a_landscape_of_a_batch_capture_is_an_error(tmp_path):
    cfg = LabelBenchConfig(name="b", scenario="test-batch-aux", trials=1, out=str(tmp_path / "b"),
                           labels=LabelTable(["idlg"]), progress=False, diagnostics={"label_landscape": {}})
    with pytest.raises(ConfigError, match="reads one sample per capture .* has 4"):
        run_label_bench(cfg)


def test_the_landscape_kinds_are_the_soft_label_methods():
    from labels.soft_label import KINDS

    assert set(LANDSCAPE_KINDS) == set(KINDS)
