"""Before and after the warm-started cone programs (fcn_analytic.disaggregate.ConeProgram), in one process: the
module at 7d113c2 (scipy's linprog, a cold solve each) against the working tree's, on the hidden layer of the
config round's client (configs/fedavg-round.yaml at SEED, E = 1): CPU seconds of ``search_inputs`` (the label
stage's search) and of ``linear_inputs``' 8·B random programs (the feature stage's), whether the two find the same
inputs (cosine > 1 − 1e-4) and how many true inputs each finds (cosine > 0.99 to an input at θᵗ).

    python research/bench_cone_programs.py SEED
"""
import importlib.util
import subprocess
import sys
import tempfile
import time

import torch
from round_client import round_client

import fcn_analytic.disaggregate as new

BEFORE = "7d113c2"
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(subprocess.run(["git", "show", f"{BEFORE}:fcn_analytic/disaggregate.py"], capture_output=True, text=True,
                           check=True).stdout)
spec = importlib.util.spec_from_file_location("disaggregate_before", f.name)
old = importlib.util.module_from_spec(spec)
sys.modules["disaggregate_before"] = old
spec.loader.exec_module(old)

capture, truth, x0 = round_client(int(sys.argv[1]) if len(sys.argv) > 1 else 0, 1)
gw, gb = capture.shared["body.1.weight"].double(), capture.shared["body.1.bias"].double()
batch = capture.num_samples


def agree(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> int:
    """Rows of ``a`` within cosine 1 − tol of some row of ``b``."""
    a, b = torch.nn.functional.normalize(a, dim=1), torch.nn.functional.normalize(b, dim=1)
    return int(((a @ b.T).max(1).values > 1 - tol).sum())


searches = {"search_inputs": lambda m: m.search_inputs(gw, gb, batch)[0],
            "linear_inputs": lambda m: m.linear_inputs(gw, gb, batch, method="lp").inputs}
for name, search in searches.items():
    found, cpu = {}, {}
    for label, module in (("before", old), ("after", new)):
        start = time.process_time()
        found[label] = search(module)
        cpu[label] = time.process_time() - start
    print(f"{name}: before {cpu['before']:.1f} CPU s, after {cpu['after']:.1f} CPU s "
          f"({cpu['before'] / cpu['after']:.2f}x); same inputs {agree(found['before'], found['after'])} of {batch}; "
          f"true inputs found before {agree(found['before'], x0.flatten(1), 1e-2)}, "
          f"after {agree(found['after'], x0.flatten(1), 1e-2)}")
