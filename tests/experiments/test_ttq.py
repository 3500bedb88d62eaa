"""gi bench kind time-to-quality: crossing / ratio math exactly, the clock, our-side curve through
the default job's stage functions, breaching's wiring (model without Normalize), the missing-breaching error."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import gi
import gi.experiments.ttq as ttq
import gi.experiments.ttq_curves as ttq_curves
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.bench import bench_kind
from gi.experiments.config.bench import BenchConfig
from gi.experiments.config.ttq import BreachingOptions, TTQConfig
from gi.experiments.ttq import AttackClock, format_ttq, run_ttq, without_normalize
from gi.experiments.ttq_curves import median_bound, ratio, summarize_curves, time_to
from gi.experiments.ttq_output import psnr_at
from gi.world.fl.protocol import Protocol
from gi.world.models import build

LENET = "configs/bench/ttq-lenet.yaml"


def test_time_to_is_the_first_checkpoint_at_or_above_the_level():
    secs, psnr = [1.0, 2.0, 3.0, 4.0], [20.0, 25.0, 24.0, 31.0]
    assert time_to(secs, psnr, 25.0) == 2.0  # reaching the level exactly counts
    assert time_to(secs, psnr, 30.0) == 4.0
    assert time_to(secs, psnr, 31.5) is None
    assert psnr_at(secs, psnr, 3.5) == 24.0 and psnr_at(secs, psnr, 3.0) == 24.0 and psnr_at(secs, psnr, 0.5) is None


def test_ratio_is_exact_or_a_bound_when_censored():
    assert ratio(2.0, 30.0, 10.0, 100.0) == (15.0, "exact")
    assert ratio(2.0, None, 10.0, 100.0) == (50.0, ">=")  # breaching censored at its budget: a lower bound
    assert ratio(None, 30.0, 10.0, 100.0) == (3.0, "<=")  # ours censored at its own: an upper bound
    assert ratio(None, None, 10.0, 100.0) == (None, "neither")
    assert median_bound([(15.0, "exact"), (50.0, ">="), (12.0, "exact")]) == (15.0, ">=")
    assert median_bound([(15.0, "exact"), (11.0, "exact")]) == (13.0, "exact")
    assert median_bound([(15.0, "exact"), (3.0, "<="), (None, "neither")]) == (9.0, "~")
    assert median_bound([(None, "neither")]) == (None, "neither")


def test_summary_per_capture_and_over_captures():
    cfg = TTQConfig(budget=100.0, levels=[25.0, 30.0], contenders=["gi", "breaching"])
    curves = []
    for k, (ours, theirs) in enumerate([([(1, 24.0), (3, 31.0)], [(30, 26.0), (60, 30.5)]),
                                        ([(2, 26.0), (4, 30.0)], [(50, 27.0), (100, 28.0)])]):
        for name, pts in (("gi", ours), ("breaching", theirs)):
            c = ttq_curves.Curve(name, k)
            for i, (t, p) in enumerate(pts):
                c.add(i, {"wall": t + 0.5, "cpu": t}, p)
            curves.append(c)
    s = summarize_curves(cfg, curves)
    r0, r1 = s["rows"]
    assert r0["gi"]["time_to_25"] == 3.0 and r0["breaching"]["time_to_25"] == 30.0
    assert r0["ratio_breaching_30"] == {"value": 20.0, "kind": "exact"}
    assert r1["ratio_breaching_30"] == {"value": 25.0, "kind": ">="}  # censored at breaching's last clock, 100
    assert s["ratios"]["breaching_30"] == {"median": 22.5, "median_kind": ">=", "min": 20.0, "censored_theirs": 1,
                                           "censored_ours": 0, "neither": 0, "not_applicable": 0}
    assert s["ratios"]["breaching_25"]["median"] == pytest.approx((10.0 + 25.0) / 2)
    assert r0["gain_over_breaching_db"] == pytest.approx(31.0 - 30.5)  # PSNRs at equal time = the budget


def test_clock_leaves_out_the_paused_time(monkeypatch):
    now = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(ttq, "CLOCKS", {k: (lambda k=k: now[k]) for k in now})
    clock = AttackClock()
    clock.start()
    now.update(wall=2.0, cpu=1.0)
    clock.pause()
    now.update(wall=7.0, cpu=4.0)  # scoring: not attack time
    assert clock.read() == {"wall": 2.0, "cpu": 1.0}
    clock.resume()
    now.update(wall=8.0, cpu=4.5)
    assert clock.read() == {"wall": 3.0, "cpu": 1.5}


def test_breaching_wiring_moves_the_normalisation_out_of_the_model():
    model = build("lenet", 10, init="uniform", seed=0).eval()
    bare, mean, std = without_normalize(model)
    x = torch.rand(2, 3, 32, 32)
    normalised = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    assert torch.allclose(bare(normalised), model(x), atol=1e-6)
    assert [n for n, _ in bare.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert mean != [0.0, 0.0, 0.0] and std != [1.0, 1.0, 1.0]  # CIFAR statistics, into breaching's metadata
    with pytest.raises(ConfigError, match="zoo model"):
        without_normalize(torch.nn.Linear(3, 2))


def test_missing_breaching_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "breaching", None)  # import breaching -> ImportError
    cfg = load(TTQConfig, LENET, [f"out={tmp_path / 'o'}"])
    with pytest.raises(ConfigError) as err:
        run_ttq(cfg)
    text = str(err.value)
    assert "\n" not in text and "pip download --no-deps breaching==0.1.2" in text and "PYTHONPATH" in text
    assert not (tmp_path / "o").exists()


def test_our_curve_is_the_analytic_answer_when_the_inversion_is_consistent(tmp_path):
    """The default job on the DLG LeNet: labels → features with the conv inversion, no optimisation; the curve is
    one point, the inversion's image at the stages' seconds."""
    over = ["contenders=[gi]", "select=[3]", "every=5", "budget=1000", f"out={tmp_path / 'a'}"]
    out = run_ttq(load(TTQConfig, LENET, over))  # fill_budget on: an analytic answer is not run again
    (c,) = json.loads((out / "curves.json").read_text())
    assert c["iterations"] == [0] and c["psnr"][0] > 40 and 0 < c["cpu"][0] < 60
    assert (out / "ttq.png").stat().st_size > 1000 and "gi to 30 dB" in format_ttq(out)
    page = (out / "report.html").read_text()
    assert "<tr><td>gi</td>" in page and page.count("data:image/png;base64,") == 1  # the row and ttq.png
    stages = c["info"]["stages"]
    assert stages[1]["analytic_inversion"] and stages[2]["skipped"] and stages[2]["iterations"] == 0
    assert c["info"]["runs"] == 1 and c["info"]["not_restarted"] == "a new run would repeat this one"


def test_our_curve_runs_the_default_job_stages(tmp_path):
    over = ["contenders=[gi]", "select=[3]", "every=5", "budget=1000", "fill_budget=false",
            "job_overrides=[attack.iterations=20,attack.retries=0,attack.analytic=false]", f"out={tmp_path / 'a'}"]
    out = run_ttq(load(TTQConfig, LENET, over))
    curves = json.loads((out / "curves.json").read_text())
    (c,) = curves
    assert c["contender"] == "gi" and c["capture"] == 3 and c["iterations"] == [5, 10, 15, 20, 20]
    assert all(b >= a for a, b in zip(c["cpu"], c["cpu"][1:])) and all(b >= a for a, b in zip(c["wall"], c["wall"][1:]))
    assert 5 < c["psnr"][-1] < 100  # 8.79-8.86 dB by CPU kernels (20 iterations from a random start)
    names = [s["name"] for s in c["info"]["stages"]]
    assert names == ["labels", "features", "reconstruct"] and c["info"]["stages"][2]["preset"] == "default"
    assert c["info"]["stages"][0]["picked_by"] == "auto" and c["info"]["labels_given"] is False
    assert (out / "ttq.png").stat().st_size > 1000 and (out / "config.yaml").exists()
    assert "gi to 25 dB" in format_ttq(out)


@pytest.mark.slow
def test_our_curve_ends_on_the_default_jobs_image_and_stops_at_its_budget(tmp_path):
    """The same capture through attack_stages outside the benchmark gives the curve's final image."""
    from gi.attack.stages import attack_stages

    over = ["contenders=[gi]", "select=[3]", "every=5", "budget=1000", "fill_budget=false",
            "job_overrides=[attack.iterations=20,attack.analytic=false]", f"out={tmp_path / 'a'}"]
    (c,) = json.loads((run_ttq(load(TTQConfig, LENET, over)) / "curves.json").read_text())

    victim = ttq.build_victim_side(load(TTQConfig, LENET, ["select=[3]",
                                                            "job_overrides=[attack.iterations=20,attack.analytic=false]"]))
    attack = victim.job.attack.__class__(**{**victim.job.attack.__dict__, "threads": 1, "progress": False})
    rec = attack_stages(victim.job.labels, attack, victim.captures, None, victim.aux).reconstructions[0]
    assert ttq.scorer(victim.truths[0])(rec.images) == pytest.approx(c["psnr"][-1], abs=1e-4)

    stopped = run_ttq(load(TTQConfig, LENET, over[:3] + ["budget=1e-9", "job_overrides=[attack.analytic=false]",
                                                         f"out={tmp_path / 'b'}"]))
    (c,) = json.loads((stopped / "curves.json").read_text())
    # the budget stops every fit after its first step (a fit one step old has stalled, so each restart-on-stall
    # retry runs too); the iterations count over all of them
    assert c["iterations"][-1] == 1 + victim.job.attack.retries
    assert c["info"]["runs"] == 1  # the budget is spent: no new run


