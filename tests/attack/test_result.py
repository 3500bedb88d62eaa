"""What gi.attack.run gives a person (docs/usage.md, "Python"): the verdict without truth (the same record and line
as gi attack's metrics.json), scores with truth kept apart from the attack, and ``save``: gi attack's output
directory, reconstructions.safetensors and one PNG per image included, never over an existing result."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import gi
from gi.analysis.report import jsonable
from gi.core.errors import OutputError

FAST = {"iterations": 4, "restarts": 1, "retries": 0, "analytic": False, "progress": False}


def _capture(n: int = 1):
    data = gi.world.data.load("cifar10-samples")
    model = gi.world.models.build("lenet", 10, activation="relu", init="uniform", seed=0)
    return gi.capture_gradients(model, data.images[:n], data.labels[:n], gi.Protocol(batch_size=n))


def _png(path) -> torch.Tensor:
    """A PNG as (C, H, W) pixels in [0, 1]."""
    pixels = np.asarray(Image.open(path), dtype=np.float32) / 255
    return torch.from_numpy(pixels).permute(2, 0, 1) if pixels.ndim == 3 else torch.from_numpy(pixels)[None]


def test_the_verdict_without_truth_is_gi_attack_s_metrics_json_record_and_line(tmp_path, capsys):
    from gi.cli import main

    capture, _ = _capture()
    capture.save(tmp_path / "capture.safetensors")
    result = gi.attack.run(capture, **FAST)
    assert main(["attack", str(tmp_path / "capture.safetensors"), "attack.iterations=4", "attack.restarts=1",
                 "attack.retries=0", "attack.analytic=false", "attack.progress=false",
                 f"out={tmp_path / 'cli'}"]) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "cli" / "metrics.json").read_text())["verdict"]
    verdict = result.verdict
    assert json.loads(json.dumps(jsonable(verdict.record))) == written
    assert verdict.sentence in printed.splitlines()  # gi attack prints the same line, labels included
    slots = [int(c) for c in result.reconstructions[0].labels.argmax(1)]
    assert verdict.labels == [slots] and written["labels"] == [slots]
    assert verdict.sentence.endswith(f"; recovered label {slots[0]}")
    assert verdict.mismatch == written["captures"] and verdict.overall == written["overall"]
    assert verdict.counts == [{slots[0]: 1}]


def test_score_takes_truth_apart_from_the_attack_and_gives_the_per_image_table():
    capture, truth = _capture(2)
    result = gi.attack.run(capture, **FAST)
    assert not any(isinstance(v, gi.Truth) for v in vars(result).values())  # the attack holds no truth
    scored = result.score(truth)
    psnr = gi.metrics.score(result.reconstructions[0].images, truth.images)["psnr"]
    assert [r["psnr"] for r in scored.rows] == pytest.approx(psnr)
    assert [r["verdict"] for r in scored.rows] == scored.verdict["images"]
    assert scored.verdict["gradient"] == result.verdict.gradient  # the attack's own signal, unchanged by truth
    assert scored.sentence.startswith(f"verdict: {scored.verdict['overall']}: {scored.verdict['summary']}; ")
    assert all(r["mean_colour_psnr"] >= r["grey_psnr"] for r in scored.rows)
    with pytest.raises(gi.ConfigError, match="2 truth"):
        result.score([truth, truth])


def test_save_writes_gi_attack_s_directory_and_the_images_as_data(tmp_path):
    capture, truth = _capture(2)
    result = gi.attack.run(capture, **FAST)
    out = result.save(tmp_path / "out", truth)
    for name in ("config.yaml", "metrics.json", "results.csv", "grid.png", "capture.safetensors",
                 "truth.safetensors", "reconstructions.safetensors"):
        assert (out / name).is_file(), name
    rec = result.reconstructions[0]
    stored = load_file(out / "reconstructions.safetensors")
    assert set(stored) == {"capture0", "labels0"}
    assert stored["capture0"].dtype == torch.float32 and torch.equal(stored["capture0"], rec.images)
    assert torch.equal(stored["labels0"], rec.labels.argmax(1))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verdict"] == json.loads(json.dumps(jsonable(result.score(truth).verdict)))
    rows = result.score(truth).rows
    for slot in range(2):  # each slot's PNG, and beside it the truth image paired with it by pixels
        assert torch.allclose(_png(out / "images" / f"c0_i{slot}.png"), rec.images[slot], atol=1 / 255)
        (truth_index,) = [r["image"] for r in rows if r["matched_slot"] == slot]
        assert torch.allclose(_png(out / "images" / f"c0_i{slot}_truth.png"), truth.images[truth_index],
                              atol=1 / 255)
    assert sorted(os.listdir(out / "images")) == ["c0_i0.png", "c0_i0_truth.png", "c0_i1.png", "c0_i1_truth.png"]


def test_save_never_writes_over_a_result_and_an_empty_directory_is_taken(tmp_path):
    capture, _ = _capture()
    result = gi.attack.run(capture, **FAST)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    with pytest.raises(OutputError, match="exists and is not empty") as err:
        result.save(taken)
    assert "\n" not in str(err.value) and os.listdir(taken) == ["mine.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="file"):
        result.save(tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (result.save(empty) / "reconstructions.safetensors").is_file()
    assert not (empty / "truth.safetensors").exists() and sorted(os.listdir(empty / "images")) == ["c0_i0.png"]


def test_a_disk_that_fills_while_the_reconstructions_are_written_is_one_output_error(tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    capture, _ = _capture()
    result = gi.attack.run(capture, **FAST)

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OutputError, match="No space left on device") as err:
        result.save(tmp_path / "out")
    assert "\n" not in str(err.value) and "reconstructions.safetensors" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing published, the staging folder removed


def test_save_names_the_classes_it_is_given_in_the_report(tmp_path):
    """``classes``: a dataset's name or a list of names; report.html then names each slot's class, and names that
    do not fit the capture's class count are left out (numbers only)."""
    capture, _ = _capture()
    result = gi.attack.run(capture, **FAST)
    label = int(result.reconstructions[0].labels.argmax(1)[0])
    cifar = gi.world.data.class_names("cifar10-samples")
    result.save(tmp_path / "by-name", classes="cifar10-samples")
    assert f"{label} {cifar[label]}" in (tmp_path / "by-name" / "report.html").read_text()
    own = [f"kind-{k}" for k in range(10)]
    result.save(tmp_path / "by-list", classes=own)
    assert f"{label} kind-{label}" in (tmp_path / "by-list" / "report.html").read_text()
    result.save(tmp_path / "too-few", classes=["a", "b"])
    assert f"{label} a" not in (tmp_path / "too-few" / "report.html").read_text()
    result.save(tmp_path / "none")
    assert f"{label} {cifar[label]}" not in (tmp_path / "none" / "report.html").read_text()
