"""``gi.reconstruct``: the attack's public entry point (docs/architecture.md, "Public contract").

The attack API takes a :class:`Capture`, a label result and optional features: there is no parameter through
which ground truth could reach it, so restarts can only be ranked by the attack objective. A reconstruction is
:func:`gi.attack.recon.problem.build_problem` (the plan), :func:`optimise` (the Lightning loop) and :func:`results`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch

from gi.attack.recon.config import SMALL_MODEL, ReconConfig
from gi.attack.recon.memory import GIB, budget_bytes, bytes_per_capture
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import Problem, build_problem, check_inputs, same_model
from gi.attack.recon.result import Reconstruction
from gi.capture import Capture
from gi.core.devices import env_threads, resolve_device, torch_device
from gi.label_result import LabelResult

Tensor = torch.Tensor
log = logging.getLogger("gi.attack.recon")


def quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the victim keeps its mode
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")


@contextlib.contextmanager
def cpu_threads(threads: int | None, model: torch.nn.Module, accelerator: str) -> Iterator[int]:
    """Set torch's CPU threads for the loop and restore them after. null: ``$GI_THREADS`` when set (the same in
    the Python API as on the command line, whose ``--threads`` sets it), else 1 for small models on CPU
    (overhead-bound), else torch's default."""
    before = torch.get_num_threads()
    if threads is None:
        threads = env_threads()
    if threads is None:
        small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
        threads = 1 if small and accelerator == "cpu" else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def reconstruct(
    capture: Capture,
    label_result: LabelResult | None = None,
    features: Tensor | None = None,
    config: ReconConfig | None = None,
    callbacks: Sequence[L.Callback] = (),
    aux_images: Tensor | None = None,
) -> Reconstruction:
    """Reconstruct the client's images from a capture (FedSGD gradients or a FedAvg update), given recovered
    (or oracle) labels; ``features`` (B, D) the feature targets of eq. 8 (default: from the capture and labels).

    Optimises ``config.restarts`` restarts as one batched problem through a Lightning ``Trainer`` and returns
    the restart with the lowest attack objective (never chosen with ground truth). ``aux_images``: the attacker's
    aux images (N, C, H, W), for the ``aux-span`` prior.
    """
    return reconstruct_many([capture], [label_result], None if features is None else [features], config,
                            callbacks, aux_images=aux_images)[0]


def reconstruct_many(
    captures: Sequence[Capture],
    label_results: Sequence[LabelResult | None] | None = None,
    features: Sequence[Tensor | None] | None = None,
    config: ReconConfig | None = None,
    callbacks: Sequence[L.Callback] = (),
    priors: Sequence[Tensor] | None = None,
    ids: Sequence[int] | None = None,
    aux_images: Tensor | None = None,
) -> list[Reconstruction]:
    """:func:`reconstruct` for many captures of one global model as one batched problem (captures × restarts).

    ``priors``: the ``init=analytic`` image (1, C, H, W) of each capture when the caller already has it (the
    pipeline's feature stage); default: :func:`gi.attack.recon.problem.analytic_prior` computes it. ``ids``: the
    captures' positions in the caller's list (``Problem.ids``, which callbacks follow; default 0 … N−1).
    ``aux_images``: the attacker's aux images (N, C, H, W), for the ``aux-span`` prior.
    A fit that starts from the analytic inversion (``init=analytic``) is not retried: it starts near its
    optimum, so its objective need not fall far below its start (the stall rule's premise).

    Captures must share model, state, protocol, history and batch size (an ablation's captures do); otherwise
    they are reconstructed one after another. On a CPU a LeNet step over 10 captures costs about twice one.
    """
    cfg = config or ReconConfig()
    captures, label_results, features = check_inputs(captures, label_results, features)
    priors = list(priors) if priors is not None else [None] * len(captures)
    ids = list(range(len(captures))) if ids is None else list(ids)
    recs = fit_many(captures, label_results, features, cfg, callbacks, ids=ids, priors=priors, aux_images=aux_images)
    kept = [0] * len(recs)  # the attempt each returned fit came from (0: the first fit)
    for attempt in range(1, (cfg.retries if cfg.init != "analytic" else 0) + 1):  # restart-on-stall (retries)
        again = [i for i, rec in enumerate(recs) if stalled(rec, cfg.retry_ratio)]
        if not again:
            break
        retry = dataclasses.replace(cfg, seed=cfg.seed + attempt, restarts=cfg.restarts * RETRY_GROWTH ** attempt,
                                    cull_after=max(cfg.cull_after, RETRY_MIN_CULL) if cfg.cull_after else 0,
                                    lbfgs_history=cfg.lbfgs_history or RETRY_LBFGS_HISTORY)
        log.warning("%d of %d capture(s) stalled (objective above %g of its start); retry %d of %d from %d new "
                    "starts (attack.seed + %d)", len(again), len(recs), cfg.retry_ratio, attempt, cfg.retries,
                    retry.restarts, attempt)
        news = fit_many([captures[i] for i in again], [label_results[i] for i in again], [features[i] for i in again],
                        retry, callbacks, stage=f"reconstruct (retry {attempt})", ids=[ids[i] for i in again],
                        priors=[priors[i] for i in again], aux_images=aux_images)
        for i, new in zip(again, news):
            old = recs[i]
            if float(new.objective.min()) < float(old.objective.min()):
                new.history["replaced"] = [*old.history.get("replaced", []), replaced_record(old, kept[i])]
                recs[i], kept[i] = new, attempt
            recs[i].seconds = old.seconds + new.seconds
            recs[i].history["retries"] = attempt
    return recs


