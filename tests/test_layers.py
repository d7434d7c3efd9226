"""The package's architecture, checked from its source: imports point one way between layers,
and no module imports itself back through others (no import cycle), counting the imports made
inside functions, which only hide a cycle until the function runs."""

from __future__ import annotations

import ast
from pathlib import Path

import tokentrail

PACKAGE = Path(tokentrail.__file__).parent

# Lower layers never import higher ones; a layer may import within itself.
LAYERS: list[tuple[str, ...]] = [
    (
        "tokentrail.compat",
        "tokentrail.errors",
        "tokentrail.kinds",
        "tokentrail.messages",
        "tokentrail.setting",
        "tokentrail._core",
    ),
    ("tokentrail.text", "tokentrail.core"),
    ("tokentrail.trajectory",),
    ("tokentrail.storage", "tokentrail.engines", "tokentrail.model"),
    ("tokentrail.view",),
    ("tokentrail.adapter",),
    ("tokentrail.sim",),
    ("tokentrail.scale",),
    ("tokentrail.integrations",),
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


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of `package` by its dotted name (a package by its `__init__.py`)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports, wherever the import statement is: at the
    top, under `if TYPE_CHECKING`, or inside a function. `from P import M` counts as importing
    the module `P.M` where that is one, else `P`."""
    root = next(iter(known)).split(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == root:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == root)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(package)
    known = {*found, f"{package.name}._core"}
    return {name: imports(path, known) - {name} for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle of `graph`, as `a -> b -> a` (one per back edge of a depth-first walk)."""
    out: list[str] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                out.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return out


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, targets in import_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(name):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


# A request body's steps through `adapter.request`, in the order it takes them: a step imports
# only the steps before it, so a body goes through each once and parsing never calls back into
# an earlier file.
REQUEST_STEPS = ["memo", "read", "lift", "parse", "limits", "context", "translate", "reader"]


def test_a_body_goes_through_the_request_steps_in_order() -> None:
    prefix = "tokentrail.adapter.request."
    graph = import_graph()
    steps = sorted(name[len(prefix) :] for name in graph if name.startswith(prefix))
    assert steps == sorted(REQUEST_STEPS)
    wrong = []
    for step in REQUEST_STEPS:
        for target in graph[prefix + step]:
            if target.startswith(prefix):
                earlier = REQUEST_STEPS[: REQUEST_STEPS.index(step)]
                if target[len(prefix) :] not in earlier:
                    wrong.append(f"{step} -> {target[len(prefix) :]}")
    assert wrong == []


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    """The check itself: a cycle whose second half is imported inside a function (the way the
    journal's writer and its migration, or the tokenizer and the families, once hid theirs)."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub.b import helper\n")
    (package / "sub" / "b.py").write_text(
        "def helper():\n    from pkg.sub import a\n\n    return a\n"
    )
    (package / "c.py").write_text("import pkg.sub.a\n")
    assert cycles(import_graph(package)) == ["pkg.sub.a -> pkg.sub.b -> pkg.sub.a"]
    (package / "sub" / "b.py").write_text("def helper():\n    return 1\n")
    assert cycles(import_graph(package)) == []


def test_modules_and_classes_stay_small() -> None:
    too_big = []
    for name, path in modules().items():
        source = path.read_text()
        lines = source.count("\n")
        if lines > 600:
            too_big.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                # A declaration table (fields only, like `ServeSettings`' settings) is one idea
                # however long it grows; a class with behaviour is held to 300 lines.
                if not any(
                    isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body
                ):
                    continue
                size = node.end_lineno - node.lineno + 1
                if size > 300:
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert too_big == []
