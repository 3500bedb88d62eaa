"""``gi run``: the end-to-end job (docs/architecture.md, "Data flow"): data → victim → labels → reconstruction → scores.

The attack side receives the capture (and auxiliary data) only; ground truth is used to make the
oracle LabelResult when ``labels.mode: truth`` is asked for explicitly, and to score.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gi.core.config import require, to_dict
from gi.core.errors import ConfigError
from gi.experiments.report import (
    check_run_name,
    save_grid,
    save_line_plot,
    staged_output,
    write_csv,
    write_json,
    write_yaml,
)
from gi.recon.config import ReconConfig
from gi.victim_setup import (  # noqa: F401  (DataConfig, ModelConfig: the sections, importable from here too)
    DataConfig,
    ModelConfig,
    VictimSetup,
    build_model,
    draw_aux,
    load_config,
    load_data,
    train_on,
)

if TYPE_CHECKING:  # torch, the data, models and Lightning load on first use: config errors answer at once
    import torch

    from gi.capture import Capture, Truth
    from gi.label_result import LabelResult
    from gi.recon import Reconstruction

log = logging.getLogger("gi.run")


@dataclass
class RunDataConfig(DataConfig):
    """The shared :class:`~gi.victim_setup.DataConfig` plus how ``gi run`` draws the client's batch.

    ``indices``: dataset indices of the client's batch (length = protocol.batch_size); null draws them
    with the run seed. ``eps``: label-smoothing ε (null: U(0, eps_max) per sample, as the soft-label
    paper). ``mixup_lam``: mixup λ (null: U(0, 1)).
    """

    indices: list[int] | None = None
    eps: float | None = None
    eps_max: float = 0.5
    mixup_lam: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.indices is None or all(i >= 0 for i in self.indices), "data.indices", self.indices,
                "dataset indices >= 0")
        for key in ("eps", "eps_max", "mixup_lam"):
            value = getattr(self, key)
            require(value is None or 0 <= value <= 1, f"data.{key}", value, "a number in [0, 1]")


@dataclass
class LabelConfig:
    """``mode`` (a name of :data:`LABEL_MODES`): ``truth`` (oracle), ``recovered`` (``method`` of the label
    registry; soft labels are soft targets, counts become per-slot one-hot labels), ``hard`` (one-hot labels of
    ``hard_method``, iDLG by default), ``joint`` (DLG: labels optimised with the images from a random start),
    ``recovered+joint`` (joint, initialised from ``method``'s labels). The attack's ``labels`` (fixed or joint)
    follows from ``mode``; methods that need auxiliary samples get the ``aux`` section's."""

    mode: str = "recovered"
    method: str = "idlg"
    hard_method: str = "idlg"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class MetricConfig:
    lpips_vgg: bool = True
    match: bool = True


@dataclass
class RunConfig(VictimSetup):
    """``gi run``: the victim setup (:class:`~gi.victim_setup.VictimSetup`: ``data``, ``model``, ``train``,
    ``aux``, ``protocol``), the label stage, the attack and the scores. ``attack.labels`` is derived from
    ``labels.mode`` (an explicit different value is a ConfigError)."""

    LEGACY: ClassVar[dict[str, str]] = {"model.train_epochs": "train.epochs", "model.train_lr": "train.lr",
                                        "labels.aux_per_class": "aux.per_class"}

    name: str = "run"
    seed: int = 0
    out: str | None = None
    overwrite: bool = False
    data: RunDataConfig = field(default_factory=RunDataConfig)
    labels: LabelConfig = field(default_factory=LabelConfig)
    attack: ReconConfig = field(default_factory=ReconConfig)
    metrics: MetricConfig = field(default_factory=MetricConfig)

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "") -> Any:
        check_attack_labels(data)
        return super().from_mapping(data, where)

    def __post_init__(self) -> None:
        check_run_name(self.name)
        if self.labels.mode not in LABEL_MODES:
            raise ConfigError(f"labels.mode={self.labels.mode!r} is not allowed; valid: {list(LABEL_MODES)}")
        kind = LABEL_MODES[self.labels.mode].kind
        if self.attack.labels != kind:  # derived: the loaders refuse an explicit other value
            self.attack = dataclasses.replace(self.attack, labels=kind)
        if self.protocol.is_update and self.protocol.label_aug == "mixup":
            raise ConfigError("protocol.label_aug=mixup is FedSGD-only here (gi.fl.victim trains with one-hot or "
                              "smoothed labels); use protocol.scheme=fedsgd or another label_aug")

    def written(self) -> dict[str, Any]:
        """The config as its ``config.yaml`` records it: every setting (derived ones as they ran), the run's own
        keys (name, seed, out, overwrite) first."""
        data = to_dict(self)
        return {**{k: data.pop(k) for k in ("name", "seed", "out", "overwrite")}, **data}


