"""The package's shape: no import cycle among its modules, and no module over MAX_LINES lines.

The import graph is read from the source with ast (nothing is imported): an edge A -> B for every
``import`` or ``from ... import`` in A that names a module B of the package, at any depth in A (a lazy
import inside a function is still a dependency). ``from .x import name`` is an edge to the submodule
``x.name`` where there is one, else to ``x``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

MAX_LINES = 400


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            # a submodule imported by name, else the module that defines the name
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name defined in a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of the package at ``package`` -> the package's modules it imports."""
    paths = sorted(package.rglob("*.py"))
    names = {path: module_name(package.parent, path) for path in paths}
    return {name: imports(path, name, set(names.values())) for path, name in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each import cycle: the strongly connected components of more than one module
    (Tarjan's algorithm)."""
    index, low, stack, found = {}, {}, [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_check_sees_a_cycle_made_by_a_lazy_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for path, text in {"__init__.py": "", "sub/__init__.py": "", "a.py": "from .sub import b\n",
                       "sub/b.py": "def f():\n    from ..a import g\n", "c.py": "from . import a\n"}.items():
        (package / path).write_text(text)
    graph = import_graph(package)
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.a"] == {"pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_cycle_in_the_package():
    graph = import_graph(REPO / "kda_impls")
    assert len(graph) > 20 and "kda_impls.verify_checks" in graph["kda_impls.verify"]
    assert cycles(graph) == []


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "kda_impls").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"
