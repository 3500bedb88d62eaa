"""Startup: the heavy packages load where they are used. Before the first stage of ``gi run`` only torch loads
(not torchvision, scipy, Lightning or matplotlib), and an attack the analytic inversion answers never imports
Lightning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
heavy = ("torchvision", "scipy", "lightning", "matplotlib", "kornia", "lpips")
import gi.experiments.run, gi.world.models, gi.world.data, gi.world.fl.victim, labels, gi.attack.stages
before = [m for m in heavy if m in sys.modules]
import torch
import gi
from gi.world.fl.protocol import Protocol
model = gi.models.build("mlp", 10, in_shape=(3, 8, 8), widths=(32, 16), bias=False, bias_last=False, seed=1)
cap, _ = gi.capture_gradients(model, torch.rand(1, 3, 8, 8), torch.tensor([3]), Protocol())
out = gi.attack.run(cap, labels="soft-lambda", preset="default")
print(json.dumps({"before": before, "skipped": out.stages[-1].get("skipped", False),
                  "lightning": "lightning" in sys.modules}))
"""


def test_heavy_packages_load_where_used_and_an_analytic_answer_needs_no_lightning():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"before": [], "skipped": True, "lightning": False}
