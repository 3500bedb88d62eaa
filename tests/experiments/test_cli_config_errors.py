"""Config errors of every command answer at once: exit 2, one line on stderr, torch never imported (an unknown key,
a wrong type, an unknown model, label method, preset or attack registry name), each command in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# each case runs gi.cli.main in this process, then records its exit code, stderr and whether torch got imported
PROBE = """
import contextlib, io, json, sys
from gi.cli import main
out = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    out.append({"args": args, "code": code, "err": err.getvalue(),
                "heavy": [m for m in ("torch", "lightning", "matplotlib", "scipy") if m in sys.modules]})
print(json.dumps(out))
"""

CASES = {
    "run": [["configs/demo.yaml", "bogus=1"], ["configs/demo.yaml", "seed=1.5"],
            ["configs/demo.yaml", "model.name=nope"], ["configs/demo.yaml", "labels.method=nope"],
            ["configs/demo.yaml", "labels.options.nope=1"],
            ["configs/demo.yaml", "labels.hard_method=nope"], ["configs/demo.yaml", "attack.preset=nope"],
            ["configs/demo.yaml", "attack.objective=nope"], ["configs/demo.yaml", "attack.regularizers={nope: 1}"],
            ["configs/demo.yaml", "name=a/b"], ["configs/demo.yaml", "attack.iterations=1000000000000"],
            ["configs/demo.yaml", "attack.restarts=1000000"]],
    "labels": [["configs/labels/decaf-fmnist.yaml", "bogus=1"], ["configs/labels/decaf-fmnist.yaml", "trials=x"],
               ["configs/labels/decaf-fmnist.yaml", "setup.model.name=nope"],
               ["configs/labels/decaf-fmnist.yaml", "labels.methods=[nope]"],
               ["configs/labels/decaf-fmnist.yaml", "methods=[decaf]"],
               ["configs/labels/decaf-fmnist.yaml", "labels.variants.decaf.options.nope=1"],
               ["configs/labels/decaf-fmnist.yaml", "metrics=[nope]"]],
    "ablate": [["configs/ablate/table3.yaml", "bogus=1"], ["configs/ablate/table3.yaml", "trials=x"],
               ["configs/ablate/table3.yaml", "model.name=nope"], ["configs/ablate/table3.yaml", "labels.method=nope"],
               ["configs/ablate/table3.yaml", "attack.preset=nope"], ["configs/ablate/table3.yaml", "trials=0"]],
    "defend": [["configs/defend/quick.yaml", "bogus=1"], ["configs/defend/quick.yaml", "seed=x"],
               ["configs/defend/quick.yaml", "model.name=nope"],
               ["configs/defend/quick.yaml", "labels.methods.nope=gradient"],
               ["configs/defend/quick.yaml", "label_methods.rlu=update"],
               ["configs/defend/quick.yaml", "labels.options.nope=1"],
               ["configs/defend/quick.yaml", "labels.method=nope"],
               ["configs/defend/quick.yaml", "attack.preset=nope"]],
    "sweep": [["configs/sweep/demo-cpu.yaml", "bogus=1"], ["configs/sweep/demo-cpu.yaml", "devices=x"],
              ["configs/sweep/demo-cpu.yaml", "grid.model.name=[nope]"],
              ["configs/sweep/demo-cpu.yaml", "grid.labels.method=[nope]"],
              ["configs/sweep/demo-cpu.yaml", "grid.attack.preset=[nope]"]],
    "attack": [["runs/none.safetensors", "bogus=1"], ["runs/none.safetensors", "seed=x"],
               ["runs/none.safetensors", "labels.method=nope"], ["runs/none.safetensors", "attack.preset=nope"]],
    "bench": [["configs/bench/quick.yaml", "bogus=1"], ["configs/bench/quick.yaml", "threads=x"],
              ["configs/bench/quick.yaml", "models=[nope]"], ["configs/bench/quick.yaml", "attack.preset=nope"],
              ["configs/bench/quick.yaml", "restarts=[1000000]"],
              ["configs/bench/quick.yaml", "batch_sizes=[100000000]"],
              ["configs/bench/quick.yaml", "iterations={lenet: 1000000000000}"],
              ["configs/bench/ttq-lenet.yaml", "job_overrides=[model.name=nope]"],
              ["configs/bench/realistic.yaml", "only=[s9]"],
              ["configs/bench/realistic.yaml", "members.s2.overrides=[x=1]"]],
}


@pytest.mark.parametrize("command", sorted(CASES))
def test_config_errors_answer_in_one_line_without_torch(command):
    cases = [[command, *args] for args in CASES[command]]
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], cwd=REPO, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for case in json.loads(out.stdout.strip().splitlines()[-1]):
        err = case["err"]
        assert case["code"] == 2, case
        assert err.count("\n") == 1 and err.startswith(f"gi {command}: error: "), case
        assert case["heavy"] == [], case  # at once: what makes a config error slow is importing these, not timed
