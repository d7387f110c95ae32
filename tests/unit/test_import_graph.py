"""The package's import graph: no new cycle, and the known ones only shrink.

The modules of ``simpy_llm`` are meant to form layers, each importing only those below it, so
the import graph should have no cycle. One group of modules still imports each other in a
circle (the latency models and the hardware catalogue). It is listed below as known debt;
this test fails when a module joins it or a new circle forms, so every change leaves the graph
no worse. When a group is broken up, shrink its entry.

Every import statement counts, at the top of a module or inside a function, except those under
``if TYPE_CHECKING:`` (which never run); importing a package counts as importing its
``__init__``, and ``from package import name`` as importing the submodule *name* when there is
one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

PACKAGE = Path(__file__).resolve().parents[2] / "simpy_llm"

KNOWN_CYCLES: tuple[frozenset[str], ...] = (
    frozenset({"serving.batch_table", "serving.hardware", "serving.latency", "serving.lut", "serving.profiled", "serving.roofline"}),
)
"""The groups of modules (names relative to ``simpy_llm``) that import each other in a circle today."""


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


def test_the_import_graph_has_no_cycle_beyond_the_known_ones():
    """Every group of modules that import each other in a circle lies inside one of the known
    groups: no module joined a circle and no new circle formed."""
    cycles = import_cycles()
    outside = [sorted(g) for g in cycles if not any(g <= known for known in KNOWN_CYCLES)]
    assert outside == [], f"new import cycles (break them; docs/model.md, 'Shape'): {outside}"


def test_the_known_cycles_are_still_there_as_listed():
    """Each known group is still exactly one circle (when one shrinks or breaks, shrink or
    remove its entry in KNOWN_CYCLES, so that it cannot grow back unnoticed)."""
    cycles = set(import_cycles())
    assert set(KNOWN_CYCLES) <= cycles, sorted(sorted(k) for k in set(KNOWN_CYCLES) - cycles)


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
