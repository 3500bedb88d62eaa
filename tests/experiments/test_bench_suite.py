"""gi bench kind suite: every member checked at load (files, overrides, nesting, labels, only), members run in
order into <out>/<label>/, a failing member recorded while the others run, suite.json / summary.md, a resumed
suite keeping its finished members, and configs/bench/realistic.yaml loading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import gi.experiments.bench  # noqa: F401  (the command: every kind registered)
import gi.experiments.suite as suite
from gi.cli import main
from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.bench_kinds import BENCH_KINDS, BenchKind, bench_kind
from gi.experiments.config.bench import BENCH_CONFIGS, BenchConfig, SuiteConfig
from gi.experiments.config.ttq import TTQConfig
from gi.experiments.outdir import cells_dir, staged_output
from gi.experiments.suite_output import format_suite
from gi.experiments.ttq_curves import Curve, summarize_curves

REPO = Path(__file__).resolve().parents[2]
LENET = str(REPO / "configs/bench/ttq-lenet.yaml")
# the smallest time-to-quality run (tests/experiments/test_ttq.py): ours alone, one capture, 20 iterations
FAST = ["contenders=[gi]", "every=5", "budget=1000", "fill_budget=false",
        "job_overrides=[attack.iterations=20,attack.retries=0,attack.analytic=false]"]


def _suite(tmp_path: Path, members: dict, **top) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"kind": "suite", "name": "t", "members": members, **top}))
    return path


def _load(path: Path, overrides: list[str] | None = None) -> SuiteConfig:
    cfg = load(BenchConfig, str(path), overrides or [])
    assert isinstance(cfg, SuiteConfig)
    return cfg


# ----------------------------------------------------------------------------- refused at load
@pytest.mark.parametrize("members, top, match", [
    ({"s1": {"config": "nowhere/missing.yaml"}}, {}, r"members\.s1 .*config file nowhere/missing\.yaml not found"),
    ({}, {}, r"members=\{\}: expected at least one member"),
    ({"s1": {"config": LENET, "overrides": ["budgett=3"]}}, {}, r"members\.s1 .*unknown config key.*budgett"),
    ({"s1": {"config": LENET, "overrides": ["budget=0"]}}, {}, r"members\.s1 .*budget=0: expected > 0"),
    ({"s1": {"config": LENET, "overrides": ['job_overrides=["attack.iterationz=3"]']}}, {},
     r"members\.s1 .*job=.*attack\.iterationz"),
    ({"s1": {"config": LENET}}, {"only": ["s9"]}, r"only names unknown member\(s\) \['s9'\]; valid: \['s1'\]"),
    ({"s1": {"config": LENET}}, {"only": []}, r"only=\[\]: expected a non-empty list"),
    ({"../up": {"config": LENET}}, {}, r"members has label\(s\) \['\.\./up'\]"),
    ({"s 1": {"config": LENET}}, {}, r"members has label\(s\) \['s 1'\]"),
    ({"s1": {"config": LENET, "overrides": ["out=elsewhere"]}}, {}, r"members\.s1\.overrides has 'out=elsewhere'"),
    ({"s1": {"overrides": ["budget=3"]}}, {}, r"members\.s1\.config='': expected the path of a gi bench config"),
    ({"s1": {"config": LENET, "overrides": ["kind=nope"]}}, {}, r"members\.s1 .*'nope' is not a bench kind"),
    ({"s1": {"config": LENET, "budget": 3}}, {}, r"unknown config key\(s\) \['members\.s1\.budget'\]"),
])
def test_bad_suites_are_one_line_config_errors_at_load(tmp_path, members, top, match):
    with pytest.raises(ConfigError, match=match) as err:
        _load(_suite(tmp_path, members, **top))
    assert "\n" not in str(err.value)


def test_a_suite_cannot_be_a_member(tmp_path):
    inner = _suite(tmp_path, {"a": {"config": LENET}})
    outer = tmp_path / "outer.yaml"
    outer.write_text(yaml.safe_dump({"kind": "suite", "members": {"x": {"config": str(inner)}}}))
    with pytest.raises(ConfigError, match=r"members\.x .*a suite cannot be a member of a suite"):
        _load(outer)
    outer.write_text(yaml.safe_dump({"kind": "suite", "members": {"x": {"config": str(outer)}}}))  # itself
    with pytest.raises(ConfigError, match="a suite cannot be a member of a suite"):
        _load(outer)
    with pytest.raises(ConfigError, match="a suite cannot be a member of a suite"):  # made one by an override
        _load(_suite(tmp_path, {"x": {"config": LENET, "overrides": ["kind=suite"]}}))


def test_the_realistic_suite_loads_every_member_without_running(tmp_path):
    cfg = _load(REPO / "configs/bench/realistic.yaml")
    assert cfg.name == "realistic" and cfg.selected() == ["s1", "s2", "s3", "s4", "s5"]
    members = cfg.member_configs()
    assert all(isinstance(m, TTQConfig) and m.contenders == ["gi", "breaching"] for m in members.values())
    assert [members[s].name for s in ("s1", "s2", "s3", "s4")] == [f"realistic-s{i}" for i in range(1, 5)]
    s5 = members["s5"]  # the results page's S5 run: ResNet-18 at seed 2, breaching's start seed 2
    assert "seed=2" in s5.job_overrides and "model.name=resnet18" in s5.job_overrides and s5.breaching.seed == 2
    assert s5.budget == 300
    assert _load(REPO / "configs/bench/realistic.yaml", ["only=[s3]"]).selected() == ["s3"]
    assert bench_kind(cfg) is BENCH_KINDS["suite"]


# ----------------------------------------------------------------------------- running
def _member_file(tmp_path: Path, name: str, select: int, extra: list[str] | None = None) -> str:
    """A tiny time-to-quality config in tmp_path: ttq-lenet's job, ours alone on one capture."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"kind": "time-to-quality", "name": name, "job": str(REPO / "configs/default.yaml"),
                                    "job_overrides": ["data.images=[0,1,2,3,4]"], "select": [select]}))
    return str(path)


