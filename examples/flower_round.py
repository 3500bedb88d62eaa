"""A Flower federation on Fashion-MNIST, recorded by gi, then the images of every client's whole round.

Each client holds ``--samples`` images and trains one local epoch of reshuffled mini-batches of ``--batch`` with
``torch.optim.SGD`` (an ordinary Flower ``NumPyClient``, :class:`examples.flower_fmnist.FmnistClient`, on its net
with :data:`NET`: 3×3 convs of 32 and 64 channels, each followed by ReLU and a 2×2 max-pool, and a hidden
fully-connected layer of 256, so the hidden layer sees a 3136-value map of a 784-pixel image; with the 8 and 16
channels of ``examples/flower_fmnist.py``, a 784-value map, the inputs are read off the update just as exactly, but
the images fitted to them stay near 13 dB: the map does not pin the pixels).
:class:`gi.world.fl.flower.CapturingFedAvg` records every update as a :class:`gi.Capture`. The attacker then runs
``gi.attack.run`` with the ``fc-inputs`` preset on each update: the hidden layer's update −ΔW/η is a sum of batch
gradients whose rows span the client's inputs (``fcn_analytic.disaggregate.summed_layer``), so each image's input is
read off it, and the images are fitted to those inputs. Each client's images are then scored (matched one to one)
against what it really trained on, beside each image's own mean colour. The spread is reported over clients and over
initial models (``--seeds``).

Run from the repository root::

    PYTHONPATH=. python examples/flower_round.py                  # 4 clients × 32 images, 2 initial models
    PYTHONPATH=. python examples/flower_round.py --clients 8 --samples 50 --batch 5 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics

import torch

from examples.flower_fmnist import FmnistClient

NET = {"channels": [32, 64], "kernel": 3, "hidden": 256}  # make_net's keyword arguments: the round's CNN


def federate(seed: int, args: argparse.Namespace) -> list[dict]:
    """One federation of one round from the initial model of ``seed``; one row per client."""
    import gi
    from gi.world.data import load
    from gi.world.fl.flower import CapturingFedAvg, run_in_process
    from gi.world.models import from_factory

    train, test = load("fashion-mnist", "train"), load("fashion-mnist", "test")
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(len(train), generator=gen)[:args.clients * args.samples].view(args.clients, -1)
    clients = [FmnistClient(train.images[p], train.labels[p], seed * 1000 + i, **NET) for i, p in enumerate(pool)]
    aux_idx = torch.cat([torch.nonzero(test.labels == c).flatten()[:args.aux] for c in range(10)])
    aux = test.subset(aux_idx)
    model = from_factory("examples.flower_fmnist:make_net", seed=seed, **NET)
    steps = args.samples // args.batch  # one local epoch
    strategy = CapturingFedAvg(
        model, in_shape=(1, 28, 28), fraction_evaluate=0.0, min_fit_clients=args.clients,
        min_available_clients=args.clients,
        on_fit_config_fn=lambda r: {"lr": args.lr, "batch_size": args.batch, "local_steps": steps, "round": r})
    run_in_process(strategy, clients, num_rounds=1)
    rows = []
    for _, cid, capture in strategy.captures:
        result = gi.attack.run(capture, aux=aux, preset="fc-inputs", labels="auto", iterations=args.iterations,
                               lr=0.1, regularizers={"tv": 1.0e-4}, init="aux-mean", feature_draws=args.draws,
                               progress=False)
        truth = clients[int(cid)].images
        scores = gi.metrics.score(result.reconstructions[0].images.cpu(), truth)
        colour = gi.metrics.psnr(truth.mean((2, 3), keepdim=True).expand_as(truth).contiguous(), truth)
        rows.append({"seed": seed, "client": cid, "images": len(truth), "psnr_mean": scores["psnr_mean"],
                     "at_least_25_db": sum(p >= 25 for p in scores["psnr"]),
                     "mean_colour_psnr": float(colour.mean()),
                     "labels": result.label_results[0].method if result.label_results[0] else None})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32, help="training images per client (at most 256)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="initial models (one federation each)")
    parser.add_argument("--aux", type=int, default=10, help="aux images per class (labels and the start image)")
    parser.add_argument("--iterations", type=int, default=2000, help="steps of the images' fit to their inputs")
    parser.add_argument("--draws", type=int, default=100_000, help="the input search's sampling budget")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = [row for seed in args.seeds for row in federate(seed, args)]
    for row in rows:
        print(json.dumps(row))
    psnr = [r["psnr_mean"] for r in rows]
    share = [r["at_least_25_db"] / r["images"] for r in rows]
    print(json.dumps({"clients": len(rows), "psnr_mean": statistics.mean(psnr), "psnr_min_client": min(psnr),
                      "share_at_least_25_db": statistics.mean(share), "share_min_client": min(share),
                      "mean_colour_psnr": statistics.mean(r["mean_colour_psnr"] for r in rows)}))
    return rows


if __name__ == "__main__":
    main()
