"""A run without out= writes a stamped folder and keeps ``runs/<name>-latest`` pointing at the newest
(gi.experiments.outdir: stamped_out, link_latest); gi attack takes the link, and a path that does not exist is an
error naming the folders that do."""

import os

import pytest

from gi.core.errors import ConfigError
from gi.core.owners import HOST
from gi.experiments.attack import capture_files
from gi.experiments.outdir import link_latest, remove_stale_staging, stamped_out


def _run(runs, name):
    (runs / name).mkdir(parents=True)
    (runs / name / "capture.safetensors").write_bytes(b"")
    return runs / name


def test_the_link_names_the_newest_stamped_run_and_is_relative(tmp_path):
    runs = tmp_path / "runs"
    old = _run(runs, "demo-20261205-021200")
    assert link_latest(old, "demo") == runs / "demo-latest"
    assert os.readlink(runs / "demo-latest") == "demo-20261205-021200"
    _run(runs, "demo-20261205-021300")
    _run(runs, "demo-20261205-021300-2")  # two runs in one second: the second is the newer
    _run(runs, "demo-x-20261205-030000")  # another name's run is not this name's
    assert link_latest(old, "demo") == runs / "demo-latest"  # whichever run made it: the newest wins
    assert os.readlink(runs / "demo-latest") == "demo-20261205-021300-2"
    assert capture_files(runs / "demo-latest") == [runs / "demo-latest" / "capture.safetensors"]
    assert sorted(p.name for p in runs.iterdir()) == ["demo-20261205-021200", "demo-20261205-021300",
                                                      "demo-20261205-021300-2", "demo-latest",
                                                      "demo-x-20261205-030000"]  # no staging link is left


def test_a_real_folder_or_file_of_the_link_s_name_is_never_replaced(tmp_path):
    runs = tmp_path / "runs"
    run = _run(runs, "demo-20261205-021200")
    (runs / "demo-latest").mkdir()
    (runs / "demo-latest" / "mine.txt").write_text("keep")
    assert link_latest(run, "demo") is None
    assert (runs / "demo-latest" / "mine.txt").read_text() == "keep"
    (runs / "attack-latest").write_text("keep")
    run = _run(runs, "attack-20261205-021200")
    assert link_latest(run, "attack") is None and (runs / "attack-latest").read_text() == "keep"


def test_without_symlinks_there_is_no_link_and_no_error(tmp_path, monkeypatch):
    run = _run(tmp_path / "runs", "demo-20261205-021200")

    def refuse(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refuse)
    assert link_latest(run, "demo") is None
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["demo-20261205-021200"]


def test_a_dead_writer_s_staging_link_is_removed(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "demo-20261205-021200")
    os.symlink("demo-20261205-021200", runs / f".demo-latest.partial-999999999@{HOST}-link")  # a dead pid
    remove_stale_staging(runs)
    assert sorted(p.name for p in runs.iterdir()) == ["demo-20261205-021200"]


def test_a_stamped_folder_that_exists_is_never_reused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = stamped_out("demo")
    assert first.parent.name == "runs" and first.name.startswith("demo-")
    first.mkdir(parents=True)
    second = stamped_out("demo")
    assert second != first and not second.exists()


def test_a_missing_path_names_the_folders_that_start_with_it(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "demo-20261205-021200")
    os.symlink("demo-20261205-021200", runs / "demo-latest")
    with pytest.raises(ConfigError) as err:
        capture_files(runs / "demo")
    assert str(err.value) == (f"capture='{runs / 'demo'}': no such capture file or folder; found "
                              f"{runs / 'demo-20261205-021200'}, {runs / 'demo-latest'}")
    with pytest.raises(ConfigError, match="no such truth file, nor an output directory"):
        capture_files(runs / "other", "truth")
