"""The reconstruction as a LightningModule with manual optimisation (GradAttack's pattern, DESIGN.md §6).

The Trainer drives one optimisation step per batch of a length-N dummy loader. All R restarts are
one batched problem: dummy gradients come from ``vmap(grad(loss))`` over restarts, the objective is
computed per restart and the optimiser minimises their sum (the restarts do not interact). Ground
truth never enters this module; callbacks may look at ``current_images()`` to log metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch.func import functional_call, grad, vmap
from torch.utils.data import DataLoader, Dataset

from gi.losses import loss_for
from gi.protocol import Protocol
from gi.recon.config import ReconConfig
from gi.recon.objectives import OBJECTIVES
from gi.recon.regularizers import REGULARIZERS

Tensor = torch.Tensor


class StepDataset(Dataset):
    """N empty items: one per optimisation step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> int:
        return i


@dataclass
class Context:
    """What the attack knows besides the target: model, protocol, recovered features (never truth)."""

    model: torch.nn.Module
    protocol: Protocol
    features: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _initial_images(cfg: ReconConfig, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    if cfg.init == "uniform":
        return torch.rand(shape, generator=generator)
    if cfg.init == "gaussian":
        return (0.5 + 0.25 * torch.randn(shape, generator=generator)).clamp(0, 1)
    return torch.full(shape, 0.5)


class GradientInversion(L.LightningModule):
    """Optimise R×B dummy images so that their gradient matches the shared one."""

    def __init__(self, ctx: Context, target: dict[str, Tensor], soft_labels: Tensor, cfg: ReconConfig,
                 image_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.ctx, self.cfg = ctx, cfg
        model = ctx.model
        if ctx.protocol.model_mode == "train":
            torch.func.replace_all_batch_norm_modules_(model)
        self.net = model
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.weights = {k: float(cfg.layer_weights.get(k, 1.0)) for k in target}
        self.names = [k for k in target if self.weights[k] != 0.0]
        for i, k in enumerate(self.names):  # buffers, so they follow the module to its device
            self.register_buffer(f"target_{i}", target[k].detach().float().clone())
        gen = torch.Generator().manual_seed(cfg.seed)
        b = soft_labels.shape[0]
        self.images = torch.nn.Parameter(_initial_images(cfg, (cfg.restarts, b, *image_shape), gen))
        self.register_buffer("soft", soft_labels.float().expand(cfg.restarts, *soft_labels.shape).clone())
        self.register_buffer("best_loss", torch.full((cfg.restarts,), float("inf")))
        self.register_buffer("best_images", self.images.detach().clone())
        self.loss_fn = loss_for(ctx.protocol)
        self.history: dict[str, list] = {"step": [], "objective": []}

    # ----------------------------------------------------------------- the attack objective
    def _dummy_gradients(self, images: Tensor, soft: Tensor) -> dict[str, Tensor]:
        params = {n: p for n, p in self.net.named_parameters()}
        buffers = dict(self.net.named_buffers())

        def loss(p_sub: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            return self.loss_fn(functional_call(self.net, ({**params, **p_sub}, buffers), (x,)), y)

        sub = {n: params[n] for n in self.names}
        return vmap(grad(loss), in_dims=(None, 0, 0))(sub, images, soft)

    def objective(self, images: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-restart attack objective (R,) and its parts; the only basis for ranking restarts."""
        dummy = self._dummy_gradients(images, self.soft)
        target = {k: getattr(self, f"target_{i}") for i, k in enumerate(self.names)}
        parts = {"match": OBJECTIVES[self.cfg.objective](dummy, target, self.weights)}
        for name, weight in self.cfg.regularizers.items():
            if weight:
                parts[name] = weight * REGULARIZERS[name](images, self.ctx)
        return sum(parts.values()), parts

    # ----------------------------------------------------------------- Lightning hooks
    def configure_optimizers(self):
        cfg = self.cfg
        if cfg.optimizer == "adam":
            opt = torch.optim.Adam([self.images], lr=cfg.lr)
        else:
            opt = torch.optim.SGD([self.images], lr=cfg.lr, momentum=0.9)
        n = cfg.iterations
        if cfg.schedule == "multistep":
            milestones = [int(n * 3 / 8), int(n * 5 / 8), int(n * 7 / 8)]
            sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        elif cfg.schedule == "cosine":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)
        else:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        return [opt], [sched]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepDataset(self.cfg.iterations), batch_size=None, shuffle=False)

    def on_train_start(self) -> None:
        # Lightning puts modules in train mode; the victim model keeps the protocol's mode
        self.net.train(self.ctx.protocol.model_mode == "train")

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        per_restart, _ = self.objective(self.images)
        self.manual_backward(per_restart.sum())
        with torch.no_grad():
            # pair each objective with the iterate that produced it (no off-by-one)
            better = per_restart.detach() < self.best_loss
            self.best_loss = torch.where(better, per_restart.detach(), self.best_loss)
            self.best_images[better] = self.images.detach()[better]
            if self.cfg.signed and self.images.grad is not None:
                self.images.grad.sign_()
        opt.step()
        sched.step()
        if self.cfg.boxed:
            with torch.no_grad():
                self.images.clamp_(0, 1)
        if batch_idx % self.cfg.log_every == 0 or batch_idx == self.cfg.iterations - 1:
            self.history["step"].append(batch_idx)
            self.history["objective"].append(per_restart.detach().cpu().tolist())
        self.log("objective", per_restart.detach().min(), prog_bar=True, on_step=True, logger=False)

    def on_train_end(self) -> None:
        with torch.no_grad():
            final, _ = self.objective(self.images.detach())
            better = final < self.best_loss
            self.best_loss = torch.where(better, final, self.best_loss)
            self.best_images[better] = self.images.detach()[better]

    def current_images(self) -> Tensor:
        """Best iterate so far of the best restart (by the attack objective), (B, C, H, W)."""
        r = int(torch.argmin(self.best_loss)) if torch.isfinite(self.best_loss).any() else 0
        src = self.best_images if torch.isfinite(self.best_loss).any() else self.images.detach()
        return src[r].detach().clamp(0, 1)
