"""A demo run's output directory, shared by the report tests: two CIFAR-10 images of one FedSGD batch through the
DLG LeNet, 40 iterations and one forced retry (retry_ratio 1e-30: every fit counts as stalled), under a name and
class names that try to inject markup (a capture and a config are untrusted input)."""

from __future__ import annotations

from pathlib import Path

import pytest

EVIL_NAME = "<script>alert(1)<script>"
EVIL_CLASS = "<script>alert('class')</script><img src=x onerror=alert(2)>"
DEMO = ["attack.iterations=40", "attack.analytic=false", "attack.progress=false", "attack.log_every=10",
        "metrics.lpips_vgg=false", "data.indices=[0,1]", "protocol.batch_size=2", "attack.retries=1",
        "attack.retry_ratio=1e-30"]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory):
    """The ``gi run`` result (``.out``: its directory, with report.html)."""
    import gi.world.data
    from gi.core.config import load
    from gi.experiments.config.run import RunConfig
    from gi.experiments.run import run

    out = tmp_path_factory.mktemp("report") / "demo"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gi.world.data, "class_names", lambda name: [f"{EVIL_CLASS}{c}" for c in range(10)])
        return run(load(RunConfig, "configs/demo.yaml", [*DEMO, f"name={EVIL_NAME}", f"out={out}"]))


@pytest.fixture(scope="session")
def demo_report(demo_run) -> Path:
    """The demo run's report.html."""
    return Path(demo_run.out) / "report.html"
