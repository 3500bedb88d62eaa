"""Probe: the inputs of a fully-connected layer, one per image of a FedSGD batch, from that layer's gradient alone
(docs/results/realistic.md, "S4"), by :func:`fcn_analytic.disaggregate.linear_inputs` (SPEAR's sparsity sampling
on the layer's input side; the method is in that module's docstring).

Scored against the truth's inputs (relative L2 error of each true input's nearest recovered one). Captures come
from a ``gi run`` output directory (``captures/NNN.safetensors``, ``truths/NNN.safetensors``) of
configs/ablate/s4-fmnist-bn.yaml's victim; ``LAYER`` names the Linear layer (``body.1``) whose input is probed.

    PYTHONPATH=$PWD python research/probe_fc_input.py RUN_DIR/captures/000.safetensors RUN_DIR/truths/000.safetensors \\
        [SAMPLES=1000000] [ZT=1e-4] [ST=1e-3] [LAYER=body.1]
"""

from __future__ import annotations

import sys
import time

import torch
from safetensors.torch import load_file

from fcn_analytic.disaggregate import linear_inputs
from gi.capture import Capture


def main(argv: list[str]) -> None:
    cap, truth = Capture.load(argv[0]), load_file(argv[1])
    samples = int(argv[2]) if len(argv) > 2 else 1_000_000
    zt = float(argv[3]) if len(argv) > 3 else 1e-4
    st = float(argv[4]) if len(argv) > 4 else 1e-3
    layer = argv[5] if len(argv) > 5 else "body.1"
    torch.manual_seed(0)
    model = cap.model().double().train(cap.protocol.model_mode == "train")  # the client's forward
    module = model.get_submodule(layer)
    seen: dict[str, torch.Tensor] = {}
    hook = module.register_forward_hook(lambda m, i, o: seen.__setitem__("x", i[0].detach()))
    model(truth["images"].double())
    hook.remove()
    true_x = seen["x"]
    print("zero fraction per image", [round(v, 3) for v in (true_x == 0).double().mean(1).tolist()])
    start = time.process_time()
    got = linear_inputs(cap.gradients[f"{layer}.weight"], cap.gradients[f"{layer}.bias"], true_x.shape[0],
                        samples=samples, zero_tol=zt, sign_tol=st)
    seconds, draws = time.process_time() - start, got.draws
    err = torch.cdist(got.inputs, true_x)
    rel = (err.min(0).values / true_x.norm(dim=1)).tolist()
    print(f"{draws} draws, {seconds:.1f} CPU s, gradient residual {got.residual:.1e}; relative error per true "
          f"input", [f"{r:.1e}" for r in rel])


if __name__ == "__main__":
    main(sys.argv[1:])
