"""The shared registry helper: names map to functions, a name registered twice is an error."""

import pytest

from gi.attack.recon import OBJECTIVES
from gi.attack.recon.objectives import register_objective
from gi.core.registry import registrar


def test_registrar_adds_under_the_name_and_refuses_duplicates():
    table: dict = {}
    register = registrar(table, "widget")

    @register("a")
    def a() -> int:
        return 1

    assert table == {"a": a} and a() == 1
    with pytest.raises(ValueError, match="widget 'a' registered twice"):
        register("a")(lambda: 2)
    assert table["a"] is a


def test_project_registries_use_it():
    with pytest.raises(ValueError, match="objective 'l2' registered twice"):
        register_objective("l2")(lambda *a: None)
    assert callable(OBJECTIVES["l2"])


def test_lazy_names_resolve_modules_and_attributes_on_first_use():
    import json
    import sys

    from gi.core.registry import lazy_names, lazy_submodules

    getattr_ = lazy_names("pkg", {"json": "json", "dumps": ("json", "dumps"), "sub": "gi.core.names"})
    assert getattr_("json") is json and getattr_("dumps") is json.dumps
    assert getattr_("sub") is sys.modules["gi.core.names"]
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        getattr_("nope")
    assert lazy_submodules("gi.core", ["errors"])("errors") is sys.modules["gi.core.errors"]
    with pytest.raises(AttributeError, match="'gi.core' has no attribute 'config'"):  # only the names it was given
        lazy_submodules("gi.core", ["errors"])("config")


def test_the_package_exposes_its_public_names_lazily():
    import gi

    assert gi.Capture.__name__ == "Capture" and gi.data.__name__ == "gi.world.data"
    assert gi.metrics.__name__ == "gi.analysis.metrics" and callable(gi.reconstruct)
    with pytest.raises(AttributeError, match="module 'gi' has no attribute 'nope'"):
        gi.nope  # noqa: B018
