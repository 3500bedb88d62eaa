"""A user's ``labels.py`` or ``fcn_analytic.py`` beside their script hides the toolkit's packages of those names:
``import gi`` says so in one line naming the file (gi.core.packages)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_script(folder: Path) -> subprocess.CompletedProcess:
    (folder / "script.py").write_text("import gi\nprint('imported', gi.__name__)\n")
    return subprocess.run([sys.executable, "script.py"], cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("name", ["labels", "fcn_analytic"])
def test_a_module_of_the_same_name_beside_a_script_is_named_at_import(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("x = 1\n")
    out = _run_script(tmp_path)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: rename {tmp_path / name}.py: it shadows the label-first toolkit's "
                           f"`{name}` package"), last


def test_without_a_clash_gi_imports(tmp_path):
    (tmp_path / "labels.csv").write_text("file,label\n")  # a data file of that name is no module
    out = _run_script(tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "imported gi"
