"""Our conv inversion (fcn_analytic.invert) against breaching 0.1.2's R-GAP on the net R-GAP was written for.

R-GAP's CNN6 (gi zoo ``cnn6`` = breaching's ``cnn6``: bias-free convs, leaky ReLU 0.2, a biased fc), one
cifar10-samples image per FedSGD capture, the same weights and gradients for both, in one process on one thread,
the order of the two alternating per image. Ours: labels ``auto`` (the soft-label search) then
``fcn_analytic.invert``. breaching: its ``rgap`` attack config (``RecursiveAttacker``), wired as its authors wire
it: its own ``torch.nn.Sequential`` cnn6 carrying our weights, the normalised-space candidate mapped back with
the dataset mean / std, the true labels given. PSNR in pixel space against the image; CPU seconds of the attack,
both on one thread (torch's and the BLAS threads of scipy / numpy limited to 1).
docs/results/time-to-quality.md reports it:

    PYTHONPATH=$PWD:/tmp/br python research/compare_rgap.py [images=0,1,...,9] [seed=0]
"""

from __future__ import annotations

import contextlib
import functools
import io
import statistics
import sys
import time
from collections import OrderedDict
from types import SimpleNamespace

import torch


def breaching_cnn6(model: torch.nn.Module, channels: int, classes: int) -> torch.nn.Module:
    """breaching's own cnn6 layout (cases/models/model_preparation.py) with ``model``'s weights."""
    spec = [(channels, 12, 4, 2, 2), (12, 36, 3, 1, 2), (36, 36, 3, 1, 1), (36, 36, 3, 1, 1), (36, 64, 3, 1, 2),
            (64, 128, 3, 1, 1)]
    mods: list[tuple[str, torch.nn.Module]] = []
    for i, (cin, cout, k, pad, stride) in enumerate(spec):
        mods.append((f"layer{i}", torch.nn.Conv2d(cin, cout, k, padding=pad, stride=stride, bias=False)))
        if i < 5:
            mods.append((f"act{i}", torch.nn.LeakyReLU(negative_slope=0.2)))
    mods += [("flatten", torch.nn.Flatten()), ("act5", torch.nn.LeakyReLU(negative_slope=0.2)),
             ("fc", torch.nn.Linear(3200, classes, bias=True))]
    net = torch.nn.Sequential(OrderedDict(mods))
    convs = [m for m in model.body if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        for i, conv in enumerate(convs):
            getattr(net, f"layer{i}").weight.copy_(conv.weight)
        net.fc.weight.copy_(model.fc.weight)
        net.fc.bias.copy_(model.fc.bias)
    return net.eval()


def run_ours(cap, x: torch.Tensor) -> tuple[float, float]:
    """labels ``auto`` → ``fcn_analytic.invert``: (PSNR, CPU seconds)."""
    import fcn_analytic
    import labels
    from gi.analysis.metrics import psnr

    start = time.process_time()
    inv = fcn_analytic.invert(cap, labels.recover(cap, "auto"))
    return float(psnr(inv.image, x)), time.process_time() - start


def run_breaching(net, names, ours_name, cap, x: torch.Tensor, label: torch.Tensor, mean: torch.Tensor,
                  std: torch.Tensor) -> tuple[float, float]:
    """breaching's ``rgap`` attack on ``net`` (its cnn6 with our weights), true labels given: (PSNR, CPU s)."""
    import breaching
    from threadpoolctl import threadpool_limits

    from gi.analysis.metrics import psnr

    attacker = breaching.attacks.prepare_attack(net, torch.nn.CrossEntropyLoss(), breaching.get_attack_config("rgap"),
                                                dict(dtype=torch.float, device=torch.device("cpu")))
    meta = SimpleNamespace(shape=tuple(x.shape[1:]), modality="vision", mean=mean.flatten().tolist(),
                           std=std.flatten().tolist())
    payload = [dict(parameters=[p.detach() for p in net.parameters()], buffers=[], metadata=meta)]
    shared = [dict(gradients=[cap.gradients[ours_name[n]] for n in names], buffers=None,
                   metadata=dict(num_data_points=1, labels=label, local_hyperparams=None))]
    start = time.process_time()
    try:  # its numpy lstsq on the same one thread as ours; it prints every module and lstsq's report
        with threadpool_limits(limits=1), contextlib.redirect_stdout(io.StringIO()):
            out, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    except Exception as e:  # report what breaching raises, whatever it is
        print(f"  breaching failed: {type(e).__name__}: {e}")
        return float("nan"), time.process_time() - start
    seconds = time.process_time() - start
    return float(psnr((out["data"] * std + mean).clamp(0, 1), x)), seconds


def main(argv: list[str]) -> None:
    from gi.world import data as gdata
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import NORMALIZATIONS, build

    opts = dict(a.split("=", 1) for a in argv)
    images = [int(i) for i in opts.get("images", ",".join(map(str, range(10)))).split(",")]
    torch.set_num_threads(1)
    ds = gdata.load("cifar10-samples")
    model = build("cnn6", 10, seed=int(opts.get("seed", 0)))
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in NORMALIZATIONS["cifar10"])
    net = breaching_cnn6(model, 3, 10)
    names = [n for n, _ in net.named_parameters()]
    ours_name = {f"layer{i}.weight": f"body.{2 * i}.weight" for i in range(6)} | {"fc.weight": "fc.weight",
                                                                                   "fc.bias": "fc.bias"}
    rows = []
    for k, i in enumerate(images):
        x = ds.images[i:i + 1]
        cap, _ = capture_gradients(model, x, ds.labels[i:i + 1], Protocol())

        ours = functools.partial(run_ours, cap, x)
        theirs = functools.partial(run_breaching, net, names, ours_name, cap, x, ds.labels[i:i + 1], mean, std)
        first, second = (ours, theirs) if k % 2 == 0 else (theirs, ours)
        a, b = first(), second()
        (o, t) = (a, b) if k % 2 == 0 else (b, a)
        rows.append((i, *o, *t))
        print(f"image {i}: ours {o[0]:7.2f} dB in {o[1]:5.2f} s   breaching rgap {t[0]:7.2f} dB in {t[1]:6.2f} s",
              flush=True)
    for j, what in ((1, "ours PSNR"), (3, "breaching PSNR")):
        vals = [r[j] for r in rows if r[j] == r[j]]
        if vals:
            print(f"{what}: mean {statistics.mean(vals):.2f} / median {statistics.median(vals):.2f} / "
                  f"min {min(vals):.2f} dB over {len(vals)} image(s)")
    for j, what in ((2, "ours CPU s"), (4, "breaching CPU s")):
        print(f"{what}: median {statistics.median(r[j] for r in rows):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
