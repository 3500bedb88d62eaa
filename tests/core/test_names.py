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
    from gi.world import bodies

    monkeypatch.setitem(bodies.BODIES, "my-net", bodies.BODIES["lenet"])
    assert "my-net" in names.known("model")
    names.check_name("model", "my-net", "model.name")
    with pytest.raises(ConfigError, match=r"model.name='nope': unknown model; valid: \[.*'lenet'"):
        names.check_name("model", "nope", "model.name")


def test_the_label_options_table_is_the_methods_signatures():
    import inspect

    import labels

    for name, fn in labels.METHODS.items():
        params = inspect.signature(fn).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            assert names.LABEL_OPTIONS[name] is None, name
        else:
            want = sorted(n for n in params if n not in ("capture", "captures", "aux"))
            assert sorted(names.LABEL_OPTIONS[name]) == want, f"update gi.core.names.LABEL_OPTIONS[{name!r}]"
    assert sorted(names.LABEL_OPTIONS) == sorted(labels.METHODS)


def test_label_options_are_checked_without_torch():
    names.check_label_call("posterior", {"dtype": "float32"}, "labels.method")
    with pytest.raises(ConfigError, match=r"labels.method='posterior' takes no option\(s\) \['dtyp'\]; valid: "):
        names.check_label_call("posterior", {"dtyp": "float32"}, "labels.method")
    with pytest.raises(ConfigError, match=r"labels.method='psychic': unknown label method"):
        names.check_label_call("psychic", {}, "labels.method")
    names.check_label_call("llg+-update", {"anything": 1}, "labels.method")  # passed on: checked where it lands
