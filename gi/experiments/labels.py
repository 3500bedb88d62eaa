"""``gi labels CONFIG``: the label-recovery benchmark (one table per config, every method on the same captures).

A config names a victim scenario (:mod:`gi.world.scenarios`), its ``setup``, an optional ``grid`` of setup
values (one table row group per grid point), the label methods to compare and the metrics to show.
Every method sees exactly the same captures; trials that share an auxiliary set are recovered in one
vectorised call (:func:`labels.recover_many`). Output: ``trials.csv`` (one row per trial and method; with
``global_acc``, the global model's test accuracy, where the scenario measured one: fedavg-client ``eval_samples``),
``summary.csv`` / ``summary.md`` / ``summary.json`` (means per grid point and method, with the paper's
value next to ours where the config gives one), ``config.yaml``, ``plot.png`` and the log.

The methods are the ``labels`` section's (:class:`gi.attack.stages.LabelTable`, docs/usage.md "The labels section"):
``labels.methods`` lists them, ``labels.variants`` names a method with fixed options (``{no-null: {method: decaf,
options: {null_removal: false}}}``, or ``{posterior: {options: {dtype: float32}}}`` for a method's own options) so
one table compares switches of the same method; ``labels.methods`` lists variants like methods. Pooled metrics
(:data:`gi.analysis.metrics.POOLED_METRICS`: ``absent_precision``, ``absent_recall``) are Σ hits / Σ decisions over
every trial of a row, not means. ``proportion_class: c`` adds ``proportions.png``: the estimated against the true
proportion of class c, one point per captured client (Ramakrishna & Dán Figs. 5–6), and ``p_true`` / ``p_hat`` to
``trials.csv``. ``pool: [key, ...]`` pools grid keys into one summary row (e.g. ``pool: [round]`` averages rounds
1–10 as Decaf Figs. 7–8 do); ``trials.csv`` keeps every point in its ``grid`` column. Trials that carry earlier
rounds (``Trial.history``, fedavg-client ``average_from``) are attacked over all their rounds and the distributions
averaged (:func:`labels.recover_rounds`, Decaf Fig. 6 d). ``diagnostics: {name: options}`` adds figures of the
attacker's aux set through each grid point's first trial's global model, one registered entry each
(:mod:`gi.experiments.labels_diagnostics`): ``posteriors: {}`` writes ``posteriors.png`` / ``posteriors.csv``, per
class j the box of p_j over the aux samples of class j (positive) and over the other classes' (negative), the
posterior paper's Fig. 2 and the premise of its eq. 3; ``logit_histograms: {pairs, bins}`` writes ``logits.png``
and ``logit-means.json``, histograms of the ``[n, j]`` pairs and the class means μ (RLU App. B.3, Figs. 4–9).
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from gi.core.errors import ConfigError
from gi.experiments.config.labels import LabelBenchConfig, grid_points
from gi.experiments.labels_diagnostics import collect_diagnostics
from gi.experiments.labels_output import write_label_bench
from gi.experiments.outdir import link_latest, staged_output, stamped_out

log = logging.getLogger("gi.labels")


def _paper_value(cfg: LabelBenchConfig, point: str, method: str) -> float | None:
    for key in (point, "*"):
        if key in cfg.paper and method in cfg.paper[key]:
            return cfg.paper[key][method]
    return None


def run_label_bench(cfg: LabelBenchConfig) -> Path:
    """Run the benchmark and write its output directory; returns the directory."""
    import torch
    from tqdm.auto import tqdm

    from gi.analysis.metrics import label_metrics
    from gi.world.scenarios import get_scenario

    scenario = get_scenario(cfg.scenario)
    out = Path(cfg.out) if cfg.out else stamped_out(cfg.name, "runs/labels")
    points = grid_points(cfg)
    summary_labels = [p for p, _ in grid_points(cfg, pooled=True)]
    rows: list[dict[str, Any]] = []
    collected: dict[str, dict[str, Any]] = {}  # diagnostics: name → grid point → its data
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        bar = tqdm(total=len(points) * cfg.trials, desc=f"{cfg.name}: captures", disable=not cfg.progress)
        for p_index, (point, setup) in enumerate(points):
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + p_index)
            trials = []
            for t in range(cfg.trials):
                for k, trial in enumerate(scenario(copy.deepcopy(setup), gen, t)):
                    trials.append((t, k, trial))
                bar.update(1)
            collect_diagnostics(cfg, point, trials[0][2], collected)
            groups: dict[tuple[int, int], list[tuple[int, int, Any]]] = defaultdict(list)
            for entry in trials:
                groups[(id(entry[2].aux), len(entry[2].history))].append(entry)
            for method in cfg.labels.methods:
                base, options = cfg.labels.call(method)
                for (_, earlier), entries in groups.items():
                    results, per, per_cpu = recover_timed(cfg.timing_repeats, base, options, entries, earlier)
                    for (t, k, trial), res in zip(entries, results):
                        row = {"point": summary_labels[p_index], "grid": point, "trial": t, "message": k,
                               "group": trial.group, "method": method,
                               **label_metrics(res, trial.truth),
                               "seconds": float(res.info.get("seconds", per) if cfg.timing_repeats == 1 else per),
                               "cpu_seconds": per_cpu, "reason": res.info.get("reason", "")}
                        if trial.capture.meta.get("global_acc") is not None:  # the scenario's test accuracy of θᵗ
                            row["global_acc"] = float(trial.capture.meta["global_acc"])
                        if cfg.proportion_class is not None:
                            row.update(class_proportions(res, trial.truth, cfg.proportion_class))
                        rows.append(row)
            log.info("%s: %d captures, %d methods", point, len(trials), len(cfg.labels.methods))
        bar.close()
        print(write_label_bench(tmp, cfg, rows, summarize_rows(cfg, rows), list(dict.fromkeys(summary_labels)), t0,
                                collected))
    if not cfg.out:  # runs/<name>-latest names the newest (docs/usage.md, "Where a run writes")
        link_latest(out, cfg.name)
    return out


def recover_timed(repeats: int, method: str, options: dict[str, Any], entries: list[tuple[int, int, Any]],
                  earlier: int) -> tuple[list[Any], float, float]:
    """One label method on one group of captures (``entries`` of ``(trial, message, Trial)``) ``repeats`` times:
    the first run's results and the median wall and CPU (process) seconds per capture over the runs. ``earlier``
    rounds of history: the multi-round attack (every round recovered, the distributions averaged)."""
    import labels

    caps = [e[2].capture for e in entries]
    aux = entries[0][2].aux
    results, walls, cpus = None, [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        if earlier:
            rounds = [[e[2].history[i] for e in entries] for i in range(earlier)] + [caps]
            out = labels.recover_rounds(rounds, method, aux=aux, **options)
        else:
            out = labels.recover_many(caps, method, aux=aux, **options)
        walls.append((time.perf_counter() - start) / len(caps))
        cpus.append((time.process_time() - cpu) / len(caps))
        results = out if results is None else results
    return results, statistics.median(walls), statistics.median(cpus)


def summarize_rows(cfg: LabelBenchConfig, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means per (grid point, method) of the chosen metrics (pooled ratios for
    :data:`gi.analysis.metrics.POOLED_METRICS`),
    success rate, median seconds, paper value."""
    from gi.analysis.metrics import POOLED_METRICS

    out = []
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        keyed[(r["point"], r["method"])].append(r)
    for (point, method), rs in keyed.items():
        row: dict[str, Any] = {"point": point, "method": method, "n": len(rs)}
        for m in cfg.metrics:
            if m in POOLED_METRICS:
                num, den = (sum(float(r[k]) for r in rs if r.get(k) is not None) for k in POOLED_METRICS[m])
                row[m] = num / den if den > 0 else None
                continue
            vals = [float(r[m]) for r in rs if m in r and r[m] is not None]
            row[m] = sum(vals) / len(vals) if vals else None
        paper = _paper_value(cfg, point, method)
        if paper is not None:
            row[f"paper_{cfg.metrics[0]}"] = paper
        row["ok_rate"] = sum(float(r.get("ok", 1.0)) for r in rs) / len(rs)
        secs = sorted(float(r["seconds"]) for r in rs)
        row["median_ms"] = 1000 * secs[len(secs) // 2]
        cpu = sorted(float(r["cpu_seconds"]) for r in rs if r.get("cpu_seconds") is not None)
        if cpu:
            row["median_cpu_ms"] = 1000 * cpu[len(cpu) // 2]
        out.append(row)
    return out


def class_proportions(result: Any, truth: Any, cls: int) -> dict[str, float]:
    """``p_true`` / ``p_hat``: the true and estimated proportion of class ``cls`` (uniform for a failed result)."""
    true = truth.counts.double()
    if cls >= true.numel():
        raise ConfigError(f"proportion_class={cls} is not a class of this data ({true.numel()} classes)")
    hat = result.proportions if result.proportions is not None else None
    p_hat = float(hat[cls]) if hat is not None else 1.0 / true.numel()
    return {"p_true": float(true[cls] / true.sum()), "p_hat": p_hat}