def test_breaching_curve_on_a_short_budget(tmp_path):
    pytest.importorskip("breaching")
    over = ["contenders=[breaching]", "select=[0]", "every=10", "breaching.max_iterations=30",
            "breaching.schedules=null", "fill_budget=false",
            f"out={tmp_path / 'c'}"]
    (c,) = json.loads((run_ttq(load(TTQConfig, LENET, over)) / "curves.json").read_text())
    assert c["iterations"] == [10, 20, 30] and c["info"]["labels_given"] is True and 5 < c["psnr"][-1] < 40


def test_bench_kinds_and_bad_configs():
    assert isinstance(load(BenchConfig, "configs/bench/quick.yaml"), BenchConfig)
    cfg = load(BenchConfig, LENET)
    assert isinstance(cfg, TTQConfig) and bench_kind(cfg).run is run_ttq
    assert cfg.breaching.tv == 5e-4 and cfg.contenders == ["gi", "breaching"]
    with pytest.raises(ConfigError, match="not a bench kind"):
        load(BenchConfig, None, ["kind=nope"])
    with pytest.raises(ConfigError, match="contenders"):
        load(TTQConfig, LENET, ["contenders=[gi, gi]"])
    with pytest.raises(ConfigError, match="contenders"):
        load(TTQConfig, LENET, ["contenders=[deepleakage]"])
    for bad, key in (("budget=0", "budget"), ("clock=tsc", "clock"), ("select=[]", "select"),
                     ("breaching.tv=-1", "breaching.tv"), ("levels=[]", "levels")):
        with pytest.raises(ConfigError, match=key):
            load(TTQConfig, LENET, [bad])
    with pytest.raises(ConfigError, match="select"):
        ttq.build_victim_side(load(TTQConfig, LENET, ["select=[99]"]))


