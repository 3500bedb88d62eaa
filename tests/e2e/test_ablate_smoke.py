"""End-to-end ablation on real CIFAR-10 samples: every label mode and two α/β variants, a few iterations."""

from __future__ import annotations

import csv
import json

from gi.core.config import load
from gi.experiments.ablate import run_ablation
from gi.experiments.config.ablate import AblateConfig


def test_ablation_smoke_on_real_samples(tmp_path):
    cfg = load(AblateConfig, "configs/ablate/table3.yaml", [
        f"out={tmp_path / 'abl'}", "trials=2", "attack.iterations=8", "only=[mixup/L2/untrained]",
        "attack_variants={base: {}, a0-b2: {last_layer_weight: 0.0, feature_weight: 2.0}}"])
    out = run_ablation(cfg)
    table = json.loads((out / "metrics.json").read_text())["table"]
    assert [(r["variant"], r["mode"]) for r in table] == [
        (v, m) for m in ("truth", "hard", "joint", "recovered", "recovered+joint") for v in ("base", "a0-b2")]
    rows = {(r["variant"], r["mode"]): r for r in table}
    # soft-lambda recovers the mixup labels almost exactly; iDLG's one-hot labels are far off; the oracle is exact
    assert rows["base", "truth"]["L_r"] == 0.0
    assert rows["base", "recovered"]["L_r"] < 1e-3
    assert rows["base", "hard"]["L_r"] > 0.2
    assert rows["base", "truth"]["paper_psnr"] == 28.27
    for r in table:
        assert 3.0 < r["psnr"] < 60.0 and r["images"] == 2
    with (out / "results.csv").open() as f:
        per_image = list(csv.DictReader(f))
    assert len(per_image) == 2 * 10
    for name in ("table.md", "table.csv", "config.yaml", "psnr.png", "log.txt",
                 "grid-mixup-L2-untrained-base-recovered.png", "grid-mixup-L2-untrained-a0-b2-joint.png"):
        assert (out / name).is_file(), name
def test_interrupted_ablation_resumes_without_redoing_finished_rows(tmp_path, monkeypatch):
    import pytest

    import gi.experiments.ablate as ablate

    over = [f"out={tmp_path / 'abl'}", "trials=1", "attack.iterations=3", "attack.restarts=1",
            "only=[mixup/L2/untrained]", "modes=[truth,hard,recovered]"]
    real, calls = ablate.reconstruct_many, []

    def interrupted(*args, **kwargs):
        calls.append(args[3].labels)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed during the second row
        return real(*args, **kwargs)

    monkeypatch.setattr(ablate, "reconstruct_many", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_ablation(load(AblateConfig, "configs/ablate/table3.yaml", over))
    assert not (tmp_path / "abl").exists() and len(list((tmp_path / ".abl.cells").glob("*.json"))) == 1
    calls.clear()
    monkeypatch.setattr(ablate, "reconstruct_many", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = run_ablation(load(AblateConfig, "configs/ablate/table3.yaml", over))
    assert len(calls) == 2  # the finished truth row was reused, hard and recovered were computed
    table = json.loads((out / "metrics.json").read_text())["table"]
    assert [r["mode"] for r in table] == ["truth", "hard", "recovered"] and table[0]["L_r"] == 0.0
    assert (out / "grid-mixup-L2-untrained-base-truth.png").is_file()
    assert not (tmp_path / ".abl.cells").exists()
