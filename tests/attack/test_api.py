"""gi.attack.run: the one Python call runs the same stages as gi attack (labels → features → reconstruct)."""

from __future__ import annotations

import pytest
import torch

import gi
from gi.core.errors import ConfigError


def _capture(model_name: str, activation: str | None = None, n: int = 1):
    data = gi.world.data.load("cifar10-samples")
    model = gi.world.models.build(model_name, 10, activation=activation, init="uniform", seed=0)
    return gi.capture_gradients(model, data.images[:n], data.labels[:n], gi.Protocol())


def test_run_answers_a_sigmoid_lenet_capture_analytically_as_gi_attack_does():
    capture, truth = _capture("lenet")
    result = gi.attack.run(capture)
    assert [s["name"] for s in result.stages] == ["labels", "features", "reconstruct"]
    assert result.reconstructions[0].history["answered_by"] == "analytic inversion"
    assert int(result.label_results[0].counts.argmax()) == int(truth.labels[0])
    assert float(gi.analysis.metrics.psnr(result.reconstructions[0].images, truth.images)) > 40  # exact: ~100 dB


def test_run_takes_preset_keys_and_a_label_method_and_optimises_when_nothing_inverts():
    capture, _ = _capture("lenet", activation="relu")
    result = gi.attack.run(capture, preset="fast", labels="idlg", iterations=3, analytic=False, progress=False)
    rec = result.reconstructions[0]
    assert rec.images.shape == (1, 3, 32, 32) and rec.iterations == 3
    assert result.stages[0]["method"] == "idlg" and result.stages[2]["preset"] == "fast"
    assert torch.isfinite(rec.images).all()


def test_run_refuses_an_unknown_preset_before_any_work():
    capture, _ = _capture("lenet")
    with pytest.raises(ConfigError, match="preset"):
        gi.attack.run(capture, preset="nope")
