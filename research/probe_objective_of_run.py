"""The attack objective of a finished run's reconstructions beside that of the truth (docs/results/batchnorm.md,
"GroupNorm"): is the fit's low objective a different image the gradient cannot tell from the truth
(non-identifiability), or a worse one the optimiser stopped short of?

For every capture of a ``gi run`` output directory (its ``capture.safetensors`` or ``captures/*.safetensors``, the
truth beside it, ``reconstructions.safetensors``) this prints, for the final images and for images a known
distance from the truth, the PSNR against the truth, Inverting Gradients' 1 − cos over all shared tensors (the
``cosine`` objective with unit weights; the captured output error for a one-sample FedSGD capture, as ``output_error:
auto`` does, else the simulated one with the slot labels), the relative mismatch ‖s − s*‖ / ‖s*‖ and breaching's
anisotropic TV (``gi.attack.recon.regularizers``).

    PYTHONPATH=$PWD python research/probe_objective_of_run.py RUN_DIR
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gi.attack.recon.mismatch import relative_mismatch, simulated_share
from gi.attack.recon.problem import captured_output_error
from gi.attack.recon.regularizers import total_variation
from gi.capture import Capture, Truth


def one_minus_cos(share: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> float:
    """1 − Σ⟨s_l, s*_l⟩ / (‖s‖ ‖s*‖) over every shared tensor together (float64)."""
    dot = sum(float((share[k].double() * target[k].double()).sum()) for k in target)
    a = sum(float(share[k].double().norm() ** 2) for k in target) ** 0.5
    b = sum(float(target[k].double().norm() ** 2) for k in target) ** 0.5
    return 1.0 - dot / (a * b)


def pairs(run: Path) -> list[tuple[Capture, Truth]]:
    """The run's (capture, truth) pairs in capture order."""
    if (run / "capture.safetensors").exists():
        return [(Capture.load(run / "capture.safetensors"), Truth.load(run / "truth.safetensors"))]
    caps = sorted((run / "captures").glob("*.safetensors"))
    truths = sorted((run / "truths").glob("*.safetensors"))
    return [(Capture.load(c), Truth.load(t)) for c, t in zip(caps, truths, strict=True)]


def main() -> None:
    torch.set_num_threads(1)
    run = Path(sys.argv[1])
    recs = load_file(str(run / "reconstructions.safetensors"))
    noise = torch.Generator().manual_seed(0)
    for k, (cap, truth) in enumerate(pairs(run)):
        x = truth.images.float()
        rec = recs[f"capture{k}"].float()
        num_classes = truth.targets.shape[1]
        rec_labels = F.one_hot(recs[f"labels{k}"], num_classes).float()
        mode = "captured" if captured_output_error(cap) is not None else "simulated"
        target = {n: v.float() for n, v in cap.shared.items()}
        candidates = {
            "reconstruction": (rec, rec_labels),
            "truth": (x, truth.targets),
            "noise 0.005": ((x + 0.005 * torch.randn(x.shape, generator=noise)).clamp(0, 1), truth.targets),
            "noise 0.02": ((x + 0.02 * torch.randn(x.shape, generator=noise)).clamp(0, 1), truth.targets),
            "blur 2x2": (F.interpolate(F.avg_pool2d(x, 2), scale_factor=2, mode="bilinear"), truth.targets),
            "blend 0.5 with grey": (0.5 * x + 0.25, truth.targets),
            "mean colour": (x.mean(dim=(2, 3), keepdim=True).expand_as(x).clone(), truth.targets),
            "grey": (torch.full_like(x, 0.5), truth.targets),
        }
        print(f"capture {k}: B = {x.shape[0]}, {len(target)} shared tensors, output error {mode}")
        print("candidate".ljust(22), "PSNR".rjust(7), "1-cos".rjust(8), "mismatch".rjust(9), "TV".rjust(8))
        for name, (images, labels) in candidates.items():
            share = simulated_share(cap, images, labels, mode)
            # PSNR of the batch's pooled error; the reconstruction's slots are not paired with the truth here
            psnr = float(-10 * torch.log10(((images - x) ** 2).mean())) if name != "reconstruction" else float("nan")
            tv = float(total_variation(images.unsqueeze(0)).mean())
            print(name.ljust(22), f"{psnr:7.2f}", f"{one_minus_cos(share, target):8.4f}",
                  f"{relative_mismatch(share, target):9.4f}", f"{tv:8.4f}", flush=True)


if __name__ == "__main__":
    main()