def test_a_suite_runs_its_members_into_their_folders_and_writes_one_table(tmp_path, capsys):
    members = {"a": {"config": _member_file(tmp_path, "one", 3), "overrides": FAST},
               "b": {"config": _member_file(tmp_path, "two", 4), "overrides": FAST + ["every=10"]}}
    out = tmp_path / "out"
    cfg = _load(_suite(tmp_path, members), [f"out={out}"])
    assert bench_kind(cfg).run(cfg) == out
    printed = capsys.readouterr().out
    assert "[1/2] a: started (time-to-quality, one)" in printed and "[2/2] b: done in" in printed
    data = json.loads((out / "suite.json").read_text())
    assert data["failed"] == [] and [m["label"] for m in data["members"]] == ["a", "b"]
    for m, capture in zip(data["members"], (3, 4)):
        assert m["status"] == "done" and m["kind"] == "time-to-quality" and m["overrides"][0] == "contenders=[gi]"
        assert m["output"] == str(out / m["label"]) and m["seconds"] > 0 and m["error"] is None
        assert (out / m["label"] / "summary.json").exists() and (out / m["label"] / "ttq.png").exists()
        rows = json.loads((out / m["label"] / "summary.json").read_text())["rows"]
        assert rows[0]["capture"] == capture
        ours = m["summary"]["contenders"]["gi"]["final_psnr"]
        assert ours["mean"] == ours["median"] == ours["min"] == pytest.approx(rows[0]["gi"]["final_psnr"])
        assert "breaching" not in m["summary"]["contenders"] and m["summary"]["captures"] == 1
    curves = json.loads((out / "b" / "curves.json").read_text())
    assert curves[0]["iterations"] == [10, 20, 20]  # the member's own override (every=10) applied
    table = (out / "summary.md").read_text()
    assert table.startswith("# t\n") and table.count("| time-to-quality | 1 |") == 2
    row_a = next(line for line in table.splitlines() if line.startswith("| a |"))
    assert f"{data['members'][0]['summary']['contenders']['gi']['final_psnr']['mean']:.2f}" in row_a
    assert "| — | — |" in row_a  # no breaching
    page = (out / "report.html").read_text()  # the same table on a page
    assert page.count("<tr><td>a</td><td>time-to-quality</td>") == 1 and "<tr><td>b</td>" in page
    assert "data:image/png;base64," in (out / "a" / "report.html").read_text()  # each member's own page and plot
    # the trivial guesses of each capture's images, carried from the ttq rows into the suite's table; the
    # per-channel mean is the constant closest to an image in MSE, so it never scores below grey
    trivial = rows[0]["trivial"]
    assert trivial["mean_colour_psnr"] >= trivial["grey_psnr"] > 0
    assert data["members"][1]["summary"]["trivial"] == pytest.approx(trivial)
    first = json.loads((out / "a" / "summary.json").read_text())["rows"][0]["trivial"]
    assert f"| {first['grey_psnr']:.2f} / {first['mean_colour_psnr']:.2f} | done |" in row_a
    assert format_suite(out) in table and (out / "config.yaml").exists() and (out / "log.txt").exists()
    assert not cells_dir(out).exists()
    with pytest.raises(ConfigError, match="exists; pass overwrite=true"):  # nothing overwrites a result
        bench_kind(cfg).run(_load(_suite(tmp_path, members), [f"out={out}"]))


