"""SIGTERM (a scheduler's preemption) and SIGINT stop a command with a message and a non-zero exit, and leave no
half-written output: Lightning alone ends a fit on SIGTERM with ``SystemExit()``, i.e. exit 0 and no word."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_optimisation_stops_gi_run_non_zero_with_a_message(tmp_path, sig):
    out = tmp_path / "run"
    cmd = [sys.executable, "-c", "import sys; from gi.cli import main; sys.exit(main())", "run", "configs/demo.yaml",
           "attack.analytic=false", "attack.iterations=1000000", f"out={out}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GI_THREADS": "1"}
    # a process started with SIGINT ignored keeps ignoring it (nohup, `cmd &`, a pytest-xdist worker's children):
    # start the command as a terminal would, with the default disposition
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the optimisation starts after the features stage's log line
        line = proc.stderr.readline()
        lines.append(line)
        if "features:" in line or not line:
            break
    time.sleep(2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + int(sig), "".join(lines) + err
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written
