import subprocess
import sys
from pathlib import Path

from gi.cli import main


def test_help_explains_itself():
    out = subprocess.run([sys.executable, "-m", "gi.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for word in ("run", "labels", "methods", "overrides", "output directory"):
        assert word in out.stdout.lower()


def test_unknown_key_is_a_one_line_error(capsys):
    assert main(["run", "configs/demo.yaml", "attack.bogus=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown config key" in err and "iterations" in err


def test_methods_lists_registry(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "idlg" in out and "options (labels.options): dtype, missing, weighting" in out  # posterior's


def test_check_loads_the_config_and_does_no_work(tmp_path, monkeypatch, capsys):
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "configs").symlink_to(root / "configs")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "configs/demo.yaml", "seed=1", "--check"]) == 0
    assert capsys.readouterr().out.strip() == "gi run: the config loads (configs/demo.yaml); --check runs nothing"
    assert not (tmp_path / "runs").exists()
    assert main(["run", "configs/demo.yaml", "attack.bogus=1", "--check"]) == 2
    assert "unknown config key" in capsys.readouterr().err
    assert main(["attack", "runs/demo", "--check"]) == 2  # gi attack also checks that the capture exists
    assert "no such capture file" in capsys.readouterr().err