def replaced_record(rec: Reconstruction, attempt: int) -> dict[str, Any]:
    """What a returned reconstruction's ``history["replaced"]`` keeps of a fit a retry replaced (``attack.retries``,
    :func:`reconstruct_many`): its ``fit`` (:attr:`GradientInversion.fit_id`), ``attempt`` (0: the first fit, k: the
    k-th retry), and its best restart's objective at the logged ``step``s, so the plots can draw it beside the
    returned fit (docs/usage.md, "Configs and outputs")."""
    return {"fit": rec.history.get("fit"), "attempt": attempt, "step": list(rec.history.get("step", [])),
            "objective": [o[rec.best_restart] for o in rec.history.get("objective", [])]}


RETRY_GROWTH = 4  # the k-th retry of a stalled capture runs restarts x 4**k new starts (culled as configured)
# a retry culls its starts no earlier than RETRY_MIN_CULL and keeps RETRY_LBFGS_HISTORY L-BFGS pairs (unless
# attack.lbfgs_history says otherwise): the recipe that rescued the plateau case (Fashion-MNIST seed 0
# image 8, docs/results/default-job.md: 93.0 dB), independent of the first fit's cull and memory. Since the one-row step
# path that image stays on the plateau with it too (objective 4.8; docs/results/default-job.md); culled at 25 with 400
# pairs
# (the one-capture memory of gi.attack.recon.optim.lbfgs_history) 9.2 dB, at 100 with 400 pairs objective 6.2
RETRY_MIN_CULL = 100
RETRY_LBFGS_HISTORY = 100


