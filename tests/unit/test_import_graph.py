"""The package's import graph has no cycle.

The modules of ``simpy_llm`` form layers, each importing only those below it
(``docs/architecture.md``; ``lint-imports`` checks the layers themselves), so no two modules
import each other, directly or through others. A circle would tie its modules into one piece
that can only be understood, tested and changed together.

Every import statement counts, at the top of a module or inside a function, except those under
``if TYPE_CHECKING:`` (which never run); importing a package counts as importing its
``__init__``, and ``from package import name`` as importing the submodule *name* when there is
one.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

PACKAGE = Path(__file__).resolve().parents[2] / "simpy_llm"

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the module at *path* imports (outside TYPE_CHECKING blocks)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit_statement(other)
                continue
            visit_statement(child)

    def visit_statement(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    targets = set()
    for target in found:
        while target and target not in modules:  # a name imported from a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            targets.add(target)
    return targets


def import_cycles() -> list[frozenset[str]]:
    """The groups of two or more modules that import each other in a circle (strongly connected
    components of the import graph), names relative to ``simpy_llm``."""
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    names = sorted(paths)
    index = {n: i for i, n in enumerate(names)}
    edges = [(index[n], index[t]) for n in names for t in _imported(paths[n], set(paths))]
    rows, cols = zip(*edges, strict=True)
    graph = csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(len(names), len(names)))
    count, labels = connected_components(graph, directed=True, connection="strong")
    groups = [frozenset(names[i].removeprefix("simpy_llm.") for i in np.flatnonzero(labels == g)) for g in range(count)]
    return [g for g in groups if len(g) > 1]


def test_the_import_graph_has_no_cycle():
    """No group of modules imports each other in a circle (through any import statement that runs,
    function-local ones included)."""
    cycles = [sorted(g) for g in import_cycles()]
    assert cycles == [], f"import cycles (break them; docs/architecture.md): {cycles}"


def test_a_new_cycle_would_be_found(tmp_path, monkeypatch):
    """The check sees a circle through a function-local import and ignores one that only a
    TYPE_CHECKING block closes."""
    package = tmp_path / "simpy_llm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from simpy_llm import b\n")
    (package / "b.py").write_text("def f():\n    from simpy_llm.a import x\n")
    (package / "c.py").write_text("from simpy_llm import d\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from simpy_llm import c\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert import_cycles() == [frozenset({"a", "b"})]


def test_every_module_sits_in_a_layer():
    """Each module of the package belongs to a layer of the import-linter contract in
    pyproject.toml (a module in no layer would be checked by nothing); only empty package
    ``__init__`` files of a package split across layers may stay outside."""
    contract = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    layers = [item.strip() for line in contract["layers"] for item in line.replace(":", "|").split("|")]
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path).removeprefix("simpy_llm").removeprefix(".")
        if not name or (path.name == "__init__.py" and not path.read_text(encoding="utf-8").strip()):
            continue
        if not any(name == layer or name.startswith(layer + ".") for layer in layers):
            outside.append(name)
    assert outside == [], f"place these modules in a layer of [tool.importlinter] (docs/architecture.md): {outside}"
