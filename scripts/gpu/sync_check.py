"""Count host synchronisations inside the training step of a packed GPU reconstruction (issue 15).

``torch.cuda.set_sync_debug_mode("warn")`` warns on every synchronising CUDA call; a Lightning callback turns it on
at the start of every training batch and off at its end, so set-up and the final scoring are not counted. The
history's steps (``gi.attack.recon.module.records_history``; the first and the last here: ``log_every`` is set past the
run) copy the objective to the host by design; they are counted apart. Prints the count, the steps and the distinct
call sites (the innermost frame of this project and the innermost frame of all); exit 1 when a synchronisation
happened inside a step that records no history. On an H200 (2026-11-27) the first version of this script counted 3
in 50 steps: two at the history's append (steps 0 and 49) and one inside ``trainer.fit`` (step not recorded then).
"""

from __future__ import annotations

import collections
import sys
import traceback
import warnings

import lightning as L
import torch

from gi.attack.recon import ReconConfig, reconstruct_many
from gi.attack.recon.module import records_history
from gi.label_result import LabelResult
from gi.world import data as gdata
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


class SyncWatch(L.Callback):
    step = -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        SyncWatch.step = batch_idx
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
    sites: collections.Counter[tuple] = collections.Counter()
    history = {s for s in range(cfg.iterations) if records_history(cfg, s)}  # log_every past the run: 0 and last

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # the innermost gi frame
        if "synchroniz" in str(message).lower():
            stack = traceback.extract_stack()
            inner = stack[-2] if len(stack) > 1 else stack[-1]  # the caller of the synchronising op (-1: here)
            ours = [f for f in stack if "/gi/" in f.filename]
            site = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else f"{filename}:{lineno}"
            sites[(SyncWatch.step in history, SyncWatch.step, site, f"{inner.filename}:{inner.lineno}")] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        reconstruct_many(captures, labels, config=cfg, callbacks=[SyncWatch()])
    syncs = sum(sites.values())
    stray = sum(n for (in_history, *_), n in sites.items() if not in_history)
    print(f"{torch.cuda.get_device_name()}: {syncs} host synchronisation(s) in {cfg.iterations} packed training "
          f"steps, {syncs - stray} in the history's steps {sorted(history)}, {stray} in other steps")
    for (in_history, step, site, inner), count in sorted(sites.items(), key=lambda kv: kv[0][1]):
        print(f"  {count:5d} at step {step}{' (history)' if in_history else ''}: {site} (innermost {inner})")
    return 1 if stray else 0


if __name__ == "__main__":
    sys.exit(main())
