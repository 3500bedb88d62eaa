"""Outputs never clobber each other: one writer per output directory, no-clobber publish, atomic overwrite,
bad `out=` / `name=` rejected before any work, stale staging of dead processes removed."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import gi.experiments.outdir as report
from gi.core.errors import ConfigError, OutputError
from gi.core.owners import HOST
from gi.experiments.outdir import staged_output

REPO = Path(__file__).resolve().parents[2]


def _write(out: Path, text: str, overwrite: bool = False) -> None:
    with staged_output(out, overwrite=overwrite) as tmp:
        (tmp / "result.txt").write_text(text)


def test_a_second_writer_of_the_same_out_fails_and_the_first_keeps_its_files(tmp_path):
    out = tmp_path / "run"
    inside, release, errors = threading.Event(), threading.Event(), []

    def first() -> None:
        with staged_output(out) as tmp:
            (tmp / "result.txt").write_text("first")
            inside.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    try:
        for overwrite in (False, True):  # even overwrite=true does not take a directory another writer holds
            with pytest.raises(ConfigError, match=r"being written.*another out=") as exc:
                _write(out, "second", overwrite=overwrite)
            errors.append(str(exc.value))
    finally:
        release.set()
        t.join()
    assert (out / "result.txt").read_text() == "first"
    with pytest.raises(ConfigError, match=r"exists; pass overwrite=true or another out="):
        _write(out, "third")
    assert (out / "result.txt").read_text() == "first"
    assert all("\n" not in e and str(out) in e for e in errors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no lock, no staging left behind


def test_a_directory_that_appears_during_the_run_is_not_replaced(tmp_path):
    """Someone bypassing the lock (a plain mkdir) creates `out` while the run writes: the publish is no-clobber."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"appeared while.*kept this run's results in .*unsaved") as exc:
        with staged_output(out) as tmp:
            (tmp / "result.txt").write_text("late")
            out.mkdir()  # empty: os.rename would silently replace it
    assert out.is_dir() and list(out.iterdir()) == []
    kept = Path(str(exc.value).split("kept this run's results in ")[1].split(";")[0])
    assert kept.parent == tmp_path and (kept / "result.txt").read_text() == "late"


