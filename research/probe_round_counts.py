"""Probe for docs/results/client-round.md ("The round's per-class counts"): how often are a one-epoch FedAvg round's
per-class counts exact, per label estimator, on the clients of configs/labels/client-round-counts.yaml (untrained
CNN, E = 1, B = 5, N = 50, aux 10 per class)?

Stage ``inputs`` disaggregates each client's hidden layer once (the linear programs of
``fcn_analytic.disaggregate.linear_inputs``, as the ``fc-inputs`` label method does) and stores the inputs and
output errors under DIR; stage ``score`` reads them and scores the estimators:

- ``fc-inputs-logits``: the inputs forwarded at θᵗ, the head's update solved by least squares for each δ_i,
  y = softmax(z) − δ (the method before this probe);
- ``hidden-error``: each sample's head error g_i from its hidden-layer output error e_i = relu'(z_i) ⊙ W₂ᵀ g_i
  (least squares on its active units, W₂ at θᵗ), y_i = argmin g_i;
- ``hidden-error+bias``: the same labels, then the head's summed bias update Σ_i g_i = −B Δb/η read for the
  samples whose errors do not look like one cross-entropy error (the classes of missed inputs);
- ``rlu``: RLU on the update (aux data).

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


def head_errors(capture, inputs: torch.Tensor, errors: torch.Tensor, per_mean: int, active_tol: float = 1e-3
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's head error g_i (B × C) from its hidden output error e_i = relu'(z_i) ⊙ W₂ᵀ g_i: least squares
    on the units where e_i is not zero (W₂ at θᵗ); and each fit's relative residual."""
    w2 = capture.model().get_submodule(capture.last_layer_name).weight.detach().double()  # C × H, at θᵗ
    e = errors.double() * per_mean
    out, res = [], []
    for row in e:
        act = row.abs() > active_tol * row.abs().max()
        a = w2[:, act].T  # (active, C)
        g = torch.linalg.lstsq(a, row[act, None]).solution.squeeze(1)
        out.append(g)
        res.append(float((a @ g - row[act]).norm() / row[act].norm()))
    return torch.stack(out), torch.tensor(res)


def forward_masks(capture, layer: str, inputs: torch.Tensor) -> torch.Tensor:
    """Which hidden units each found input turns on at θᵗ (B × H, bool): W₁ x_i + b₁ > 0."""
    lin = capture.model().get_submodule(layer).double()
    with torch.no_grad():
        return lin(inputs.double()) > 0


def fit_errors(w2: torch.Tensor, masks: torch.Tensor, e: torch.Tensor, basis: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: e_i ≈ D_i W₂ᵀ g_i + U a_i (least squares, all H units), U = ``basis`` (H × k, the errors of
    samples judged spurious: the span their missed samples' errors leak into); returns g (B × C) and each fit's
    relative residual."""
    a = masks.double()[:, :, None] * w2.T[None]  # B × H × C
    if basis.shape[1]:
        a = torch.cat([a, basis[None].expand(len(e), -1, -1)], 2)
    sol = torch.linalg.lstsq(a, e[:, :, None]).solution
    res = (a @ sol).squeeze(2) - e
    return sol[:, : w2.shape[0], 0], res.norm(dim=1) / e.norm(dim=1).clamp_min(1e-30)


def decontaminate(w2: torch.Tensor, masks: torch.Tensor, e: torch.Tensor, most: int = 6, gain: float = 0.7
                  ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Greedily pick found samples as spurious (their errors span the leak of missed inputs) while the others' fit
    improves: returns g, residuals and the spurious set."""
    spurious: list[int] = []
    g, res = fit_errors(w2, masks, e, e[:0].T)
    score = float(res.median())
    for _ in range(most):
        best = None
        for s in range(len(e)):
            if s in spurious:
                continue
            pick = spurious + [s]
            keep = torch.ones(len(e), dtype=torch.bool)
            keep[pick] = False
            g2, r2 = fit_errors(w2, masks[keep], e[keep], e[pick].T)
            sc = float(r2.median())
            if best is None or sc < best[0]:
                best = (sc, s)
        if best is None or best[0] > gain * score:
            break
        score = best[0]
        spurious.append(best[1])
    keep = torch.ones(len(e), dtype=torch.bool)
    keep[spurious] = False
    g = torch.zeros(len(e), w2.shape[0], dtype=e.dtype)
    res = torch.zeros(len(e), dtype=e.dtype)
    g[keep], res[keep] = fit_errors(w2, masks[keep], e[keep], e[spurious].T)
    return g, res, spurious


def bias_fill(capture, g: torch.Tensor, good: torch.Tensor, per_mean: int) -> torch.Tensor:
    """Counts from the samples judged ``good`` (argmin of their g_i) plus the classes of the others read from the
    head's bias identity Σ_i g_i = −B Δb/η: their Σ (p − y) is the rest R, so Σ y = Σ p − R with Σ p ≈ (#bad)/C
    each class (an untrained head)."""
    c = g.shape[1]
    bias = capture.shared[capture.last_layer_keys[1]].double() * (-per_mean / capture.protocol.lr)
    counts = torch.bincount(g[good].argmin(1), minlength=c)
    bad = int((~good).sum())
    if bad:
        rest = bias - g[good].sum(0)
        want = (bad / c - rest)  # Σ_bad y ≈ Σ_bad p − R
        fill = torch.zeros(c, dtype=torch.long)
        for _ in range(bad):  # greedy: the class most wanted, one sample at a time
            j = int(want.argmax())
            fill[j] += 1
            want[j] -= 1
        counts = counts + fill
    return counts


def stage_score(out: Path, argv: list[str]) -> None:
    """Score the estimators on every stored client (module docstring)."""
    from fcn_analytic.disaggregate import sample_errors
    from labels.fc_inputs import complete_inputs, hidden_errors, labels_from_inputs

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
