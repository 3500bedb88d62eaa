"""Calibrating a per-image verdict without truth from each slot's own feature mismatch (the verdict's
``features.slot_feature_mismatch``): for finished `gi run` directories (with truth), each image's verdict with truth
(``verdict.images``, matched to slots by ``images.perm``) beside its slot's mismatch; prints, per run and pooled,
the mismatch ranges of recovered / partial / not recovered images and the agreement of every threshold that
separates recovered from the rest.
  .venv/bin/python research/probe_slot_verdict.py RUN_DIR [RUN_DIR ...]
"""
import json
import sys
from pathlib import Path


def rows(run: Path) -> list[tuple[float, str, float]]:
    """(slot mismatch, verdict with truth, PSNR) per true image of ``run`` (one capture per metrics record)."""
    m = json.loads((run / "metrics.json").read_text())
    slots = [v for cap in m["verdict"]["features"]["slot_feature_mismatch"] for v in cap]
    perm, words, psnr = m["images"]["perm"], m["verdict"]["images"], m["images"]["psnr"]
    return [(slots[perm[j]], words[j], psnr[j]) for j in range(len(words))]


def spread(vals: list[float]) -> str:
    vals = sorted(vals)
    return "—" if not vals else f"{vals[0]:.3f} / {vals[len(vals) // 2]:.3f} / {vals[-1]:.3f} ({len(vals)})"


pooled = []
print("| run | recovered: min / median / max (n) | partial | not recovered |")
print("|---|---|---|---|")
for arg in sys.argv[1:]:
    r = rows(Path(arg))
    pooled += r
    print(f"| {arg} | " + " | ".join(spread([s for s, w, _ in r if w == k])
                                   for k in ("recovered", "partial", "not recovered")) + " |")
print("| all | " + " | ".join(spread([s for s, w, _ in pooled if w == k])
                               for k in ("recovered", "partial", "not recovered")) + " |")
print("\nthreshold t: slot mismatch < t reads 'recovered'; agreement with the verdict with truth (recovered or not)")
for t in (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2):
    agree = sum((s < t) == (w == "recovered") for s, w, _ in pooled)
    false_yes = sum(s < t and w != "recovered" for s, w, _ in pooled)
    false_no = sum(s >= t and w == "recovered" for s, w, _ in pooled)
    print(f"t {t:<6g} agree {agree}/{len(pooled)} ({100 * agree / len(pooled):.1f} %), says recovered wrongly "
          f"{false_yes}, misses {false_no}")