def test_overwrite_replaces_the_old_result(tmp_path):
    out = tmp_path / "run"
    _write(out, "old")
    _write(out, "new", overwrite=True)
    assert (out / "result.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_overwrite_killed_between_the_two_renames_loses_nothing(tmp_path):
    """SIGKILL-like exit after the old result was moved aside and before the new one moved in: the next command
    puts the old result back."""
    out = tmp_path / "run"
    _write(out, "old")
    script = textwrap.dedent(f"""
        import os, gi.experiments.outdir as r
        real = r._rename_noreplace
        def dying(src, dst):
            if os.path.basename(str(src)).startswith(".run.partial-"):
                os._exit(9)
            real(src, dst)
        r._rename_noreplace = dying
        with r.staged_output({str(out)!r}, overwrite=True) as tmp:
            (tmp / "result.txt").write_text("new")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert not out.exists()  # killed in the window; the old result lies aside, not deleted
    report.remove_stale_staging(tmp_path)
    assert (out / "result.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the dead writer's staging is gone too


def test_stale_staging_of_dead_processes_is_removed_and_live_ones_are_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = HOST
    stale = tmp_path / f".other.partial-{dead.pid}@{host}-abc123"
    live = tmp_path / f".other.partial-{os.getpid()}@{host}-def456"
    foreign = tmp_path / f".other.partial-{dead.pid}@another-host.example-ghi789"
    for p in (stale, live, foreign):
        p.mkdir()
    _write(tmp_path / "mine", "x")  # any command cleans its output parent
    assert not stale.exists() and live.exists() and foreign.exists()


def test_staging_folder_names_its_owner(tmp_path):
    with staged_output(tmp_path / "run") as tmp:
        assert tmp.name.startswith(f".run.partial-{os.getpid()}@{HOST}-")


def test_out_naming_a_file_or_an_unwritable_place_fails_before_any_work(tmp_path):
    (tmp_path / "file").write_text("precious")
    started = []
    for out, match in [(tmp_path / "file", "is a file"), (tmp_path / "file" / "sub", "is a file"),
                       (Path("/proc/gi-cannot-write/out"), "cannot create|not writable")]:
        for overwrite in (False, True):
            with pytest.raises(ConfigError, match=match):
                with staged_output(out, overwrite=overwrite):
                    started.append(out)
    assert started == [] and (tmp_path / "file").read_text() == "precious"


def _refuse_under(monkeypatch, folder: Path, code: int, calls=("open", "mkdir")) -> None:
    """``os.open`` / ``os.mkdir`` of a path under ``folder`` raise ``OSError(code)``: what a read-only mount (EROFS)
    answers, also to root, whom a chmod does not stop."""
    def refusing(real):
        def refuse(path, *args, **kwargs):
            if Path(os.fsdecode(path)).is_relative_to(folder):
                raise OSError(code, os.strerror(code), os.fsdecode(path))
            return real(path, *args, **kwargs)
        return refuse

    for name in calls:
        monkeypatch.setattr(os, name, refusing(getattr(os, name)))


def test_a_read_only_parent_is_one_line_naming_it_before_any_work(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    if os.geteuid() == 0:  # root writes through a chmod: make the place read-only the way a read-only mount does
        _refuse_under(monkeypatch, parent, errno.EROFS)
    else:
        parent.chmod(0o555)
    started = []
    try:
        for overwrite in (False, True):
            with pytest.raises(ConfigError, match=r"out=.*(not writable|lock file .*Read-only file system).*"
                                                  "pass another out=") as exc:
                with staged_output(parent / "run", overwrite=overwrite):
                    started.append(overwrite)
            assert "\n" not in str(exc.value) and str(parent) in str(exc.value)
    finally:
        parent.chmod(0o755)
    assert started == [] and list(parent.iterdir()) == []


def test_a_place_that_refuses_the_staging_folder_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The lock file can be written (it may be left from before) but the staging folder cannot: an OutputError
    naming the path, before any work."""
    _refuse_under(monkeypatch, tmp_path, errno.EROFS, calls=("mkdir",))
    started = []
    with pytest.raises(OutputError, match=rf"out={tmp_path / 'run'}: cannot write {tmp_path}/\.run\.partial-.* "
                                          r"\(Read-only file system\); nothing was published.*another out=") as exc:
        with staged_output(tmp_path / "run"):
            started.append(1)
    assert "\n" not in str(exc.value) and started == [] and list(tmp_path.iterdir()) == []


def _disk_full_at(monkeypatch, name: str) -> None:
    """Writing a file called ``name`` writes half of it, then the disk is full (ENOSPC, as ``write`` reports it:
    no file name)."""
    real = Path.write_text

    def write_text(self, text, *args, **kwargs):
        if self.name == name:
            real(self, text[: len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_full_disk_mid_write_is_one_line_and_publishes_nothing(tmp_path, monkeypatch, overwrite):
    out = tmp_path / "run"
    if overwrite:
        _write(out, "old")
    _disk_full_at(monkeypatch, "metrics.json")
    with pytest.raises(OutputError, match=rf"out={out}: cannot write .*\.run\.partial-.* \(No space left on device\); "
                                          "nothing was published and the partial output was removed; free some "
                                          "space or pass another out=") as exc:
        with staged_output(out, overwrite=overwrite) as tmp:
            (tmp / "grid.txt").write_text("written before the disk filled")
            (tmp / "metrics.json").write_text('{"psnr": 1.0, "ssim": 0.5}')
    assert "\n" not in str(exc.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["run"] if overwrite else [])  # no staging, no lock
    if overwrite:
        assert sorted(p.name for p in out.iterdir()) == ["log.txt", "result.txt"]
        assert (out / "result.txt").read_text() == "old"


def test_a_refused_read_elsewhere_is_not_called_an_output_problem(tmp_path):
    """A permission error on a file outside the output (a dataset the user cannot read) passes through as it is;
    the staging folder still goes."""
    with pytest.raises(PermissionError, match="data.bin"):
        with staged_output(tmp_path / "out" / "run"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "data.bin"))
    assert list((tmp_path / "out").iterdir()) == []


def test_a_full_disk_while_writing_a_report_file_leaves_no_file(tmp_path):
    path = tmp_path / "bench.json"

    def write(tmp: Path) -> None:
        tmp.write_text("{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    with pytest.raises(OutputError, match=rf"out={path}: cannot write {tmp_path}/\.bench\.json\.partial-.*No space "
                                          "left on device") as exc:
        report.publish_file(path, write)
    assert "\n" not in str(exc.value) and list(tmp_path.iterdir()) == []


def test_gi_run_on_a_full_disk_exits_2_with_one_line_and_publishes_nothing(tmp_path, monkeypatch, capsys):
    from gi.cli import main

    _disk_full_at(monkeypatch, "metrics.json")
    out = tmp_path / "run"
    assert main(["run", "configs/demo.yaml", *TINY, f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gi run: error: out={out}: cannot write ") and "No space left on device" in err, err
    assert "\n" not in err and list(tmp_path.iterdir()) == []


FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors' own words


def test_a_library_storage_error_is_the_os_error_it_names():
    from safetensors import SafetensorError

    from gi.core.errors import as_os_error

    err = as_os_error(SafetensorError(FULL), "/x/capture.safetensors")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == "/x/capture.safetensors"
    other = SafetensorError("Error while deserializing header: HeaderTooLarge")
    assert as_os_error(other, "/x") is other


def test_gi_run_on_a_disk_that_fills_inside_safetensors_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """The disk fills while safetensors writes the capture (its own error type, not an OSError)."""
    from safetensors import SafetensorError

    import gi.capture
    from gi.cli import main

    def full(*args, **kwargs):
        raise SafetensorError(FULL)

    monkeypatch.setattr(gi.capture, "save_file", full)
    out = tmp_path / "run"
    assert main(["run", "configs/demo.yaml", *TINY, f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gi run: error: out={out}: cannot write ") and "No space left on device" in err, err
    assert "\n" not in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "a\\b", ""])
def test_run_names_stay_inside_the_runs_folder(name):
    from gi.core.config import load
    from gi.experiments.config.ablate import AblateConfig
    from gi.experiments.config.bench import BenchConfig
    from gi.experiments.config.labels import LabelBenchConfig
    from gi.experiments.config.run import RunConfig
    from gi.experiments.config.sweep import SweepConfig

    with pytest.raises(ConfigError, match="name"):
        load(RunConfig, "configs/demo.yaml", [f"name={name!r}"])
    with pytest.raises(ConfigError, match="name"):
        load(AblateConfig, "configs/ablate/table3.yaml", [f"name={name!r}"])
    with pytest.raises(ConfigError, match="name"):
        load(SweepConfig, "configs/sweep/demo-cpu.yaml", [f"name={name!r}"])
    with pytest.raises(ConfigError, match="name"):
        load(LabelBenchConfig, "configs/labels/ramakrishna-table1.yaml", [f"name={name!r}"])
    with pytest.raises(ConfigError, match="name"):
        load(BenchConfig, None, [f"name={name!r}"])


def test_bench_report_is_not_clobbered(tmp_path):
    from gi.experiments.bench import check_report_path
    from gi.experiments.config.bench import BenchConfig

    path = tmp_path / "b.json"
    path.write_text("{}")
    with pytest.raises(ConfigError, match="exists; pass overwrite=true or another out="):
        check_report_path(BenchConfig(models=["lenet"], out=str(path)))
    check_report_path(BenchConfig(models=["lenet"], out=str(path), overwrite=True))
    with pytest.raises(ConfigError, match="is a directory"):
        check_report_path(BenchConfig(models=["lenet"], out=str(tmp_path)))


TINY = ["attack.iterations=2", "attack.progress=false", "metrics.lpips_vgg=false", "attack.log_every=1"]


@pytest.mark.slow
def test_two_concurrent_gi_runs_with_the_same_out(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gi.cli", "--threads", "1", "run", "configs/demo.yaml", *TINY, f"out={out}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(300), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    err = next(r[2] for r in results if r[0] == 2).strip()
    assert err.count("\n") == 0 and str(out) in err and "another out=" in err
    assert {"metrics.json", "grid.png", "capture.safetensors", "log.txt"} <= {p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