def test_a_failing_member_is_recorded_the_others_run_and_gi_exits_non_zero(tmp_path, capsys):
    members = {"bad": {"config": _member_file(tmp_path, "bad", 99), "overrides": FAST},
               "good": {"config": _member_file(tmp_path, "good", 3), "overrides": FAST}}
    out = tmp_path / "out"
    assert main(["bench", str(_suite(tmp_path, members)), f"out={out}"]) == 2
    captured = capsys.readouterr()
    assert "[1/2] bad: FAILED after" in captured.out and "[2/2] good: done in" in captured.out
    assert "| bad | time-to-quality | — | — |" in captured.out  # the table is printed all the same
    assert "1 of 2 member(s) failed (bad;" in captured.err and str(out) in captured.err
    data = json.loads((out / "suite.json").read_text())
    bad, good = data["members"]
    assert data["failed"] == ["bad"] and bad["status"] == "failed" and bad["output"] is None
    assert bad["error"].startswith("ConfigError: select=[99] but the job")
    assert not (out / "bad").exists() and good["status"] == "done" and (out / "good" / "summary.json").exists()
    assert "bad failed: ConfigError: select=[99]" in (out / "summary.md").read_text()


def test_only_runs_the_named_members(tmp_path):
    members = {"a": {"config": _member_file(tmp_path, "one", 3), "overrides": FAST},
               "b": {"config": str(tmp_path / "missing.yaml")}}
    with pytest.raises(ConfigError, match="missing.yaml not found"):  # every member is checked, only= or not
        _load(_suite(tmp_path, members, only=["a"]))
    members["b"] = {"config": _member_file(tmp_path, "two", 99), "overrides": FAST}  # would fail if it ran
    out = tmp_path / "out"
    cfg = _load(_suite(tmp_path, members), [f"out={out}", "only=[a]"])
    suite.run_suite(cfg)
    data = json.loads((out / "suite.json").read_text())
    assert [m["label"] for m in data["members"]] == ["a"] and data["only"] == ["a"] and not (out / "b").exists()


# ----------------------------------------------------------------------------- a member kind of the test's own
@dataclass
class EchoConfig:
    kind: str = "echo"
    name: str = "echo"
    value: float = 1.0
    out: str | None = None
    overwrite: bool = False