def test_a_gpu_bench_needs_the_wall_clock_and_a_named_device(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="clock.*wall when device=gpu"):
        load(TTQConfig, LENET, ["device=gpu", "clock=cpu"])
    with pytest.raises(ConfigError, match="device"):
        load(TTQConfig, LENET, ["device=auto", "clock=wall"])
    monkeypatch.setattr("gi.core.devices._gpu_device_nodes", lambda: False)  # any machine: as if it had no GPU
    # a GPU run's config loads anywhere; running it needs the GPU, and says so before any work
    gpu = load(TTQConfig, LENET, ["device=gpu", "clock=wall", "contenders=[gi]", f"out={tmp_path / 'o'}"])
    with pytest.raises(ConfigError, match="no GPU.*use device=cpu$"):
        run_ttq(gpu)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="device"):
        load(TTQConfig, LENET, ["device=tpu", "clock=wall"])
    assert load(TTQConfig, LENET, ["clock=wall"]).device == "cpu"
    assert ttq.device_sync("cpu") is None


def test_clock_synchronises_before_it_starts_and_pauses(monkeypatch):
    now = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(ttq, "CLOCKS", {k: (lambda k=k: now[k]) for k in now})
    queued = []

    def sync() -> None:  # the GPU finishing its queued work takes 3 s of wall time
        if queued:
            now["wall"] += queued.pop()

    clock = AttackClock(sync)
    queued.append(5.0)  # work queued before the attack starts is not attack time
    clock.start()
    queued.append(3.0)
    assert clock.read() == {"wall": 0.0, "cpu": 0.0}  # a budget check between pauses does not wait for the GPU
    clock.pause()
    assert clock.read() == {"wall": 3.0, "cpu": 0.0}  # the pause waits: the queued work counts


