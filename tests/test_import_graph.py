"""The rooms' arrows run one way: every import of product code, those inside functions too,
read from the source, and checked for cycles between rooms and within them."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"gemmgen": "gemmgen", "dsl": "gemmgen.dsl", "backends": "gemmgen.backends",
           "policy": "gemmgen.policy", "tuning_db": "gemmgen.tuning_db"}

# Longest prefix wins: a module belongs to the room of the longest prefix of its name.
ROOMS = {
    "gemmgen.dsl": "dsl",
    "gemmgen.errors": "base", "gemmgen.cache": "base",
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


def test_the_checker_sees_a_cycle_and_imports_inside_functions(tmp_path):
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}}) == []
    mods = {"gemmgen.dsl.x": tmp_path / "x.py"}
    mods["gemmgen.dsl.x"].write_text("def f():\n    from gemmgen.backends import get\n")
    mods["gemmgen.backends"] = tmp_path / "y.py"
    mods["gemmgen.backends"].write_text("")
    assert imports(mods) == [("gemmgen.dsl.x", "gemmgen.backends", 2)]
