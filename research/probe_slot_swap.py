"""Calibrating the per-image verdict without truth (gi.analysis.verdict, "Per image without truth") on finished
`gi run` directories: for every image, its verdict with truth, its capture's mismatch and the distance its slot's
swap for its own mean colour moves the share (gi.attack.recon.mismatch.slot_swap_distances, recomputed from the
saved captures and reconstructions), and the slot's word without truth; then, per group of the verdict with truth,
the swap distances' range, and the agreement of the words (explains ~ recovered, partly explains ~ partial, not
pinned / does not explain ~ not recovered).
  PYTHONPATH=$PWD .venv/bin/python research/probe_slot_swap.py RUN_DIR [RUN_DIR ...]
"""
import glob
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from gi.analysis.metrics import match_images, psnr
from gi.analysis.verdict import (
    DOES_NOT_EXPLAIN,
    EXPLAINS,
    NOT_PINNED,
    NOT_RECOVERED,
    PARTIAL,
    PARTLY_EXPLAINS,
    RECOVERED,
    mismatch_verdict,
    slot_verdict,
)
from gi.attack.recon.mismatch import shared_mismatch, slot_swap_distances
from gi.capture import Capture, Truth
from gi.world.fl.local import order_known

SAME = {EXPLAINS: RECOVERED, PARTLY_EXPLAINS: PARTIAL, NOT_PINNED: NOT_RECOVERED, DOES_NOT_EXPLAIN: NOT_RECOVERED}


def rows(run: Path) -> list[dict]:
    m = json.loads((run / "metrics.json").read_text())
    truth_words = m["verdict"]["images"]
    recs = safe_open(str(run / "reconstructions.safetensors"), "pt")
    out, j = [], 0
    for k, path in enumerate(sorted(glob.glob(str(run / "captures" / "*.safetensors")))):
        cap, truth = Capture.load(path), Truth.load(path.replace("captures", "truths"))
        x, labels = recs.get_tensor(f"capture{k}"), recs.get_tensor(f"labels{k}")
        y = torch.nn.functional.one_hot(labels.long(), cap.model_spec["num_classes"]).float()
        model = cap.model()
        mismatch = shared_mismatch(cap, x, y, model=model)
        known = order_known(cap.protocol, cap.num_samples)
        swaps = slot_swap_distances(cap, x, y, model=model) if known else [float("nan")] * x.shape[0]
        perm = match_images(x, truth.images) if x.shape[0] > 1 else [0]
        for i in range(truth.images.shape[0]):
            slot = perm[i]
            out.append({"run": run.name, "capture": k, "psnr": float(psnr(x[slot:slot + 1], truth.images[i:i + 1])[0]),
                        "truth": truth_words[j], "mismatch": mismatch, "swap": swaps[slot],
                        "capture_word": mismatch_verdict(mismatch, known),
                        "word": slot_verdict(mismatch, swaps[slot], known)})
            j += 1
    return out


def spread(vals: list[float]) -> str:
    vals = sorted(vals)
    return "—" if not vals else f"{vals[0]:.2g} / {vals[len(vals) // 2]:.2g} / {vals[-1]:.2g} ({len(vals)})"


pooled = []
for arg in sys.argv[1:]:
    r = rows(Path(arg))
    pooled += r
    for row in r:
        print(f"{row['run']} capture {row['capture']}: {row['psnr']:6.2f} dB {row['truth']:<13} mismatch "
              f"{row['mismatch']:.2g} ({row['capture_word']}), swap {row['swap']:.2g} -> {row['word']}")
print("\n| verdict with truth | swap distance: min / median / max (n) | capture mismatch |")
print("|---|---|---|")
for w in (RECOVERED, PARTIAL, NOT_RECOVERED):
    g = [row for row in pooled if row["truth"] == w]
    print(f"| {w} | {spread([row['swap'] for row in g])} | {spread([row['mismatch'] for row in g])} |")
agree_capture = sum(SAME[row["capture_word"]] == row["truth"] for row in pooled if row["capture_word"] in SAME)
agree = sum(SAME[row["word"]] == row["truth"] for row in pooled if row["word"] in SAME)
wrong = sum(row["word"] == EXPLAINS and row["truth"] == NOT_RECOVERED for row in pooled)
wrong_capture = sum(row["capture_word"] == EXPLAINS and row["truth"] == NOT_RECOVERED for row in pooled)
print(f"\nagreement with the verdict with truth over {len(pooled)} images: per capture {agree_capture}, per slot "
      f"{agree}; 'explains' on a not-recovered image: per capture {wrong_capture}, per slot {wrong}")