def test_merge_runs_joins_disjoint_parts_and_refuses_overlaps(tmp_path):
    from gi.analysis.report import write_json, write_yaml
    from gi.core.config import to_dict

    def part(name, captures, every=50):
        d = tmp_path / name
        d.mkdir()
        cfg = TTQConfig(every=every, select=captures)
        write_yaml(d / "config.yaml", to_dict(cfg))
        curves = []
        for k in captures:
            for who, (t, p) in (("gi", (2.0 + k, 31.0)), ("breaching", (40.0 + k, 30.5))):
                c = ttq_curves.Curve(who, k)
                c.add(10, {"wall": t, "cpu": t}, p)
                curves.append(json.loads(json.dumps(c.__dict__)))
        write_json(d / "curves.json", curves)
        write_json(d / "summary.json", {"git": "x", "load_average_end": [1.0, 1.0, 1.0]})
        return d

    a, b = part("a", [0, 1]), part("b", [2])
    out = ttq.merge_runs([a, b], tmp_path / "m")
    s = json.loads((out / "summary.json").read_text())
    assert [r["capture"] for r in s["rows"]] == [0, 1, 2] and len(s["parts"]) == 2
    assert s["ratios"]["breaching_30"]["median"] == pytest.approx(41.0 / 3.0)  # 40/2, 41/3, 42/4
    assert s["ratios"]["breaching_30"]["min"] == pytest.approx(42.0 / 4.0)
    with pytest.raises(ConfigError, match="same capture"):
        ttq.merge_runs([a, part("c", [1])], tmp_path / "m2")
    with pytest.raises(ConfigError, match="different configs"):
        ttq.merge_runs([a, part("d", [5], every=7)], tmp_path / "m3")


def test_breaching_setup_runs_on_grey_images():
    """breaching's TV filters are built for 3 channels; the adapter's shim makes them fit a 1-channel model."""
    pytest.importorskip("breaching")
    model = build("lenet", 10, in_shape=(1, 28, 28), seed=0).eval()
    capture, truth = gi.capture_gradients(model, torch.rand(2, 1, 28, 28), torch.tensor([1, 2]),
                                          gi.Protocol(batch_size=2))
    attacker, payload, shared, mean, std = ttq.breaching_setup(capture, truth.labels, 5e-4, 3)
    assert [r.groups for r in attacker.regularizers] == [1] and len(mean) == len(std) == 1
    out, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    assert out["data"].shape == (2, 1, 28, 28)