def check_attack_labels(data: Any) -> None:
    """``attack.labels`` follows from ``labels.mode`` (fixed or joint labels); an explicit other value is refused
    instead of being replaced silently."""
    if not isinstance(data, dict) or not isinstance(data.get("attack"), dict) or "labels" not in data["attack"]:
        return
    labels = data.get("labels")
    mode = labels.get("mode", LabelConfig.mode) if isinstance(labels, dict) else LabelConfig.mode
    given = data["attack"]["labels"]
    if mode in LABEL_MODES and given != LABEL_MODES[mode].kind:
        raise ConfigError(f"attack.labels={given!r} contradicts labels.mode={mode!r} (its labels are "
                          f"{LABEL_MODES[mode].kind!r}); attack.labels follows from labels.mode: leave it out")


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    return load_config(RunConfig, path, overrides)


# ----------------------------------------------------------------------------- stages
def client_batch(cfg: RunConfig, dataset: Any, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """The client's images, soft targets (per ``protocol.label_aug``: one-hot, smoothing, mixup) and the dataset
    indices of every sample they are made of (both images of a mixup pair)."""
    import torch

    from gi import data as gdata

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


def oracle_labels(truth: Truth) -> LabelResult:
    """The LabelResult an oracle would return: true soft targets and counts (scoring/ablation only)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts("truth", truth.counts, soft=truth.targets.clone(), info={"oracle": True})


def build_victim(cfg: Any) -> tuple[Any, torch.nn.Module]:
    """The client's dataset and the global model (trained briefly when ``train.epochs`` > 0).

    ``cfg`` is a victim setup with a ``seed`` (a RunConfig or an AblateConfig): the model is initialised with
    ``seed`` (or ``model.seed``) and trained with a generator seeded ``seed + 1``.
    """
    import torch

    dataset = load_data(cfg.data)
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
    FedAvg-style update of local training on that batch (``gi.fl.victim.simulate_client``). ``truth.meta["indices"]``
    lists the dataset indices the batch is made of (kept out of the attacker's aux set by :func:`make_aux`)."""
    images, targets, indices = client_batch(cfg, dataset, gen)
    if cfg.protocol.is_update:
        from gi.fl.victim import simulate_client

        capture, truth = simulate_client(model, (images, targets.argmax(1)), cfg.protocol, rng=gen)
    else:
        from gi.capture import capture_gradients

        capture, truth = capture_gradients(model, images, targets, cfg.protocol, generator=gen)
    if cfg.protocol.share_bn_stats:
        share_bn_statistics(model, images, capture)
    truth.meta = {**truth.meta, "indices": [int(i) for i in indices]}
    return capture, truth


# --------------------------------------------------------------------------- label modes
def _truth_labels(lcfg: LabelConfig, capture: Capture, truth: Truth, aux: Any) -> LabelResult | None:
    return oracle_labels(truth)


def _recovered_labels(lcfg: LabelConfig, capture: Capture, truth: Truth, aux: Any) -> LabelResult | None:
    import labels

    return labels.recover(capture, lcfg.method, aux=aux, **lcfg.options)


def _hard_labels(lcfg: LabelConfig, capture: Capture, truth: Truth, aux: Any) -> LabelResult | None:
    """iDLG-style one-hot labels: the counts of ``hard_method`` (its soft labels, if any, become their argmax)."""
    import torch

    import labels
    from gi.label_result import LabelResult

    result = labels.recover(capture, lcfg.hard_method, aux=aux)
    counts = result.counts if result.soft is None else torch.bincount(result.soft.argmax(1),
                                                                      minlength=capture.num_classes)
    return LabelResult.from_counts(f"hard:{result.method}", counts, ok=result.ok, info=dict(result.info))


def _no_labels(lcfg: LabelConfig, capture: Capture, truth: Truth, aux: Any) -> LabelResult | None:
    return None


@dataclass(frozen=True)
class LabelMode:
    """A label-knowledge mode: where its labels come from (``labels(lcfg, capture, truth, aux)`` → LabelResult or
    None; only the oracle reads ``truth``) and whether the attack keeps them ``fixed`` or optimises them
    ``joint``ly (DLG)."""

    labels: Callable[[LabelConfig, Capture, Truth, Any], Any]
    kind: str


LABEL_MODES: dict[str, LabelMode] = {
    "truth": LabelMode(_truth_labels, "fixed"),
    "recovered": LabelMode(_recovered_labels, "fixed"),
    "hard": LabelMode(_hard_labels, "fixed"),
    "joint": LabelMode(_no_labels, "joint"),
    "recovered+joint": LabelMode(_recovered_labels, "joint"),
}


def attack_labels(lcfg: LabelConfig, capture: Capture, truth: Truth,
                  aux: Any = None) -> tuple[LabelResult | None, str]:
    """The label knowledge of ``lcfg.mode``: ``(LabelResult or None, "fixed" | "joint")``."""
    mode = LABEL_MODES[lcfg.mode]
    return mode.labels(lcfg, capture, truth, aux), mode.kind


def make_aux(cfg: VictimSetup, dataset: Any, gen: torch.Generator, truths: list[Truth]) -> Any:
    """The attacker's aux set (``aux.per_class`` per class of ``aux.split``), drawn with ``gen``; from the victim's
    ``dataset`` it holds no sample of the victims' batches (``truth.meta["indices"]`` of every truth in ``truths``)."""
    if cfg.aux.per_class <= 0:
        return None
    if cfg.aux.split not in (None, cfg.data.split):
        return draw_aux(load_data(cfg.data, cfg.aux.split), cfg.aux.per_class, gen)[0]
    victims = [i for t in truths for i in t.meta["indices"]]
    return draw_aux(dataset, cfg.aux.per_class, gen, exclude=victims)[0]


def used_labels(rec: Reconstruction, mode: str) -> LabelResult:
    """The labels the reconstruction ended with, as a LabelResult (soft rows and their argmax counts)."""
    from gi.label_result import LabelResult

    return LabelResult.from_counts(mode, final_counts(rec), soft=rec.labels.double())


def final_counts(rec: Reconstruction) -> torch.Tensor:
    import torch

    return torch.bincount(rec.labels.argmax(1), minlength=rec.labels.shape[1])


def truth_monitor(truth_images: torch.Tensor, every: int) -> Any:
    """A Lightning callback that logs PSNR of the current best iterate against the truth every ``every`` steps,
    from outside the attack module (``.steps``, ``.psnr``)."""
    import lightning as L

    class TruthMonitor(L.Callback):
        def __init__(self) -> None:
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

    return TruthMonitor()


@dataclass
class RunResult:
    out: Path
    metrics: dict[str, Any]
    capture: Capture
    truth: Truth
    reconstruction: Reconstruction


def run(cfg: RunConfig) -> RunResult:
    """Run one end-to-end reconstruction and write its output directory."""
    import torch

    from gi.metrics import label_metrics, score
    from gi.recon import reconstruct

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"runs/{cfg.name}-{stamp}")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        dataset, model = build_victim(cfg)
        capture, truth = capture_client(cfg, dataset, model, gen)
        log.info("captured %s %s of %d samples", cfg.model.name, "update" if capture.is_update else "gradients",
                 truth.images.shape[0])

        # ---- attack side: capture (+ aux) only; the oracle mode alone reads truth, by request
        aux = make_aux(cfg, dataset, gen, [truth])
        label_result, label_kind = attack_labels(cfg.labels, capture, truth, aux)
        if label_result is not None:
            log.info("labels (%s): ok=%s counts=%s", label_result.method, label_result.ok,
                     label_result.counts.tolist())
        attack = cfg.attack  # attack.labels is label_kind: RunConfig derives it from labels.mode
        assert attack.labels == label_kind, (attack.labels, label_kind)
        monitor = truth_monitor(truth.images, cfg.attack.log_every)
        features = None if label_result is None else label_result.features
        rec = reconstruct(capture, label_result, features=features, config=attack, callbacks=[monitor])

        # ---- scoring
        scores = score(rec.images, truth.images, labels_rec=rec.labels.argmax(1), labels_true=truth.labels,
                       match=cfg.metrics.match, vgg=cfg.metrics.lpips_vgg)
        random_img = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(cfg.seed + 7))
        baseline = score(random_img, truth.images, match=cfg.metrics.match, vgg=False)
        lab = label_metrics(label_result, truth) if label_result is not None else {}
        final = label_metrics(used_labels(rec, cfg.labels.mode), truth)
        metrics = {
            "name": cfg.name,
            "psnr_mean": scores["psnr_mean"], "ssim_mean": scores["ssim_mean"],
            "lpips_alex_mean": scores["lpips_alex_mean"],
            "random_image_psnr_mean": baseline["psnr_mean"],
            "labels": {"mode": cfg.labels.mode, "method": "joint" if label_result is None else label_result.method,
                       "ok": True if label_result is None else label_result.ok, **lab,
                       "counts": (label_result.counts if label_result is not None else final_counts(rec)).tolist(),
                       "true_counts": truth.counts.tolist()},
            "final_labels": {**final, "L_r": final.get("soft_l1"), "counts": final_counts(rec).tolist()},
            "images": scores,
            "attack": {"objective": rec.objective.tolist(), "best_restart": rec.best_restart,
                       "seconds": rec.seconds, "iterations": rec.iterations,
                       "seconds_per_100_iterations": 100 * rec.seconds / rec.iterations},
            "total_seconds": time.perf_counter() - t0,
            "device": "cuda" if torch.cuda.is_available() and cfg.attack.device != "cpu" else "cpu",
            "torch": torch.__version__,
        }
        write_yaml(tmp / "config.yaml", cfg.written())
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
