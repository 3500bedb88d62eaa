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
