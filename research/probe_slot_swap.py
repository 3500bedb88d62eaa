"""Calibrating the verdict without truth across nets (gi.analysis.verdict, "Without truth" and "Per image without
truth") on finished `gi run` directories: for every image, its verdict with truth, its capture's mismatch, the
distance its slot's swap for its own mean colour moves the share (gi.attack.recon.mismatch.slot_swap_distances,
recomputed from the saved captures and reconstructions), the slot's word without truth and its estimate of the
verdict with truth (gi.analysis.verdict.image_estimate, by the evidence kind the run's reconstruction had: its
results.csv `answered_by`, its config's attack.match_weight and objective, the capture's share). Prints, per net
(the LABEL given) and pooled, the ranges per group of the verdict with truth, the agreement of the words (explains
~ recovered, partly explains ~ partial, not pinned / does not explain ~ not recovered), per capture and per slot,
and of the estimates (recovered and not recovered right of those said, undecided);
with --plot, the mismatch of every image's capture against its PSNR above its best trivial guess, one panel per net.
  PYTHONPATH=$PWD .venv/bin/python research/probe_slot_swap.py [--plot OUT.png] [--json ROWS.json] LABEL=RUN_DIR ...
  PYTHONPATH=$PWD .venv/bin/python research/probe_slot_swap.py [--plot OUT.png] --rows ROWS.json
(a bare RUN_DIR is labelled by its name; --rows reads the rows a --json run wrote instead of recomputing them)
"""
import csv
import glob
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from gi.analysis.metrics import match_images, psnr
from gi.analysis.verdict import (
    DOES_NOT_EXPLAIN,
    EXPLAINED_BELOW,
    EXPLAINS,
    NOT_PINNED,
    NOT_RECOVERED,
    PARTIAL,
    PARTLY_EXPLAINS,
    RECOVERED,
    UNDECIDED,
    UNEXPLAINED_FROM,
    evidence_kind,
    image_estimate,
    mismatch_verdict,
    slot_verdict,
)
from gi.attack.recon.mismatch import relative_mismatch, shared_mismatch, simulated_share, slot_swap_distances
from gi.capture import Capture, Truth
from gi.world.fl.local import order_known

SAME = {EXPLAINS: RECOVERED, PARTLY_EXPLAINS: PARTIAL, NOT_PINNED: NOT_RECOVERED, DOES_NOT_EXPLAIN: NOT_RECOVERED}
GROUPS = (RECOVERED, PARTIAL, NOT_RECOVERED)


def rows(run: Path, label: str) -> list[dict]:
    m = json.loads((run / "metrics.json").read_text())
    truth_words = m["verdict"]["images"]
    answered = {int(r["capture"]): r["answered_by"] for r in csv.DictReader(open(run / "results.csv"))}
    import yaml

    attack = yaml.safe_load((run / "config.yaml").read_text())["attack"]
    match, objective = float(attack.get("match_weight", 1.0)), attack.get("objective", "l2")
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
        noise = 0.056 * torch.randn(x.shape, generator=torch.Generator().manual_seed(k))  # 25 dB of pixel noise
        d25 = relative_mismatch(simulated_share(cap, x + noise, y, model=model),
                                simulated_share(cap, x, y, model=model)) if known else float("nan")
        perm = match_images(x, truth.images) if x.shape[0] > 1 else [0]
        base = trivial_psnr(truth.images)
        kind = evidence_kind(answered[k] == "analytic inversion", match > 0, cap.is_update, objective)
        for i in range(truth.images.shape[0]):
            slot = perm[i]
            p = float(psnr(x[slot:slot + 1], truth.images[i:i + 1])[0])
            out.append({"net": label, "run": run.name, "capture": k, "psnr": p, "above": p - base[i],
                        "truth": truth_words[j], "mismatch": mismatch, "swap": swaps[slot], "d25": d25,
                        "capture_word": mismatch_verdict(mismatch, known),
                        "word": slot_verdict(mismatch, swaps[slot], known), "kind": kind,
                        "estimate": image_estimate(mismatch, swaps[slot], kind, known)})
            j += 1
    return out


def trivial_psnr(images: torch.Tensor) -> list[float]:
    """Each image's best trivial guess (the better of grey and its mean colour), as the verdict with truth."""
    from gi.analysis.verdict import trivial_baselines

    b = trivial_baselines(images)
    return [max(g, c) for g, c in zip(b["grey_psnr"], b["mean_colour_psnr"])]


def spread(vals: list[float]) -> str:
    vals = sorted(vals)
    return "—" if not vals else f"{vals[0]:.2g} / {vals[len(vals) // 2]:.2g} / {vals[-1]:.2g} ({len(vals)})"


def agreement(group: list[dict]) -> str:
    cap = sum(SAME.get(r["capture_word"]) == r["truth"] for r in group)
    slot = sum(SAME.get(r["word"]) == r["truth"] for r in group)
    wrong = sum(r["word"] == EXPLAINS and r["truth"] == NOT_RECOVERED for r in group)
    wrong_cap = sum(r["capture_word"] == EXPLAINS and r["truth"] == NOT_RECOVERED for r in group)
    return f"{cap} / {slot} of {len(group)} | {wrong_cap} / {wrong}"


