"""The package's import graph, read from the source (AST), not from an import: no cycles
between its modules, and no private name (``_x``) imported from another module (a name two
modules share is public, in a private module if need be).

Run as a script to print the graph::

    python tests/python/package/test_import_graph.py [-v]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "python" / "redcount"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (the compiled ``_core``
    by its stub)."""
    found: dict[str, Path] = {}
    for p in sorted(root.rglob("*.py")) + sorted(root.rglob("*.pyi")):
        if p.suffix == ".pyi" and p.with_suffix(".py").exists():
            continue
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = p
    return found


def _target(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph(root: Path = PACKAGE) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package's modules it imports, anywhere in its body: at the top, in a
    function or under TYPE_CHECKING), and the private names imported across modules."""
    mods = modules(root)
    top = root.name
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    for m, path in mods.items():
        if path.suffix == ".pyi":
            continue  # the compiled module imports nothing of the package
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                target = _target(m, is_package, node.level, node.module) if node.level else (node.module or "")
                if target.split(".")[0] != top:
                    continue
                for a in node.names:
                    if f"{target}.{a.name}" in mods:
                        graph[m].add(f"{target}.{a.name}")  # a module of a package
                        continue
                    if target in mods:
                        graph[m].add(target)
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.append(f"{m}: from {target} import {a.name}")
        graph[m].discard(m)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles() -> None:
    graph, _ = import_graph()
    assert len(graph) > 40  # the whole package was read
    assert cycles(graph) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    _, private = import_graph()
    assert private == []


def test_a_cycle_and_a_private_import_are_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import _helper\n")
    (pkg / "b.py").write_text("def f() -> None:\n    from . import a\n")
    graph, private = import_graph(pkg)
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert private == ["pkg.a: from pkg.b import _helper"]


if __name__ == "__main__":
    graph, private = import_graph()
    if "-v" in sys.argv:
        for module in sorted(graph):
            print(f"{module} -> {', '.join(sorted(graph[module])) or '-'}")
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} imports between them")
    print("cycles:", cycles(graph) or "none")
    print("private names imported across modules:", private or "none")