RUNS: list[float] = []


def _echo_run(cfg: EchoConfig) -> Path:
    """Writes a time-to-quality-like summary.json whose PSNRs are ``value``; 13 stops the process (not a GIError)."""
    RUNS.append(cfg.value)
    if cfg.value == 13:
        raise RuntimeError("the machine went away")
    with staged_output(cfg.out) as tmp:
        rows = [{"capture": k, "gi": {"final_psnr": cfg.value + k, "psnr_at_equal_time": cfg.value + k},
                 "breaching": {"final_psnr": 10.0, "psnr_at_equal_time": None},
                 "trivial": {"grey_psnr": 12.0, "mean_colour_psnr": 13.0 + k}} for k in range(3)]
        (tmp / "summary.json").write_text(json.dumps({"clock": "cpu", "equal_time": 5.0, "rows": rows}))
    return Path(cfg.out)


@pytest.fixture
def echo_kind(monkeypatch):
    monkeypatch.setitem(BENCH_CONFIGS, "echo", EchoConfig)
    monkeypatch.setitem(BENCH_KINDS, "echo", BenchKind(_echo_run, lambda p: "echo"))
    RUNS.clear()
    return RUNS


def _echo_file(tmp_path: Path) -> str:
    path = tmp_path / "echo.yaml"
    path.write_text("kind: echo\n")
    return str(path)


def test_summary_numbers_and_table_with_both_contenders_and_trivial_guesses(tmp_path, echo_kind):
    out = tmp_path / "out"
    suite.run_suite(_load(_suite(tmp_path, {"e": {"config": _echo_file(tmp_path), "overrides": ["value=30.0"]}}),
                          [f"out={out}"]))
    (m,) = json.loads((out / "suite.json").read_text())["members"]
    s = m["summary"]
    assert s["contenders"]["gi"]["final_psnr"] == {"mean": 31.0, "median": 31.0, "min": 30.0}
    assert s["contenders"]["breaching"]["psnr_at_equal_time"] is None
    assert s["gain_over_breaching_db"] == {"mean": 21.0, "median": 21.0, "min": 20.0}
    assert s["trivial"] == {"grey_psnr": 12.0, "mean_colour_psnr": 14.0}
    row = format_suite(out).splitlines()[2]
    assert row.startswith("| e | echo | 3 | 31.00 / 31.00 / 30.00 | 10.00 / 10.00 / 10.00 | +21.00 / +21.00 / +20.00 "
                          "| 12.00 / 14.00 | done |")


def test_real_time_to_quality_summary_is_read(tmp_path):
    """member_numbers on a summary written by the time-to-quality summariser itself (both contenders)."""
    cfg = TTQConfig(budget=100.0, levels=[25.0], contenders=["gi", "breaching"])
    curves = []
    for k, (ours, theirs) in enumerate([(31.0, 20.0), (25.0, 27.0)]):
        for name, value in (("gi", ours), ("breaching", theirs)):
            c = Curve(name, k)
            c.add(10, {"wall": 50.0, "cpu": 50.0}, value)
            curves.append(c)
    (tmp_path / "summary.json").write_text(json.dumps(summarize_curves(cfg, curves)))
    s = suite.member_numbers(tmp_path)
    assert s["contenders"]["gi"]["final_psnr"] == {"mean": 28.0, "median": 28.0, "min": 25.0}
    assert s["gain_over_breaching_db"]["min"] == -2.0 and s["ratios"]["breaching_25"]["median"] is not None
    assert "trivial" not in s and suite.member_numbers(tmp_path / "nothing-here") is None


