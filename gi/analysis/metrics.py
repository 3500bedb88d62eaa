"""Scoring: image metrics (PSNR, SSIM, LPIPS), one-to-one batch matching, label-recovery metrics
(docs/architecture.md, "Public contract").

Images are pixel tensors in [0, 1] of shape (B, C, H, W); every metric clamps its inputs to [0, 1] first and
averages per image (never sums, never on normalised tensors). Batches are matched one-to-one with the
Hungarian algorithm (never many-to-one) and the permutation is recorded.

Label metrics follow the batch label-recovery papers (iLRG, LLG, Ramakrishna et al.): class-existence accuracy
``cls_acc``, instance accuracy ``ins_acc``, exact-count accuracy ``count_acc`` and distances between label
proportion vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kornia
import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from gi.analysis.lpips_offline import CONV_INDEX, get_lpips
from gi.capture import pixel_problem
from gi.core.errors import ConfigError
from gi.core.names import LABEL_METRICS, POOLED_METRICS

Tensor = torch.Tensor

SSIM_WINDOW = 11  # Gaussian window, sigma 1.5 (kornia's fixed sigma), data range 1 (Wang et al. 2004)
LPIPS_MIN_SIZE = {"alex": 31, "vgg": 16}  # smallest side each trunk accepts (AlexNet's pools need >= 31 px)
LPIPS_RESIZE = 32  # smaller images (MNIST 28x28) are bilinearly resized so their short side is 32 px
KL_EPS = 1e-6  # smoothing of the predicted proportions inside prop_kl


# ---------------------------------------------------------------- image metrics


def _image_pair(rec: Tensor, truth: Tensor, where: str) -> tuple[Tensor, Tensor]:
    """Check shapes, dtypes and finiteness; the truth must be float pixels in [0, 1] (a scorer that clamped an 8-bit
    or normalised truth would report a wrong PSNR as valid); the reconstruction is clamped to [0, 1]."""
    for name, x in (("reconstruction", rec), ("truth", truth)):
        if not isinstance(x, Tensor):
            raise ConfigError(f"{where}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 4:
            raise ConfigError(f"{where}: {name} must be (B, C, H, W) images in [0, 1], got shape {tuple(x.shape)}")
    if rec.shape != truth.shape:
        raise ConfigError(f"{where}: reconstruction shape {tuple(rec.shape)} != truth shape {tuple(truth.shape)}; "
                          "pass one reconstruction per truth image at the same resolution")
    problem = pixel_problem(truth)
    if problem is not None:
        raise ConfigError(f"{where}: the truth {problem}")
    if not torch.isfinite(rec).all():
        raise ConfigError(f"{where}: the reconstruction contains NaN or Inf; check the reconstruction run")
    # a reconstruction may overshoot [0, 1] (its pixels are optimised); the truth is checked above, never clamped
    return rec.clamp(0, 1), truth.to(rec.device)


def psnr(rec: Tensor, truth: Tensor) -> Tensor:
    """Per-image PSNR in dB, ``10 log10(1 / MSE)`` with data range 1, MSE averaged over C·H·W; (B,) float64.

    Identical images give ``+inf``.
    """
    rec, truth = _image_pair(rec, truth, "psnr")
    mse = (rec.double() - truth.double()).pow(2).mean(dim=(1, 2, 3))
    return 10 * torch.log10(1 / mse)


def mse(rec: Tensor, truth: Tensor) -> Tensor:
    """Per-image mean squared error over C·H·W of the clamped images; (B,) float64."""
    rec, truth = _image_pair(rec, truth, "mse")
    return (rec.double() - truth.double()).pow(2).mean(dim=(1, 2, 3))


def ssim(rec: Tensor, truth: Tensor) -> Tensor:
    """Per-image SSIM (Wang et al. 2004, eq. 13): 11×11 Gaussian window, σ = 1.5, data range 1; (B,) float64.

    ``kornia.metrics.ssim`` with ``padding="valid"`` (the map is only taken where the window fits, as in the
    original MATLAB code, scikit-image and pytorch-msssim) and ``eps=0`` (c1, c2 > 0 already keep it finite),
    averaged over channels and pixels.
    """
    rec, truth = _image_pair(rec, truth, "ssim")
    if min(rec.shape[-2:]) < SSIM_WINDOW:
        raise ConfigError(f"ssim: images of {tuple(rec.shape[-2:])} px are smaller than the {SSIM_WINDOW}×"
                          f"{SSIM_WINDOW} window")
    ssim_map = kornia.metrics.ssim(rec.double(), truth.double(), SSIM_WINDOW, max_val=1.0, eps=0.0, padding="valid")
    return ssim_map.mean(dim=(1, 2, 3))


def _lpips_input(x: Tensor, net: str) -> Tensor:
    """Grey → 3 channels; images below the trunk's minimum size are bilinearly resized (short side 32 px)."""
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif x.shape[1] != 3:
        raise ConfigError(f"lpips: images need 1 or 3 channels, got {x.shape[1]}")
    height, width = x.shape[-2:]
    if min(height, width) < LPIPS_MIN_SIZE[net]:
        scale = LPIPS_RESIZE / min(height, width)
        size = (max(LPIPS_RESIZE, round(height * scale)), max(LPIPS_RESIZE, round(width * scale)))
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False).clamp(0, 1)
    return x.float()


