"""The reconstruction as a LightningModule with manual optimisation (GradAttack's pattern).

The Trainer drives one optimisation step per batch of a length-N dummy loader. P = N problems (captures that
share one global model) × R restarts are one batched problem: the dummy gradients (or unrolled updates) come
from ``vmap`` of a per-problem ``torch.func`` simulator (:mod:`gi.attack.recon.simulate`), the objective is computed
per problem and the optimiser minimises their sum (problems do not interact: Adam and sign are elementwise).
What to match is prepared before the loop (:func:`gi.attack.recon.problem.build_problem`); the objective is its weighted
terms (:mod:`gi.attack.recon.terms`). Ground truth never enters this module; callbacks may look at
:meth:`current_images` to log metrics.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch.func import vmap
from torch.utils.data import DataLoader, Dataset

from gi.attack.recon.config import ReconConfig, compile_mode
from gi.attack.recon.inits import INITS
from gi.attack.recon.objectives import FLAT_OBJECTIVES, OBJECTIVES
from gi.attack.recon.optim import OPTIMIZERS, select_rows
from gi.attack.recon.problem import Problem
from gi.attack.recon.simulate import SIMULATORS
from gi.attack.recon.terms import TERMS, Evaluation
from gi.world.losses import output_error_loss

Tensor = torch.Tensor
# shared entries per problem up to which the one-at-a-time path concatenates the layers on a CPU. Off the CPU the
# objective always does, one row or many under vmap: a GPU step of one image is bound by kernel launches, and one
# concatenation and three dot products replace some ten ops per layer. Aten ops per step counted with
# torch.profiler (scripts/step_ops.py), one CPU thread: ResNet-18 (62 layers, 11M entries), one restart, 11 523
# per layer against 4 576 concatenated (breaching 6 616), but 418 against 554 ms (the 44 MB copy costs more than
# the launches it saves); on an H200, 55.8 against 34.2 ms (docs/results/throughput-gpu.md). 20 packed DLG LeNet
# captures under vmap: 2 052 against 1 122 ops, but on the CPU 33.2 against 31.0 ms (within noise) and the packed
# iterates then drift from the one-at-a-time ones (signed Adam flips the sign of near-zero gradient entries: 0.09
# mean absolute pixel difference after 30 steps, against < 1e-6 per layer), so a CPU keeps vmap per layer.
FLAT_MAX = 4_000_000
# convolution multiply-adds per objective call up to which a CPU step uses PyTorch's native convolutions instead of
# oneDNN (mkldnn), whose per-call overhead outweighs its kernels on tiny convolutions. Measured
# (docs/results/time-to-quality.md, research/lenet_step_time.py, one thread): the DLG LeNet (0.7M MACs per 32 px image)
# with 1
# image per call 5.7-8.6 ms native vs 9.5-11.2 ms oneDNN per objective + backward, 4 images 14.8-17.4 vs 16.5-21.1,
# 5 images about even, 20 images 58-67 vs 38-56; ResNet-18 (0.56G MACs per image) 1.0-1.3 s native vs 0.37-0.43 s.
NATIVE_CONV_MACS = 4_000_000
# steps of the hard-thresholding pursuit (fcn_analytic.disaggregate.pursue) after each refreshed feature target's
# null direction from its image's zeros (GradientInversion.refresh_features)
REFRESH_PURSUIT = 2


def multistep_marks(steps: int) -> list[int]:
    """Inverting Gradients' multistep schedule over ``steps``: the steps at 3/8, 5/8 and 7/8, where the rate drops
    ×0.1."""
    return [int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]


def leaf_outputs(net: torch.nn.Module, image_shape: tuple[int, ...], meta: bool = True
                 ) -> list[tuple[torch.nn.Module, list[torch.Size]]]:
    """Every leaf module of ``net`` that ran in one forward pass of one image of ``image_shape``, in call order,
    with the shapes of its tensor outputs. ``meta``: on the meta device (shapes only; the parameters and buffers
    are untouched; raises where the net cannot run on meta tensors), else a real pass of a zero image. The net
    runs in eval mode (the shapes are the same) and keeps its mode."""
    calls: list[tuple[torch.nn.Module, list[torch.Size]]] = []

    def record(mod: torch.nn.Module, inputs: Any, out: Any) -> None:
        outs = out if isinstance(out, tuple) else (out,)
        calls.append((mod, [t.shape for t in outs if isinstance(t, torch.Tensor)]))

    leaves = [m for m in net.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(record) for m in leaves]
    was_training = net.training
    device = "meta" if meta else "cpu"
    try:
        net.eval()  # one image through a training BatchNorm can fail (one value per channel); shapes do not change
        state = {k: torch.empty_like(v, device=device) if meta else v
                 for k, v in [*net.named_parameters(), *net.named_buffers()]}
        with torch.no_grad():
            torch.func.functional_call(net, state, (torch.zeros((1, *image_shape), device=device),))
    finally:
        net.train(was_training)
        for h in handles:
            h.remove()
    return calls


def conv_macs(net: torch.nn.Module, image_shape: tuple[int, ...]) -> int | None:
    """Multiply-adds of ``net``'s convolutions for one image of ``image_shape`` (:func:`leaf_outputs` on the meta
    device); None when the net cannot run on meta tensors."""
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    try:
        calls = leaf_outputs(net, image_shape)
    except Exception:  # noqa: BLE001 - a net that cannot run on meta keeps the default convolutions
        return None
    return sum(math.prod(shapes[0]) * (m.in_channels // m.groups) * math.prod(m.kernel_size)
               for m, shapes in calls if isinstance(m, convs))


@contextmanager
def native_convolutions(enabled: bool) -> Iterator[None]:
    """PyTorch's native CPU convolutions instead of oneDNN inside the block when ``enabled`` (restored after)."""
    if not enabled or not torch.backends.mkldnn.is_available():
        yield
        return
    before = torch.backends.mkldnn.set_flags(_enabled=False, _fp32_precision=None)[0]
    try:
        yield
    finally:
        torch.backends.mkldnn.set_flags(_enabled=before, _fp32_precision=None)


