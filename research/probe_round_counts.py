"""Probe for docs/results/client-round.md ("The round's per-class counts"): how often are a one-epoch FedAvg round's
per-class counts exact, per label estimator, on the clients of configs/labels/client-round-counts.yaml (untrained
CNN, E = 1, B = 5, N = 50, aux 10 per class)?

Stage ``inputs`` disaggregates each client's hidden layer once (the linear programs of
``fcn_analytic.disaggregate.linear_inputs``, as the ``fc-inputs`` label method does) and stores the inputs and
output errors under DIR; stage ``score`` reads them and scores the estimators:

- ``fc-inputs-logits``: the inputs forwarded at θᵗ, the head's update solved by least squares for each δ_i,
  y = softmax(z) − δ (the method before this probe);
- ``hidden-error``: each sample's head error g_i from its own hidden-layer output error e_i = relu'(z_i) ⊙ W₂ᵀ g_i
  (least squares on its active units, W₂ at θᵗ), y_i = argmin g_i, on the inputs as found;
- ``completed``: the same after ``complete_inputs`` (of fcn_analytic.disaggregate: missed inputs found again
  by linear programs orthogonal to the sure ones);
- ``fc-inputs``: ``labels.fc_inputs.labels_from_inputs`` on the inputs as found (the completion, the leak of
  inputs still doubtful fitted out, their classes from the head's bias identity);
- ``rlu``: RLU on the update (aux data).

The label method itself now searches the vertices with orthogonal objectives from the start
(``labels.fc_inputs.vertex_inputs``); ``gi labels`` measures it (docs/results/client-round.md).

    GI_CACHE_DIR=/tmp/gicache PYTHONPATH=$PWD python research/probe_round_counts.py inputs DIR [trials=2]
    GI_CACHE_DIR=/tmp/gicache PYTHONPATH=$PWD python research/probe_round_counts.py score DIR [trials=2]
"""

import copy
import sys
import time
from pathlib import Path

import torch

import labels
from fcn_analytic.disaggregate import first_linear, linear_inputs, summed_layer
from gi.core.config import load
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.world.scenarios import get_scenario

CONFIG = "configs/labels/client-round-counts.yaml"


def clients(argv: list[str]):
    """Every client (trial, index, Trial) of the config's E = 1, aux 10 point, ``trials`` federations."""
    cfg = load(LabelBenchConfig, CONFIG, ["grid={}", *[a for a in argv if "=" in a]])
    scenario = get_scenario(cfg.scenario)
    (_, setup), = grid_points(cfg)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003)
    for t in range(cfg.trials):
        for k, trial in enumerate(scenario(copy.deepcopy(setup), gen, t)):
            yield t, k, trial


def stage_inputs(out: Path, argv: list[str]) -> None:
    """Disaggregate each client's hidden layer; store inputs, output errors and CPU seconds."""
    out.mkdir(parents=True, exist_ok=True)
    for t, k, trial in clients(argv):
        path = out / f"{t}_{k}.pt"
        if path.exists():
            continue
        capture = trial.capture
        name = first_linear(capture.model())
        summed = summed_layer(capture, name)
        start = time.process_time()
        found = linear_inputs(summed.weight, summed.bias, summed.samples, **summed.tolerances)
        seconds = time.process_time() - start
        torch.save({"inputs": found.inputs, "errors": found.output_errors, "seconds": seconds,
                    "residual": found.residual}, path)
        print(f"{t}_{k}: {seconds:.1f} CPU s, residual {found.residual:.1e}", flush=True)


def train_images() -> torch.Tensor:
    """The clients' split (Fashion-MNIST train): the truth of a federation keeps indices, not pixels."""
    from gi.world import data as gdata

    return gdata.load("fashion-mnist", "train").images


def true_inputs(capture, images: torch.Tensor) -> torch.Tensor:
    """The hidden layer's true inputs at θᵗ (the max-pooled ReLU map), float64."""
    model = capture.model().double()
    with torch.no_grad():
        return model.body[0](model.normalize(images.double()))


