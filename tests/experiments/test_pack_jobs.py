"""Issue 15, point 1: jobs that share a model are packed into one problem (gi.experiments.run.run_many, gi sweep
``pack``), each job still written to its own directory with the reconstructions it gets alone."""

from __future__ import annotations

import json

import pytest
import torch

import gi.experiments.sweep as sweep
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.config.run import RunConfig
from gi.experiments.config.sweep import SweepConfig, expand_jobs, pack_key
from gi.experiments.run import run, run_many
from gi.experiments.sweep import dry_run, pack_batches, run_sweep

FAST = ["attack.preset=ig", "attack.iterations=30", "attack.progress=false", "metrics.lpips_vgg=false",
        "attack.log_every=10", "attack.retries=0", "attack.restarts=1", "attack.analytic=false"]


def _cfg(tmp_path, name, *extra):
    return load(RunConfig, "configs/demo.yaml", FAST + [f"out={tmp_path / name}", *extra])


def test_jobs_differing_in_labels_and_images_share_one_problem_and_get_what_they_get_alone(tmp_path):
    jobs = [_cfg(tmp_path, "a", "labels.mode=truth", "data.indices=[0]"),
            _cfg(tmp_path, "b", "labels.method=idlg", "data.indices=[3]"),
            _cfg(tmp_path, "c", "attack.objective=l2", "data.indices=[0]")]  # another attack: its own problem
    packed = run_many(jobs)
    stages = [{s["name"]: s for s in r.metrics["stages"]}["reconstruct"] for r in packed]
    assert [s.get("packed_jobs") for s in stages] == [2, 2, None]
    assert stages[0]["captures"] == 2 and stages[2]["captures"] == 1
    for name, res in zip("abc", packed):
        assert res.out == tmp_path / name and (res.out / "psnr.png").is_file() and (res.out / "grid.png").is_file()
        assert json.loads((res.out / "metrics.json").read_text())["psnr_mean"] == res.metrics["psnr_mean"]
    for k, name in enumerate("ab"):  # alone: the same start image and objective; vmap vs loop differ by rounding
        alone = run(_cfg(tmp_path, f"{name}-alone", *[o for o in (["labels.mode=truth", "data.indices=[0]"],
                                                                   ["labels.method=idlg", "data.indices=[3]"])[k]]))
        assert (alone.reconstruction.images - packed[k].reconstruction.images).abs().mean() < 2e-3
    assert packed[1].metrics["labels"]["method"] == "idlg" and packed[0].metrics["labels"]["mode"] == "truth"
    logs = {name: (tmp_path / name / "log.txt").read_text() for name in "abc"}  # each job's own lines + its pack's
    assert "labels: idlg" in logs["b"] and "labels: idlg" not in logs["a"] and "labels: idlg" not in logs["c"]
    assert all("packing 2 jobs into one problem" in logs[n] for n in "ab") and "packing" not in logs["c"]
    assert logs["c"].count("captured lenet") == 1 and logs["a"].count("captured lenet") == 1


def test_a_failing_job_writes_no_directory_of_its_pack(tmp_path):
    bad = _cfg(tmp_path, "b", "data.indices=[99]")
    with pytest.raises(ConfigError, match="out of range"):
        run_many([_cfg(tmp_path, "a"), bad])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_pack_batches_group_jobs_that_differ_only_in_label_stage_or_images():
    cfg = SweepConfig(base="configs/demo.yaml", grid={"labels.method": ["idlg", "auto"], "data.indices": [[0], [1]]},
                      seeds=[0, 1], pack=8)
    jobs = expand_jobs(cfg)
    batches = pack_batches(cfg, jobs)
    assert sorted(len(b) for b in batches) == [4, 4]  # one batch per seed (the seed draws the model)
    for batch in batches:
        assert len({dict(j.params)["seed"] for j in batch}) == 1
        assert len({pack_key("run", cfg.base, list(j.overrides)) for j in batch}) == 1
    small = SweepConfig(**{**cfg.__dict__, "pack": 3})
    assert sorted(len(b) for b in pack_batches(small, jobs)) == [1, 1, 3, 3]
    assert [len(b) for b in pack_batches(SweepConfig(**{**cfg.__dict__, "pack": 0}), jobs)] == [1] * 8
    lr_grid = SweepConfig(base="configs/demo.yaml", grid={"attack.lr": [0.1, 0.2]}, pack=8)
    assert [len(b) for b in pack_batches(lr_grid, expand_jobs(lr_grid))] == [1, 1]  # another attack: not packed


def test_a_packed_sweep_runs_its_batches_and_a_failing_batch_job_by_job(tmp_path, capsys):
    cfg = SweepConfig(name="p", base="configs/demo.yaml", overrides=FAST,
                      grid={"data.indices": [[0], [2], [99]]}, seeds=[0], pack=4, devices=1, accelerator="cpu",
                      out=str(tmp_path / "sw"))
    with pytest.raises(sweep.JobsFailed, match="1 of 3 jobs failed"):
        run_sweep(cfg)  # index 99 fails the batch: every job then runs alone, the two good ones finish
    text = capsys.readouterr().out
    assert "packed batch of 3 failed" in text and text.count("FAILED") == 1
    cfg = SweepConfig(**{**cfg.__dict__, "grid": {"data.indices": [[0], [2], [4]]}, "out": str(tmp_path / "ok")})
    run_sweep(cfg)
    text = capsys.readouterr().out
    assert text.count("packed with 2 other job(s)") == 3
    rows = (tmp_path / "ok" / "aggregate.csv").read_text().splitlines()
    assert len(rows) == 4
    plan = dry_run(SweepConfig(**{**cfg.__dict__, "out": str(tmp_path / "plan")}))
    assert "packed into one problem where their attacks allow: jobs 0, 1, 2" in plan


