"""A small Flower federation on Fashion-MNIST, recorded by gi, then RLU on the recorded client updates.

Flower 1.42 (``pip install 'gi[flower]'``) runs its own server loop and FedAvg aggregation in this process
(:func:`gi.world.fl.flower.run_in_process`: no Ray, no network). The strategy is
:class:`gi.world.fl.flower.CapturingFedAvg`,
which keeps every client's update as a :class:`gi.Capture` with the protocol filled from the fit config (``lr``,
``batch_size``, ``local_steps``). The clients are ordinary Flower ``NumPyClient`` s training a user CNN (head
``classifier``) with ``torch.optim.SGD``. The attacker then runs RLU (``labels.recover(capture, "rlu", aux)``,
with 10 labelled Fashion-MNIST test images per class as aux data) on each recorded update and compares with the
labels the client really trained on; the federation's own test accuracy is printed beside the attack's.

Run from the repository root::

    PYTHONPATH=. python examples/flower_fmnist.py                      # 4 clients × 64 images, 3 rounds, 1 and 5 steps
    PYTHONPATH=. python examples/flower_fmnist.py --clients 8 --rounds 5 --steps 1 5 10
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import torch
import torch.nn.functional as F
from flwr.client import NumPyClient
from torch import nn


class FmnistNet(nn.Module):
    """conv k×k (c₁) → ReLU → pool → conv k×k (c₂) → ReLU → pool → fc ``hidden`` → ReLU → classifier (10); by
    default k = 5, (c₁, c₂) = (8, 16), hidden 128."""

    def __init__(self, num_classes: int = 10, channels: tuple[int, int] = (8, 16), kernel: int = 5,
                 hidden: int = 128) -> None:
        super().__init__()
        (c1, c2), pad = channels, kernel // 2
        self.body = nn.Sequential(nn.Conv2d(1, c1, kernel, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(c1, c2, kernel, padding=pad), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                  nn.Linear(c2 * 7 * 7, hidden), nn.ReLU())
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.body(x))


def make_net(num_classes: int = 10, seed: int = 0, channels: tuple[int, int] = (8, 16), kernel: int = 5,
             hidden: int = 128) -> FmnistNet:
    """The factory the captures record (``examples.flower_fmnist:make_net`` and its keyword arguments)."""
    torch.manual_seed(seed)
    return FmnistNet(num_classes, tuple(channels), kernel, hidden)


class FmnistClient(NumPyClient):
    """A Flower client: plain SGD on its own images, ``local_steps`` fresh batches of ``batch_size`` (reshuffled
    every pass, the last incomplete batch dropped). ``seen[round]`` keeps the labels it trained on (for scoring
    the attack only: the server never sees it)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, seed: int, **net: Any) -> None:
        from gi.world.models import from_factory

        self.model = from_factory("examples.flower_fmnist:make_net", **net)  # net: make_net's keyword arguments
        self.images, self.labels = images, labels
        self.gen = torch.Generator().manual_seed(seed)
        self.seen: dict[int, list[int]] = {}

    def get_parameters(self, config):
        from gi.world.fl.flower import state_to_ndarrays

        return state_to_ndarrays(self.model)

    def fit(self, parameters, config):
        from gi.world.fl.flower import ndarrays_to_state, state_to_ndarrays

        self.model.load_state_dict(ndarrays_to_state(self.model, parameters))
        self.model.eval()  # no dropout / BatchNorm here; eval is the protocol's default mode
        batch, n = int(config["batch_size"]), len(self.labels)
        opt = torch.optim.SGD(self.model.parameters(), lr=float(config["lr"]))
        perm, pos = torch.randperm(n, generator=self.gen), 0
        counts = torch.zeros(10, dtype=torch.long)
        for _ in range(int(config["local_steps"])):
            if pos + batch > n:
                perm, pos = torch.randperm(n, generator=self.gen), 0
            idx = perm[pos:pos + batch]
            pos += batch
            opt.zero_grad()
            F.cross_entropy(self.model(self.images[idx]), self.labels[idx]).backward()
            opt.step()
            counts += torch.bincount(self.labels[idx], minlength=10)
        self.seen[int(config["round"])] = counts.tolist()
        return state_to_ndarrays(self.model), n, {}


def federate(steps: int, args: argparse.Namespace) -> dict:
    import labels
    from gi.world.data import load
    from gi.world.fl.flower import CapturingFedAvg, ndarrays_to_state, run_in_process
    from gi.world.fl.partition import dirichlet_partition
    from gi.world.models import from_factory

    train, test = load("fashion-mnist", "train"), load("fashion-mnist", "test")
    gen = torch.Generator().manual_seed(args.seed)
    pool = torch.randperm(len(train), generator=gen)[:args.clients * args.samples]
    parts = dirichlet_partition(train.labels[pool], args.clients, args.alpha, gen, min_size=args.batch)
    clients = [FmnistClient(train.images[pool[p]], train.labels[pool[p]], args.seed + i) for i, p in enumerate(parts)]
    ev_x, ev_y = test.images[:args.eval], test.labels[:args.eval]
    aux_idx = torch.cat([torch.nonzero(test.labels[5000:] == c).flatten()[:args.aux] + 5000 for c in range(10)])
    aux = test.subset(aux_idx)
    model = from_factory("examples.flower_fmnist:make_net")

    @torch.no_grad()
    def evaluate(server_round, arrays, config):
        model.load_state_dict(ndarrays_to_state(model, arrays))
        model.eval()
        logits = model(ev_x)
        return float(F.cross_entropy(logits, ev_y)), {"accuracy": float((logits.argmax(1) == ev_y).float().mean())}

    strategy = CapturingFedAvg(
        model, in_shape=(1, 28, 28), evaluate_fn=evaluate, fraction_evaluate=0.0,
        min_fit_clients=args.clients, min_available_clients=args.clients,
        on_fit_config_fn=lambda r: {"lr": args.lr, "batch_size": args.batch, "local_steps": steps, "round": r})
    history = run_in_process(strategy, clients, args.rounds)
    accuracy = {int(r): float(a) for r, a in history.metrics_centralized["accuracy"]}
    rows = []
    for rnd, cid, capture in strategy.captures:
        result = labels.recover(capture, "rlu", aux=aux)
        truth = clients[int(cid)].seen[rnd]
        got = result.info["labelled_counts"]
        rows.append({"steps": steps, "round": rnd, "client": cid, "exact": got == truth,
                     "count_accuracy": sum(min(a, b) for a, b in zip(got, truth)) / sum(truth),
                     "fed_accuracy_before": accuracy.get(rnd - 1)})
    exact = sum(r["exact"] for r in rows)
    summary = {"steps": steps, "captures": len(rows), "exact": exact,
               "mean_count_accuracy": sum(r["count_accuracy"] for r in rows) / max(len(rows), 1),
               "federation_accuracy": accuracy, "last_layer": strategy.captures[0][2].last_layer_name,
               "protocol": {k: getattr(strategy.captures[0][2].protocol, k)
                            for k in ("lr", "batch_size", "local_steps", "num_samples")}}
    return {"rows": rows, "summary": summary}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64, help="training images per client (on average)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 5], help="local steps (one federation each)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of the client split")
    parser.add_argument("--aux", type=int, default=10, help="aux images per class for RLU")
    parser.add_argument("--eval", type=int, default=2000, help="test images for the federation's accuracy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = []
    for steps in args.steps:
        res = federate(steps, args)
        for row in res["rows"]:
            print(json.dumps(row))
        print(json.dumps(res["summary"]))
        out.append(res["summary"])
    return out


if __name__ == "__main__":
    main()
