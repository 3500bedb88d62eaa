"""Is the agreement of independent fits a truth-free error estimate? For every image of the first `gi run` directory:
its PSNR against truth, and the PSNR between its reconstruction and the same capture's slot in each other run (the
same captures attacked with another `attack.seed`). By the triangle inequality the worse of two fits a, b has
‖x̂ − x‖ ≥ ‖a − b‖ / 2, i.e. a PSNR at most their mutual PSNR + 6.02 dB: disagreement bounds quality from above;
agreement alone proves nothing (fits can share a bias).
  PYTHONPATH=$PWD .venv/bin/python research/probe_seed_agreement.py RUN_DIR OTHER_RUN_DIR ...
"""
import csv
import sys
from pathlib import Path

from safetensors.torch import load_file

from gi.analysis.metrics import psnr

runs = [Path(r) for r in sys.argv[1:]]
recs = [load_file(str(r / "reconstructions.safetensors")) for r in runs]
out = []
for row in csv.DictReader((runs[0] / "results.csv").open()):
    k, slot = int(row["capture"]), int(row["matched_slot"])
    a = recs[0][f"capture{k}"][slot:slot + 1]
    mutual = [float(psnr(a, r[f"capture{k}"][slot:slot + 1])[0]) for r in recs[1:]]
    trivial = max(float(row["grey_psnr"]), float(row["mean_colour_psnr"]))
    out.append((float(row["psnr"]), trivial, row["verdict"], mutual))
for p, t, v, m in sorted(out):
    print(f"{p:6.2f} dB ({v}, best trivial guess {t:5.2f} dB); PSNR to the other runs' fits: "
          + " ".join(f"{x:6.2f}" for x in m))