@pytest.mark.parametrize("keys, needle", [({"pack": -1}, "pack must be"), ({"pack": True}, "pack must be"),
                                          ({"pack": 2, "command": "ablate"}, "needs command=run")])
def test_bad_pack_settings_raise(keys, needle):
    with pytest.raises(ConfigError, match=needle):
        SweepConfig(**keys)


def test_reconstruct_prepared_refuses_attacks_that_cannot_share_a_problem(tmp_path):
    from gi.attack.stages import prepare_attack, reconstruct_prepared
    from gi.world.build import build_victim, capture_all

    cfg = _cfg(tmp_path, "x")
    dataset, model = build_victim(cfg)
    captures, _ = capture_all(cfg, dataset, model, torch.Generator().manual_seed(0))
    a = prepare_attack(cfg.labels, cfg.attack, captures)
    other = prepare_attack(cfg.labels, type(cfg.attack)(**{**cfg.attack.__dict__, "lr": 0.5}), captures)
    with pytest.raises(ConfigError, match="cannot share one problem"):
        reconstruct_prepared([a, other])


def test_the_psnr_curve_follows_the_captures_through_every_problem_of_a_split_fit(tmp_path):
    cfg = _cfg(tmp_path, "split", "data.indices=null", "data.images=[0,1,2]", "attack.pack=2")
    res = run(cfg)
    assert [r.history["pack"] for r in res.reconstructions] == [2, 2, 1]
    assert (res.out / "psnr.png").is_file()  # before, a split fit left the curve out


def _rec(history):
    from gi.attack.recon import Reconstruction

    image = torch.zeros(1, 3, 4, 4)
    return Reconstruction(images=image, all_images=image[None], labels=torch.ones(1, 1), objective=torch.zeros(1),
                          best_restart=0, history=history)


def test_the_truth_monitor_follows_every_fit_and_the_plot_draws_the_returned_one():
    """The monitor keeps one curve per fit of each capture (a pack chunk, a retry); psnr.png draws the fit each
    reconstruction was returned from and, dashed, the fit its retry replaced (before, the first fit was drawn
    even where a retry replaced it)."""
    from types import SimpleNamespace

    from gi.analysis.outputs import psnr_curves, truth_monitor
    from gi.capture import Truth

    truths = [Truth(images=torch.zeros(1, 3, 4, 4), labels=torch.tensor([0]), counts=torch.tensor([1]),
                    targets=torch.tensor([[1.0]])) for _ in range(3)]
    monitor = truth_monitor(truths, every=1)
    trainer = SimpleNamespace(max_steps=2)

    def fit(ids, value, fit_id):
        module = SimpleNamespace(problem=SimpleNamespace(capture_ids=ids), fit_id=fit_id,
                                 current_batch=lambda: torch.full((len(ids), 1, 3, 4, 4), value))
        monitor.on_train_start(trainer, module)
        for step in range(2):
            monitor.on_train_batch_end(trainer, module, None, None, step)

    fit((0, 1), 0.1, fit_id=7)  # a pack chunk of captures 0 and 1
    fit((2,), 0.01, fit_id=8)  # the chunk of capture 2
    fit((1,), 0.001, fit_id=9)  # a retry of capture 1, which replaced its first fit
    assert monitor.curves[1] == {7: pytest.approx({0: 20.0, 1: 20.0}), 9: pytest.approx({0: 60.0, 1: 60.0})}
    recs = [_rec({"fit": 7}), _rec({"fit": 9, "replaced": [{"fit": 7, "attempt": 0}]}), _rec({"fit": 8})]
    returned, replaced = psnr_curves(monitor.curves, monitor.ids, recs)
    assert returned.x == [0, 1] and returned.y == pytest.approx([40.0, 40.0])  # (20 + 60 + 40) / 3
    assert replaced.style == "replaced" and "replaced (first fit)" in replaced.label
    assert replaced.y == pytest.approx([20.0, 20.0])
    part = monitor.part(1, 3)
    (returned, _replaced) = psnr_curves(part.curves, part.ids, recs[1:])
    assert returned.y == pytest.approx([50.0, 50.0])


def test_a_run_with_analytically_answered_captures_still_draws_the_optimised_ones_psnr():
    """A mixed run (some captures answered by the analytic inversion, never optimised) drew no psnr.png: the curve
    now averages the optimised captures (the drawn file: tests/experiments/test_attack.py's mixed run)."""
    from gi.analysis.outputs import psnr_curves

    curves = {0: {3: {0: 10.0, 5: 12.0}}, 2: {4: {0: 20.0, 5: 30.0, 7: 31.0}}}  # capture 1: answered
    recs = [_rec({"fit": 3}), _rec({"answered_by": "analytic inversion"}), _rec({"fit": 4})]
    (curve,) = psnr_curves(curves, [0, 1, 2], recs)
    assert curve.x == [0, 5] and curve.y == pytest.approx([15.0, 21.0])
    assert "1 answered analytically" in curve.label
    assert psnr_curves({}, [0, 1, 2], recs) == []  # nothing optimised: no curve