def stack_rows(rows: list[Tensor]) -> Tensor:
    """``torch.stack(rows)``; one row as a view (a ResNet-18's gradients: 11M entries not copied every step)."""
    return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)


def records_history(cfg: ReconConfig, step: int) -> bool:
    """Whether training step ``step`` copies the objective to the host (the history, ``GradientInversion.history``):
    every ``cfg.log_every`` steps and the last. With the progress bar's every 10th step, the only steps with a host
    synchronisation by design."""
    return step % cfg.log_every == 0 or step == cfg.iterations - 1


class StepDataset(Dataset):
    """N empty items: one per optimisation step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> int:
        return i


FIT_IDS = itertools.count()  # one number per fit in this process: GradientInversion.fit_id


class GradientInversion(L.LightningModule):
    """Optimise the P = N·R dummy batches of a :class:`Problem` (N rows × ``cfg.restarts``) so that what they
    would share matches its targets; ``cfg`` gives the restarts, initialisation, optimiser and schedule.
    ``fit_id`` names this fit in the process (a reconstruction's ``history["fit"]``), so a callback that follows
    every fit (a retry, an alternative: docs/architecture.md "Conventions", packing) can tell which one a
    reconstruction came from."""

    def __init__(self, problem: Problem, cfg: ReconConfig) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.problem, self.cfg = problem, cfg
        self.num_problems, self.batch = problem.num_problems, problem.num_samples
        self.rows = cfg.restarts  # restarts still optimised per problem: R, then 1 after the cull
        self.culled: dict[str, Tensor] | None = None  # every restart's best (keep, loss, images, soft) at the cull
        self.net = problem.model
        if problem.protocol.model_mode == "train":
            torch.func.replace_all_batch_norm_modules_(self.net)
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.names = problem.matched
        self.weights = {k: problem.weights[k] for k in self.names}
        self.use_features = "features" in problem.terms
        self._register_targets()
        self._init_parameters()
        self._build_simulators()
        self.step_objective = self.objective
        if cfg.compile and self.vectorised():  # the vmap path: one graph (the loop path's autograd.grad is not)
            self.step_objective = torch.compile(self.objective, mode=compile_mode(cfg.compile))
        self.history: dict[str, list] = {"step": [], "objective": []}
        self.fit_id = next(FIT_IDS)
        self.macs_per_image: int | None | bool = False  # conv_macs of one image, measured at the first CPU step

    def _per_problem(self, t: Tensor) -> Tensor:
        """(N, …) → (1, …) when one problem (broadcast over restarts), else (N·R, …)."""
        return t if self.num_problems == 1 else t.repeat_interleave(self.rows, 0)

    def _register_targets(self) -> None:
        """The matched targets and f* as buffers (they follow the module to its device)."""
        for i, k in enumerate(self.names):
            self.register_buffer(f"target_{i}", self._per_problem(self.problem.targets[k].detach().float()))
        if self.use_features:
            target = self.problem.features.detach().float()
            if self.cfg.feature_relative:  # ‖f*‖ per problem divides both sides of the feature term
                norm = target.flatten(1).norm(dim=1).clamp_min(1e-30).view(-1, *(1,) * (target.dim() - 1))
                self.register_buffer("feature_norm", self._per_problem(norm))
                target = target / norm
            self.register_buffer("feature_target", self._per_problem(target))
        if self.problem.aux_span is not None:
            self.register_buffer("aux_mu", self.problem.aux_span[0].detach())
            self.register_buffer("aux_basis", self.problem.aux_span[1].detach())
        for i, (mean, var) in enumerate((self.problem.bn_targets or {}).values()):  # BN prior (a GPU run failed
            self.register_buffer(f"bn_mean_{i}", mean.detach())                   # with them left on the CPU)
            self.register_buffer(f"bn_var_{i}", var.detach())

    def device_bn_targets(self) -> dict[str, tuple[Tensor, Tensor]] | None:
        """The BatchNorm targets from the module's buffers, on its device (None without a BN prior)."""
        if not self.problem.bn_targets:
            return None
        return {name: (getattr(self, f"bn_mean_{i}"), getattr(self, f"bn_var_{i}"))
                for i, name in enumerate(self.problem.bn_targets)}

    def _init_parameters(self) -> None:
        """The images (``cfg.init``), the fixed soft labels or joint label logits, and the best iterates."""
        problem, cfg, n, r, b = self.problem, self.cfg, self.num_problems, self.cfg.restarts, self.batch
        # every problem draws its start from its own generator seeded cfg.seed, as if it were reconstructed alone:
        # packing captures into one problem (reconstruct_many) changes the speed, not the images
        gens = [torch.Generator().manual_seed(cfg.seed) for _ in range(n)]
        init = torch.cat([INITS[cfg.init]((1, r, b, *problem.image_shape), gen,
                                          None if problem.prior is None else problem.prior[i:i + 1], cfg.init_noise)
                          for i, gen in enumerate(gens)])
        self.images = torch.nn.Parameter(init.reshape(n * r, b, *problem.image_shape))
        self.joint = cfg.labels == "joint"
        if self.joint:
            if problem.soft is None:
                logits = torch.cat([torch.randn((r, b, self.net.num_classes), generator=gen) for gen in gens])
            else:
                logits = problem.soft.float().clamp_min(1e-8).log().repeat_interleave(r, 0)
            self.label_logits = torch.nn.Parameter(logits)
        else:
            self.register_buffer("soft", problem.soft.float().repeat_interleave(r, 0))
        if self.captured_error:  # the dummy gradients' ∂L/∂z, frozen at the capture's (ReconConfig.output_error)
            self.register_buffer("output_error", problem.output_error.float().repeat_interleave(r, 0))
        self.register_buffer("best_loss", torch.full((n * r,), float("inf")))
        self.register_buffer("best_images", self.images.detach().clone())
        self.register_buffer("best_soft", self.current_soft().detach().clone())

    def _build_simulators(self) -> None:
        """``simulate`` (vmappable, any kind) and ``simulate_one``: one problem at a time (batching=loop), FedSGD
        gradients by plain autograd on the model's parameters, and for l2/cosine on small nets one concatenated
        √w-scaled vector per problem (a few dot products per step)."""
        problem, trained = self.problem, list(self.problem.targets)
        loss = output_error_loss if self.captured_error else None
        self.simulate = SIMULATORS[problem.kind](self.net, problem.protocol, self.names, num_samples=self.batch,
                                                 history=problem.history, trained=trained, features=self.use_features,
                                                 loss=loss, feature_layer=problem.feature_layer)
        self.simulate_one, self.flat_numel = self.simulate, None
        if problem.kind == "gradient":
            self.simulate_one = SIMULATORS["gradient"](self.net, problem.protocol, self.names,
                                                       features=self.use_features, autograd=True, loss=loss,
                                                       feature_layer=problem.feature_layer)
            if self.cfg.objective in FLAT_OBJECTIVES and self.names:
                self.flat_numel = sum(getattr(self, f"target_{i}")[0].numel() for i in range(len(self.names)))
                self.sqrt_w = [math.sqrt(self.weights[k]) for k in self.names]

    def flat(self) -> bool:
        """Whether the objective matches one concatenated √w-scaled vector per row instead of layer by layer (l2
        and cosine only; the same value up to rounding): always off the CPU; on it one row at a time up to
        :data:`FLAT_MAX` entries, never under vmap."""
        if self.flat_numel is None:
            return False
        return not self.images.is_cpu or (not self.vectorised() and self.flat_numel <= FLAT_MAX)

    def concatenated(self, grads: dict[str, Tensor] | list[Tensor], start: int) -> Tensor:
        """The matched layers of ``grads`` (by name, or in :attr:`names` order) as one √w-scaled vector, each
        flattened from dimension ``start`` (1: rows first, 0: one row)."""
        layers = [grads[k] for k in self.names] if isinstance(grads, dict) else grads
        return torch.cat([g.flatten(start) * w if w != 1.0 else g.flatten(start)
                          for g, w in zip(layers, self.sqrt_w)], start)

    def flat_target(self) -> Tensor:
        """The targets as one √w-scaled vector per problem, built on first use on the module's device (a buffer,
        so that the cull selects its rows)."""
        if not hasattr(self, "target_flat"):
            self.register_buffer("target_flat", self.concatenated(
                [getattr(self, f"target_{i}") for i in range(len(self.names))], 1))
        return self.target_flat

    # ----------------------------------------------------------------- the attack objective
    def vectorised(self) -> bool:
        """Whether the rows are simulated in one ``vmap`` call: :attr:`Problem.batching` ``vmap`` while more than one
        row is optimised. One row (a single problem, e.g. after the cull) takes the loop path: plain autograd costs
        half of vmap's ``torch.func`` transforms there (DLG LeNet, one 32 px image, one thread: 5.9-7.2 ms
        against 9.5-14.3 ms per objective + backward; the same objective, rounding aside)."""
        return self.problem.batching == "vmap" and self.images.shape[0] > 1

    @property
    def captured_error(self) -> bool:
        """Whether the dummy gradients use the captured output error (:attr:`Problem.output_error`), so the labels
        do not enter the objective."""
        return self.problem.output_error is not None

    def current_soft(self) -> Tensor:
        """Soft labels (P, B, C) the dummy data is trained with: fixed, or softmax of the joint logits."""
        return torch.softmax(self.label_logits, -1) if self.joint else self.soft

    def evaluation(self, images: Tensor, soft: Tensor, pick: Any) -> Evaluation:
        """Simulate the rows ``images`` with labels ``soft`` and pair what they share with the targets
        (``pick`` selects the targets' rows)."""
        vectorised = self.vectorised()
        flat = self.flat()
        if vectorised:
            dummy, feats = vmap(self.simulate, out_dims=(0, 0 if self.use_features else None))(images, soft)
            if flat:  # one √w-scaled vector per row: same value
                dummy = {"all": self.concatenated(dummy, 1)}
        else:
            outs = [self.simulate_one(images[p], soft[p if soft.shape[0] > 1 else 0])
                    for p in range(images.shape[0])]
            if flat:
                dummy = {"all": stack_rows([self.concatenated(o[0], 0) for o in outs])}
            else:
                dummy = {k: stack_rows([o[0][k] for o in outs]) for k in self.names}
            feats = stack_rows([o[1] for o in outs]) if self.use_features else None
        if self.use_features and self.cfg.feature_relative:
            feats = feats / pick(self.feature_norm)
        ev = Evaluation(self.problem, OBJECTIVES[self.cfg.objective], features=feats,
                        feature_target=pick(self.feature_target) if self.use_features else None,
                        device_bn_targets=self.device_bn_targets(),
                        device_aux_span=(self.aux_mu, self.aux_basis) if self.problem.aux_span is not None else None)
        if flat:
            ev.shared, ev.shared_target, ev.shared_weights = dummy, {"all": pick(self.flat_target())}, {"all": 1.0}
        else:
            ev.shared, ev.shared_weights = dummy, self.weights
            ev.shared_target = {k: pick(getattr(self, f"target_{i}")) for i, k in enumerate(self.names)}
        return ev

    def objective(self, images: Tensor, soft: Tensor | None = None,
                  rows: slice | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-problem attack objective (P,) and its weighted terms (:attr:`Problem.terms`); the only basis for
        ranking restarts. ``rows``: the problems ``images`` holds (default all P), e.g. ``slice(p, p + 1)`` for one
        problem at a time."""
        def pick(t: Tensor) -> Tensor:
            return t[rows] if rows is not None and t.shape[0] > 1 else t

        y = self.output_error if self.captured_error else (self.current_soft() if soft is None else soft)
        ev = self.evaluation(images, pick(y), pick)
        parts = {name: weight * TERMS[name](images, ev) for name, weight in self.problem.terms.items()}
        return sum(parts.values()), parts

    def small_convolutions(self) -> bool:
        """Whether one objective call's convolutions (all rows under vmap, one row in the loop) are small enough
        (:data:`NATIVE_CONV_MACS`) for PyTorch's native CPU kernels to beat oneDNN; never off the CPU."""
        if not self.images.is_cpu:
            return False
        if self.macs_per_image is False:
            self.macs_per_image = conv_macs(self.net, tuple(self.problem.image_shape))
        if not self.macs_per_image:
            return False
        images = self.batch * (self.images.shape[0] if self.vectorised() else 1)
        return self.macs_per_image * images <= NATIVE_CONV_MACS

    def objective_and_backward(self) -> Tensor:
        """The objective of all P problems (P,), its gradient accumulated into the parameters: one vmap call and
        one backward, or (``batching=loop``) one problem at a time, so only one problem's graph is alive. Small
        convolutions run on PyTorch's native CPU kernels (:meth:`small_convolutions`)."""
        with native_convolutions(self.small_convolutions()):
            return self._objective_and_backward()

    def _objective_and_backward(self) -> Tensor:
        inputs = [self.images] + ([self.label_logits] if self.joint else [])  # never the model's parameters
        if self.vectorised():
            per_problem, _ = self.step_objective(self.images)
            per_problem.sum().backward(inputs=inputs)
            return per_problem.detach()
        losses = []
        for p in range(self.images.shape[0]):
            loss, _ = self.objective(self.images[p:p + 1], rows=slice(p, p + 1))
            loss.sum().backward(inputs=inputs)
            losses.append(loss.detach())
        return torch.cat(losses)

    # ----------------------------------------------------------------- Lightning hooks
    @property
    def refreshing(self) -> bool:
        """Whether the fit refreshes its feature targets (``attack.feature_refresh`` on a multi-epoch round's
        approximate inputs, :meth:`refresh_features`)."""
        return bool(self.use_features and self.problem.feature_basis is not None and self.cfg.feature_refresh)

    def _schedule(self, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        n = self.cfg.iterations
        if self.cfg.schedule == "multistep-cycle" and self.refreshing:  # the multistep steps in every period
            period = self.cfg.feature_refresh
            marks = multistep_marks(period)
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 ** sum(s % period >= m for m in marks))
        if self.cfg.schedule in ("multistep", "multistep-cycle"):
            return torch.optim.lr_scheduler.MultiStepLR(opt, multistep_marks(n), 0.1)
        if self.cfg.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)  # constant

    def configure_optimizers(self):
        """One optimiser (``cfg.optimizer``) over the images and, for joint labels, the label logits as a second
        parameter group with step ``label_lr`` (null: ``lr``). Keeping both in one L-BFGS keeps its curvature pairs
        consistent: a separate label optimiser changes the objective under L-BFGS' feet and does worse."""
        cfg = self.cfg
        groups = [{"params": [self.images], "lr": cfg.lr}]
        if self.joint:
            groups.append({"params": [self.label_logits], "lr": cfg.label_lr or cfg.lr})
        opt = OPTIMIZERS[cfg.optimizer](groups, cfg)
        return [opt], [self._schedule(opt)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepDataset(self.cfg.iterations), batch_size=None, shuffle=False)

    def _track(self, loss: Tensor) -> None:
        """Keep each problem's best iterate, paired with the objective it produced (no off-by-one)."""
        better = loss < self.best_loss
        self.best_loss = torch.where(better, loss, self.best_loss)
        # torch.where, not boolean-mask assignment: a mask needs its nonzero count on the host, i.e. a GPU sync
        # on every step
        for best, now in ((self.best_images, self.images.detach()), (self.best_soft, self.current_soft().detach())):
            best.copy_(torch.where(better.view(-1, *[1] * (now.dim() - 1)), now, best))

    def on_train_start(self) -> None:
        # Lightning puts modules in train mode; the victim model keeps the protocol's mode
        self.net.train(self.problem.protocol.model_mode == "train")
        # the raw torch optimisers and schedulers: Lightning's wrappers cost a profiler-visible share of a small
        # net's step and add nothing here (full precision, one process per problem set)
        opts, scheds = self.optimizers(use_pl_optimizer=False), self.lr_schedulers()
        self.raw_optimizers = opts if isinstance(opts, list) else [opts]
        self.raw_schedulers = scheds if isinstance(scheds, list) else [scheds]

    def refresh_features(self) -> None:
        """``attack.feature_refresh``: each slot's feature target becomes the direction of its capture's row space
        (:attr:`Problem.feature_basis`) that best vanishes where the slot's current image's input of the feature
        layer does (:func:`fcn_analytic.disaggregate.null_directions`), at that input's norm. Measured on
        Fashion-MNIST rounds of E = 5: the approximate inputs' own scales gave 22.0 dB and 18 of 50 recovered (seed
        0); the input's projection on the direction 25.0 dB and 20 of 50 (seed 0) but 11.2 dB and 0 of 50 (seed 1),
        as each refresh shrinks the target by the cosine until the images fade. The images' zero pattern is nearer
        the truth's than the approximate inputs' (a multi-epoch round's visits differ by the drift, their zeros
        barely), so target and images sharpen each other. The best iterates are tracked anew, since the objective
        changed."""
        from fcn_analytic.disaggregate import null_directions, pursue

        with torch.no_grad():
            y = self.output_error if self.captured_error else self.current_soft()
            feats = self.evaluation(self.images, y, lambda t: t).features
            rows, slots = feats.shape[0], feats.shape[1]
            old = self.feature_target.expand(rows, *self.feature_target.shape[1:]).reshape(rows, slots, -1)
            new = torch.empty_like(old)
            per = max(1, rows // self.num_problems)
            for row in range(rows):
                basis = self.problem.feature_basis[min(row // per, len(self.problem.feature_basis) - 1)]
                f = feats[row].reshape(slots, -1).double().cpu()
                d, _ = pursue(basis, null_directions(basis, f)[0], REFRESH_PURSUIT)
                new[row] = (d * f.norm(dim=1, keepdim=True)).to(old)
            self.feature_target = new.reshape(rows, *self.feature_target.shape[1:])
            self.best_loss.fill_(float("inf"))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One optimisation step of every problem. No host synchronisation: the objective stays on the device
        except every ``log_every`` steps (the history) and, with a progress bar, every 10 steps."""
        opts, scheds = self.raw_optimizers, self.raw_schedulers
        if self.rows > 1 and batch_idx == self.cfg.cull_after > 0:
            self.cull()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        per_problem = self.objective_and_backward()
        with torch.no_grad():
            self._track(per_problem)
            if self.cfg.signed and self.cfg.optimizer != "lbfgs" and self.images.grad is not None:
                self.images.grad.sign_()
        for opt, sched in zip(opts, scheds):
            opt.step()
            sched.step()
        if self.cfg.boxed:
            with torch.no_grad():
                self.images.clamp_(0, 1)
        if self.refreshing and batch_idx > 0 and batch_idx % self.cfg.feature_refresh == 0:
            self.refresh_features()
        if records_history(self.cfg, batch_idx):
            self.history["step"].append(batch_idx)
            self.history["objective"].append(self.all_rows(per_problem.detach().cpu()).tolist())
        if self.cfg.progress and batch_idx % 10 == 0:  # self.log costs ~0.5 ms: a small net's whole step is ~7 ms
            self.log("objective", per_problem.detach().min(), prog_bar=True, on_step=True, logger=False)

    def cull(self) -> None:
        """Successive halving in one step (``cfg.cull_after``): keep every problem's restart with the lowest
        objective so far and continue only it, with its optimiser state (its L-BFGS memory), so it follows the
        iterates it would have followed had it run alone. The other restarts' best iterates stay in
        :attr:`culled`. Ranked by the attack objective only."""
        n, r = self.num_problems, self.rows
        keep = torch.arange(n, device=self.best_loss.device) * r + self.best_per_problem()
        self.culled = {"keep": keep, "loss": self.best_loss.clone(), "images": self.best_images.clone(),
                       "soft": self.best_soft.clone()}
        params = [self.images] + ([self.label_logits] if self.joint else [])
        for opt in self.raw_optimizers:
            select_rows(opt, keep)
        for p in params:
            p.data = p.data[keep]
            p.grad = None
        for name, buf in list(self.named_buffers(recurse=False)):  # the module's own: not the victim model's
            if buf.dim() and buf.shape[0] == n * r:  # per-row (targets of one problem broadcast: 1 row)
                setattr(self, name, buf[keep])
        self.rows = 1

    def all_rows(self, values: Tensor, fill: Tensor | float = float("nan")) -> Tensor:
        """Per-row ``values`` of the rows still optimised, spread over all N·R restarts (before the cull: as they
        are); the culled rows get ``fill`` (a tensor of N·R rows, or a scalar)."""
        if self.culled is None:
            return values
        keep = self.culled["keep"].to(values.device)
        full = fill.clone() if isinstance(fill, Tensor) else torch.full(
            (self.num_problems * self.cfg.restarts, *values.shape[1:]), fill, dtype=values.dtype)
        full = full.to(values.device)
        full[keep] = values
        return full

    def on_train_end(self) -> None:
        with torch.no_grad(), native_convolutions(self.small_convolutions()):  # as in the steps it is ranked with
            final, _ = self.objective(self.images.detach())
            self._track(final)

    # ----------------------------------------------------------------- results
    def best_per_problem(self) -> Tensor:
        """Index (N,) of the restart with the lowest objective of every problem."""
        return self.best_loss.view(self.num_problems, -1).argmin(1)

    def current_batch(self) -> Tensor:
        """Best iterate so far of every problem's best restart (by the attack objective), (N, B, C, H, W)."""
        finite = torch.isfinite(self.best_loss).any()
        src = self.best_images if finite else self.images.detach()
        r = self.rows
        view = src.view(self.num_problems, r, *src.shape[1:])
        idx = self.best_per_problem() if finite else torch.zeros(self.num_problems, dtype=torch.long)
        return view[torch.arange(self.num_problems), idx.to(view.device)].detach().clamp(0, 1)

    def current_images(self) -> Tensor:
        """:meth:`current_batch` of the first problem, (B, C, H, W)."""
        return self.current_batch()[0]
