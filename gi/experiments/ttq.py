"""``gi bench`` kind ``time-to-quality``: PSNR against seconds, this toolkit's default job vs
breaching (Geiping et al.) wired the way its authors wire it.

For every capture of a ``gi run`` job (``job``: a ``gi run`` config such as ``configs/default.yaml``, plus
``job_overrides``), every contender of ``contenders`` (a name of :data:`CONTENDERS`) attacks the same capture of the
same model weights, in one process on ``threads`` torch threads, the contenders' order alternating from capture to
capture so that load on a shared machine hits both alike. Each contender's clock (:class:`AttackClock`: wall and
CPU seconds of the process) runs from the start of its attack and is stopped while its iterate is scored, every
``every`` iterations and once at the end (the answer it returns). ``clock`` picks which of the two clocks the
budgets, crossing times and ratios use (both are recorded).

Equal time means equal (the fairness rule, docs/usage.md "Against breaching"; :func:`attack_until_budget`):
with ``fill_budget`` (the default) a contender whose attack ends before the budget is run again from a new random
start, each its own way (ours: a new ``attack.seed``; breaching: a new trial of its ``restarts``), until the budget
is spent, and holds its best run by its OWN objective, never by PSNR against the truth. With ``fill_budget:
false`` it stops, and that capture's PSNRs are compared at the time it finished (:func:`compared_until`). Every
row records per contender the iterations actually run, the runs, the CPU and wall seconds and when it finished
before the budget (:func:`~gi.experiments.ttq_curves.spent`).

- ``gi``: the default job's attack side, :func:`gi.attack.stages.attack_stages` with the job's ``labels`` and
  ``attack`` sections (labels recovered, e.g. ``auto``; then features; then the preset's reconstruction). The score
  is the best iterate by the attack objective (what the attack returns when stopped there).
- ``breaching``: breaching's ``invertinggradients`` attack config with ``tv`` (its own CIFAR notebook's 5e-4
  by default) and ``max_iterations`` (or several ``schedules``, one curve each), given the TRUE labels (ours
  recovers them), on the model WITHOUT its ``Normalize`` layer with the dataset mean/std in its metadata, so its
  candidate lives in normalised space as its authors intend. The score is its best candidate so far by its own
  rule (lowest objective of the previous iterate, the iterate after the step and the box projection). breaching
  is not a dependency of this project: it is imported when this contender runs, and a missing install is a
  one-line :class:`ConfigError` raised before any work (:func:`check_contenders`).

The curves and their summary live in :mod:`gi.experiments.ttq_curves`. Time to ``levels`` dB: the clock at the first
checkpoint whose PSNR reaches the level (:func:`time_to`); a contender that never reaches it within its budget is
*censored* at its last clock reading. A contender run under several variants (breaching's ``schedules``) is scored
per capture by its best wiring (:func:`best_of`): the earliest time to each level over its variants. The ratio
breaching/ours per capture is exact when both reach the level, a lower bound (``>=``) when only ours does, an upper
bound when only breaching does (:func:`ratio`), and ``n/a`` where a time it would divide is near zero
(:func:`ratio_not_applicable`). ``psnr_at`` gives each contender's PSNR at equal time (the last checkpoint at or
before it)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gi.core.config import from_dict, load
from gi.core.devices import torch_device
from gi.core.errors import ConfigError
from gi.core.provenance import git_commit
from gi.core.registry import registrar
from gi.experiments.bench_kinds import BenchKind, register_bench_kind
from gi.experiments.config.ttq import TTQConfig
from gi.experiments.outdir import staged_output
from gi.experiments.ttq_curves import (
    Curve,
    finished_at,
    ratio_text,
    seconds_text,
    summarize_curves,
    time_to,
)
from gi.experiments.ttq_output import contender_names, write_ttq

BREACHING_INSTALL = ("pip download --no-deps breaching==0.1.2 -d /tmp/w && pip install --no-deps --target /tmp/br "
                     "/tmp/w/breaching*.whl && pip install --target /tmp/br hydra-core, then PYTHONPATH=$PWD:/tmp/br")


# --------------------------------------------------------------------------- clock and curves
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


class AttackClock:
    """Wall and CPU seconds of an attack with the scoring left out: :meth:`pause` / :meth:`resume` around it.
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs first in :meth:`start` and :meth:`pause`, so that work a GPU
    still has queued counts as attack time; :meth:`read` between pauses (a budget check every step) does not
    synchronise, so the attack's own loop keeps its pace and a budget may be overrun by the queued work."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync or (lambda: None)
        self._start = {k: 0.0 for k in CLOCKS}
        self._paused_at: dict[str, float] | None = None
        self._excluded = {k: 0.0 for k in CLOCKS}

    def start(self) -> None:
        self._sync()
        self._start = {k: f() for k, f in CLOCKS.items()}
        self._excluded = {k: 0.0 for k in CLOCKS}
        self._paused_at = None

    def pause(self) -> None:
        self._sync()
        self._paused_at = {k: f() for k, f in CLOCKS.items()}

    def resume(self) -> None:
        if self._paused_at is not None:
            for k, f in CLOCKS.items():
                self._excluded[k] += f() - self._paused_at[k]
        self._paused_at = None

    def read(self) -> dict[str, float]:
        """Seconds of attack so far, per clock (frozen while paused)."""
        now = self._paused_at or {k: f() for k, f in CLOCKS.items()}
        return {k: now[k] - self._start[k] - self._excluded[k] for k in CLOCKS}


