"""``gi run``: the end-to-end job (DESIGN.md §2): data → victim → labels → reconstruction → scores.

The attack side receives the capture (and auxiliary data) only; ground truth is used to make the
oracle LabelResult when ``labels.mode: truth`` is asked for explicitly, and to score.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from gi import data as gdata
from gi.capture import Capture, Truth, capture_gradients
from gi.config import apply_overrides, from_dict, load_yaml, to_dict
from gi.errors import ConfigError
from gi.models import build
from gi.protocol import Protocol
from gi.recon import ReconConfig, Reconstruction, reconstruct
from gi.report import save_grid, save_line_plot, staged_output, write_csv, write_json, write_yaml

log = logging.getLogger("gi.run")
LABEL_MODES = ("truth", "recovered")


@dataclass
class DataConfig:
    """Which real samples the client holds and how its targets are augmented.

    ``indices``: dataset indices of the client's batch (length = protocol.batch_size); null draws them
    with the run seed. ``eps``: label-smoothing ε (null: U(0, eps_max) per sample, as the soft-label
    paper). ``mixup_lam``: mixup λ (null: U(0, 1)).
    """

    name: str = "cifar10-samples"
    split: str = "test"
    root: str | None = None
    size: int | None = None
    indices: list[int] | None = None
    eps: float | None = None
    eps_max: float = 0.5
    mixup_lam: float | None = None


@dataclass
class ModelConfig:
    """``gi.models.build`` arguments; ``num_classes`` null takes the dataset's; ``train_epochs`` > 0 trains
    the model briefly on the dataset's train split (or the samples) before the attack."""

    name: str = "lenet"
    num_classes: int | None = None
    activation: str | None = None
    init: str | None = None
    bias_last: bool = True
    norm: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    train_epochs: float = 0.0
    train_lr: float = 0.01


@dataclass
class LabelConfig:
    """``mode``: ``truth`` (oracle labels) or ``recovered`` (``method`` of the label registry);
    ``aux_per_class`` auxiliary samples per class for methods that need them."""

    mode: str = "recovered"
    method: str = "idlg"
    options: dict[str, Any] = field(default_factory=dict)
    aux_per_class: int = 0


@dataclass
class MetricConfig:
    lpips_vgg: bool = True
    match: bool = True


@dataclass
class RunConfig:
    name: str = "run"
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    protocol: Protocol = field(default_factory=Protocol)
    labels: LabelConfig = field(default_factory=LabelConfig)
    attack: ReconConfig = field(default_factory=ReconConfig)
    metrics: MetricConfig = field(default_factory=MetricConfig)

    def __post_init__(self) -> None:
        if self.labels.mode not in LABEL_MODES:
            raise ConfigError(f"labels.mode={self.labels.mode!r} is not allowed; valid: {list(LABEL_MODES)}")


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    data = apply_overrides(load_yaml(path), list(overrides or []))
    return from_dict(RunConfig, data)


