"""Count host synchronisations inside the training step of a packed GPU reconstruction (issue 15).

``torch.cuda.set_sync_debug_mode("warn")`` warns on every synchronising CUDA call; a Lightning callback turns
it on at the start of every training batch and off at its end, so set-up, the final scoring and the history
(``log_every``, set past the run here) are not counted. Prints the count and the distinct call sites; exit 1
when any synchronisation happened inside a step.
"""

from __future__ import annotations

import collections
import sys
import traceback
import warnings

import lightning as L
import torch

from gi import data as gdata
from gi.capture import capture_gradients
from gi.fl.protocol import Protocol
from gi.label_result import LabelResult
from gi.models import build
from gi.recon import ReconConfig, reconstruct_many


class SyncWatch(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        torch.cuda.set_sync_debug_mode("default")


def main() -> int:
    ds = gdata.load("cifar10-samples")
    model = build("lenet", 10, init="uniform", seed=0)
    captures, labels = [], []
    for i in range(20):
        c, t = capture_gradients(model, ds.images[i:i + 1], ds.labels[i:i + 1], Protocol())
        captures.append(c)
        labels.append(LabelResult.from_counts("truth", t.counts, soft=t.targets))
    cfg = ReconConfig(iterations=50, lr=0.01, regularizers={"tv": 2e-3}, device="gpu", progress=False,
                      log_every=10**6)
    sites: collections.Counter[str] = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # the innermost gi frame
        if "synchroniz" in str(message).lower():
            ours = [f for f in traceback.extract_stack() if "/gi/" in f.filename]
            sites[f"{ours[-1].filename}:{ours[-1].lineno}" if ours else f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        reconstruct_many(captures, labels, config=cfg, callbacks=[SyncWatch()])
    syncs = sum(sites.values())
    print(f"{torch.cuda.get_device_name()}: {syncs} host synchronisation(s) in 50 packed training steps")
    for site, count in sites.most_common():
        print(f"  {count:5d} at {site}")
    return 1 if syncs else 0


if __name__ == "__main__":
    sys.exit(main())
