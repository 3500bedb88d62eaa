"""Shared by the client-round probes (run as scripts from the repository root, so this file's folder is on their
path): the clients of ``configs/fedavg-round.yaml`` at a seed and E, each image's label read from given inputs of
its hidden layer, and the one-to-one PSNR of fitted images."""
import torch

from gi.analysis.metrics import match_images, psnr
from gi.capture import Capture, Truth
from gi.core.config import load
from gi.experiments.config.run import RunConfig
from gi.experiments.run import capture_all
from gi.world.build import build_victim


def round_clients(seed: int, overrides: tuple[str, ...] = ()) -> tuple[list[Capture], list[Truth]]:
    """The config's clients at ``seed`` (``overrides``: further config overrides, e.g. ``trials=6``,
    ``protocol.local_epochs=5`` or ``train={epochs: 1}`` for the trained round): their captures and truths."""
    cfg = load(RunConfig, "configs/fedavg-round.yaml", [f"seed={seed}", *overrides])
    torch.manual_seed(cfg.seed)
    dataset, model = build_victim(cfg)
    captures, truths = capture_all(cfg, dataset, model, torch.Generator().manual_seed(cfg.seed))[:2]
    return captures, truths


def round_client(seed: int, epochs: int, num_samples: int | None = None, extra: tuple[str, ...] = ()
                 ) -> tuple[Capture, Truth, torch.Tensor]:
    """The config's first client at ``seed`` over ``epochs`` local epochs (of ``num_samples`` images; None: the
    config's; ``extra``: further config overrides, e.g. ``train={epochs: 1}`` for the trained round): its capture,
    its truth, and the true images' inputs of the hidden layer at the global model (float64)."""
    overrides = (f"protocol.local_epochs={epochs}", *extra,
                 *(() if num_samples is None else (f"protocol.num_samples={num_samples}",)))
    captures, truths = round_clients(seed, overrides)
    net = captures[0].model()
    with torch.no_grad():
        x0 = net.body[0](net.normalize(truths[0].images)).double()
    return captures[0], truths[0], x0


def layer_labels(capture: Capture, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each image's label from ``x`` (N × n), taken as the images' inputs of the first Linear layer at θᵗ for every
    visit: the errors summed over its E visits, ē = (−ΔW/η) X⁺, read as at E = 1
    (``labels.fc_inputs.hidden_errors``). Returns the labels by the one negative entry of Σ_e g, each fit's
    residual, and the labels by the argmax of p − Σ_e g / E."""
    from fcn_analytic.disaggregate import first_linear, summed_layer
    from labels.fc_inputs import hidden_errors

    name = first_linear(capture.model())
    summed = summed_layer(capture, name)
    errors = torch.linalg.lstsq(x.T, summed.weight.T).solution * summed.per_mean
    logits, g, fit = hidden_errors(capture, name, x, errors)
    soft = torch.softmax(logits, 1) - g / capture.protocol.local_epochs  # p at θᵗ standing for each visit's
    return g.argmin(1), fit, soft.argmax(1)


def matched_psnr(images: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per true image, the PSNR of the fitted image matched to it one to one (:func:`match_images`, by MSE)."""
    return psnr(images[match_images(images, truth)], truth)
