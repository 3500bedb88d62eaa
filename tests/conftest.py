"""Test-wide settings: one torch thread per worker (pytest -n 2 already uses both cores; more threads
oversubscribe the CPU and make small-op loops an order of magnitude slower)."""

import os

import torch

os.environ.setdefault("GI_THREADS", "1")
torch.set_num_threads(1)
