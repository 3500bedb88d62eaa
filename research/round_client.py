"""Shared by the client-round probes (run as scripts from the repository root, so this file's folder is on their
path): the client of ``configs/fedavg-round.yaml`` at a seed and E, and the one-to-one PSNR of fitted images."""
import torch

from gi.analysis.metrics import match_images, psnr
from gi.capture import Capture, Truth
from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.experiments.run import capture_all
from gi.world.build import build_victim


def round_client(seed: int, epochs: int, num_samples: int | None = None, extra: tuple[str, ...] = ()
                 ) -> tuple[Capture, Truth, torch.Tensor]:
    """The config's first client at ``seed`` over ``epochs`` local epochs (of ``num_samples`` images; None: the
    config's; ``extra``: further config overrides, e.g. ``train={epochs: 1}`` for the trained round): its capture,
    its truth, and the true images' inputs of the hidden layer at the global model (float64)."""
    overrides = [f"seed={seed}", f"protocol.local_epochs={epochs}", *extra]
    cfg = load(RunConfig, "configs/fedavg-round.yaml",
               overrides + ([] if num_samples is None else [f"protocol.num_samples={num_samples}"]))
    torch.manual_seed(cfg.seed)
    dataset, model = build_victim(cfg)
    captures, truths = capture_all(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))[:2]
    net = captures[0].model()
    with torch.no_grad():
        x0 = net.body[0](net.normalize(truths[0].images)).double()
    return captures[0], truths[0], x0


def matched_psnr(images: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per true image, the PSNR of the fitted image matched to it one to one (:func:`match_images`, by MSE)."""
    return psnr(images[match_images(images, truth)], truth)
