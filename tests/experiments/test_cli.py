import subprocess
import sys

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
