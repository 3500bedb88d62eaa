"""``gi run``: the end-to-end job (docs/architecture.md, "Data flow"): data → victim → labels → reconstruction → scores.

The attack side receives the capture (and auxiliary data) only; ground truth is used to make the
oracle LabelResult when ``labels.mode: truth`` is asked for explicitly, and to score.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.outputs import truth_monitor, verdict_line, write_outputs
from gi.attack.stages import (
    PreparedAttack,
    can_pack,
    prepare_attack,
    reconstruct_prepared,
)
from gi.core.errors import ConfigError
from gi.experiments.config.run import RunConfig, check_capture_count
from gi.experiments.outdir import log_scope, staged_output
from gi.world.build import build_model, draw_aux, load_data, train_on
from gi.world.setup import VictimSetup

if TYPE_CHECKING:  # torch, the data, models and Lightning load on first use: config errors answer at once
    import torch

    from gi.attack.recon import Reconstruction
    from gi.capture import Capture, Truth

log = logging.getLogger("gi.run")


# ----------------------------------------------------------------------------- stages
def client_batch(cfg: RunConfig, dataset: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """The client's images, soft targets (per ``protocol.label_aug``: one-hot, smoothing, mixup) and the dataset
    indices of every sample they are made of (both images of a mixup pair)."""
    import torch

    from gi.world import data as gdata

    b, c = cfg.protocol.batch_size, dataset.num_classes
    kind = cfg.protocol.label_aug
    if kind == "mixup":
        i1, i2 = gdata.sample_mixup_pairs(dataset, b, gen)
        lam = torch.rand(b, generator=gen) if cfg.data.mixup_lam is None else cfg.data.mixup_lam
        images, targets = gdata.mixup(dataset.images[i1], dataset.labels[i1], dataset.images[i2],
                                      dataset.labels[i2], lam, c)
        return images, targets, torch.cat([i1, i2])
    if cfg.data.indices is not None:
        if len(cfg.data.indices) != b:
            raise ConfigError(f"data.indices has {len(cfg.data.indices)} entries but protocol.batch_size={b}")
        idx = torch.as_tensor(cfg.data.indices)
        images, labels = gdata.to_batch(dataset, idx)
    else:
        images, labels, idx = gdata.sample_batch(dataset, b, gen)
    eps = cfg.data.eps
    if kind != "onehot" and eps is None:
        eps = torch.rand(b, generator=gen, dtype=torch.float64) * cfg.data.eps_max
    return images, gdata.make_targets(labels, c, kind, eps), idx


def build_victim(cfg: Any) -> tuple[Any, torch.nn.Module]:
    """The client's dataset and the global model (trained briefly when ``train.epochs`` > 0).

    ``cfg`` is a victim setup with a ``seed`` (a RunConfig or an AblateConfig): the model is initialised with
    ``seed`` (or ``model.seed``) and trained with a generator seeded ``seed + 1``.
    """
    import torch

    dataset = load_data(cfg.data)
    if getattr(cfg.data, "images", None) is not None:
        victim_batches(cfg, dataset)  # data.images checked against the dataset (size, indices) before any model
    model = build_model(cfg.model, dataset, cfg.seed)
    if cfg.train.epochs > 0:
        stats = train_on(model, cfg.train, cfg.data, dataset, torch.Generator().manual_seed(cfg.seed + 1))
        log.info("trained model: %s", stats)
    return dataset, model


def share_bn_statistics(model: torch.nn.Module, images: torch.Tensor, capture: Capture) -> None:
    """Victim side, when the threat model grants it (``protocol.share_bn_stats``): put the client's
    per-channel batch mean and biased variance at every BatchNorm input into ``capture.bn_stats`` (what FedAvg's
    shared running buffers reveal), for the ``bn`` regulariser."""
    import torch

    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, i[0].detach()))
             for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    for name, a in seen.items():
        dims = (0,) + tuple(range(2, a.ndim))
        capture.bn_stats[name] = (a.mean(dims), a.var(dims, unbiased=False))


def capture_client(cfg: Any, dataset: Any, model: torch.nn.Module, gen: torch.Generator) -> tuple[Capture, Truth]:
    """Victim side: the client's batch (per ``protocol.label_aug``) and what it shares: a FedSGD gradient, or a
    FedAvg-style update of local training on that batch (``gi.world.fl.victim.simulate_client``).
    ``truth.meta["indices"]``
    lists the dataset indices the batch is made of (kept out of the attacker's aux set by :func:`make_aux`)."""
    images, targets, indices = client_batch(cfg, dataset, gen)
    if cfg.protocol.is_update:
        from gi.world.fl.victim import simulate_client

        capture, truth = simulate_client(model, (images, targets.argmax(1)), cfg.protocol, rng=gen,
                                         device=cfg.torch_device)
    else:
        from gi.world.fl.victim import capture_gradients

        capture, truth = capture_gradients(model, images, targets, cfg.protocol, generator=gen,
                                           device=cfg.torch_device)
    if cfg.protocol.share_bn_stats:
        share_bn_statistics(model, images, capture)
    truth.meta = {**truth.meta, "indices": [int(i) for i in indices]}
    return capture, truth


def make_aux(cfg: VictimSetup, dataset: Any, gen: torch.Generator, truths: list[Truth]) -> Any:
    """The attacker's aux set (``aux.per_class`` per class of ``aux.split``), drawn with ``gen``; from the victim's
    ``dataset`` it holds no sample of the victims' batches (``truth.meta["indices"]`` of every truth in ``truths``)."""
    if cfg.aux.per_class <= 0:
        return None
    if cfg.aux.split not in (None, cfg.data.split):
        return draw_aux(load_data(cfg.data, cfg.aux.split), cfg.aux.per_class, gen)[0]
    victims = [i for t in truths for i in t.meta["indices"]]
    return draw_aux(dataset, cfg.aux.per_class, gen, exclude=victims)[0]


def victim_batches(cfg: RunConfig, dataset: Any) -> list[list[int] | None]:
    """The dataset indices of every capture's batch: ``data.images`` in chunks of ``protocol.batch_size``, else
    ``data.indices`` (one batch), else ``trials`` batches drawn with the run seed (None each)."""
    b = cfg.protocol.batch_size
    if cfg.data.images is None:
        return [cfg.data.indices] if cfg.data.indices is not None else [None] * cfg.trials
    check_capture_count(cfg.data, cfg.trials, b, len(dataset))
    images = list(range(len(dataset))) if cfg.data.images == "all" else list(cfg.data.images)
    if max(images) >= len(dataset):
        raise ConfigError(f"data.images has index {max(images)} but {cfg.data.name} holds {len(dataset)} images")
    if len(images) % b:
        raise ConfigError(f"data.images holds {len(images)} images, not a multiple of protocol.batch_size={b}: "
                          "every capture is a batch of consecutive entries")
    if cfg.protocol.label_aug == "mixup":
        raise ConfigError("data.images with protocol.label_aug=mixup: mixup draws its pairs; use trials")
    return [images[i:i + b] for i in range(0, len(images), b)]


def capture_all(cfg: RunConfig, dataset: Any, model: torch.nn.Module, gen: torch.Generator
                ) -> tuple[list[Capture], list[Truth]]:
    """Victim side: one (capture, truth) per batch of :func:`victim_batches`."""
    captures, truths = [], []
    for indices in victim_batches(cfg, dataset):
        one = cfg if indices is None else dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, images=None, indices=indices))
        capture, truth = capture_client(one, dataset, model, gen)
        captures.append(capture)
        truths.append(truth)
    return captures, truths


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
    reconstructions it gets alone (every capture starts from the image its seed gives it; up to float rounding);
    the reconstruct stage record says ``packed_jobs``; each job's ``log.txt`` holds its own lines and its pack's
