"""The import rules of docs/architecture.md ("Layout"): layers point down, no private name crosses modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gi", "labels", "fcn_analytic")

# (module prefix, layer); the longest matching prefix wins
LAYERS = [
    ("gi.core", 0),
    ("gi.fl", 1), ("gi.fl.schemes", 1), ("gi.fl.optim", 1), ("gi.fl.protocol", 1), ("gi.fl.defences", 1),
    ("gi.losses", 2), ("gi.models", 2), ("gi.assets", 2), ("gi.fl.local", 2), ("gi.capture", 2),
    ("gi.label_result", 2),
    ("gi.data", 3), ("gi.train", 3), ("gi.lpips_offline", 3), ("gi.metrics", 3), ("gi.fl.victim", 3),
    ("gi.fl.partition", 3), ("gi.victim_setup", 3), ("gi.fl.flower", 3),
    ("labels", 4),
    ("fcn_analytic", 5),
    ("gi.recon", 6),
    ("gi.scenarios", 7),
    ("gi.experiments", 8),
    ("gi.cli", 9), ("gi", 9),
]


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """``(module imported, names imported from it, line)`` for every import of a project module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # ``from gi import data`` imports the module gi.data
                sub = f"{node.module}.{alias.name}"
                out.append((sub, [], node.lineno) if sub in modules else (node.module, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((alias.name, [], node.lineno) for alias in node.names)
    return [(m, names, line) for m, names, line in out if m.split(".")[0] in PACKAGES]


def test_every_module_has_a_layer_and_imports_point_down():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for target, _, line in _imports(path, modules):
            if layer(target) > layer(name):
                upward.append(f"{path.relative_to(ROOT)}:{line} {name} (layer {layer(name)}) imports {target} "
                              f"(layer {layer(target)})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_private_name_is_imported_across_modules():
    modules = _modules()
    private = [f"{path.relative_to(ROOT)}:{line} imports {target}.{n}" for name, path in modules.items()
               for target, names, line in _imports(path, modules) for n in names
               if n.startswith("_") and target != name]
    assert not private, "\n".join(private)


def test_the_layer_table_rejects_what_it_should():
    assert layer("gi.fl.schemes.feddyn") == 1 and layer("gi.fl.victim") == 3 and layer("gi.experiments.sweep") == 8
    assert layer("labels.rlu") == 4 and layer("gi") == 9 and layer("gi.core.config") == 0