# ----------------------------------------------------------------------------- stages
def client_batch(cfg: RunConfig, dataset: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's images and soft targets, per ``protocol.label_aug`` (one-hot, smoothing, mixup)."""
    b, c = cfg.protocol.batch_size, dataset.num_classes
    kind = cfg.protocol.label_aug
    if kind == "mixup":
        i1, i2 = gdata.sample_mixup_pairs(dataset, b, gen)
        lam = torch.rand(b, generator=gen) if cfg.data.mixup_lam is None else cfg.data.mixup_lam
        return gdata.mixup(dataset.images[i1], dataset.labels[i1], dataset.images[i2], dataset.labels[i2], lam, c)
    if cfg.data.indices is not None:
        if len(cfg.data.indices) != b:
            raise ConfigError(f"data.indices has {len(cfg.data.indices)} entries but protocol.batch_size={b}")
        idx = torch.as_tensor(cfg.data.indices)
        images, labels = gdata.to_batch(dataset, idx)
    else:
        images, labels, _ = gdata.sample_batch(dataset, b, gen)
    eps = cfg.data.eps
    if kind != "onehot" and eps is None:
        eps = torch.rand(b, generator=gen, dtype=torch.float64) * cfg.data.eps_max
    return images, gdata.make_targets(labels, c, kind, eps)


def oracle_labels(truth: Truth) -> Any:
    """The LabelResult an oracle would return: true soft targets and counts (scoring/ablation only)."""
    from labels import LabelResult

    return LabelResult.from_counts("truth", truth.counts, soft=truth.targets.clone(), info={"oracle": True})


class TruthMonitor(L.Callback):
    """Logs PSNR of the current best iterate against the truth, from outside the attack module."""

    def __init__(self, truth_images: torch.Tensor, every: int) -> None:
        self.truth, self.every = truth_images, every
        self.steps: list[int] = []
        self.psnr: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx % self.every and batch_idx != trainer.max_steps - 1:
            return
        from gi.metrics import match_images, psnr

        rec = pl_module.current_images().cpu()
        perm = match_images(rec, self.truth) if rec.shape[0] > 1 else [0]
        self.steps.append(batch_idx)
        self.psnr.append(float(psnr(rec[perm], self.truth).clamp(max=100).mean()))


@dataclass
class RunResult:
    out: Path
    metrics: dict[str, Any]
    capture: Capture
    truth: Truth
    reconstruction: Reconstruction


def run(cfg: RunConfig) -> RunResult:
    """Run one end-to-end reconstruction and write its output directory."""
    import labels
    from gi.metrics import label_metrics, score

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"runs/{cfg.name}-{stamp}")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        dataset = gdata.load(cfg.data.name, split=cfg.data.split, root=cfg.data.root, size=cfg.data.size)
        num_classes = cfg.model.num_classes or dataset.num_classes
        in_shape = tuple(dataset.images.shape[1:])
        model = build(cfg.model.name, num_classes, activation=cfg.model.activation, in_shape=in_shape,
                      bias_last=cfg.model.bias_last, init=cfg.model.init, norm=cfg.model.norm, seed=cfg.seed,
                      **cfg.model.options)
        if cfg.model.train_epochs > 0:
            from gi.train import train_model

            pool = gdata.load(cfg.data.name, split="train", root=cfg.data.root, size=cfg.data.size) \
                if cfg.data.name == "fashion-mnist" else dataset
            stats = train_model(model, pool.images, pool.labels, cfg.model.train_epochs, lr=cfg.model.train_lr,
                                generator=torch.Generator().manual_seed(cfg.seed + 1))
            log.info("trained model: %s", stats)
        images, targets = client_batch(cfg, dataset, gen)
        capture, truth = capture_gradients(model, images, targets, cfg.protocol, generator=gen)
        log.info("captured %s gradients of %d samples", cfg.model.name, images.shape[0])

        # ---- attack side: capture (+ aux) only
        if cfg.labels.mode == "truth":
            label_result = oracle_labels(truth)
        else:
            aux = None
            if cfg.labels.aux_per_class > 0:
                from labels.aux import AuxData

                ax, ay, _ = gdata.sample_aux(dataset, cfg.labels.aux_per_class, gen)
                aux = AuxData(ax, ay, num_classes)
            label_result = labels.recover(capture, cfg.labels.method, aux=aux, **cfg.labels.options)
        log.info("labels (%s): ok=%s counts=%s", label_result.method, label_result.ok, label_result.counts.tolist())
        monitor = TruthMonitor(truth.images, cfg.attack.log_every)
        rec = reconstruct(capture, label_result, features=label_result.features, config=cfg.attack,
                          callbacks=[monitor])

        # ---- scoring
        scores = score(rec.images, truth.images, labels_rec=rec.labels.argmax(1), labels_true=truth.labels,
                       match=cfg.metrics.match, vgg=cfg.metrics.lpips_vgg)
        random_img = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(cfg.seed + 7))
        baseline = score(random_img, truth.images, match=cfg.metrics.match, vgg=False)
        lab = label_metrics(label_result, truth)
        metrics = {
            "name": cfg.name,
            "psnr_mean": scores["psnr_mean"], "ssim_mean": scores["ssim_mean"],
            "lpips_alex_mean": scores["lpips_alex_mean"],
            "random_image_psnr_mean": baseline["psnr_mean"],
            "labels": {"method": label_result.method, "ok": label_result.ok, **lab,
                       "counts": label_result.counts.tolist(), "true_counts": truth.counts.tolist()},
            "images": scores,
            "attack": {"objective": rec.objective.tolist(), "best_restart": rec.best_restart,
                       "seconds": rec.seconds, "iterations": rec.iterations,
                       "seconds_per_100_iterations": 100 * rec.seconds / rec.iterations},
            "total_seconds": time.perf_counter() - t0,
            "device": "cuda" if torch.cuda.is_available() and cfg.attack.device != "cpu" else "cpu",
            "torch": torch.__version__,
        }
        write_yaml(tmp / "config.yaml", to_dict(cfg))
        write_json(tmp / "metrics.json", metrics)
        rows = [{"image": i, "psnr": scores["psnr"][i], "ssim": scores["ssim"][i],
                 "lpips_alex": scores["lpips_alex"][i], "matched_reconstruction": scores["perm"][i],
                 "true_label": int(truth.labels[i])} for i in range(truth.images.shape[0])]
        write_csv(tmp / "results.csv", rows)
        save_grid(tmp / "grid.png", [truth.images, rec.images[torch.as_tensor(scores["perm"])]], scale=2)
        save_line_plot(tmp / "psnr.png", monitor.steps, {"PSNR (best restart)": monitor.psnr}, "iteration",
                       "PSNR [dB]", title=cfg.name)
        save_line_plot(tmp / "objective.png", rec.history["step"],
                       {f"restart {r}": [o[r] for o in rec.history["objective"]] for r in range(len(rec.objective))},
                       "iteration", "attack objective", logy=True)
        capture.save(tmp / "capture.safetensors")
        truth.save(tmp / "truth.safetensors")
        log.info("PSNR %.2f dB (random image %.2f dB), SSIM %.3f, LPIPS %.3f", metrics["psnr_mean"],
                 metrics["random_image_psnr_mean"], metrics["ssim_mean"], metrics["lpips_alex_mean"])
    return RunResult(out, metrics, capture, truth, rec)
