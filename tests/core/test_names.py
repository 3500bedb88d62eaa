"""gi.core.names: the static name tables configs are checked against without torch equal the registries."""

import importlib

import pytest

from gi.core import names
from gi.core.errors import ConfigError


@pytest.mark.parametrize("kind", sorted(names.REGISTRIES))
def test_every_static_name_table_is_its_registry(kind):
    static, module, table = names.REGISTRIES[kind]
    registry = getattr(importlib.import_module(module), table)
    if module == "labels.base":
        import labels  # noqa: F401  (every module of labels/ registers its methods)
    if module == "gi.attack.recon.terms":
        import gi.attack.recon.regularizers  # noqa: F401  (the image priors register there)
    assert sorted(static) == sorted(registry), f"update gi.core.names for {module}.{table}"


def test_metric_names_are_those_of_the_metrics_module():
    from gi.analysis import metrics

    assert metrics.LABEL_METRICS is names.LABEL_METRICS and metrics.POOLED_METRICS is names.POOLED_METRICS


def test_names_registered_at_run_time_are_known(monkeypatch):
    from gi.world import models

    monkeypatch.setitem(models.BODIES, "my-net", models.BODIES["lenet"])
    assert "my-net" in names.known("model")
    names.check_name("model", "my-net", "model.name")
    with pytest.raises(ConfigError, match=r"model.name='nope': unknown model; valid: \[.*'lenet'"):
        names.check_name("model", "nope", "model.name")
