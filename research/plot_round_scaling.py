"""The client round's scaling plot (docs/results/client-round.md, "How the leak scales"): % of images the run's
verdict calls recovered, and mean PSNR beside the mean colour, against N, E and B, from the aggregate.csv of the
`gi sweep configs/sweep/round-scaling-{n,e,b,b32}.yaml` runs (each point: every job's clients pooled), and the table.
  .venv/bin/python research/plot_round_scaling.py [OUT.png]
"""
import json
import sys
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

AXES = {"n": ("protocol.num_samples", "N (images per client)"), "e": ("protocol.local_epochs", "E (local epochs)"),
        "b": ("protocol.batch_size", "B (batch size)")}
ROOTS = {"n": ["runs/round-scaling-n"], "e": ["runs/round-scaling-e"],
         "b": ["runs/round-scaling-b", "runs/round-scaling-b32"]}
BASE = {"protocol.num_samples": 50.0, "protocol.local_epochs": 1.0, "protocol.batch_size": 5.0}


def job_rows(root: Path) -> list[dict]:
    """One row per finished job under ``root``: its protocol values and the metrics the table needs."""
    rows = []
    for metrics in sorted(root.glob("jobs/*/metrics.json")):
        m = json.loads(metrics.read_text())
        protocol = yaml.safe_load((metrics.parent / "config.yaml").read_text())["protocol"]
        rows.append({**{f"protocol.{k}": v for k, v in protocol.items()}, "num_images": m["num_images"],
                     "verdict.counts.recovered": m["verdict"]["counts"]["recovered"], "psnr_mean": m["psnr_mean"],
                     "psnr_min": m["psnr_min"], "mean_colour_psnr_mean": m["mean_colour_psnr_mean"]})
    return rows


def points(key: str, rows: list[dict]) -> dict[float, dict[str, float]]:
    """Per value of ``key``: images, recovered, PSNR (image-weighted), mean colour and jobs, pooled over jobs."""
    out: dict[float, dict[str, float]] = {}
    for r in rows:
        p = out.setdefault(float(r[key]), {"images": 0, "recovered": 0, "psnr": 0.0, "colour": 0.0, "jobs": 0,
                                           "min": float("inf")})
        k = float(r["num_images"])
        p["images"] += k
        p["recovered"] += float(r["verdict.counts.recovered"])
        p["psnr"] += k * float(r["psnr_mean"])
        p["colour"] += k * float(r["mean_colour_psnr_mean"])
        p["min"] = min(p["min"], float(r["psnr_min"]))
        p["jobs"] += 1
    return out


table = {}
for ax, (key, _) in AXES.items():
    rows = [r for d in ROOTS[ax] for r in job_rows(Path(d))]
    if rows:
        table[ax] = points(key, rows)
shared = table.get("n", {}).get(50.0)  # the base point (N 50, E 1, B 5) is the N sweep's middle one
fig, axs = plt.subplots(2, len(AXES), figsize=(10, 5.4), dpi=120, sharey="row")
print("| axis | value | clients | images | recovered | mean PSNR | mean colour | min |")
print("|---|---|---|---|---|---|---|---|")
for col, (ax, (key, label)) in enumerate(AXES.items()):
    pts = dict(table.get(ax, {}))
    if shared is not None and ax != "n":
        pts.setdefault(BASE[key], shared)
    xs = sorted(pts)
    for x in xs:
        p = pts[x]
        print(f"| {key.split('.')[1]} | {x:g} | {6 * p['jobs']:g} | {p['images']:g} | "
              f"{p['recovered']:g} ({100 * p['recovered'] / p['images']:.0f} %) | {p['psnr'] / p['images']:.2f} dB | "
              f"{p['colour'] / p['images']:.2f} dB | {p['min']:.2f} dB |")
    axs[0, col].plot(xs, [100 * pts[x]["recovered"] / pts[x]["images"] for x in xs], "o-")
    axs[1, col].plot(xs, [pts[x]["psnr"] / pts[x]["images"] for x in xs], "o-", label="attack")
    axs[1, col].plot(xs, [pts[x]["colour"] / pts[x]["images"] for x in xs], "s--", color="grey", label="mean colour")
    axs[1, col].set_xlabel(label)
    for r in (0, 1):
        axs[r, col].grid(alpha=0.3)
        if len(xs) > 1 and max(xs) / min(xs) > 5:
            axs[r, col].set_xscale("log")
axs[0, 0].set_ylabel("% recovered (verdict)")
axs[1, 0].set_ylabel("mean PSNR (dB)")
axs[1, 0].legend(fontsize=7)
fig.suptitle("FedAvg client round, Fashion-MNIST CNN, untrained: one axis varied from N 50, E 1, B 5", fontsize=9)
fig.tight_layout()
out = sys.argv[1] if len(sys.argv) > 1 else "docs/results/img/client-round-scaling.png"
fig.savefig(out)
print(f"wrote {out}")
