"""How many captures one packed problem may hold: ``attack.pack: auto``.

A packed problem of N captures × R restarts keeps, per row (capture × restart), what the matching step of
:mod:`gi.attack.recon.module` holds at its peak: the row's parameter-sized tensors (the simulated gradient, the graph of
its double backward, the distance terms), the forward activations of its batch, and the optimiser's state for its
images; and per capture the target gradient. The model is counted from the capture (parameters) and one forward of
a zero batch with hooks on its leaf modules (activations). The memory model::

    bytes(capture) = 4 · [R · (PARAM_COPIES · P + (ACTIVATION_COPIES · A + V · U) · b + (S + 3) · n · b) + P]

with P the parameter count, A the activation elements of one sample, U the elements of its convolutions'
unfolded inputs (V = 1 when the rows are simulated with ``vmap``, whose batched convolutions keep them; 0 on the
loop path), b the samples per capture, n the elements of one image and S the optimiser's state per image
element (:data:`STATE`; L-BFGS: :data:`LBFGS_STATE` per curvature pair, packed problems keep
:data:`gi.attack.recon.optim.LBFGS_HISTORY` pairs unless ``attack.lbfgs_history`` says otherwise). The factors were
fitted to the peak resident memory of one process fitting 1 to 4 ResNet-18 captures (batch 1 and 8, Adam) and 4
to 16 LeNet captures × 4 restarts (L-BFGS and Adam, 150 steps) on the CPU (``research/pack_memory.py``;
docs/results/throughput-gpu.md,
"Throughput"), rounded up, so the estimate errs on the side of smaller packs.
The budget (``attack.memory_budget`` GiB, else :data:`BUDGET_SHARE` of the device's free memory) divided by the
estimate gives the pack.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gi.attack.recon.module import leaf_outputs
from gi.attack.recon.optim import LBFGS_HISTORY
from gi.attack.recon.problem import choose_batching
from gi.capture import Capture
from gi.core.devices import resolve_device

PARAM_COPIES = 4  # parameter-sized tensors per row at the step's peak (measured ~3.2 on ResNet-18)
ACTIVATION_COPIES = 3  # activation-sized tensors per row and sample (measured ~1.8 on ResNet-18, batch 8)
# optimiser state per image element: Adam's two moments, SGD's momentum; L-BFGS keeps LBFGS_STATE per curvature
# pair (s, y and the two-loop's temporaries: ~330 measured on LeNet, 64 rows, 100 pairs)
STATE = {"adam": 2, "sgd": 1}
LBFGS_STATE = 3.5
BUDGET_SHARE = 0.5  # of the device's free memory when attack.memory_budget is null
GIB = 2 ** 30


def activation_elements(model: torch.nn.Module, in_shape: tuple[int, ...]) -> tuple[int, int]:
    """For one sample of shape ``in_shape`` (:func:`gi.attack.recon.module.leaf_outputs`, a real forward pass): the
    elements of every leaf module's output, and the elements of the unfolded (im2col) inputs of its 2-d
    convolutions, C_in/groups · k_h · k_w · H_out · W_out each, which the vmap path keeps for its backward."""
    calls = leaf_outputs(model, in_shape, meta=False)
    total = sum(math.prod(shape) for _, shapes in calls for shape in shapes)
    unfolded = sum(m.in_channels // m.groups * math.prod(m.kernel_size) * math.prod(shapes[0][-2:])
                   for m, shapes in calls if isinstance(m, torch.nn.Conv2d))
    return total, unfolded


def bytes_per_capture(capture: Capture, cfg: Any) -> int:
    """Estimated peak bytes one capture adds to a packed problem under ``cfg`` (a ReconConfig): the memory model
    of the module docstring."""
    model = capture.model()
    in_shape = tuple(int(s) for s in capture.model_spec["in_shape"])
    params = sum(p.numel() for p in model.parameters())
    acts, unfolded = activation_elements(model, in_shape)
    vmap = choose_batching(cfg.batching, max(2, cfg.restarts), model, resolve_device(cfg.device)[0]) == "vmap"
    b = capture.num_samples
    n = math.prod(in_shape)
    state = LBFGS_STATE * (cfg.lbfgs_history or LBFGS_HISTORY) if cfg.optimizer == "lbfgs" else \
        STATE.get(cfg.optimizer, 2)
    row = PARAM_COPIES * params + (ACTIVATION_COPIES * acts + vmap * unfolded) * b + (state + 3) * n * b
    return int(4 * (cfg.restarts * row + params))


def free_bytes(device: str) -> int:
    """Free memory of ``device``: the CUDA device's free memory, else the host's available memory (Linux
    ``MemAvailable``; else physical pages × page size)."""
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def budget_bytes(memory_budget: float | None, device: str) -> int:
    """``attack.memory_budget`` GiB in bytes, or :data:`BUDGET_SHARE` of the device's free memory when null."""
    if memory_budget is not None:
        return int(memory_budget * GIB)
    return int(BUDGET_SHARE * free_bytes(device))
