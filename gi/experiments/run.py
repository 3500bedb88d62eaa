"""``gi run``: the end-to-end job (docs/architecture.md, "Data flow"): data → victim → labels → reconstruction → scores.

The attack side receives the capture (and auxiliary data) only; ground truth is used to make the
oracle LabelResult when ``labels.mode: truth`` is asked for explicitly, and to score.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.outputs import truth_monitor, write_outputs
from gi.analysis.verdict import verdict_line
from gi.attack.stages import (
    PreparedAttack,
    can_pack,
    prepare_attack,
    reconstruct_prepared,
)
from gi.experiments.config.run import RunConfig
from gi.experiments.outdir import link_latest, log_scope, staged_output, stamped_out
from gi.world.build import build_victim, capture_all, make_aux

if TYPE_CHECKING:  # torch, the data, models and Lightning load on first use: config errors answer at once
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture, Truth

log = logging.getLogger("gi.run")


@dataclass
class RunResult:
    out: Path
    metrics: dict[str, Any]
    capture: Capture
    truth: Truth
    reconstruction: Reconstruction
    captures: list[Capture] = field(default_factory=list)
    truths: list[Truth] = field(default_factory=list)
    reconstructions: list[Reconstruction] = field(default_factory=list)
    latest: Path | None = None  # the runs/<name>-latest link made to ``out`` (without out=), else None


def run(cfg: RunConfig) -> RunResult:
    """Run the end-to-end job and write its output directory: the victim part (data, model, captures) and the
    attack part (:func:`gi.attack.stages.attack_stages`: labels → features → reconstruct, the same stages as
    ``gi attack``), then scores."""
    return run_many([cfg])[0]


@dataclass
class _Job:
    cfg: RunConfig
    out: Path
    tmp: Path
    t0: float
    captures: list[Capture]
    truths: list[Truth]
    prepared: PreparedAttack


def pack_groups(prepared: Sequence[PreparedAttack]) -> list[list[int]]:
    """Indices of ``prepared`` in groups that share one reconstruction problem (:func:`can_pack` with the group's
    first), in order of first appearance."""
    groups: list[list[int]] = []
    for i, p in enumerate(prepared):
        home = next((g for g in groups if can_pack(prepared[g[0]], p)), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    return groups


def run_many(cfgs: Sequence[RunConfig]) -> list[RunResult]:
    """Run several ``gi run`` jobs, each to its own output directory, and reconstruct the jobs whose attacks can
    share one problem (:func:`pack_groups`: the same attack config, captures of one global model; e.g. a sweep over
    the label method or the images attacked) as one packed problem. Each job gets the
    reconstructions it gets alone (every capture starts from the image its seed gives it; up to float rounding,
    which a long chaotic fit can amplify, docs/architecture.md "Packing");
    the reconstruct stage record says ``packed_jobs``; each job's ``log.txt`` holds its own lines and its pack's
shared reconstruction (:func:`gi.experiments.outdir.log_scope`), not the other jobs'. If any
    job fails, no job's directory is written."""
    import torch

    from gi.attack.recon.problem import check_feature_layer

    with contextlib.ExitStack() as stack:
        jobs: list[_Job] = []
        for cfg in cfgs:
            out = Path(cfg.out) if cfg.out else stamped_out(cfg.name)
            tmp = stack.enter_context(staged_output(out, overwrite=cfg.overwrite))
            with log_scope(out):  # this job's victim and label / feature stages go to its own log.txt only
                t0 = time.perf_counter()
                torch.manual_seed(cfg.seed)
                gen = torch.Generator().manual_seed(cfg.seed)
                dataset, model = build_victim(cfg)
                check_feature_layer(model, cfg.attack.feature_layer)  # a bad name answers before any capture
                captures, truths = capture_all(cfg, dataset, model, gen)
                log.info("captured %s %s of %d capture(s) x %d samples%s", cfg.model.label,
                         "update" if captures[0].is_update else "gradients", len(captures), captures[0].num_samples,
                         f" ({captures[0].meta.get('num_steps')} local steps of up to {cfg.protocol.batch_size} "
                         f"over {cfg.protocol.local_epochs} epoch(s))" if captures[0].is_update else "")
                # ---- attack side: captures (+ aux) only; the oracle mode alone reads truth, by request
                aux = make_aux(cfg, dataset, gen, truths)
                prepared = prepare_attack(cfg.labels, cfg.attack, captures,
                                          truths if cfg.labels.mode == "truth" else None, aux)
            jobs.append(_Job(cfg, out, tmp, t0, captures, truths, prepared))
        by_job: dict[int, RunResult] = {}
        for group in pack_groups([j.prepared for j in jobs]):
            with log_scope(*(jobs[i].out for i in group)):  # the pack's shared reconstruction: every member's log
                if len(group) > 1:
                    log.info("packing %d jobs into one problem: %s", len(group),
                             ", ".join(jobs[i].cfg.name for i in group))
                truths = [t for i in group for t in jobs[i].truths]
                fits = any(jobs[i].prepared.optimises for i in group)  # no fit: no PSNR curve, and no Lightning import
                monitor = truth_monitor(truths, jobs[group[0]].cfg.attack.log_every) if fits else None
                outcomes = reconstruct_prepared([jobs[i].prepared for i in group],
                                                callbacks=[monitor] if monitor is not None else [])
            start = 0
            for i, outcome in zip(group, outcomes):
                job, cfg = jobs[i], jobs[i].cfg
                part = monitor.part(start, start + len(job.captures)) if monitor is not None else None
                start += len(job.captures)
                with log_scope(job.out):
                    metrics = write_outputs(job.tmp, cfg.name, cfg.written(), job.captures, job.truths, outcome,
                                            cfg.labels, cfg.seed, {"match": cfg.metrics.match,
                                                                   "lpips_vgg": cfg.metrics.lpips_vgg}, part, job.t0)
                    log.info("PSNR mean %.2f / median %.2f / min %.2f dB over %d image(s) (trivial guesses: mean "
                             "colour %.2f, grey %.2f, random image %.2f dB); %s", metrics["psnr_mean"],
                             metrics["psnr_median"], metrics["psnr_min"], metrics["num_images"],
                             metrics["mean_colour_psnr_mean"], metrics["grey_psnr_mean"],
                             metrics["random_image_psnr_mean"], verdict_line(metrics["verdict"]))
                recs = outcome.reconstructions
                by_job[i] = RunResult(job.out, metrics, job.captures[0], job.truths[0], recs[0], job.captures,
                                      job.truths, recs)
    for i, job in enumerate(jobs):  # published: the staged outputs closed without an error
        if not job.cfg.out:
            by_job[i].latest = link_latest(job.out, job.cfg.name)
    return [by_job[i] for i in range(len(jobs))]
