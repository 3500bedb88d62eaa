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


def test_an_override_the_analytic_answer_ignores_is_named_in_a_notice(tmp_path, capsys):
    """The demo's sigmoid LeNet is answered by the analytic inversion: attack.iterations, read by the optimisation
    only, had no effect, and the run says so; attack.analytic (read) is not named; with the optimisation on,
    no notice."""
    from gi.attack.stages.result import no_effect

    assert main(["--threads", "1", "run", "configs/demo.yaml", "attack.iterations=5000", "attack.analytic=true",
                 "metrics.lpips_vgg=false", f"out={tmp_path / 'a'}"]) == 0
    err = capsys.readouterr().err
    assert "notice: attack.iterations had no effect on this run" in err and "attack.analytic had" not in err
    assert main(["--threads", "1", "run", "configs/demo.yaml", "attack.iterations=20", "attack.analytic=false",
                 "metrics.lpips_vgg=false", f"out={tmp_path / 'b'}"]) == 0
    assert "had no effect" not in capsys.readouterr().err
    assert no_effect(["iterations"], []) == []  # nothing reconstructed: nothing to say