shared reconstruction (:func:`gi.experiments.outdir.log_scope`), not the other jobs'. If any
    job fails, no job's directory is written."""
    import torch

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    with contextlib.ExitStack() as stack:
        jobs: list[_Job] = []
        for cfg in cfgs:
            out = Path(cfg.out or f"runs/{cfg.name}-{stamp}")
            tmp = stack.enter_context(staged_output(out, overwrite=cfg.overwrite))
            with log_scope(out):  # this job's victim and label / feature stages go to its own log.txt only
                t0 = time.perf_counter()
                torch.manual_seed(cfg.seed)
                gen = torch.Generator().manual_seed(cfg.seed)
                dataset, model = build_victim(cfg)
                captures, truths = capture_all(cfg, dataset, model, gen)
                log.info("captured %s %s of %d capture(s) x %d samples", cfg.model.label,
                         "update" if captures[0].is_update else "gradients", len(captures), captures[0].num_samples)
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
                             metrics["random_image_psnr_mean"], verdict_line(metrics))
                recs = outcome.reconstructions
                by_job[i] = RunResult(job.out, metrics, job.captures[0], job.truths[0], recs[0], job.captures,
                                      job.truths, recs)
    return [by_job[i] for i in range(len(jobs))]  # published: the staged outputs closed without an error
