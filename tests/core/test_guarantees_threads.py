"""The command's process: GI_THREADS means the same in the Python API as on the command line (torch's
CPU threads of the whole job, the reconstruction included), and `gi --help` / config errors answer without
importing torch, Lightning, matplotlib or torchvision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

import gi
from gi.attack.recon import ReconConfig
from gi.cli import main
from gi.core.errors import ConfigError
from gi.world.models import build


class _Threads(L.Callback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(torch.get_num_threads())


def _reconstruct_threads(config: ReconConfig | None = None) -> list[int]:
    model = build("lenet", 10, init="uniform", seed=0)
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    capture, _ = gi.capture_gradients(model, images, torch.eye(10)[[3]], gi.Protocol())
    probe = _Threads()
    gi.reconstruct(capture, None, config=config or ReconConfig(iterations=2, progress=False, labels="joint"),
                   callbacks=[probe])
    return probe.seen


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("env, torch_default", [("1", 2), ("2", 3)])
def test_gi_threads_sets_the_reconstruction_threads_in_the_python_api(monkeypatch, restore_threads, env,
                                                                     torch_default):
    monkeypatch.setenv("GI_THREADS", env)
    torch.set_num_threads(torch_default)  # what torch picks by itself on a bigger machine
    assert set(_reconstruct_threads()) == {int(env)}
    assert torch.get_num_threads() == torch_default  # restored afterwards


def test_attack_threads_still_wins_over_gi_threads(monkeypatch, restore_threads):
    monkeypatch.setenv("GI_THREADS", "1")
    assert set(_reconstruct_threads(ReconConfig(iterations=2, progress=False, labels="joint", threads=2))) == {2}


@pytest.mark.parametrize("bad", ["zero", "0", "-2", "1.5"])
def test_a_bad_gi_threads_is_a_clear_error(monkeypatch, restore_threads, bad, capsys):
    monkeypatch.setenv("GI_THREADS", bad)
    with pytest.raises(ConfigError, match="GI_THREADS"):
        _reconstruct_threads()
    assert main(["methods"]) == 2
    assert "GI_THREADS" in capsys.readouterr().err


def test_cli_threads_flag_is_gi_threads_for_the_whole_command(monkeypatch, restore_threads):
    monkeypatch.delenv("GI_THREADS", raising=False)
    assert main(["--threads", "2", "methods"]) == 0
    assert os.environ["GI_THREADS"] == "2" and torch.get_num_threads() == 2
    assert set(_reconstruct_threads()) == {2}  # a small model on CPU would otherwise get 1 thread


PROBE = """
import json, runpy, sys
sys.argv = ["gi"] + sys.argv[1:]
code = 0
try:
    runpy.run_module("gi.cli", run_name="__main__")
except SystemExit as exc:
    code = exc.code
heavy = [m for m in ("torch", "lightning", "matplotlib", "torchvision", "kornia", "scipy") if m in sys.modules]
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("args, code", [
    (["--help"], 0), (["run", "--help"], 0),
    (["run", "configs/nope.yaml"], 2), (["run", "configs/demo.yaml", "attack.bogus=1"], 2),
    (["ablate", "configs/ablate/table3.yaml", "bogus=1"], 2), (["labels", "configs/nope.yaml"], 2),
    (["sweep", "configs/sweep/demo-cpu.yaml", "bogus=1"], 2), (["bench", "bogus=1"], 2),
])
def test_help_and_config_errors_import_nothing_heavy(args, code):
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo)}, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"code": code, "heavy": []}, out.stderr
    if code:
        assert out.stderr.count("\n") == 1 and "error:" in out.stderr