def plot(pooled: list[dict], nets: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {RECOVERED: "tab:green", PARTIAL: "tab:orange", NOT_RECOVERED: "tab:red"}
    fig, axes = plt.subplots(1, len(nets), figsize=(3.2 * len(nets), 3.4), sharey=True, squeeze=False)
    for ax, net in zip(axes[0], nets):
        for w in GROUPS:
            g = [r for r in pooled if r["net"] == net and r["truth"] == w]
            ax.scatter([max(r["mismatch"], 1e-7) for r in g], [r["above"] for r in g], s=12, c=colours[w],
                       label=f"{w} ({len(g)})", alpha=0.8)
            said = [r for r in g if r.get("estimate") == RECOVERED]
            ax.scatter([max(r["mismatch"], 1e-7) for r in said], [r["above"] for r in said], s=60,
                       facecolors="none", edgecolors="k", linewidths=0.8)
            said = [r for r in g if r.get("estimate") == NOT_RECOVERED]
            ax.scatter([max(r["mismatch"], 1e-7) for r in said], [r["above"] for r in said], s=60, marker="x",
                       c="k", linewidths=0.8)
        for t in (EXPLAINED_BELOW, UNEXPLAINED_FROM):
            ax.axvline(t, color="grey", lw=0.8, ls="--")
        ax.axhline(10, color="grey", lw=0.5, ls=":")
        ax.axhline(1, color="grey", lw=0.5, ls=":")
        ax.set_xscale("log")
        ax.set_title(net, fontsize=9)
        ax.set_xlabel("capture's relative mismatch")
        ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("PSNR above the best trivial guess (dB)")
    fig.suptitle("mismatch thresholds (dashed: 1e-3, 0.03) against the verdict with truth (colour); the estimate "
                 "without truth: ringed recovered, crossed not recovered, bare undecided", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


args = sys.argv[1:]
out_png = out_json = None
while args[:1] in (["--plot"], ["--json"]):
    if args[0] == "--plot":
        out_png = args[1]
    else:
        out_json = args[1]
    args = args[2:]
pooled, nets = [], []
if args[:1] == ["--rows"]:  # the rows a --json run wrote: table and plot again without recomputing them
    pooled = json.loads(Path(args[1]).read_text())
    nets = list(dict.fromkeys(r["net"] for r in pooled))
    args = []
for arg in args:
    label, _, run = arg.rpartition("=") if "=" in arg else ("", "", arg)
    label = label or Path(run).name
    pooled += rows(Path(run), label)
    if label not in nets:
        nets.append(label)
print("| net | images | recovered: mismatch min / median / max (n) | partial | not recovered | swap distance of the "
      "recovered | of the not recovered | agreement per capture / per slot | explains on a not recovered image, "
      "per capture / per slot |")
print("|---|---|---|---|---|---|---|---|---|")
for net in nets + ["all"]:
    g = [r for r in pooled if net in ("all", r["net"])]
    print(f"| {net} | {len(g)} | " + " | ".join(spread([r["mismatch"] for r in g if r["truth"] == w]) for w in GROUPS)
          + f" | {spread([r['swap'] for r in g if r['truth'] == RECOVERED])} | "
          f"{spread([r['swap'] for r in g if r['truth'] == NOT_RECOVERED])} | {agreement(g)} |")
print("\n| net | mismatch / d25 of the recovered | partial | not recovered |")
print("|---|---|---|---|")
for net in nets + ["all"]:
    g = [r for r in pooled if net in ("all", r["net"])]
    print(f"| {net} | " + " | ".join(spread([r["mismatch"] / r["d25"] for r in g if r["truth"] == w]) for w in GROUPS)
          + " |")
print("\n| net | images | evidence | estimated recovered: right / said | estimated not recovered: right / said | "
      "undecided | right of all | right of those said |")
print("|---|---|---|---|---|---|---|---|")
for net in nets + ["all"]:
    g = [r for r in pooled if net in ("all", r["net"])]
    said = {w: [r for r in g if r["estimate"] == w] for w in (RECOVERED, NOT_RECOVERED)}
    right = {w: sum(r["truth"] == w for r in v) for w, v in said.items()}
    und = sum(r["estimate"] == UNDECIDED for r in g)
    n_said = sum(len(v) for v in said.values())
    kinds = ", ".join(sorted({r["kind"] for r in g}))
    print(f"| {net} | {len(g)} | {kinds} | {right[RECOVERED]} / {len(said[RECOVERED])} | "
          f"{right[NOT_RECOVERED]} / {len(said[NOT_RECOVERED])} | {und} | {sum(right.values())} of {len(g)} | "
          f"{sum(right.values())} of {n_said} |")
if out_json:
    Path(out_json).write_text(json.dumps(pooled, indent=1))
    print(f"wrote {out_json}")
if out_png:
    plot(pooled, nets, out_png)
    print(f"wrote {out_png}")
