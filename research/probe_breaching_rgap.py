"""Does breaching 0.1.2's own R-GAP (``attack=rgap``, its ``RecursiveAttacker``) run on the DLG LeNet of
configs/default.yaml (image 0 of cifar10-samples, model seed 0)?

docs/results/time-to-quality.md: it stops at once with an ``UnboundLocalError``: its recursion computes a
layer's pre-activation only after a LeakyReLU or Identity (the sigmoid of the DLG LeNet leaves it unset), and it
reads bias-free gradients. Run with breaching on the path (install: docs/usage.md):

    PYTHONPATH=$PWD:/tmp/br python research/probe_breaching_rgap.py
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch


def main() -> None:
    import breaching

    from gi.analysis.metrics import psnr
    from gi.experiments.ttq import without_normalize
    from gi.world import data as gdata
    from gi.world.fl.protocol import Protocol
    from gi.world.fl.victim import capture_gradients
    from gi.world.models import build

    torch.set_num_threads(1)
    ds = gdata.load("cifar10-samples")
    cap, _ = capture_gradients(build("lenet", 10, init="uniform", seed=0), ds.images[:1], ds.labels[:1], Protocol())
    model, mean, std = without_normalize(cap.model().eval())  # wired as ttq.breaching_setup wires breaching
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), breaching.get_attack_config("rgap"),
                                                dict(dtype=torch.float, device=torch.device("cpu")))
    meta = SimpleNamespace(shape=tuple(cap.model_spec["in_shape"]), modality="vision", mean=mean, std=std)
    payload = [dict(parameters=[p.detach() for p in model.parameters()], buffers=list(model.buffers()), metadata=meta)]
    names = [n for n, _ in model.named_parameters()]
    shared = [dict(gradients=[cap.gradients[n] for n in names], buffers=None,
                   metadata=dict(num_data_points=1, labels=ds.labels[:1], local_hyperparams=None))]
    start = time.perf_counter()
    try:
        out, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    except Exception as e:  # report what breaching raises, whatever it is
        print(f"breaching rgap failed after {time.perf_counter() - start:.2f} s: {type(e).__name__}: {e}")
        return
    x = out["data"] * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)
    print(f"breaching rgap: {float(psnr(x.clamp(0, 1), ds.images[:1])):.2f} dB in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