def _curve(who, k, points, variant="", **info):
    c = ttq_curves.Curve(who, k, variant=variant)
    for it, (t, p) in enumerate(points, 1):
        c.add(10 * it, {"wall": t, "cpu": t}, p)
    c.info = dict(info)
    return c


def test_best_of_takes_the_earliest_variant_and_censors_honestly():
    fast = _curve("breaching", 0, [(30.0, 26.0), (40.0, 31.0)], "6000 it", stopped_by_budget=False)
    slow = _curve("breaching", 0, [(50.0, 29.0), (60.0, 33.0)], "24000 it", stopped_by_budget=False)
    row = ttq_curves.best_of([slow, fast], "cpu", [25.0, 30.0, 40.0], when=55.0)
    assert row["time_to_25"] == 30.0 and row["time_to_30"] == 40.0 and row["best_variant_30"] == "6000 it"
    assert row["time_to_40"] is None and row["best_variant_40"] is None
    assert row["final_psnr"] == 33.0 and row["psnr_at_equal_time"] == 31.0  # 24000 it: 29 dB at 50 s
    assert set(row["variants"]) == {"6000 it", "24000 it"} and row["variants"]["24000 it"]["time_to_30"] == 60.0
    # a level no variant reached: censored at the shortest run the budget cut, else at the longest run
    done = _curve("breaching", 0, [(80.0, 12.0)], "6000 it", stopped_by_budget=False)
    cut = _curve("breaching", 0, [(150.0, 14.0)], "24000 it", stopped_by_budget=True)
    assert ttq_curves.best_of([done, cut], "cpu", [30.0], 10.0)["seconds"] == 150.0
    cut_early = _curve("breaching", 0, [(100.0, 14.0)], "24000 it", stopped_by_budget=True)
    long_done = _curve("breaching", 0, [(300.0, 14.0)], "48000 it", stopped_by_budget=False)
    assert ttq_curves.best_of([cut_early, long_done], "cpu", [30.0], 10.0)["seconds"] == 100.0
    assert ttq_curves.best_of([done, long_done], "cpu", [30.0], 10.0)["seconds"] == 300.0
    one = ttq_curves.best_of([fast], "cpu", [30.0], 55.0)
    assert "variants" not in one and "best_variant_30" not in one and one["seconds"] == 40.0


def test_stopped_by_budget_reads_old_curves_by_their_iterations():
    assert ttq_curves.stopped_by_budget(_curve("breaching", 0, [(1.0, 5.0)], max_iterations=10)) is False  # 10 of 10
    assert ttq_curves.stopped_by_budget(_curve("breaching", 0, [(1.0, 5.0)], max_iterations=24000)) is True
    assert ttq_curves.stopped_by_budget(_curve("gi", 0, [(1.0, 5.0)])) is True  # unknown: the conservative reading
    assert ttq_curves.stopped_by_budget(_curve("gi", 0, [(1.0, 5.0)], stopped_by_budget=False)) is False


def test_breaching_schedules_are_variants_and_bad_schedules_are_errors():
    cfg = load(TTQConfig, LENET, ["breaching.schedules=[6000, 24000]"])
    variants = ttq.CONTENDERS["breaching"].variants(cfg)
    assert [name for name, _ in variants] == ["6000 it", "24000 it"]
    assert [v.breaching.max_iterations for _, v in variants] == [6000, 24000]
    assert all(v.breaching.schedules is None and v.breaching.tv == cfg.breaching.tv for _, v in variants)
    plain = load(TTQConfig, LENET, ["breaching.schedules=null", "breaching.max_iterations=123"])
    assert [name for name, _ in ttq.CONTENDERS["breaching"].variants(plain)] == ["123 it"]
    assert ttq.CONTENDERS["gi"].variants is None
    for bad in ("breaching.schedules=[]", "breaching.schedules=[6000, 6000]", "breaching.schedules=[0]"):
        with pytest.raises(ConfigError, match="breaching.schedules"):
            load(TTQConfig, LENET, [bad])


