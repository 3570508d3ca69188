"""The rooms' arrows run one way: every import of product code, those inside functions too,
read from the source, and checked for cycles between rooms and within them."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"gemmgen": "gemmgen", "dsl": "gemmgen.dsl", "backends": "gemmgen.backends",
           "policy": "gemmgen.policy", "tuning_db": "gemmgen.tuning_db"}

# Longest prefix wins: a module belongs to the room of the longest prefix of its name.
ROOMS = {
    "gemmgen.dsl": "dsl",
    "gemmgen.errors": "base", "gemmgen.cache": "base", "gemmgen.files": "base",
    "gemmgen.backends": "backends",
    "gemmgen.runtime": "runtime",
    "gemmgen.tuning_db": "tuning_db",
    "gemmgen.measure": "measure",
    "gemmgen.policy": "policy",
    "gemmgen.tune": "tune",
    "gemmgen.policy.training": "training",
    "gemmgen": "face",
    "gemmgen.torch_compile": "torch_compile",
    "gemmgen.cli": "cli", "gemmgen.__main__": "cli",
}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def room(module: str) -> str:
    best = max((p for p in ROOMS if module == p or module.startswith(p + ".")), key=len)
    return ROOMS[best]


def imports(mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every gemmgen import, at any depth of the code."""
    edges = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                if target.startswith("gemmgen"):
                    while target not in mods and "." in target:
                        target = target.rpartition(".")[0]
                    if target != name:
                        edges.append((name, target, node.lineno))
    return edges


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a list of nodes, or [] if it has none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


@pytest.fixture(scope="module")
def graph():
    mods = modules()
    return mods, imports(mods)


def test_every_module_has_a_room(graph):
    mods, _ = graph
    assert len(mods) > 80
    assert {room(m) for m in mods} == set(ROOMS.values())


def test_the_language_imports_nothing_else_of_gemmgen(graph):
    _, edges = graph
    out = [f"{a} -> {b} (line {line})" for a, b, line in edges if room(a) == "dsl" and room(b) != "dsl"]
    assert out == []


def test_no_cycle_between_rooms(graph):
    _, edges = graph
    rooms = defaultdict(set)
    for a, b, _ in edges:
        if room(a) != room(b):
            rooms[room(a)].add(room(b))
    assert cycle(rooms) == [], "\n".join(f"{a} -> {b} at {line}" for a, b, line in edges
                                          if room(a) != room(b) and room(b) in cycle(rooms)
                                          and room(a) in cycle(rooms))


def test_no_cycle_between_modules(graph):
    mods, edges = graph
    modules_graph = defaultdict(set)
    for a, b, _ in edges:
        # A package imports its own modules to re-export them; that is not an arrow back.
        if not (mods[a].name == "__init__.py" and b.startswith(a + ".")):
            modules_graph[a].add(b)
    assert cycle(modules_graph) == []


def deferred_imports_without_a_reason(path: Path) -> list[str]:
    """Imports inside functions that do not say why they are deferred. An import is deferred only
    to put off an optional heavy dependency (torch, triton, ...), and a comment line above its
    group (or on it) says so; an import in a `try` probes for an optional package and is its own
    reason. The standard library is never deferred."""
    lines = path.read_text().split("\n")
    tree = ast.parse("\n".join(lines))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def enclosing(node, kinds):
        node = parents.get(node)
        while node is not None and not isinstance(node, kinds):
            node = parents.get(node)
        return node

    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        function = enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if function is None or isinstance(enclosing(node, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef)), ast.Try):
            continue
        root = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name or "").split(".")[0]
        line = node.lineno
        while line > 1 and lines[line - 2].strip().startswith(("import ", "from ")):
            line -= 1           # the first import of this group
        said = "deferred" in lines[line - 2].lower() or "deferred" in lines[node.lineno - 1].lower()
        if root in sys.stdlib_module_names or not said:
            bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return bad


def test_imports_inside_functions_only_defer_heavy_dependencies(graph):
    mods, _ = graph
    bad = [b for path in mods.values() for b in deferred_imports_without_a_reason(path)]
    assert bad == []


def test_the_checker_sees_a_cycle_and_imports_inside_functions(tmp_path):
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}}) == []
    mods = {"gemmgen.dsl.x": tmp_path / "x.py"}
    mods["gemmgen.dsl.x"].write_text("def f():\n    from gemmgen.backends import get\n")
    mods["gemmgen.backends"] = tmp_path / "y.py"
    mods["gemmgen.backends"].write_text("")
    assert imports(mods) == [("gemmgen.dsl.x", "gemmgen.backends", 2)]
    global REPO
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n\n\ndef g():\n    # Deferred: torch is optional.\n"
                      "    import torch\n    from gemmgen import x\n\n\ndef h():\n    from gemmgen import y\n")
    saved, REPO = REPO, tmp_path
    try:
        assert [b.split(": ")[1] for b in deferred_imports_without_a_reason(module)] == [
            "import json", "from gemmgen import y"]
    finally:
        REPO = saved


def test_every_package_is_installed(graph):
    """pyproject lists the packages explicitly: a new room left out would import here, from the
    checkout, and be missing from a wheel."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mods, _ = graph
    packages = {name for name, path in mods.items() if path.name == "__init__.py"}
    assert packages == listed