def stage_score(out: Path, argv: list[str]) -> None:
    """Score the estimators on every stored client (module docstring)."""
    from fcn_analytic.disaggregate import complete_inputs, sample_errors
    from labels.fc_inputs import hidden_errors, labels_from_inputs

    rows: dict[str, list[torch.Tensor]] = {m: [] for m in ("fc-inputs-logits", "hidden-error", "completed",
                                                           "fc-inputs", "rlu", "truth")}
    seconds: dict[str, list[float]] = {"lp": [], "complete": [], "rlu": []}
    for t, k, trial in clients(argv):
        capture, truth = trial.capture, trial.truth
        if not (out / f"{t}_{k}.pt").exists():
            continue
        saved = torch.load(out / f"{t}_{k}.pt")
        name = first_linear(capture.model())
        summed = summed_layer(capture, name)
        true = truth.counts.long()
        rows["truth"].append(true)
        x = true_inputs(capture, train_images()[truth.extra["indices"]])
        logits, errs = sample_errors(capture, name, saved["inputs"], summed.per_mean)
        soft = (torch.softmax(logits, 1) - errs).clamp(0, 1)
        rows["fc-inputs-logits"].append(torch.bincount(soft.argmax(1), minlength=10))
        g = hidden_errors(capture, name, saved["inputs"], saved["errors"] * summed.per_mean)[1]
        rows["hidden-error"].append(torch.bincount(g.argmin(1), minlength=10))
        start = time.process_time()
        done, added, doubtful = complete_inputs(summed.weight, summed.bias, saved["inputs"], **summed.tolerances)
        _, gc, fit = hidden_errors(capture, name, done.inputs, done.output_errors * summed.per_mean)
        rows["completed"].append(torch.bincount(gc.argmin(1), minlength=10))
        result = labels_from_inputs(capture, name, summed, saved["inputs"])
        seconds["complete"].append(time.process_time() - start)
        rows["fc-inputs"].append(result.counts)
        start = time.process_time()
        rows["rlu"].append(labels.recover(capture, "rlu", aux=trial.aux).counts.long())
        seconds["rlu"].append(time.process_time() - start)
        seconds["lp"].append(saved["seconds"])
        hits = []
        for inputs in (saved["inputs"], done.inputs):
            cos = torch.nn.functional.normalize(inputs, dim=1) @ torch.nn.functional.normalize(x, dim=1).T
            best, which = cos.max(1)
            hits.append(int((torch.bincount(which[best > 0.99], minlength=len(x)) > 0).sum()))
        wrong = int((gc[~doubtful].argmin(1) != truth.labels[which[~doubtful]]).sum())
        print(f"{t}_{k}: inputs hit {hits[0]} -> {hits[1]} of {len(x)} ({added} added, {seconds['complete'][-1]:.1f} "
              f"CPU s, {int(doubtful.sum())} doubtful); fit residual median {fit.median():.3f} max {fit.max():.3f}; "
              f"wrong labels among the sure {wrong}; bias residual {result.info.get('bias_residual', 0):.3f}; off: "
              + " ".join(f"{m} {int((r[-1] - true).abs().sum()) // 2}" for m, r in rows.items() if m != "truth"),
              flush=True)
    truth = torch.stack(rows.pop("truth"))
    for m, r in rows.items():
        r = torch.stack(r)
        ins = (torch.minimum(r, truth).sum(1).double() / truth.sum(1)).mean()
        exact = (r == truth).all(1)
        print(f"{m:18s} ins_acc {ins:.3f} exact {int(exact.sum())}/{len(r)} = {exact.double().mean():.2f}")
    print("CPU s per round (median): " + ", ".join(f"{k} {torch.tensor(v).median():.1f}" for k, v in seconds.items()))


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    stage, out = argv[0], Path(argv[1])
    {"inputs": stage_inputs, "score": stage_score}[stage](out, argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