def test_merge_runs_joins_contenders_and_schedules_from_separate_runs(tmp_path):
    """ours in one run, breaching's two schedules in others (one written before variants existed): each capture's
    ratio is against breaching's best schedule; a contender missing on a capture is an error."""
    from gi.analysis.report import write_json, write_yaml
    from gi.core.config import to_dict

    def part(name, contenders, curves, **breaching):
        d = tmp_path / name
        d.mkdir()
        cfg = TTQConfig(contenders=contenders, budget=150.0 if breaching else 2000.0, select=[0, 1],
                        breaching=BreachingOptions(**breaching))
        write_yaml(d / "config.yaml", to_dict(cfg))
        rows = [dict(c.__dict__) for c in curves]
        for r in rows:
            if r["info"].pop("legacy", False):
                r.pop("variant")  # curves.json of the code before variants
        write_json(d / "curves.json", rows)
        write_json(d / "summary.json", {"git": "x", "load_average_end": [1.0, 1.0, 1.0]})
        return d

    ours = part("gi", ["gi"], [_curve("gi", 0, [(5.0, 31.0)], stopped_by_budget=False),
                               _curve("gi", 1, [(10.0, 32.0)], stopped_by_budget=False)])
    short = part("b6", ["breaching"], [_curve("breaching", 0, [(60.0, 30.5)], max_iterations=6000, legacy=True),
                                       _curve("breaching", 1, [(70.0, 20.0)], max_iterations=6000, legacy=True)],
                 max_iterations=6000)
    long = part("b24", ["breaching"], [_curve("breaching", 0, [(150.0, 29.0)], "24000 it", stopped_by_budget=True),
                                       _curve("breaching", 1, [(120.0, 30.2)], "24000 it", stopped_by_budget=False)],
                schedules=[24000])
    out = ttq.merge_runs([short, ours, long], tmp_path / "m")
    s = json.loads((out / "summary.json").read_text())
    cfg = load(TTQConfig, out / "config.yaml")
    assert cfg.contenders == ["gi", "breaching"] and cfg.breaching.schedules == [6000, 24000] and cfg.budget == 2000
    r0, r1 = s["rows"]
    assert r0["ratio_breaching_30"] == {"value": 12.0, "kind": "exact"}  # 60 s (6000 it) / 5 s
    assert r1["ratio_breaching_30"] == {"value": 12.0, "kind": "exact"}  # 120 s (24000 it) / 10 s
    assert [r["breaching"]["best_variant_30"] for r in (r0, r1)] == ["6000 it", "24000 it"]
    assert s["ratios"]["breaching_30"]["median"] == 12.0 and s["ratios"]["breaching_30"]["min"] == 12.0
    with pytest.raises(ConfigError, match="every contender"):
        ttq.merge_runs([ours, part("b1", ["breaching"], [_curve("breaching", 0, [(1.0, 1.0)], "9 it")],
                                   schedules=[9])], tmp_path / "m2")