def _check_net(net: str) -> None:
    if net not in CONV_INDEX:
        raise ConfigError(f"unknown LPIPS net {net!r}; valid: {sorted(CONV_INDEX)}")


def lpips(rec: Tensor, truth: Tensor, net: str = "alex", device: str | torch.device | None = None,
          chunk: int = 64) -> Tensor:
    """Per-image LPIPS v0.1 (Zhang et al. 2018) with the ImageNet ``alex`` or ``vgg`` trunk; (B,) float32.

    Inputs in [0, 1] (``normalize=True``). Grey images repeat their channel to 3; images smaller than the
    trunk allows (AlexNet: 31 px, e.g. MNIST) are bilinearly resized to a short side of 32 px first.
    Weights are loaded offline (:mod:`gi.analysis.lpips_offline`); the network is cached per (net, device).
    Runs on ``device`` (default: the images' device) in chunks of ``chunk`` images.
    """
    _check_net(net)
    rec, truth = _image_pair(rec, truth, "lpips")
    device = torch.device(device) if device is not None else rec.device
    model = get_lpips(net, device)
    rec, truth = _lpips_input(rec, net), _lpips_input(truth, net)
    out = [model(rec[i:i + chunk].to(device), truth[i:i + chunk].to(device), normalize=True).reshape(-1)
           for i in range(0, rec.shape[0], chunk)]
    return torch.cat(out).to(rec.device)


def _lpips_features(model: torch.nn.Module, x: Tensor) -> list[Tensor]:
    """Unit-normalised trunk features of images in [0, 1], as inside ``lpips.LPIPS.forward``."""
    import lpips as lpips_package

    outs = model.net.forward(model.scaling_layer(2 * x - 1))
    return [lpips_package.normalize_tensor(o) for o in outs]


def pairwise_lpips(rec: Tensor, truth: Tensor, net: str = "alex", device: str | torch.device | None = None,
                   pairs_per_chunk: int = 256) -> Tensor:
    """LPIPS between every truth image i and reconstruction j, (B_truth, B_rec); each trunk runs once per image."""
    _check_net(net)
    for name, x in (("reconstruction", rec), ("truth", truth)):
        if x.ndim != 4 or not torch.isfinite(x).all():
            raise ConfigError(f"pairwise_lpips: {name} must be finite (B, C, H, W) images")
    if rec.shape[1:] != truth.shape[1:]:
        raise ConfigError(f"pairwise_lpips: image shapes {tuple(rec.shape[1:])} and {tuple(truth.shape[1:])} differ")
    device = torch.device(device) if device is not None else rec.device
    model = get_lpips(net, device)
    with torch.no_grad():
        fr = _lpips_features(model, _lpips_input(rec.clamp(0, 1), net).to(device))
        ft = _lpips_features(model, _lpips_input(truth.clamp(0, 1), net).to(device))
        n_rec, rows = rec.shape[0], max(1, pairs_per_chunk // max(rec.shape[0], 1))
        blocks = []
        for start in range(0, truth.shape[0], rows):
            total = 0
            for lin, a, b in zip(model.lins, ft, fr):
                diff = (a[start:start + rows, None] - b[None]).pow(2).flatten(0, 1)  # (rows·B_rec, C, H, W)
                total = total + lin(diff).mean(dim=(1, 2, 3))
            blocks.append(total.reshape(-1, n_rec))
    return torch.cat(blocks).to(rec.device)


def _pairwise_mse(rec: Tensor, truth: Tensor) -> Tensor:
    """(B_truth, B_rec) MSE via ‖t‖² + ‖r‖² − 2 t·r in float64."""
    r = rec.clamp(0, 1).flatten(1).double()
    t = truth.clamp(0, 1).flatten(1).double().to(r.device)
    sq = t.pow(2).sum(1)[:, None] + r.pow(2).sum(1)[None] - 2 * t @ r.T
    return sq.clamp_min(0) / r.shape[1]


MATCH_COSTS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    # cost[i, j] between truth image i and reconstruction j; lower is better
    "mse": _pairwise_mse,  # the default: the matching that minimises the total MSE
    "psnr": lambda rec, truth: 10 * torch.log10(_pairwise_mse(rec, truth).clamp_min(1e-20)),  # = −PSNR
    "lpips": lambda rec, truth: pairwise_lpips(rec, truth, "alex"),
    "lpips-vgg": lambda rec, truth: pairwise_lpips(rec, truth, "vgg"),
}


