"""A person's own script, outside the repository, with its own model class (docs/usage.md, "Python"): a capture
from its gradients (gi.Capture.from_gradients), gi.attack.run with progress on stderr (lines when piped, none with
progress=False), the verdict without truth, the scores with truth, and result.save: the images come back exactly
from reconstructions.safetensors and within 8-bit rounding from the PNGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]

SCRIPT = '''
import json, sys
import torch
torch.set_num_threads(1)
import gi
from safetensors.torch import save_file


class Net(torch.nn.Module):
    """The user's own classifier: a hidden sigmoid layer and a head."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 12), torch.nn.Sigmoid())
        self.head = torch.nn.Linear(12, 4)

    def forward(self, x):
        return self.head(self.hidden(x))


torch.manual_seed(0)
model = Net()
images, targets = torch.rand(1, 3, 32, 32), torch.tensor([2])
loss = torch.nn.functional.cross_entropy(model(images), targets)
names, params = zip(*model.named_parameters())
gradients = dict(zip(names, torch.autograd.grad(loss, params)))
capture = gi.Capture.from_gradients(model, gradients, gi.Protocol(), num_samples=1, in_shape=(3, 32, 32))
truth = gi.Truth(images=images, labels=targets, targets=torch.nn.functional.one_hot(targets, 4).float(),
                 counts=torch.bincount(targets, minlength=4))
keys = dict(iterations=20, restarts=1, retries=0, analytic=False)
print("== quiet", file=sys.stderr, flush=True)
gi.attack.run(capture, progress=False, **keys)
print("== progress", file=sys.stderr, flush=True)
result = gi.attack.run(capture, **keys)
print("== done", file=sys.stderr, flush=True)
verdict = result.verdict
scored = result.score(truth)
out = result.save(sys.argv[1], truth)
save_file({"images": result.reconstructions[0].images.contiguous()}, sys.argv[2])
print(json.dumps({"kind": type(result).__name__, "sentence": verdict.sentence, "record": verdict.record,
                  "labels": verdict.labels, "rows": scored.rows, "scored": scored.verdict, "out": str(out)},
                 default=str))
'''


def _env(where: Path) -> dict[str, str]:
    """The environment of a process started in ``where``: PYTHONPATH names this checkout only when ``import gi``
    from there would find another one (an editable install of another worktree); in CI it finds this one."""
    env = {**os.environ, "GI_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    found = subprocess.run([sys.executable, "-c", "import gi; print(gi.__file__)"], cwd=where, env=env,
                           capture_output=True, text=True, timeout=60)
    if found.returncode != 0 or Path(found.stdout.strip()).resolve() != REPO / "gi" / "__init__.py":
        env["PYTHONPATH"] = str(REPO)
    return env


def _png(path: Path) -> torch.Tensor:
    pixels = np.asarray(Image.open(path), dtype=np.float32) / 255
    return torch.from_numpy(pixels).permute(2, 0, 1)


def test_an_own_model_script_outside_the_repository_attacks_scores_and_saves(tmp_path):
    script = tmp_path / "attack_mine.py"
    script.write_text(SCRIPT)
    out, expected = tmp_path / "result", tmp_path / "expected.safetensors"
    done = subprocess.run([sys.executable, str(script), str(out), str(expected)], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kind"] == "Attack" and Path(report["out"]) == out
    # progress: lines on piped stderr, never a carriage return; none with progress=False
    quiet, progress = done.stderr.split("== quiet\n")[1].split("== progress\n")
    progress = progress.split("== done\n")[0]
    assert "iterations)" not in quiet
    assert "reconstruct: 100% (20/20 iterations)" in progress and "\r" not in done.stderr
    # the verdict without truth: its record is what save wrote beside the scores, its line names the labels
    metrics = json.loads((out / "metrics.json").read_text())
    record = report["record"]
    assert metrics["verdict"]["gradient"] == {k: v for k, v in record.items() if k not in ("features", "labels")}
    assert metrics["verdict"] == report["scored"]
    slots = load_file(out / "reconstructions.safetensors")["labels0"].tolist()
    assert report["labels"] == [slots] and report["sentence"].endswith(f"recovered label {slots[0]}")
    assert [r["verdict"] for r in report["rows"]] == metrics["verdict"]["images"]
    # the images as data: exactly the result's, float32 in [0, 1]; the PNGs within 8-bit rounding
    images = load_file(expected)["images"]
    stored = load_file(out / "reconstructions.safetensors")["capture0"]
    assert stored.dtype == torch.float32 and stored.shape == (1, 3, 32, 32) and torch.equal(stored, images)
    assert float(stored.min()) >= 0 and float(stored.max()) <= 1
    assert torch.allclose(_png(out / "images" / "c0_i0.png"), images[0], atol=1 / 255)
    assert (out / "images" / "c0_i0_truth.png").is_file() and (out / "grid.png").is_file()
    assert metrics["num_images"] == 1 and len(report["rows"]) == 1