def test_merge_runs_longest_keeps_the_same_attack_run_further_and_refuses_a_different_one(tmp_path):
    """A breaching schedule cut at its budget in one part and run to its end in another: ``longest=True`` keeps
    the longer curve (its checkpoints extend the shorter one's); a curve that differs before the cut is refused."""
    from gi.analysis.report import write_json, write_yaml
    from gi.core.config import to_dict

    def part(name, contenders, curves):
        d = tmp_path / name
        d.mkdir()
        write_yaml(d / "config.yaml", to_dict(TTQConfig(contenders=contenders, select=[0])))
        write_json(d / "curves.json", [dict(c.__dict__) for c in curves])
        write_json(d / "summary.json", {"git": "x", "load_average_end": [1.0, 1.0, 1.0]})
        return d

    def breaching(points, stopped):  # checkpoints every 10 iterations, the answer at the end
        c = ttq_curves.Curve("breaching", 0, variant="24000 it", info={"stopped_by_budget": stopped})
        for i, (t, p) in enumerate(points):
            c.add(10 * (i + 1), {"wall": t, "cpu": t}, p)
        return c

    ours = part("gi", ["gi"], [_curve("gi", 0, [(5.0, 31.0)], stopped_by_budget=False)])
    cut = part("cut", ["breaching"], [breaching([(50.0, 20.0), (100.0, 25.0), (150.0, 25.5)], True)])
    full = part("full", ["breaching"], [breaching([(50.0, 20.0), (100.0, 25.0), (150.0, 29.0), (200.0, 31.0)],
                                                  False)])
    with pytest.raises(ConfigError, match="longest=True"):
        ttq.merge_runs([ours, cut, full], tmp_path / "m0")
    out = ttq.merge_runs([ours, cut, full], tmp_path / "m", longest=True)
    s = json.loads((out / "summary.json").read_text())
    assert len(json.loads((out / "curves.json").read_text())) == 2
    assert s["rows"][0]["ratio_breaching_30"] == {"value": 40.0, "kind": "exact"}  # 200 s / 5 s
    other = part("other", ["breaching"], [breaching([(50.0, 20.0), (100.0, 24.0), (150.0, 29.0), (200.0, 31.0)],
                                                    False)])
    with pytest.raises(ConfigError, match="not the same attack"):
        ttq.merge_runs([ours, cut, other], tmp_path / "m2", longest=True)


def _update(batch: int, samples: int, epochs: int, **protocol):
    from gi.world.fl.victim import simulate_client

    model = build("lenet", 10, in_shape=(1, 28, 28), seed=0, activation="relu")
    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand(samples, 1, 28, 28, generator=g), torch.tensor([3, 1, 4, 1, 5, 9, 2, 6][:samples])
    proto = Protocol(scheme="fedavg", batch_size=batch, num_samples=samples, local_epochs=epochs, lr=0.05,
                     **protocol)
    return simulate_client(model, (images, labels), proto, rng=g)


def test_breaching_takes_a_fedavg_update_as_its_multi_step_user():
    """breaching's UserMultiStep walks consecutive slices of data_per_step samples, wrapping: the slot schedule."""
    capture, truth = _update(batch=2, samples=4, epochs=2)
    steps = ttq.breaching_local_steps(capture, truth.labels)
    assert (steps["lr"], steps["steps"], steps["data_per_step"]) == (0.05, 4, 2)
    assert [s.tolist() for s in steps["labels"]] == [truth.labels[i:i + 2].tolist() for i in (0, 2, 0, 2)]
    fedsgd, t1 = gi.capture_gradients(build("lenet", 10, in_shape=(1, 28, 28), seed=0), torch.rand(2, 1, 28, 28),
                                      torch.tensor([1, 2]), gi.Protocol(batch_size=2))
    assert ttq.breaching_local_steps(fedsgd, t1.labels) is None
    for bad in (_update(batch=2, samples=4, epochs=1, momentum=0.9), _update(batch=2, samples=5, epochs=1,
                                                                            drop_last=False)):
        with pytest.raises(ConfigError, match="plain SGD steps of one size"):
            ttq.breaching_local_steps(bad[0], bad[1].labels)


def test_breaching_simulates_our_fedavg_update_at_the_truth():
    """Wired as above, breaching's own multi-step objective reproduces the captured update from the true images
    (normalised) and labels."""
    pytest.importorskip("breaching")
    capture, truth = _update(batch=4, samples=4, epochs=3)
    attacker, payload, shared, mean, std = ttq.breaching_setup(capture, truth.labels, 5e-4, 3)
    objective = attacker.objective
    objective.initialize(attacker.loss_fn, attacker.cfg.impl, shared[0]["metadata"]["local_hyperparams"])
    x = (truth.images - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    model = ttq.without_normalize(capture.model())[0]
    simulated, _ = objective._grad_fn(model, x, truth.labels)
    for got, want in zip(simulated, shared[0]["gradients"]):
        assert torch.allclose(got, want, atol=1e-6)
