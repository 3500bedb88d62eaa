"""The import rules of docs/architecture.md ("Layout"): layers point down, no private name crosses modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gi", "labels", "fcn_analytic")

# (module prefix, layer); the longest matching prefix wins
LAYERS = [
    ("gi.core", 0),
    ("gi.world", 1), ("gi.world.fl", 1), ("gi.world.fl.schemes", 1), ("gi.world.fl.optim", 1),
    ("gi.world.fl.protocol", 1), ("gi.world.fl.defences", 1),
    ("gi.world.losses", 2), ("gi.world.models", 2), ("gi.world.bodies", 2), ("gi.world.assets", 2),
    ("gi.world.fl.local", 2),
    ("gi.capture", 2), ("gi.label_result", 2),
    ("gi.world.data", 3), ("gi.world.train", 3), ("gi.world.fl.victim", 3), ("gi.world.fl.partition", 3),
    ("gi.world.setup", 3), ("gi.world.build", 3), ("gi.world.fl.flower", 3),
    ("gi.analysis", 3),
    ("labels", 4), ("fcn_analytic.disaggregate", 4),  # captures only: the fc-inputs label method builds on it
    ("fcn_analytic", 5),
    ("gi.attack", 8), ("gi.attack.stages", 7), ("gi.attack.recon", 6),
    ("gi.world.scenarios", 7),
    ("gi.analysis.outputs", 8), ("gi.attack.api", 8),  # the Python entry scores and saves: outputs, outdir
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
            for alias in node.names:  # ``from gi import data`` imports the module gi.world.data
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
    assert layer("gi.world.fl.schemes.feddyn") == 1 and layer("gi.world.fl.victim") == 3
    assert layer("gi.experiments.sweep") == 8 and layer("gi.attack.recon.api") == 6 and layer("gi.attack.stages") == 7
    assert layer("gi.attack.api") == 8 and layer("gi.attack") == 8
    assert layer("labels.rlu") == 4 and layer("gi") == 9 and layer("gi.core.config") == 0
    assert layer("gi.world.build") == 3 and layer("gi.experiments.config.run") == 8  # schema and builders


MAX_LINES = 800  # docs/architecture.md, "Layout": no module of gi/ longer


def test_no_module_of_gi_is_over_800_lines():
    long = {f"{path.relative_to(ROOT)}": n for path in (ROOT / "gi").rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def _runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports when it runs: module-level and function-level imports, not the
    type-only ones under ``if TYPE_CHECKING:`` (which never execute); a package's own children excluded."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                   and node.test.id == "TYPE_CHECKING" for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in modules}


def test_no_import_circle_between_modules():
    """docs/architecture.md, "Layout": no module imports, at any depth and at run time (at import or inside a
    function), a module that imports it back; a package importing its own modules is not a circle."""
    modules = _modules()
    graph = {name: {t for t in _runtime_imports(path, modules) if t != name and not name.startswith(t + ".")}
             for name, path in modules.items()}
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack
                               else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)
