"""The package's architecture, checked from its source: imports point one way between layers,
and no module imports itself back through others (no import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import tokentrail

PACKAGE = Path(tokentrail.__file__).parent

# Lower layers never import higher ones; a layer may import within itself.
LAYERS: list[tuple[str, ...]] = [
    ("tokentrail.errors", "tokentrail.kinds", "tokentrail.messages", "tokentrail._core"),
    ("tokentrail.text", "tokentrail.core"),
    ("tokentrail.trajectory",),
    ("tokentrail.storage", "tokentrail.engines", "tokentrail.model"),
    ("tokentrail.adapter",),
    ("tokentrail.sim",),
    ("tokentrail.scale", "tokentrail.integrations"),
    ("tokentrail.cli", "tokentrail.__main__", "tokentrail"),
]


def layer_of(module: str) -> int:
    best = (-1, -1)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), level))
    assert best[1] >= 0, f"{module} is in no layer"
    return best[1]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """The tokentrail modules `path` imports (all of them, or those run at import time)."""
    tree = ast.parse(path.read_text())
    found = set()
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("tokentrail"):
                known = {*modules(), "tokentrail._core"}
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tokentrail"))
    return found


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, path in modules().items():
        for target in imports(path, top_level_only=False):
            if layer_of(target) > layer_of(name):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_no_import_cycle() -> None:
    graph = {name: imports(path, top_level_only=True) - {name} for name, path in modules().items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_modules_and_classes_stay_small() -> None:
    too_big = []
    for name, path in modules().items():
        source = path.read_text()
        lines = source.count("\n")
        if lines > 600:
            too_big.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 300:
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert too_big == []