def test_an_interrupted_suite_keeps_its_finished_members_and_reruns_the_rest(tmp_path, echo_kind):
    echo = _echo_file(tmp_path)
    members = {"a": {"config": echo, "overrides": ["value=20.0"]}, "b": {"config": echo, "overrides": ["value=13"]}}
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="went away"):  # not a GIError: the suite stops, nothing published
        suite.run_suite(_load(_suite(tmp_path, members), [f"out={out}"]))
    assert echo_kind == [20.0, 13] and not out.exists() and (cells_dir(out) / "a" / "summary.json").exists()
    members["b"]["overrides"] = ["value=21.0"]
    suite.run_suite(_load(_suite(tmp_path, members), [f"out={out}"]))
    assert echo_kind == [20.0, 13, 21.0]  # a was kept, not run again
    a, b = json.loads((out / "suite.json").read_text())["members"]
    assert a["reused"] is True and a["status"] == "done" and "reused" not in b
    assert (out / "a" / "summary.json").exists() and not cells_dir(out).exists()
    assert "done (kept)" in format_suite(out)

    # a kept member whose config changed runs again
    members["b"]["overrides"] = ["value=13"]
    out2 = tmp_path / "out2"
    with pytest.raises(RuntimeError):
        suite.run_suite(_load(_suite(tmp_path, members), [f"out={out2}"]))
    members["a"]["overrides"], members["b"]["overrides"] = ["value=22.0"], ["value=23.0"]
    suite.run_suite(_load(_suite(tmp_path, members), [f"out={out2}"]))
    assert echo_kind[-3:] == [13, 22.0, 23.0]


def test_a_kind_that_writes_one_file_writes_it_in_its_member_folder(tmp_path, monkeypatch):
    """A kind whose ``out`` is a file (``throughput``: out_file bench.json) writes <out>/<label>/<out_file>."""
    from gi.experiments.outdir import publish_file

    def run(cfg: EchoConfig) -> Path:
        path = Path(cfg.out)
        publish_file(path, lambda tmp: tmp.write_text("{}"))
        return path

    monkeypatch.setitem(BENCH_CONFIGS, "echo", EchoConfig)
    monkeypatch.setitem(BENCH_KINDS, "echo", BenchKind(run, lambda p: "", out_file="r.json"))
    assert BENCH_KINDS["throughput"].out_file == "bench.json"
    out = tmp_path / "out"
    suite.run_suite(_load(_suite(tmp_path, {"f": {"config": _echo_file(tmp_path)}}), [f"out={out}"]))
    (m,) = json.loads((out / "suite.json").read_text())["members"]
    assert m["output"] == str(out / "f" / "r.json") and (out / "f" / "r.json").read_text() == "{}"
    assert m["summary"] is None and "| f | echo | — | — | — | — | — | done |" in format_suite(out)


def test_a_member_whose_package_is_missing_is_refused_before_any_member_runs(tmp_path, monkeypatch):
    """breaching is not a dependency: a suite with a breaching member answers at once, naming the member, and
    nothing is written (the first member, which needs only gi, does not run either)."""
    monkeypatch.setitem(__import__("sys").modules, "breaching", None)  # import breaching -> ImportError
    members = {"a": {"config": _member_file(tmp_path, "one", 3), "overrides": FAST},
               "b": {"config": _member_file(tmp_path, "two", 4),
                     "overrides": [o for o in FAST if not o.startswith("contenders=")]
                     + ["contenders=[gi, breaching]"]}}
    out = tmp_path / "out"
    cfg = _load(_suite(tmp_path, members), [f"out={out}"])
    with pytest.raises(ConfigError, match="member b: contender 'breaching' needs the breaching package"):
        bench_kind(cfg).run(cfg)
    assert not out.exists() and not cells_dir(out).exists()


def test_every_bench_kind_has_a_schema_and_a_runner():
    """The kinds a bench config may name (the schemas' table) are the kinds the command can run (the runners)."""
    assert set(BENCH_KINDS) == set(BENCH_CONFIGS) == {"throughput", "time-to-quality", "suite"}
