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
    assert result.warnings == []  # nothing asked that it ignored
    ignored = gi.attack.run(capture, iterations=5000, restarts=4, analytic=True, progress=False)
    assert [w for w in ignored.warnings if w.startswith("notice:")] == [
        "notice: iterations, restarts had no effect on this run: the analytic inversion answered every capture, so "
        "no optimisation ran (analytic=false runs the optimisation instead)"]


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


def _silenced(capture):
    """``capture`` with every shared tensor zeroed: a client whose loss had no gradient."""
    import dataclasses

    return dataclasses.replace(capture, gradients={k: torch.zeros_like(v) for k, v in capture.gradients.items()})


def test_silent_is_true_only_when_every_shared_tensor_is_zero():
    capture, _ = _capture("lenet")
    assert not capture.silent
    zeroed = _silenced(capture)
    assert zeroed.silent
    one_left = dict(zeroed.gradients)
    name = next(iter(one_left))
    one_left[name] = one_left[name].clone()
    one_left[name].view(-1)[0] = 1e-30  # one nonzero entry anywhere: the capture shares something
    import dataclasses

    assert not dataclasses.replace(zeroed, gradients=one_left).silent


def test_a_capture_with_an_all_zero_gradient_is_answered_by_a_grey_guess_and_does_not_stop_the_others():
    data = gi.world.data.load("cifar10-samples")
    model = gi.world.models.build("lenet", 10, init="uniform", seed=0)
    live, live_truth = gi.capture_gradients(model, data.images[1:2], data.labels[1:2], gi.Protocol())
    dead, _ = gi.capture_gradients(model, data.images[:1], data.labels[:1], gi.Protocol())
    result = gi.attack.run([_silenced(dead), live])
    grey, answered = result.reconstructions
    assert torch.equal(grey.images, torch.full((1, 3, 32, 32), 0.5))  # what one knows without a capture
    assert grey.history["answered_by"] == "nothing (all-zero gradient)" and grey.iterations == 0
    assert result.label_results[0].ok is False and int(result.label_results[0].counts.sum()) == 0
    assert "all zero" in result.label_results[0].info["reason"]
    # the live capture is attacked exactly as alone: the analytic answer, its own label
    assert answered.history["answered_by"] == "analytic inversion"
    assert float(gi.analysis.metrics.psnr(answered.images, live_truth.images)) > 40
    assert int(result.label_results[1].counts.argmax()) == int(live_truth.labels[0])
    assert any("1 of 2 capture(s) (0) not attacked" in w for w in result.warnings)
    assert result.stages[0]["silent_captures"] == [0]
    # the verdict without truth names no label for the capture that shares nothing
    verdict = result.verdict
    assert verdict.labels == [None, [int(live_truth.labels[0])]] and verdict.mismatch[1] == "explains"
    assert verdict.sentence.endswith(f"recovered labels per capture: 0: none (the capture shares nothing); "
                                     f"1: {int(live_truth.labels[0])}")


def test_a_run_of_only_silent_captures_reconstructs_nothing_and_says_why():
    capture, _ = _capture("lenet")
    result = gi.attack.run([_silenced(capture)])
    assert result.stages[2]["skipped"] and result.stages[2]["why"] == "no capture shares a gradient"
    assert result.stages[0]["method"] is None and result.label_results[0].ok is False
    assert result.reconstructions[0].history["gradient_mismatch"] != result.reconstructions[0].history[
        "gradient_mismatch"]  # NaN: no gradient to explain