# --------------------------------------------------------------------------- contenders
@dataclass
class Victim:
    """What every contender attacks: the job's config, its captures and truths (truths only score), aux data."""

    job: Any
    captures: list[Any]
    truths: list[Any]
    aux: Any


@dataclass(frozen=True)
class Contender:
    """``check(cfg)`` raises before any work when the contender cannot run; ``run(cfg, victim, k, clock, score,
    restart)`` runs its attack once on capture ``k`` and returns that run's :class:`Curve` (``score(images)`` →
    PSNR against the truth). ``clock`` is started (and paused) once per capture and runs on across its runs: a
    run resumes it when its attack starts (its own set-up left out) and leaves it paused after scoring its
    answer; ``restart`` (0, 1, …) is the run's index, from which it draws a new random start. The curve's
    ``info`` says ``stopped_by_budget``, ``objective`` (the contender's OWN score of its answer, lower is better,
    never the truth; None: it has none) and, where a further run could only repeat this one, ``restartable:
    False`` (:func:`attack_until_budget`, the fairness rule of docs/usage.md, "Against breaching").
    ``variants(cfg)``: the ``(name, cfg)`` it runs under, one curve each (None: once, under ``cfg``)."""

    check: Callable[[TTQConfig], None]
    run: Callable[[TTQConfig, Victim, int, AttackClock, Callable[[Any], float], int], Curve]
    summary: str
    variants: Callable[[TTQConfig], list[tuple[str, TTQConfig]]] | None = None


CONTENDERS: dict[str, Contender] = {}


register_contender = registrar(CONTENDERS, "contender")  # register_contender(name)(Contender(...))


def _no_check(cfg: TTQConfig) -> None:
    return None


def restart_seed(attack: Any, restart: int) -> int:
    """``attack.seed`` of our attack's ``restart``-th run in the bench: ``seed + restart × (retries + 1)``, so that
    no run reuses a seed of another run's restart-on-stall fits (``seed + 1 … seed + retries``)."""
    return int(attack.seed) + restart * (int(attack.retries) + 1)


