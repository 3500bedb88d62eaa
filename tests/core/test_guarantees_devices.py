"""Devices and label metrics: a bad request is a one-line error before any work."""

import subprocess
import sys
import time

import pytest
import torch

from gi.core.devices import resolve_device
from gi.core.errors import ConfigError

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
def test_gpu_on_a_cpu_machine_is_a_config_error_before_the_capture(tmp_path):
    """Before any work, shown without a clock: the output folder is never staged (a run stages it before it reads
    data), and with ``-v`` (every step logs to stderr) stderr is the refusal's one line and nothing else."""
    out = subprocess.run([sys.executable, "-m", "gi.cli", "-v", "run", "configs/demo.yaml", "attack.device=gpu",
                          f"out={tmp_path / 'run'}"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("gi run: error: attack.device=gpu but torch sees no GPU")
    assert out.stderr.count("\n") == 1 and out.stdout == "", out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
@pytest.mark.parametrize("key", ["device", "labels.device", "attack.device"])
def test_every_stage_refuses_a_missing_gpu_at_load_before_torch_work(key):
    """The victim (``device``), label recovery (``labels.device``) and the attack (``attack.device``) each refuse
    a GPU this machine lacks when the config loads, naming the key, in well under a second of CPU."""
    from gi.core.config import load
    from gi.experiments.config.run import RunConfig

    start = time.process_time()
    with pytest.raises(ConfigError, match=f"^{key}=gpu but torch sees no GPU"):
        load(RunConfig, "configs/demo.yaml", [f"{key}=gpu"])
    assert time.process_time() - start < 1.0


def test_device_names():
    assert resolve_device("cpu") == ("cpu", 1)
    assert resolve_device("auto")[0] in ("cpu", "gpu")
    with pytest.raises(ConfigError, match="valid: auto, cpu, gpu, cuda, cuda:N, mps"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="not allowed"):
        resolve_device("cuda:x")
    if NO_GPU:
        with pytest.raises(ConfigError, match="cuda:1 but torch sees no GPU"):
            resolve_device("cuda:1")


def test_unknown_label_metric_is_an_error_at_load():

    from gi.core.config import load
    from gi.experiments.config.labels import LabelBenchConfig

    with pytest.raises(ConfigError, match=r"metrics=\['nosuch'\]: unknown \['nosuch'\]; valid: \['ok', 'cls_acc'"):
        load(LabelBenchConfig, "configs/labels/rlu-table4-fedprox.yaml", ["metrics=[nosuch]"])
