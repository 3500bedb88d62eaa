"""``gi defend CONFIG``: which defence, at which strength, stops label and image leakage, and what does it cost?

For every defence × strength of the config (plus the undefended baseline) the **same** federation is trained
(same data, partition, initial model and seeds; only the protocol's defences differ, :mod:`gi.world.fl.defences`):

- **utility**: the global model's test accuracy after ``federation.rounds`` rounds
  (:func:`gi.world.fl.victim.run_federation`);
- **label leakage**: every captured client at ``federation.capture_round`` is attacked by each of
  ``labels.methods`` (``labels.recover`` with the attacker's aux set) on what that method reads: its ``update``
  (e.g. RLU), or (``gradient``, e.g. the posterior attack) a defended FedSGD gradient of ``label_batch`` of its
  samples at the same global model; ``label_acc`` = 1 − ½‖p̂ − p‖₁ (the proportion of the client's label
  distribution recovered, 1 = exact), ``ins_acc`` and ``prop_mse`` beside it. Under secure aggregation the
  server holds one group's message, so ``label_acc`` is scored against the group's labels and ``own_acc``
  against the target client's own labels (what the attacker wanted; equal to ``label_acc`` without groups);
- **image leakage**: ``images.count`` images of the first captured client (or of its secure-aggregation group),
  shared as defended FedSGD gradients of ``images.batch_size`` images at the same round's global model, are
  attacked by the default job's stages (:func:`gi.attack.stages.attack_stages`: labels of ``labels.mode``,
  e.g. ``recovered`` with ``auto``, then the last-layer features, then the ``attack`` recipe, which
  ``attack.preset`` fills as in ``gi run``); PSNR / LPIPS against the truth (matched one-to-one);
  ``images.oracle: true`` adds the same reconstruction with the true labels (``psnr_mean:oracle``, ...);
- DP-SGD rows report ε (Opacus' accountant, the entry's ``delta``) spent by a client over the ``rounds``.

Output directory: ``table.md`` / ``table.csv`` / ``metrics.json`` (one row per cell), ``results.csv`` (per image),
``clients.csv`` (per client and label method), a truth-over-reconstruction grid per cell, and privacy–utility
plots ``tradeoff-<metric>.png`` (leakage against accuracy, one curve per defence). Long runs resume like
``gi ablate``: finished cells are kept in ``.<out>.cells/`` (:func:`gi.experiments.outdir.save_cell`) and the same
command after an interruption computes only the missing ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

from gi.analysis.report import save_grid, write_yaml
from gi.attack.stages import (
    LabelConfig,
    attack_stages,
    derived_attack,
    variant_call,
)
from gi.core.config import to_dict
from gi.core.errors import GIError
from gi.experiments.config.defend import BASELINE, DefendConfig, cell_protocol, defence_sweep
from gi.experiments.defend_output import write_defend
from gi.experiments.outdir import (
    cells_dir,
    file_slug,
    link_latest,
    load_cell,
    restore_cell_file,
    save_cell,
    staged_output,
    stamped_out,
)
from gi.world.build import FederationSetup, build_federation_setup, group_capture
from gi.world.fl.protocol import Protocol

log = logging.getLogger("gi.experiments.defend")


# ----------------------------------------------------------------------------- one cell
def _label_leakage(cfg: DefendConfig, setup: FederationSetup, protocol: Protocol, model: Any,
                   captures: list[tuple[int, Any, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    import labels
    from gi.analysis.metrics import label_metrics, label_metrics_from_counts
    from gi.world.fl.defences import group_size

    batch = cfg.label_batch or protocol.batch_size
    gradient = {c: group_capture(cfg.seed, setup, protocol, model, c, group_size(protocol), batch, 0)
                for c, _, _ in captures} if "gradient" in cfg.labels.methods.values() else {}
    per_client, summary = [], {}
    for method, reads in cfg.labels.methods.items():
        scores = []
        for client, capture, truth in captures:
            if reads == "gradient":
                capture, truth = gradient[client]
            try:
                base, options = variant_call(cfg.labels.variants, method)
                result = labels.recover(capture, base, aux=setup.aux, **options)
                m = label_metrics(result, truth, match_soft=False)
                own = label_metrics_from_counts(result.counts, truth.meta.get("member_counts", [truth.counts])[0],
                                                pred_proportions=result.proportions)
                row = {"label_acc": 1 - 0.5 * m["l1"], "own_acc": 1 - 0.5 * own["l1"], "ins_acc": m["ins_acc"],
                       "prop_mse": m["prop_mse"], "ok": m["ok"]}
                if not result.ok:
                    row["error"] = result.info.get("reason")
            except GIError as exc:  # a method that cannot read this capture: no leakage from it
                row = {"label_acc": math.nan, "own_acc": math.nan, "ins_acc": math.nan, "prop_mse": math.nan,
                       "ok": 0.0, "error": str(exc)}
            scores.append(row)
            per_client.append({"client": client, "method": method, "reads": reads, **row})
        for key in ("label_acc", "own_acc", "ins_acc", "prop_mse"):
            vals = [s[key] for s in scores if not math.isnan(s[key])]
            summary[f"{key}:{method}"] = sum(vals) / len(vals) if vals else math.nan
    return summary, per_client


def _image_leakage(cfg: DefendConfig, setup: FederationSetup, protocol: Protocol, model: Any, first: int, group: int,
                   grid: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """PSNR / LPIPS of the default job's stages on ``images.count`` images of client ``first`` (its group's under
    secure aggregation), with the labels of ``labels.mode`` and, with ``images.oracle``, the true labels too."""
    import torch

    from gi.analysis.metrics import score, summarize

    bs = cfg.images.batch_size
    pairs = [group_capture(cfg.seed, setup, protocol, model, first, group, bs, k)
             for k in range(cfg.images.count // bs)]
    captures, truths = [c for c, _ in pairs], [t for _, t in pairs]
    runs = [("", cfg.labels)] + ([(":oracle", LabelConfig(mode="truth"))] if cfg.images.oracle else [])
    per_image: list[dict[str, Any]] = []
    summary: dict[str, float] = {}
    rows: list[Any] = [torch.cat([t.images for t in truths])]
    for suffix, lcfg in runs:
        attack = dataclasses.replace(derived_attack(lcfg, cfg.attack), progress=False)
        outcome = attack_stages(lcfg, attack, captures, truths, setup.aux)
        scored, rec_rows = [], []
        for k, (rec, truth) in enumerate(zip(outcome.reconstructions, truths)):
            sc = score(rec.images, truth.images, match=cfg.metrics.match, vgg=cfg.metrics.lpips_vgg)
            for i in range(truth.images.shape[0]):
                scored.append({"capture": k, "image": i, "labels": lcfg.mode, "psnr": sc["psnr"][i],
                               "ssim": sc["ssim"][i], "lpips": sc["lpips_alex"][i],
                               "true_label": int(truth.labels[i])})
            rec_rows.append(rec.images[torch.as_tensor(sc["perm"])] if "perm" in sc else rec.images)
        rows.append(torch.cat(rec_rows))
        psnr = summarize([r["psnr"] for r in scored])
        summary.update({f"psnr_mean{suffix}": psnr["mean"], f"psnr_median{suffix}": psnr["median"],
                        f"psnr_min{suffix}": psnr["min"],
                        f"lpips{suffix}": sum(r["lpips"] for r in scored) / len(scored)})
        per_image += scored
    summary["images"] = len(per_image) // len(runs)
    save_grid(grid, rows, scale=2)  # truth, then the reconstruction of each label mode
    return summary, per_image


def run_cell(cfg: DefendConfig, setup: FederationSetup, label: str, strength: float | None, protocol: Protocol,
             grid: Path) -> dict[str, Any]:
    """One defence at one strength: utility, label leakage and image leakage on the shared setup."""
    import torch

    from gi.world.fl import defences
    from gi.world.fl.victim import run_federation

    start = time.perf_counter()
    fed_cfg = cfg.federation
    fed = run_federation(setup.model, setup.pool, protocol, fed_cfg.num_clients, fed_cfg.rounds, None,
                         rng=torch.Generator().manual_seed(int(cfg.seed) + 1), partition=setup.partition,
                         capture_rounds=[fed_cfg.capture_round], capture_clients=fed_cfg.capture_clients,
                         eval_data=setup.eval_data)
    summary: dict[str, Any] = {"defence": label, "strength": strength,
                               "accuracy": fed.accuracy[fed_cfg.rounds + 1]}
    captures = [(c, cap, truth) for _, c, cap, truth in fed.captures]
    first = captures[0][1].meta.get("defences")  # what the capture records of its defences
    privacy = [d for d in first or [] if "epsilon" in d]
    if privacy:  # ε spent by the captured client over the whole training (its steps per round × rounds)
        cap = captures[0][1]
        rate = min(protocol.batch_size, cap.num_samples) / cap.num_samples
        rec = defences.record(protocol, int(cap.meta["num_steps"]) * fed_cfg.rounds, rate)
        summary["epsilon"] = next(d["epsilon"] for d in rec if "epsilon" in d)
        summary["delta"] = privacy[0]["delta"]
    model = fed.model(setup.model, fed_cfg.capture_round)
    label_summary, per_client = _label_leakage(cfg, setup, protocol, model, captures)
    summary.update(label_summary)
    per_image: list[dict[str, Any]] = []
    if cfg.images.count:
        image_summary, per_image = _image_leakage(cfg, setup, protocol, model, captures[0][0],
                                                  defences.group_size(protocol), grid)
        summary.update(image_summary)
    summary["seconds"] = time.perf_counter() - start
    for r in per_image + per_client:
        r.update(defence=label, strength=strength)
    return {"summary": summary, "per_image": per_image, "per_client": per_client}


# ----------------------------------------------------------------------------- the table
def cells(cfg: DefendConfig) -> list[tuple[str, float | None, Protocol]]:
    """``(label, strength, protocol)`` of every cell: the baseline first, then each defence at each strength."""
    out: list[tuple[str, float | None, Protocol]] = [(BASELINE, None, cfg.protocol)]
    for i, entry in enumerate(cfg.defences):
        sweep = defence_sweep(entry, f"defences[{i}]")
        out += [(sweep["label"], s, cell_protocol(cfg.protocol, sweep, s)) for s in sweep["strengths"]]
    return [c for c in out if cfg.only is None or c[0] in cfg.only]


def _cell_key(cfg: DefendConfig, protocol: Protocol) -> str:
    """Hash of everything that determines one cell (not the output paths, the other cells, the worker count)."""
    keep = {k: v for k, v in to_dict(cfg).items()
            if k not in ("out", "overwrite", "defences", "only", "protocol", "workers")}
    text = json.dumps([keep, to_dict(protocol)], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


_WORKER_SETUP: dict[str, FederationSetup] = {}


def compute_cell(cfg: DefendConfig, label: str, strength: float | None, protocol: Protocol, grid: Path,
                 setup: FederationSetup | None = None) -> dict[str, Any]:
    """One cell from a fresh seed: the same record whichever process computes it (a worker builds the shared
    setup once and keeps it)."""
    import torch

    if setup is None:  # a worker process: $GI_THREADS threads, else one (the workers share the cores)
        from gi.core.devices import env_threads

        torch.set_num_threads(env_threads() or 1)
        key = _cell_key(cfg, cfg.protocol)
        setup = _WORKER_SETUP.get(key) or _WORKER_SETUP.setdefault(key, build_federation_setup(cfg))
    torch.manual_seed(cfg.seed)
    return run_cell(cfg, setup, label, strength, protocol, grid)


def _report_cell(label: str, strength: float | None, cfg: DefendConfig, record: dict[str, Any]) -> None:
    s = record["summary"]
    leak = "  ".join(f"{m} {s[f'label_acc:{m}']:.3f}" for m in cfg.labels.methods)
    eps = f"  ε {s['epsilon']:.3g}" if "epsilon" in s else ""
    print(f"  {label:>16s} {strength!s:>8s}  acc {s['accuracy']:.3f}  {leak}  PSNR {s.get('psnr_mean', math.nan):5.2f}"
          f"{eps}  ({s['seconds']:.0f} s)", flush=True)


def _compute_cells(cfg: DefendConfig, todo: list[tuple[str, float | None, Protocol, str, Path]],
                   cache: Path) -> None:
    """Compute the missing cells, ``cfg.workers`` at a time (spawned processes), keeping each as it finishes."""
    if cfg.workers == 1 or len(todo) == 1:
        setup = build_federation_setup(cfg) if todo else None
        for label, strength, protocol, key, grid in todo:
            record = compute_cell(cfg, label, strength, protocol, grid, setup)
            save_cell(cache, key, record, {"png": grid})
            _report_cell(label, strength, cfg, record)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(min(cfg.workers, len(todo)), mp_context=mp.get_context("spawn")) as pool:
        jobs = {pool.submit(compute_cell, cfg, label, strength, protocol, grid): (label, strength, key, grid)
                for label, strength, protocol, key, grid in todo}
        for job in as_completed(jobs):
            label, strength, key, grid = jobs[job]
            record = job.result()
            save_cell(cache, key, record, {"png": grid})
            _report_cell(label, strength, cfg, record)


def run_defend(cfg: DefendConfig) -> Path:
    """Every cell (resuming finished ones; ``workers`` at a time), then the table, per-image and per-client CSVs,
    grids and plots."""
    out = Path(cfg.out) if cfg.out else stamped_out(f"defend-{cfg.name}", "runs")
    cache = cells_dir(out)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        write_yaml(tmp / "config.yaml", to_dict(cfg))
        grid_cells = [(label, strength, protocol, _cell_key(cfg, protocol),
                       tmp / f"grid-{file_slug(label)}-{strength if strength is not None else 0:g}.png")
                      for label, strength, protocol in cells(cfg)]
        todo = []
        for label, strength, protocol, key, grid in grid_cells:
            if load_cell(cache, key) is not None:
                restore_cell_file(cache, key, "png", grid)
                print(f"  {label:>16s} {strength!s:>8s}  (finished earlier, reused)", flush=True)
            else:
                todo.append((label, strength, protocol, key, grid))
        _compute_cells(cfg, todo, cache)
        records = [load_cell(cache, key) for _, _, _, key, _ in grid_cells]
        print(write_defend(tmp, cfg, records, t0))
    shutil.rmtree(cache, ignore_errors=True)
    if not cfg.out:  # runs/<name>-latest names the newest (docs/usage.md, "Where a run writes")
        link_latest(out, f"defend-{cfg.name}")
    return out