def fit_many(captures: Sequence[Capture], label_results: Sequence[LabelResult | None],
             features: Sequence[Tensor | None], cfg: ReconConfig, callbacks: Sequence[L.Callback] = (),
             stage: str = "reconstruct", ids: Sequence[int] | None = None,
             priors: Sequence[Tensor | None] | None = None, aux_images: Tensor | None = None
             ) -> list[Reconstruction]:
    """One fit of checked inputs: one packed problem, or problems of at most ``cfg.pack`` captures one after
    another (``auto``: :func:`pack_size`), or one problem per capture when the captures do not share a model.
    ``stage`` names the fit in the piped progress lines; ``ids`` are the captures' positions in
    :func:`reconstruct_many`'s list (``Problem.ids``; default 0 … N−1). An ``auto`` pack that runs out of CUDA
    memory is halved and the problem that failed is run again (the problems before it are kept)."""
    ids = list(range(len(captures))) if ids is None else list(ids)
    priors = list(priors) if priors is not None else [None] * len(captures)
    have = [f is not None for f in features]
    if cfg.feature_weight > 0 and any(have) and not all(have):  # captures with f* and without: one problem each
        out: list[Reconstruction | None] = [None] * len(captures)
        for flag in (True, False):
            idx = [i for i, h in enumerate(have) if h == flag]
            part = fit_many([captures[i] for i in idx], [label_results[i] for i in idx], [features[i] for i in idx],
                            cfg, callbacks, stage, [ids[i] for i in idx], [priors[i] for i in idx], aux_images)
            for i, rec in zip(idx, part):
                out[i] = rec
        return out  # type: ignore[return-value]
    if not all(same_model(captures[0], c, cfg.decoupled_bn) for c in captures[1:]):
        return [fit_many([c], [label_result], [f], cfg, callbacks, stage, [i], [pr], aux_images)[0]
                for c, label_result, f, i, pr in zip(captures, label_results, features, ids, priors)]
    auto = cfg.pack == "auto"
    pack = min(pack_size(captures[0], cfg, len(captures)) if auto else int(cfg.pack) or len(captures), len(captures))
    out: list[Reconstruction] = []
    while len(out) < len(captures):
        part = slice(len(out), len(out) + pack)
        try:
            problem = dataclasses.replace(build_problem(captures[part], label_results[part], cfg, features[part],
                                                        priors[part], aux_images),
                                          ids=tuple(ids[part]))
            module, seconds, threads = optimise(problem, cfg, callbacks, stage)
        except torch.OutOfMemoryError:
            if not auto or pack == 1:
                raise
            pack = max(1, pack // 2)
            torch.cuda.empty_cache()
            log.warning("out of device memory with attack.pack=auto; running %d capture(s) per problem from capture "
                        "%d on", pack, len(out))
            continue
        fitted = results(module, cfg, seconds, threads)
        for rec in fitted:
            rec.history["pack"] = len(fitted)  # captures in the problem this one was fitted in
        out += fitted
    return out


def pack_size(capture: Capture, cfg: ReconConfig, captures: int) -> int:
    """``attack.pack: auto``: the captures per problem that fit ``attack.memory_budget`` by the memory model of
    :mod:`gi.attack.recon.memory` (logged with the estimate and the budget)."""
    budget = budget_bytes(cfg.memory_budget, torch_device(cfg.device, "attack.device"))
    per_capture = bytes_per_capture(capture, cfg)
    pack = max(1, budget // per_capture)
    log.info("attack.pack=auto: %d of %d capture(s) per problem (estimated %.0f MiB per capture with %d "
             "restart(s); budget %.2f GiB)", min(pack, captures), captures, per_capture / 2 ** 20, cfg.restarts,
             budget / GIB)
    return pack


def stalled(rec: Reconstruction, ratio: float) -> bool:
    """Whether a fit stalled: its best restart's final objective kept more than ``ratio`` of that restart's first
    logged objective (the start). On the DLG plateau the objective stays within ~10× of its start; a capture
    whose gradients are matched ends many decades below it (docs/results/default-job.md)."""
    logged = rec.history.get("objective") or []
    if not logged:
        return False
    start = float(logged[0][rec.best_restart])
    final = float(rec.objective[rec.best_restart])
    return math.isfinite(start) and start > 0 and final > ratio * start


def stage_bar(stage: str) -> L.Callback:
    """Lightning's terminal bar named after the stage and counting the iterations (its own reads "Epoch 0": one
    epoch of ``attack.iterations`` steps is the whole fit)."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    class StageBar(TQDMProgressBar):
        def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
            super().on_train_epoch_start(trainer, *args)
            self.train_progress_bar.set_description(stage)
            if trainer.max_steps > 0:
                self.train_progress_bar.total = trainer.max_steps

    return StageBar()


def optimise(problem: Problem, cfg: ReconConfig, callbacks: Sequence[L.Callback] = (), stage: str = "reconstruct"
             ) -> tuple[GradientInversion, float, int]:
    """Fit a :class:`GradientInversion` of ``problem`` with a Lightning ``Trainer``; the fitted module, the
    seconds of the loop and the CPU threads it ran on."""
    module = GradientInversion(problem, cfg)
    quiet_lightning()
    accelerator, devices = resolve_device(cfg.device)
    bar = cfg.progress and sys.stderr.isatty()
    lines = [ProgressLines(cfg.iterations, stage=stage)] if cfg.progress and not bar else [stage_bar(stage)] if bar \
        else []
    trainer = L.Trainer(
        max_steps=cfg.iterations, max_epochs=1, accelerator=accelerator, devices=devices,
        logger=False, enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
        enable_progress_bar=bar, callbacks=[*callbacks, *lines],
    )
    initial = module.images.detach().clone()
    with cpu_threads(cfg.threads, problem.model, accelerator) as threads:
        start = time.perf_counter()
        trainer.fit(module)
        seconds = time.perf_counter() - start
        module.history["warnings"] = [*problem.notes, *diagnose(module, cfg, initial)]
    log.info("reconstructed %d capture(s) x %d restart(s) in %.1f s (%d threads)", problem.num_problems,
             cfg.restarts, seconds, threads)
    for warning in module.history["warnings"]:
        log.warning("%s", warning)
    return module, seconds, threads


class ProgressLines(L.Callback):
    """Progress for piped or redirected output (``attack.progress`` when stderr is not a terminal): one log line
    every ``percent`` % of the iterations with the best objective so far and the elapsed time, instead of a
    carriage-return bar."""

    def __init__(self, iterations: int, percent: int = 5, stage: str = "reconstruct") -> None:
        self.stage = stage
        self.iterations = iterations
        self.every = max(1, iterations * percent // 100)
        self.start = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = batch_idx + 1
        if step % self.every and step != self.iterations:
            return
        best = getattr(pl_module, "best_loss", None)
        value = float(best.min()) if isinstance(best, torch.Tensor) and best.numel() else float("nan")
        log.info("%s: %3d%% (%d/%d iterations)  best objective %.4g  %.1f s", self.stage, 100 * step // self.iterations,
                 step, self.iterations, value, time.perf_counter() - self.start)


STALL_RATIO = 0.5  # the gradient-matching term kept more than this fraction of its start: it stalled
DOMINANT = 0.5  # a regulariser above this share of the final objective dominates it
MATCHED = 1e-2  # ... unless the match term fell below this fraction of its start: then the gradients are matched
GREW = 1.05  # the last iterate's whole objective above this multiple of the start's: the fit diverged


def diagnose(module: GradientInversion, cfg: ReconConfig, start: Tensor | None = None) -> list[str]:
    """Warnings about a finished fit, each naming the knob to turn (median over captures of each capture's best
    restart): the match term stalled (at the best iterate it kept more than :data:`STALL_RATIO` of its value at
    the start images ``start``, or of the first logged objective), or a regulariser makes up more than
    :data:`DOMINANT` of the final objective (so the gradients are hardly matched). A fit that did not improve
    because its objective grew (the last iterate's whole objective above :data:`GREW` times the start's,
    :func:`growth`) is called diverged, not stalled: its best iterate is near the start because every step made
    it worse; a match term that grew while the whole objective fell is put down to the regularisers."""
    out: list[str] = []
    n, r = module.num_problems, module.rows
    best = module.best_loss.detach().cpu().view(n, r).argmin(1)
    rows = torch.arange(n) * r + best

    def terms(images: Tensor) -> dict[str, Tensor]:
        with torch.enable_grad():
            _, parts = module.objective(images.detach())
        return {k: v.detach().cpu().double()[rows] for k, v in parts.items()}

    final = terms(module.best_images)
    regs = {k: w for k, w in module.problem.terms.items() if k not in ("match", "features")}
    if "match" in final:
        if start is not None:
            if module.culled is not None:  # the survivors' starts (the index may be on the fit's device)
                start = start[module.culled["keep"].to(start.device)]
            at_start = terms(start)
            first = at_start["match"]
        else:
            at_start = None
            history = module.history.get("objective") or [[float("inf")] * (n * r)]
            first = torch.tensor(history[0], dtype=torch.float64)[rows]
        kept = float((final["match"] / first.clamp_min(1e-30)).median())
        grew = growth(at_start, terms(module.images)) if kept > STALL_RATIO and at_start is not None else None
        if grew is not None:
            ratio, before, after = grew
            out.append(f"the objective grew {ratio:.3g}x (from {before:.3g} to {after:.3g}) over {cfg.iterations} "
                       f"iterations{' (medians over captures)' if n > 1 else ''}: the optimisation diverged; "
                       f"lower attack.lr (now {cfg.lr:g}) or change attack.optimizer (now {cfg.optimizer})")
        elif kept > GREW:  # the whole objective fell, the match term rose: the regularisers outweigh it
            pulls = ", ".join(f"attack.regularizers.{k} (now {w:g})" for k, w in regs.items()) or "the regularisers"
            out.append(f"the gradient-matching term grew {kept:.3g}x from its start over {cfg.iterations} iterations "
                       f"(median over captures) while the whole objective fell: the regularisers pull the images "
                       f"away from the gradient; lower {pulls}")
        elif kept > STALL_RATIO:
            hold = "".join(f", or lower attack.regularizers.{k} (now {w:g}), which may hold it back"
                           for k, w in regs.items())
            out.append(f"the attack stalled: the gradient-matching term kept {100 * kept:.0f}% of its start after "
                       f"{cfg.iterations} iterations (median over captures); raise attack.iterations or change "
                       f"attack.lr (now {cfg.lr:g}), or try attack.preset=strong{hold}")
        total = sum(final.values())
        for name, weight in (regs.items() if kept > MATCHED else ()):  # a near-perfect match is no warning
            share = float((final[name] / total.clamp_min(1e-30)).median())
            if share > DOMINANT:
                out.append(f"the regulariser {name} (weight {weight:g}) is {100 * share:.0f}% of the final attack "
                           f"objective, so the gradients are hardly matched; lower attack.regularizers.{name} "
                           f"(e.g. {weight / 10:g})")
    return out


def growth(first: dict[str, Tensor], last: dict[str, Tensor]) -> tuple[float, float, float] | None:
    """``(ratio, first, last)`` when the whole objective at the fit's last iterate (its terms ``last``, per
    capture) exceeds :data:`GREW` times the one at its start images (``first``), median over captures; else None."""
    before, after = sum(first.values()), sum(last.values())
    ratio = float((after / before.clamp_min(1e-30)).median())
    if not ratio > GREW:
        return None
    return ratio, float(before.median()), float(after.median())


def results(module: GradientInversion, cfg: ReconConfig, seconds: float, threads: int) -> list[Reconstruction]:
    """One :class:`Reconstruction` per row of a fitted module: its restart with the lowest objective."""
    n, r = module.num_problems, cfg.restarts
    culled = module.culled or {}  # restarts culled early keep their best iterate from before the cull

    def rows(name: str, best: Tensor) -> Tensor:
        return module.all_rows(best.detach().cpu(), culled[name].cpu()) if culled else best.detach().cpu()

    loss = rows("loss", module.best_loss).view(n, r)
    images = rows("images", module.best_images).clamp(0, 1).view(n, r, *module.best_images.shape[1:])
    labels = rows("soft", module.best_soft).view(n, r, *module.best_soft.shape[1:])
    out = []
    for i in range(n):
        best = int(torch.argmin(loss[i]))
        history = {"step": module.history["step"],
                   "objective": [o[i * r:(i + 1) * r] for o in module.history["objective"]],
                   "threads": threads, "warnings": list(module.history.get("warnings", [])), "fit": module.fit_id,
                   "output_error": "captured" if module.captured_error else "simulated"}
        out.append(Reconstruction(images=images[i, best], all_images=images[i], labels=labels[i, best],
                                  objective=loss[i], best_restart=best, history=history, seconds=seconds / n,
                                  iterations=cfg.iterations, all_labels=labels[i]))
    return out
