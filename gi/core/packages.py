"""The toolkit's own top-level packages beside ``gi`` (docs/architecture.md, "Layout"): ``labels`` and
``fcn_analytic``. Their names are common words, so a user's ``labels.py`` (or ``fcn_analytic.py``, or a folder of
that name) beside their script comes first on ``sys.path`` and hides ours; :func:`check_own_packages` says so in
one line when ``gi`` is imported, instead of a ``No module named 'labels.slot_check'`` deep inside an attack."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

OWN_PACKAGES = ("labels", "fcn_analytic")


def check_own_packages() -> None:
    """Raise ImportError naming the file that shadows one of :data:`OWN_PACKAGES`: the one Python would import
    is not the package installed beside ``gi``. Imports nothing (``importlib.util.find_spec`` of a top-level name
    only locates it); a package that cannot be found at all is left to the import that needs it."""
    home = Path(__file__).resolve().parents[2]  # the folder that holds gi/, labels/ and fcn_analytic/
    for name in OWN_PACKAGES:
        module = sys.modules.get(name)
        try:
            spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            continue
        if spec is None:
            continue
        origin = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), None)
        if origin is None:
            continue
        where = Path(origin).resolve()
        if where == home / name / "__init__.py" or where == home / name:
            continue
        shadow = where.parent if where.name == "__init__.py" else where
        raise ImportError(f"rename {shadow}: it shadows the label-first toolkit's `{name}` package "
                          f"({home / name}), which gi imports")
