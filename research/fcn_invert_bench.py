"""Soft-label paper Table 6 / Fig. 3: analytic inversion of the bias-free FCN-4 from one gradient.

For every image: a single-sample FedSGD capture on an untrained FCN-4 (12288-4096-1024-256-C, default init),
soft-label recovery (``soft-lambda``), the recovered feature λ·g_r, then layer-by-layer inversion
(``fcn_analytic.invert``); scored against the true image with PSNR / SSIM (gi.analysis.metrics) and, with ``--lpips``,
LPIPS-alex. Prints a Markdown table; times are wall seconds with one torch thread.

    python research/fcn_invert_bench.py --dataset imagenet-samples --aug smoothing
    python research/fcn_invert_bench.py --dataset cifar10-samples --aug mixup
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fcn_analytic
import labels
from gi.analysis import metrics
from gi.world import data
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="imagenet-samples")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--aug", default="smoothing", choices=["smoothing", "mixup", "onehot"])
    ap.add_argument("-n", type=int, default=20, help="images (one capture each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="a fresh FCN-4 per image (default: one model)")
    ap.add_argument("--lpips", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(args.seed)
    ds = data.load(args.dataset, size=args.size)
    c = ds.num_classes
    if args.aug == "mixup":
        i1, i2 = data.sample_mixup_pairs(ds, args.n, g)
        lam = torch.rand(args.n, generator=g)
        images, targets = data.mixup(ds.images[i1], ds.labels[i1], ds.images[i2], ds.labels[i2], lam, c)
    else:
        idx = torch.arange(args.n) % len(ds)
        eps = 0.5 * torch.rand(args.n, generator=g) if args.aug == "smoothing" else torch.zeros(args.n)
        images, targets = ds.images[idx], data.smooth_labels(ds.labels[idx], c, eps)
    rows = []
    model = build("fcn4", c, in_shape=(3, args.size, args.size), seed=args.seed)
    for i in range(args.n):
        if args.fresh and i:
            model = build("fcn4", c, in_shape=(3, args.size, args.size), seed=args.seed + i)
        t0 = time.perf_counter()
        cap, truth = capture_gradients(model, images[i:i + 1], targets[i:i + 1], Protocol(label_aug=args.aug))
        t1, c1 = time.perf_counter(), time.thread_time()
        res = labels.recover(cap, "soft-lambda")
        t2 = time.perf_counter()
        inv = fcn_analytic.invert(cap, res)
        t3, c3 = time.perf_counter(), time.thread_time()
        row = {"ok": res.ok, "label_l1": float((res.soft - truth.targets.double()).abs().sum()) if res.ok else None,
               "psnr": float(metrics.psnr(inv.image, truth.images)),
               "ssim": float(metrics.ssim(inv.image, truth.images)),
               "exact": inv.exact, "capture_s": t1 - t0, "label_s": t2 - t1, "invert_s": t3 - t2,
               "cpu_s": c3 - c1}
        if args.lpips:
            row["lpips"] = float(metrics.lpips(inv.image, truth.images))
        rows.append(row)
        print(f"{i:3d} ok {res.ok} L1 {row['label_l1']:.2e} PSNR {row['psnr']:.2f} SSIM {row['ssim']:.5f} "
              f"exact {inv.exact} capture {row['capture_s']:.2f}s label {row['label_s'] * 1e3:.1f}ms "
              f"invert {row['invert_s']:.3f}s", flush=True)
    keys = ["label_l1", "psnr", "ssim"] + (["lpips"] if args.lpips else [])
    mean = {k: statistics.mean(float(r[k]) for r in rows if r[k] is not None) for k in keys}
    med = {k: statistics.median(float(r[k]) for r in rows) for k in ("label_s", "invert_s", "capture_s", "cpu_s")}
    lp_head, lp_sep = (" mean LPIPS |", "---|") if args.lpips else ("", "")
    lp = f" {mean['lpips']:.4f} |" if args.lpips else ""
    print(f"\n| dataset | aug | n | label ok | mean label L1 | mean PSNR (dB) | min PSNR | mean SSIM |{lp_head} "
          "median label + invert (s, wall / CPU) | median capture (s) |")
    print(f"|---|---|---|---|---|---|---|---|{lp_sep}---|---|")
    print(f"| {args.dataset} {args.size}px | {args.aug} | {len(rows)} | {sum(r['ok'] for r in rows)}/{len(rows)} | "
          f"{mean['label_l1']:.2e} | {mean['psnr']:.2f} | {min(r['psnr'] for r in rows):.2f} | "
          f"{mean['ssim']:.5f} |{lp} "
          f"{med['label_s'] + med['invert_s']:.3f} / {med['cpu_s']:.3f} | {med['capture_s']:.2f} |")


if __name__ == "__main__":
    main()