def _gi_default_job(cfg: TTQConfig, victim: Victim, k: int, clock: AttackClock,
                    score: Callable[[Any], float], restart: int = 0) -> Curve:
    """The job's attack side on capture ``k`` alone: :func:`gi.attack.stages.attack_stages` (labels →
    features → reconstruct) on ``cfg.threads`` threads, scored every ``cfg.every`` steps, stopped at ``budget``;
    run ``restart`` with ``attack.seed`` from :func:`restart_seed`. Its own score is the answer's relative
    gradient mismatch (``history["gradient_mismatch"]``, the rule by which the stage itself keeps one of several
    fits, :func:`gi.attack.stages.lower_mismatch`); an analytic answer (no optimisation) is not restartable."""
    import lightning as L

    from gi.attack.stages import attack_stages

    curve = Curve("gi", k)
    budget, which = cfg.budget, cfg.clock
    steps = [0]  # iterations over every fit of this run (restart-on-stall retries included)

    stopped = [False]

    class Checkpoints(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            steps[0] += 1
            if steps[0] % cfg.every == 0:
                clock.pause()
                curve.add(steps[0], clock.read(), score(pl_module.current_batch()[0]))
                clock.resume()
            if clock.read()[which] >= budget and batch_idx + 1 < trainer.max_steps:
                trainer.should_stop = stopped[0] = True

    job = victim.job
    attack = dataclasses.replace(job.attack, threads=cfg.threads, progress=False, device=cfg.device,
                                 seed=restart_seed(job.attack, restart))
    truths = [victim.truths[k]] if job.labels.mode == "truth" else None
    clock.resume()
    outcome = attack_stages(job.labels, attack, [victim.captures[k]], truths, victim.aux, callbacks=[Checkpoints()])
    clock.pause()
    rec = outcome.reconstructions[0]
    curve.add(steps[0], clock.read(), score(rec.images))
    mismatch = rec.history.get("gradient_mismatch")
    curve.info = {"stages": outcome.stages,  # the reconstruct stage's own seconds include the scoring pauses
                  "labels_ok": all(result is None or result.ok for result in outcome.label_results),
                  "labels_given": False, "stopped_by_budget": stopped[0], "seed": attack.seed,
                  "objective": None if mismatch is None or mismatch != mismatch else float(mismatch),
                  "objective_name": "relative gradient mismatch",
                  "restartable": not outcome.stages[-1].get("skipped", False)}
    return curve


def device_sync(name: str) -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` on a CUDA device (the clock's :class:`AttackClock` ``sync``), else None."""
    if name == "cpu":
        return None
    import torch

    device = torch.device(torch_device(name))  # checked: a missing GPU is a ConfigError
    return lambda: torch.cuda.synchronize(device)


def check_breaching(cfg: TTQConfig) -> None:
    """breaching importable (it is not a dependency of this project), else a one-line ConfigError."""
    try:
        import breaching  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"contender 'breaching' needs the breaching package, which is not installed ({exc}); "
                          f"install it outside the project: {BREACHING_INSTALL}") from None


class _OutOfBudget(KeyboardInterrupt):
    """Raised from the optimiser hook; breaching's trial loop catches KeyboardInterrupt and returns its best."""


def without_normalize(model: Any) -> tuple[Any, list[float], list[float]]:
    """A zoo model's ``fc(body(x))`` (the same parameters, no ``Normalize`` layer) and the mean/std that layer
    applied: breaching's wiring, its candidate in normalised space and the dataset statistics in its metadata."""
    import torch

    if not all(hasattr(model, a) for a in ("normalize", "body", "fc")):
        raise ConfigError("contender 'breaching' needs a zoo model (normalize -> body -> fc): its input "
                          "normalisation moves into breaching's metadata")

    class Unnormalized(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.fc = model.body, model.fc

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.body(x))

    mean = model.normalize.mean.flatten().tolist()
    std = model.normalize.std.flatten().tolist()
    return Unnormalized().eval(), mean, std


def breaching_setup(capture: Any, labels: Any, tv: float, max_iterations: int, device: str = "cpu"
                    ) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]], list[float], list[float]]:
    """breaching's ``invertinggradients`` attacker for ``capture`` wired as its authors wire it: the model without
    its ``Normalize`` layer (:func:`without_normalize`), the dataset mean/std in the payload's metadata (its
    candidate lives in normalised space), ``labels`` given. Returns ``(attacker, server_payload, shared_data,
    mean, std)`` for ``attacker.reconstruct(server_payload, shared_data, {})``."""
    from types import SimpleNamespace

    import breaching
    import torch
    from omegaconf import OmegaConf

    bcfg = breaching.get_attack_config("invertinggradients")
    OmegaConf.set_struct(bcfg, False)
    bcfg.optim.max_iterations = max_iterations
    bcfg.optim.callback = 10**9
    bcfg.restarts.num_trials = 1  # its restarts: one trial per call; the bench runs more (attack_until_budget)
    bcfg.regularization.total_variation.scale = tv
    model, mean, std = without_normalize(capture.model().eval())
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), bcfg,
                                                dict(dtype=torch.float, device=torch.device(device)))
    channels = int(capture.model_spec["in_shape"][0])
    for reg in attacker.regularizers:  # shim: breaching's TV builds its filters for 3 channels (groups=3)
        if type(reg).__name__ == "TotalVariation" and not reg.double_opponents and reg.groups != channels:
            reg.groups, reg.weight = channels, reg.weight[: 2 * channels]
    meta = SimpleNamespace(shape=tuple(capture.model_spec["in_shape"]), modality="vision", mean=mean, std=std)
    payload = [dict(parameters=[p.detach().to(device) for p in model.parameters()],
                    buffers=[b.to(device) for b in model.buffers()], metadata=meta)]
    names = [n for n, _ in model.named_parameters()]
    shared = [dict(gradients=[capture.shared[n].to(device) for n in names], buffers=None,
                   metadata=dict(num_data_points=capture.num_samples, labels=labels.to(device),
                                 local_hyperparams=breaching_local_steps(capture, labels.to(device))))]
    return attacker, payload, shared, mean, std


def breaching_local_steps(capture: Any, labels: Any) -> dict[str, Any] | None:
    """breaching's ``local_hyperparams`` for a FedAvg update (None for a FedSGD gradient): its multi-step user
    (``UserMultiStep``) takes ``steps`` plain SGD steps at ``lr`` on consecutive slices of ``data_per_step``
    samples, wrapping around, which is this project's slot schedule (:func:`gi.world.fl.local.slot_schedule`)
    when every step has one size that divides the sample count. Other updates are a :class:`ConfigError`:
    another scheme, optimiser, momentum or weight decay, unequal steps, or a client defence."""
    if not capture.is_update:
        return None
    from gi.world.fl.local import local_schedule

    protocol = capture.protocol
    sizes = local_schedule(protocol, capture.num_samples)
    if (protocol.scheme != "fedavg" or protocol.optimizer != "sgd" or protocol.momentum or protocol.weight_decay
            or protocol.defences or protocol.dp_sigma or len(set(sizes)) != 1 or capture.num_samples % sizes[0]):
        raise ConfigError("contender 'breaching' takes a FedAvg update of plain SGD steps of one size that divides "
                          f"the sample count (its UserMultiStep); this one: scheme {protocol.scheme}, optimiser "
                          f"{protocol.optimizer}, momentum {protocol.momentum}, weight decay "
                          f"{protocol.weight_decay}, step sizes {sorted(set(sizes))} over {capture.num_samples} "
                          f"samples, defences {[d.get('name') for d in protocol.defences] or protocol.dp_sigma}")
    steps, size = len(sizes), sizes[0]
    per_step = [labels[(k * size) % capture.num_samples:][:size] for k in range(steps)]
    return dict(lr=protocol.lr, steps=steps, data_per_step=size, labels=per_step)


def _breaching_attack(cfg: TTQConfig, victim: Victim, k: int, clock: AttackClock,
                      score: Callable[[Any], float], restart: int = 0) -> Curve:
    """breaching's invertinggradients attack on capture ``k`` (module docstring), true labels given: one call of
    its ``reconstruct`` with ``restarts.num_trials = 1``, i.e. one of its trials. Run 0 seeds torch with
    ``breaching.seed``; a later run draws its random start from the same generator, continued, as breaching's
    own trial loop does. Its own score of the answer is breaching's restart score (``_score_trial`` under
    ``restarts.scoring``, cosine similarity for this attack, read from its ``stats["opt_value"]``), by which its
    ``_select_optimal_reconstruction`` keeps the lowest of several trials."""
    import logging

    import torch

    logging.getLogger("breaching").setLevel(logging.WARNING)
    capture, truth = victim.captures[k], victim.truths[k]
    opts = cfg.breaching
    attacker, payload, shared, mean, std = breaching_setup(capture, truth.labels.clone(), opts.tv,
                                                           opts.max_iterations, torch_device(cfg.device))
    dm, ds = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def pixels(x: torch.Tensor) -> torch.Tensor:
        return (x.detach().cpu() * ds + dm).clamp(0, 1)

    curve = Curve("breaching", k, variant=f"{opts.max_iterations} it")
    state: dict[str, Any] = {"done": 0, "loss": None, "best": None, "best_loss": math.inf, "stopped": False}
    budget, which = cfg.budget, cfg.clock

    def pre_hook(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        candidate = optimizer.param_groups[0]["params"][0]
        if state["done"]:  # breaching's best-candidate rule on the iterate it has just boxed
            if state["loss"] < state["best_loss"]:
                state["best_loss"], state["best"] = state["loss"], candidate.detach().clone()
            if state["done"] % cfg.every == 0:
                clock.pause()
                curve.add(state["done"], clock.read(), score(pixels(state["best"])))
                clock.resume()
            if clock.read()[which] >= budget:
                state["stopped"] = True
                raise _OutOfBudget
        closure = args[1] if len(args) > 1 else kwargs.pop("closure")  # args[0] is the optimiser

        def counted() -> torch.Tensor:
            loss = closure()
            state["loss"] = float(loss.detach())
            return loss

        state["done"] += 1
        return (args[0], counted), kwargs

    def init_optimizer(candidate: list[torch.Tensor]) -> tuple[Any, Any]:
        optimizer, scheduler = type(attacker)._init_optimizer(attacker, candidate)
        optimizer.register_step_pre_hook(pre_hook)
        return optimizer, scheduler

    attacker._init_optimizer = init_optimizer  # an instance attribute: breaching itself is not changed
    if restart == 0:
        torch.manual_seed(opts.seed)
    clock.resume()
    out, stats = attacker.reconstruct(payload, shared, {}, dryrun=False)
    clock.pause()
    curve.add(state["done"], clock.read(), score(pixels(out["data"])))
    opt = stats.get("opt_value")
    curve.info = {"labels_given": True, "tv": opts.tv, "max_iterations": opts.max_iterations,
                  "space": "normalised (model without Normalize; mean/std in metadata)",
                  "stopped_by_budget": state["stopped"],
                  "objective": None if opt is None or not math.isfinite(opt) else float(opt),
                  "objective_name": f"breaching restart score ({attacker.cfg.restarts.scoring})"}
    return curve


register_contender("gi")(Contender(_no_check, _gi_default_job,
                                   "this toolkit's default job: labels (recovered) -> features -> preset"))
def breaching_schedules(cfg: TTQConfig) -> list[tuple[str, TTQConfig]]:
    """One variant per ``breaching.schedules`` entry (else ``max_iterations``): its step-lr schedule over that many
    iterations (x0.1 at 3/8, 5/8, 7/8)."""
    return [(f"{n} it", dataclasses.replace(cfg, breaching=dataclasses.replace(cfg.breaching, max_iterations=n,
                                                                                schedules=None)))
            for n in cfg.breaching.iteration_counts()]


register_contender("breaching")(Contender(check_breaching, _breaching_attack,
                                          "breaching invertinggradients, normalised space, TV 5e-4, true labels",
                                          breaching_schedules))


# --------------------------------------------------------------------------- the job
def build_victim_side(cfg: TTQConfig) -> Victim:
    """The job's victim part exactly as ``gi run`` makes it (:mod:`gi.world.build`): data, model,
    captures (one per image or batch) and the attacker's aux set."""
    import torch

    from gi.experiments.config.run import RunConfig
    from gi.world.build import build_victim, capture_all, make_aux

    job = load(RunConfig, cfg.job, cfg.job_overrides)
    torch.manual_seed(job.seed)
    gen = torch.Generator().manual_seed(job.seed)
    dataset, model = build_victim(job)
    captures, truths = capture_all(job, dataset, model, gen)
    aux = make_aux(job, dataset, gen, truths)
    if cfg.select is not None:
        if max(cfg.select) >= len(captures):
            raise ConfigError(f"select={cfg.select} but the job {cfg.job} makes {len(captures)} captures")
        captures, truths = [captures[i] for i in cfg.select], [truths[i] for i in cfg.select]
    return Victim(job, captures, truths, aux)


def scorer(truth: Any) -> Callable[[Any], float]:
    """Mean PSNR of a batch against ``truth`` after one-to-one matching (one image: no matching), clamped to 100."""
    from gi.analysis.metrics import match_images, psnr

    def score(images: Any) -> float:
        images = images.detach().cpu().float().clamp(0, 1)
        perm = match_images(images, truth.images) if images.shape[0] > 1 else [0]
        return float(psnr(images[perm], truth.images).clamp(max=100).mean())

    return score


def attack_until_budget(name: str, cfg: TTQConfig, victim: Victim, k: int, clock: AttackClock,
                        score: Callable[[Any], float]) -> Curve:
    """Contender ``name`` on capture ``k`` under the fairness rule (docs/usage.md, "Against breaching"): its
    attack runs (:attr:`Contender.run`) on one clock, and while ``cfg.fill_budget`` holds and a run ends on its
    own before ``cfg.budget``, a new run (the next ``restart``) starts from a new random start, until the budget
    is spent. A contender is not run again when its run cannot be ranked by its own objective (``objective``
    None), could only repeat itself (``restartable: False``, e.g. our analytic answer) or did no iterations; it
    has then finished early (:func:`~gi.experiments.ttq_curves.finished_at`).

    The curve is one line over every run, iterations counted over all runs. Its answer at a checkpoint is the
    one the attacker holds then: during the first run that run's own best; later, the best run ENDED so far by
    the contender's own objective (lower wins, a tie keeps the earlier run; never by PSNR: the attacker has no
    truth), each run entering the choice when it ends, the last one cut by the budget too (what breaching's
    own trial loop does with an interrupted trial). ``info``: the chosen run's info, plus ``runs``,
    ``best_run``, ``fill_budget``, ``not_restarted`` (why a contender that finished early was not run again)
    and ``run_records`` (per run: iterations, seconds on ``cfg.clock``, objective, final PSNR, whether the
    budget cut it)."""
    contender = CONTENDERS[name]
    which = cfg.clock
    curve = Curve(name, k)
    records: list[dict[str, Any]] = []
    best: tuple[int, Curve] | None = None  # the chosen ended run: index, curve
    done_before = 0
    why_not = None
    clock.start()
    clock.pause()  # each run resumes it when its attack starts: a contender's own set-up is not attack time
    while True:
        restart = len(records)
        one = contender.run(cfg, victim, k, clock, score, restart)  # resumes the clock, leaves it paused
        held = None if best is None else best[1].psnr[-1]
        for i, (it, w, c, p) in enumerate(zip(one.iterations, one.wall, one.cpu, one.psnr)):
            last = i == len(one.psnr) - 1
            if last and (best is None or better(one.info.get("objective"), best[1].info.get("objective"))):
                best = (restart, one)
            value = best[1].psnr[-1] if last else (p if held is None else held)
            curve.add(done_before + it, {"wall": w, "cpu": c}, value)
        done_before += one.iterations[-1]
        records.append({"iterations": one.iterations[-1], "seconds": one.seconds(which)[-1],
                        "objective": one.info.get("objective"), "psnr": one.psnr[-1],
                        "stopped_by_budget": bool(one.info.get("stopped_by_budget", True))})
        if records[-1]["stopped_by_budget"] or clock.read()[which] >= cfg.budget:
            break
        why_not = ("fill_budget is false" if not cfg.fill_budget
                   else "its run cannot be ranked by its own objective" if one.info.get("objective") is None
                   else "a new run would repeat this one" if one.info.get("restartable") is False
                   else "its run did no iterations" if one.iterations[-1] == 0 else None)
        if why_not is not None:
            break
    assert best is not None
    budget_spent = records[-1]["stopped_by_budget"] or clock.read()[which] >= cfg.budget
    curve.info = {**best[1].info, "stopped_by_budget": budget_spent, "runs": len(records), "best_run": best[0],
                  "fill_budget": cfg.fill_budget, "run_records": records,
                  **({"not_restarted": why_not} if not budget_spent else {})}
    return curve


def better(objective: float | None, than: float | None) -> bool:
    """Whether a run whose own objective is ``objective`` replaces the one held at ``than`` (lower wins; None or
    NaN never wins, a tie keeps the held run)."""
    if objective is None or objective != objective:
        return False
    return than is None or than != than or objective < than


def progress_line(curve: Curve, clock: str, levels: Sequence[float]) -> str:
    """The line a run prints per contender, variant and capture: its answer's PSNR after the seconds and the
    iterations it actually ran (over all its runs), the runs, when it finished early, and its times to
    ``levels``. The variant (breaching's schedule) is named as a schedule, never as the iterations run."""
    secs = curve.seconds(clock)
    reached = ", ".join(f"{lvl:g} dB at {seconds_text(t)} s" if t is not None else f"{lvl:g} dB never"
                        for lvl in levels for t in [time_to(secs, curve.psnr, lvl)])
    who = curve.contender + (f" [{curve.variant} schedule]" if curve.variant else "")
    runs = int(curve.info.get("runs", 1))
    end = finished_at(curve, clock)
    done = "budget spent" if end is None else f"finished at {seconds_text(end)} s"
    return (f"capture {curve.capture:2d} {who:>28s}: {curve.psnr[-1]:6.2f} dB after {seconds_text(secs[-1])} s "
            f"({curve.iterations[-1]} it in {runs} run{'s' if runs != 1 else ''}, {done}; {reached})  "
            f"load {os.getloadavg()[0]:.2f}")


def check_contenders(cfg: TTQConfig) -> None:
    for name in cfg.contenders:
        CONTENDERS[name].check(cfg)


def run_ttq(cfg: TTQConfig) -> Path:
    """Run the benchmark (module docstring) and write its output directory: ``config.yaml``, ``curves.json`` (every
    checkpoint), ``summary.json`` (times to each level, ratios, PSNR at equal time), ``ttq.png``; returns it."""
    check_contenders(cfg)  # before torch loads: a missing optional package answers at once
    cfg.check_device()
    import torch

    from gi.analysis.verdict import trivial_baselines

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"runs/bench/{cfg.name}-{stamp}")
    torch.set_num_threads(cfg.threads)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        victim = build_victim_side(cfg)
        curves: list[Curve] = []
        for k in range(len(victim.captures)):
            order = cfg.contenders if k % 2 == 0 else cfg.contenders[::-1]
            score = scorer(victim.truths[k])
            guesses = trivial_baselines(victim.truths[k].images)  # the images' grey and mean-colour guesses
            trivial = {key: statistics.fmean(guesses[key]) for key in ("grey_psnr", "mean_colour_psnr")}
            for name in order:
                contender = CONTENDERS[name]
                for variant, vcfg in (contender.variants(cfg) if contender.variants else [("", cfg)]):
                    torch.set_num_threads(cfg.threads)
                    curve = attack_until_budget(name, vcfg, victim, k, AttackClock(device_sync(cfg.device)), score)
                    curve.capture, curve.variant = (cfg.select[k] if cfg.select else k), variant
                    curve.info["trivial"] = trivial
                    curves.append(curve)
                    print(progress_line(curve, cfg.clock, cfg.levels), flush=True)
        summary = summarize_curves(cfg, curves)
        meta = {"created": stamp, "git": git_commit(), "torch": torch.__version__,
                "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "load_average_end": list(os.getloadavg()), "threads": torch.get_num_threads(), "device": cfg.device,
                "accelerator": (torch.cuda.get_device_name(torch.device(torch_device(cfg.device)))
                                if cfg.device != "cpu" else platform.processor() or platform.machine())}
        write_ttq(tmp, cfg, curves, {**meta, **summary}, f"{cfg.name}: {cfg.job} ({len(victim.captures)} captures)")
    return out


MERGE_MAY_DIFFER = ("select", "out", "overwrite", "name", "contenders", "budget", "breaching")


def same_run_longer(short: Curve, long: Curve, tol_db: float = 1e-6) -> bool:
    """Whether ``long`` is ``short``'s attack run further: every checkpoint of ``short`` but its last (the answer it
    returned when stopped) is a checkpoint of ``long`` at the same iteration with the same PSNR (``tol_db``)."""
    at = dict(zip(long.iterations, long.psnr))
    return long.iterations[-1] >= short.iterations[-1] and all(
        i in at and abs(at[i] - p) <= tol_db for i, p in zip(short.iterations[:-1], short.psnr[:-1]))


def keep_longest(curves: list[Curve]) -> list[Curve]:
    """One curve per (contender, variant, capture): where parts attacked one twice, the longer run, provided it is
    the same attack run further (:func:`same_run_longer`; else a ConfigError)."""
    kept: dict[tuple[str, str, int], Curve] = {}
    for c in curves:
        key = (c.contender, c.variant, c.capture)
        old = kept.get(key)
        if old is None:
            kept[key] = c
            continue
        short, long = (old, c) if c.iterations[-1] >= old.iterations[-1] else (c, old)
        if not same_run_longer(short, long):
            raise ConfigError(f"merge_runs: two curves of {key} differ before the shorter one stops: not the same "
                              f"attack run longer, so neither can stand for the other")
        kept[key] = long
    return list(kept.values())


def merge_runs(parts: Sequence[str | Path], out: str | Path, overwrite: bool = False, longest: bool = False
               ) -> Path:
    """One output directory from several runs of one job: disjoint ``select`` lists (e.g. two processes on two
    cores) and/or different contenders or breaching schedules on the same captures (e.g. breaching's long
    schedules in one process, ours in another): every curve, the summary over all captures (each contender's best
    variant per capture) and the plot; ``summary.json`` names the parts. The parts must agree on everything but
    :data:`MERGE_MAY_DIFFER` (same job, levels, checkpoints, clock, threads, ``fill_budget``, breaching's tv and
    seed; a part written before ``fill_budget`` counts as ``false``, which is what it did) and
    attack each (contender, variant, capture) once, unless ``longest``: then a (contender, variant, capture)
    attacked in several parts keeps its longest curve, which must be the same attack run further
    (:func:`keep_longest`; e.g. breaching's 24000 schedule cut at 150 s in one part and run to its end in another).
    The merged config lists every contender (``gi`` first), every breaching schedule and the largest budget."""
    import yaml

    parts = [Path(p) for p in parts]
    # a part written before fill_budget never restarted a contender: it ran as fill_budget false
    configs = [{"fill_budget": False, **yaml.safe_load((p / "config.yaml").read_text())} for p in parts]

    def fixed(c: dict[str, Any]) -> dict[str, Any]:
        b = c.get("breaching") or {}
        return {**{k: v for k, v in c.items() if k not in MERGE_MAY_DIFFER},
                "breaching": {k: v for k, v in b.items() if k not in ("max_iterations", "schedules")}}

    if any(fixed(c) != fixed(configs[0]) for c in configs[1:]):
        raise ConfigError(f"merge_runs: {[str(p) for p in parts]} ran different configs (beyond "
                          f"{', '.join(MERGE_MAY_DIFFER)})")
    curves = [Curve(**c) for p in parts for c in json.loads((p / "curves.json").read_text())]
    for c in curves:  # curves written before variants: breaching's schedule is in its info
        if not c.variant and c.contender == "breaching" and "max_iterations" in c.info:
            c.variant = f"{c.info['max_iterations']} it"
    if longest:
        curves = keep_longest(curves)
    keys = [(c.contender, c.variant, c.capture) for c in curves]
    if len(keys) != len(set(keys)):
        raise ConfigError(f"merge_runs: the parts attack the same capture twice with the same contender "
                          f"({sorted(k for k in set(keys) if keys.count(k) > 1)}); longest=True keeps the longer "
                          f"run where one is the other run further")
    names = sorted({n for c in configs for n in c["contenders"]}, key=lambda n: (n != "gi", n))
    seen = sorted({c.capture for c in curves})
    missing = [(n, k) for n in names for k in seen if not any((c.contender, c.capture) == (n, k) for c in curves)]
    if missing:
        raise ConfigError(f"merge_runs: no curve for (contender, capture) {missing}: every contender must attack "
                          f"every capture")
    schedules = sorted({int(v.split()[0]) for c in curves if c.contender == "breaching" and c.variant
                        for v in [c.variant]})
    breaching = {**(configs[0].get("breaching") or {}), **({"schedules": schedules} if schedules else {})}
    cfg = from_dict(TTQConfig, {**configs[0], "contenders": names, "select": seen, "out": str(out),
                                "budget": max(c["budget"] for c in configs), "breaching": breaching})
    metas = [json.loads((p / "summary.json").read_text()) for p in parts]
    with staged_output(Path(out), overwrite=overwrite) as tmp:
        keep = ("created", "git", "torch", "python", "machine", "cpus", "load_average_end", "threads")
        summary = {"parts": [{"path": str(p), **{k: m.get(k) for k in keep}} for p, m in zip(parts, metas)],
                   **summarize_curves(cfg, curves)}
        write_ttq(tmp, cfg, curves, summary, f"{cfg.name}: {cfg.job} ({len(seen)} captures)")
    return Path(out)


def format_ttq(out: Path) -> str:
    """A Markdown table of ``summary.json``: per capture, each contender's time to every level, its PSNR at the
    row's equal time (the budget, or the time a contender finished where restarting was off:
    :func:`compared_until`), what it spent (runs, iterations actually run, CPU seconds) and when it finished
    before the budget; then the ratio lines (``n/a`` with the reason where a time is near zero)."""
    data = json.loads((Path(out) / "summary.json").read_text())
    rows = data["rows"]
    names = contender_names(data)
    levels = sorted({float(k.split("_")[-1]) for r in rows for n in names for k in r[n] if k.startswith("time_to_")})

    def cell(v: float | None, budget: float) -> str:
        return seconds_text(v) if v is not None else f"never (>{budget:.0f})"

    def spent_cell(c: dict[str, Any]) -> str:
        cpu = c.get("cpu_seconds")
        return (f"{c.get('runs', 1)} / {c['iterations']} / " + (seconds_text(cpu) if cpu is not None else "-")
                if "iterations" in c else "-")

    def end_cell(c: dict[str, Any]) -> str:
        end = c.get("finished_at")
        return "budget" if end is None else f"finished at {seconds_text(end)} s"

    head = (["capture"] + [f"{n} to {lvl:g} dB [s]" for lvl in levels for n in names] + ["equal time [s]"]
            + [f"{n} dB at equal time" for n in names] + [f"{n} runs / it / CPU s" for n in names]
            + [f"{n} ended" for n in names])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["capture"])] + [cell(r[n][f"time_to_{lvl:g}"], r[n]["seconds"]) for lvl in levels
                                       for n in names]
        cells.append(seconds_text(r.get("equal_time", data["equal_time"])))
        cells += [f"{r[n]['psnr_at_equal_time']:.2f}" if r[n]["psnr_at_equal_time"] is not None else "-"
                  for n in names]
        cells += [spent_cell(r[n]) for n in names] + [end_cell(r[n]) for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    for key, s in data["ratios"].items():
        skipped = s.get("not_applicable", 0)
        why = "; ".join(s.get("why_not_applicable", []))
        if s["median"] is not None:
            mark = "" if s["median_kind"] == "exact" else s["median_kind"] + " "
            lines.append(f"ratio {key} dB: median {mark}{ratio_text(s['median'])}x, min {ratio_text(s['min'])}x "
                         f"(breaching censored {s['censored_theirs']}, ours censored {s['censored_ours']}, "
                         f"neither {s['neither']}" + (f", n/a {skipped}: {why}" if skipped else "") + ")")
        elif skipped:
            lines.append(f"ratio {key} dB: n/a ({why})")
    return "\n".join(lines)


register_bench_kind("time-to-quality")(BenchKind(run_ttq, format_ttq, check=check_contenders))