def match_images(rec: Tensor, truth: Tensor, cost: str = "mse") -> list[int]:
    """One-to-one Hungarian matching (scipy ``linear_sum_assignment``); ``perm[i]`` = reconstruction of truth i.

    ``cost`` names an entry of :data:`MATCH_COSTS`. The default ``"mse"`` minimises the summed per-image MSE
    (negative PSNR ranks pairs the same way, but ``"psnr"`` maximises the mean PSNR instead: they can differ).
    """
    if cost not in MATCH_COSTS:
        raise ConfigError(f"unknown matching cost {cost!r}; valid: {sorted(MATCH_COSTS)}")
    rec, truth = _image_pair(rec, truth, "match_images")
    matrix = MATCH_COSTS[cost](rec, truth).detach().cpu().double().numpy()
    rows, cols = linear_sum_assignment(matrix)
    perm = np.empty(len(rows), dtype=np.int64)
    perm[rows] = cols
    return perm.tolist()


def summarize(values: Tensor | list[float]) -> dict[str, Any]:
    """``{"mean", "median", "max", "min", "values"}`` of per-image values (median averages the middle two)."""
    arr = np.asarray(torch.as_tensor(values).detach().cpu().double(), dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ConfigError("summarize: no values")
    return {"mean": float(arr.mean()), "median": float(np.median(arr)), "max": float(arr.max()),
            "min": float(arr.min()), "values": arr.tolist()}


def score(reconstructed: Tensor, truth_images: Tensor, labels_rec: Tensor | None = None,
          labels_true: Tensor | None = None, match: bool = True, cost: str = "mse", vgg: bool = False,
          device: str | torch.device | None = None) -> dict[str, Any]:
    """Score a batch of reconstructions against the truth images (docs/architecture.md, "Public contract").

    With ``match`` (and B > 1) reconstructions are paired one-to-one with truth images by the Hungarian
    algorithm on ``cost`` (default ``"mse"``, i.e. maximal agreement in the negative-PSNR sense; see
    :func:`match_images`); ``perm[i]`` is the reconstruction matched to truth image ``i``. Returns per-image
    lists ``mse``, ``psnr``, ``ssim``, ``lpips_alex`` (and ``lpips_vgg`` when ``vgg``), in truth order, plus
    ``<metric>_{mean,median,max,min}``. With ``labels_rec`` (label of each reconstruction) and ``labels_true``,
    adds ``label_acc`` (matched pairs with equal labels) and ``label_ins_acc`` (order-free multiset agreement).
    Identical images have ``psnr = inf``.
    """
    rec, truth = _image_pair(reconstructed, truth_images, "score")
    batch = rec.shape[0]
    perm = match_images(rec, truth, cost) if match and batch > 1 else list(range(batch))
    rec = rec[torch.as_tensor(perm, device=rec.device)]
    out: dict[str, Any] = {"num_images": batch, "perm": perm, "match_cost": cost if match else None}
    with torch.no_grad():
        per_image = {"mse": mse(rec, truth), "psnr": psnr(rec, truth), "ssim": ssim(rec, truth),
                     "lpips_alex": lpips(rec, truth, "alex", device)}
        if vgg:
            per_image["lpips_vgg"] = lpips(rec, truth, "vgg", device)
    for name, values in per_image.items():
        stats = summarize(values)
        out[name] = stats.pop("values")
        out.update({f"{name}_{k}": v for k, v in stats.items()})
    if (labels_rec is None) != (labels_true is None):
        raise ConfigError("score: pass both labels_rec and labels_true, or neither")
    if labels_rec is not None:
        labels_rec, labels_true = torch.as_tensor(labels_rec).long().cpu(), torch.as_tensor(labels_true).long().cpu()
        if labels_rec.shape != (batch,) or labels_true.shape != (batch,):
            raise ConfigError(f"score: labels must be ({batch},) class ids, got {tuple(labels_rec.shape)} and "
                              f"{tuple(labels_true.shape)}")
        out["label_acc"] = float((labels_rec[torch.as_tensor(perm)] == labels_true).double().mean())
        classes = int(max(labels_rec.max(), labels_true.max())) + 1
        out["label_ins_acc"] = label_metrics_from_counts(torch.bincount(labels_rec, minlength=classes),
                                                         torch.bincount(labels_true, minlength=classes))["ins_acc"]
    return out


# ---------------------------------------------------------------- label metrics


def _as_counts(x: Any, name: str) -> Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.ndim not in (1, 2) or t.shape[-1] == 0:
        raise ConfigError(f"label metrics: {name} must be (C,) or (N, C) counts, got shape {tuple(t.shape)}")
    if t.is_floating_point() and not torch.isfinite(t).all():
        raise ConfigError(f"label metrics: {name} contains NaN or Inf")
    if (t < 0).any():
        raise ConfigError(f"label metrics: {name} has negative counts")
    return t.double()


def _proportions(counts: Tensor) -> Tensor:
    """counts / total; uniform where the total is 0 (as :meth:`LabelResult.failure` reports)."""
    total = counts.sum(-1, keepdim=True)
    uniform = torch.full_like(counts, 1.0 / counts.shape[-1])
    return torch.where(total > 0, counts / total.clamp_min(1e-300), uniform)


# every key :func:`label_metrics` can report (soft_l1 / top1 only for methods that recover soft labels)
# LABEL_METRICS (the per-trial metrics) and POOLED_METRICS (pooled over trials: Σ numerator / Σ denominator, the
# precision and recall of "class absent" decisions) are named in gi.core.names, so configs check them without torch


def label_metrics_from_counts(pred_counts: Any, true_counts: Any, pred_proportions: Any = None,
                              true_proportions: Any = None, kl_eps: float = KL_EPS) -> dict[str, Any]:
    """Batch label-recovery metrics from per-class counts (C,) → floats, or (N, C) → (N,) float64 tensors.

    With n̂ the predicted and n the true counts, B = Σ_c n_c, p̂ and p the proportions (``pred_proportions``
    defaults to n̂ / Σ n̂, uniform when n̂ = 0; ``true_proportions`` to n / B):

    - ``cls_acc`` = mean_c [ [n̂_c > 0] = [n_c > 0] ]  (class-existence accuracy over all C classes),
    - ``ins_acc`` = Σ_c min(n̂_c, n_c) / B            (instance accuracy, iLRG / LLG),
    - ``count_acc`` = 1 if n̂ = n exactly else 0,
    - ``prop_mse`` = mean_c (p̂_c − p_c)²; ``l1``, ``l2``, ``linf`` = norms of p̂ − p,
    - ``prop_kl`` = KL(p ‖ p̂_ε) with p̂_ε = (p̂ + ε) / (1 + C ε), ε = ``kl_eps`` (1e-6): finite when a class is missed,
    - ``absent_hit`` / ``absent_called`` / ``absent_true`` = the number of classes with p̂_c = 0 and n_c = 0 / with
      p̂_c = 0 / with n_c = 0 (pooled over trials into :data:`POOLED_METRICS`' precision and recall).
    """
    pred, true = _as_counts(pred_counts, "pred_counts"), _as_counts(true_counts, "true_counts")
    if pred.shape != true.shape:
        raise ConfigError(f"label metrics: pred_counts shape {tuple(pred.shape)} != true_counts shape "
                          f"{tuple(true.shape)}; both need one entry per class")
    total = true.sum(-1)
    if (total <= 0).any():
        raise ConfigError("label metrics: true counts sum to 0; the truth must label at least one sample")
    p_hat = _proportions(pred) if pred_proportions is None else torch.as_tensor(pred_proportions).cpu().double()
    p = true / total[..., None] if true_proportions is None else torch.as_tensor(true_proportions).cpu().double()
    if p_hat.shape != pred.shape or p.shape != pred.shape:
        raise ConfigError(f"label metrics: proportions must have shape {tuple(pred.shape)}, got "
                          f"{tuple(p_hat.shape)} and {tuple(p.shape)}")
    num_classes = pred.shape[-1]
    diff = p_hat - p
    q = (p_hat + kl_eps) / (1 + num_classes * kl_eps)
    metrics = {
        "cls_acc": ((pred > 0) == (true > 0)).double().mean(-1),
        "ins_acc": torch.minimum(pred, true).sum(-1) / total,
        "count_acc": (pred == true).all(-1).double(),
        "prop_mse": diff.pow(2).mean(-1),
        "prop_kl": (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1),
        "l1": diff.abs().sum(-1),
        "l2": diff.pow(2).sum(-1).sqrt(),
        "linf": diff.abs().amax(-1),
        "absent_hit": ((p_hat == 0) & (true == 0)).double().sum(-1),
        "absent_called": (p_hat == 0).double().sum(-1),
        "absent_true": (true == 0).double().sum(-1),
    }
    return {k: float(v) for k, v in metrics.items()} if pred.ndim == 1 else metrics


def _soft_metrics(soft: Tensor, targets: Tensor, match: bool) -> dict[str, float]:
    """``soft_l1`` (mean per-sample L1 between soft rows) and ``top1`` (argmax agreement).

    A batch method's row order is arbitrary, so with ``match`` rows are first paired one-to-one with the true
    rows by the Hungarian algorithm on their L1 distance.
    """
    soft, targets = soft.detach().cpu().double(), targets.detach().cpu().double()
    if soft.shape != targets.shape:
        raise ConfigError(f"label metrics: soft labels {tuple(soft.shape)} do not match truth targets "
                          f"{tuple(targets.shape)}")
    cost = torch.cdist(targets, soft, p=1)  # (B_true, B_rec)
    if match and soft.shape[0] > 1:
        _, cols = linear_sum_assignment(cost.numpy())
        soft = soft[torch.as_tensor(cols)]
    return {"soft_l1": float((soft - targets).abs().sum(1).mean()),
            "top1": float((soft.argmax(1) == targets.argmax(1)).double().mean())}


def label_metrics(result: Any, truth: Any, match_soft: bool = True, kl_eps: float = KL_EPS) -> dict[str, float]:
    """Score a :class:`labels.LabelResult` against a :class:`gi.Truth` (see :func:`label_metrics_from_counts`).

    Uses ``result.counts`` and ``result.proportions`` against ``truth.counts``. A failed result (``ok=False``)
    is scored as it stands: zero counts (so ``ins_acc`` = 0, ``count_acc`` = 0) and its uniform proportions.
    ``ok`` is 1.0 or 0.0. When ``result.soft`` is set and the truth has targets, adds ``soft_l1`` and ``top1``
    (rows matched one-to-one first when ``match_soft``; see :func:`_soft_metrics`).
    """
    out = {"ok": float(bool(result.ok))}
    out.update(label_metrics_from_counts(result.counts, truth.counts, pred_proportions=result.proportions,
                                         kl_eps=kl_eps))
    targets = getattr(truth, "targets", None)
    if result.soft is not None and targets is not None and targets.numel() > 0:
        out.update(_soft_metrics(result.soft, targets, match_soft))
    return out


__all__ = [
    "KL_EPS",
    "LABEL_METRICS",
    "MATCH_COSTS",
    "POOLED_METRICS",
    "label_metrics",
    "label_metrics_from_counts",
    "lpips",
    "match_images",
    "mse",
    "pairwise_lpips",
    "psnr",
    "ssim",
    "score",
    "summarize",
]
