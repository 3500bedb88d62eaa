"""The ``fc-inputs`` label method on each client of configs/fedavg-round.yaml (a probe): counts exact or not,
ins_acc, L1 of the counts, which search gave the inputs (vertices found by one program per input, rows the
pursuit is sure of, rows completed, rows left doubtful) and CPU seconds, one line per client.

    python research/probe_round_labels.py SEED CLIENTS [OVERRIDES...]   (e.g. protocol.num_samples=100)
"""
import sys
import time

import torch
from round_client import round_clients

from labels.fc_inputs import recover_fc_inputs

torch.set_num_threads(1)
seed, clients = int(sys.argv[1]), int(sys.argv[2])
captures, truths = round_clients(seed, (f"trials={clients}", *sys.argv[3:]))
for k, (capture, truth) in enumerate(zip(captures, truths)):
    start = time.process_time()
    result = recover_fc_inputs(capture)
    ins = int(torch.minimum(result.counts, truth.counts).sum()) / int(truth.counts.sum())
    info = {key: result.info.get(key) for key in ("vertices", "search_sure", "completed", "doubtful")}
    print(f"seed {seed} client {k}: exact {bool(torch.equal(result.counts, truth.counts))}, ins_acc {ins:.3f}, "
          f"L1 {int((result.counts - truth.counts).abs().sum())}, {info}, {time.process_time() - start:.1f} CPU s",
          flush=True)
