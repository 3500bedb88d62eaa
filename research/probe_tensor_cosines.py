"""Which shared tensors carry the gradient-matching objective, and which the reconstruction matches
(docs/results/batchnorm.md, "GroupNorm"): for a finished one-capture run, each tensor's share of ‖s*‖² and the
cosine cos(s_l, s*_l) of the final images' simulated gradient (``rec``) and of the truth blended 0.5 with grey
(``blend``), the largest tensors first, with the shares summed per kind (conv, norm, fc).

    PYTHONPATH=$PWD python research/probe_tensor_cosines.py RUN_DIR [ROWS]
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gi.attack.recon.mismatch import simulated_share
from gi.attack.recon.problem import captured_output_error
from gi.capture import Capture, Truth


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()).clamp_min(1e-30))


def main() -> None:
    torch.set_num_threads(1)
    run, rows = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25
    cap, truth = Capture.load(run / "capture.safetensors"), Truth.load(run / "truth.safetensors")
    recs = load_file(str(run / "reconstructions.safetensors"))
    mode = "captured" if captured_output_error(cap) is not None else "simulated"
    x = truth.images.float()
    rec_labels = F.one_hot(recs["labels0"], truth.targets.shape[1]).float()
    target = {k: v.float() for k, v in cap.shared.items()}
    rec = simulated_share(cap, recs["capture0"].float(), rec_labels, mode)
    blend = simulated_share(cap, 0.5 * x + 0.25, truth.targets, mode)
    total = sum(float(v.norm() ** 2) for v in target.values())
    table = [(k, float(v.norm() ** 2) / total, cos(rec[k], v), cos(blend[k], v)) for k, v in target.items()]

    def kind(name: str) -> str:
        if name.startswith("fc"):
            return "fc"
        return "conv" if target[name].dim() == 4 else "norm"

    for k in ("conv", "norm", "fc"):
        part = [t for t in table if kind(t[0]) == k]
        print(f"{k}: {len(part)} tensors, share {sum(t[1] for t in part):.3f}")
    print("tensor".ljust(28), "share".rjust(7), "rec".rjust(7), "blend".rjust(7))
    for name, share, c_rec, c_blend in sorted(table, key=lambda t: -t[1])[:rows]:
        print(name.ljust(28), f"{share:7.4f}", f"{c_rec:7.3f}", f"{c_blend:7.3f}")


if __name__ == "__main__":
    main()
