"""Only ``simpy_llm/kernel.py`` touches SimPy's internals.

Every other module of the package is walked (its syntax tree, not its text): it may
name no private attribute of SimPy's classes, and import no private name from SimPy.
The kernel wraps each internal it needs behind a public function or class; when SimPy
changes, it is the one module to update.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import simpy
import simpy.events
import simpy.resources.base
import simpy.resources.container
import simpy.resources.resource
import simpy.resources.store
import simpy.rt

import simpy_llm

PACKAGE = Path(simpy_llm.__file__).parent
KERNEL = PACKAGE / "kernel.py"

STRICT = frozenset({
    "_env", "_value", "_ok", "_queue", "_eid", "_now", "_target", "_resume", "_trigger_get",
    "_trigger_put", "_do_get", "_do_put", "_defused", "_generator", "_active_proc", "_delay",
})
"""SimPy privates that no other module may name at all (read, write or definition)."""


def _simpy_private_names() -> frozenset[str]:
    """The underscore names SimPy's own classes and instances define (not dunders, not
    names they inherit from ``object`` or ``typing``)."""
    env = simpy.Environment()

    def proc():
        yield env.timeout(1)

    instances = [
        env, env.event(), env.timeout(1), env.process(proc()), env.all_of([]), env.any_of([]),
        simpy.Store(env), simpy.PriorityStore(env), simpy.FilterStore(env), simpy.Container(env),
        simpy.Resource(env), simpy.PriorityResource(env), simpy.PreemptiveResource(env),
        simpy.rt.RealtimeEnvironment(),
    ]
    classes = {
        *(type(obj) for obj in instances),
        simpy.events.Initialize, simpy.events.Interruption, simpy.events.ConditionValue,
        simpy.resources.base.BaseResource, simpy.resources.base.Put, simpy.resources.base.Get,
        simpy.resources.store.StorePut, simpy.resources.store.StoreGet,
        simpy.resources.container.ContainerPut, simpy.resources.container.ContainerGet,
        simpy.resources.resource.Request, simpy.resources.resource.Release,
    }
    names: set[str] = set(STRICT)
    for cls in classes:
        for klass in cls.__mro__:
            if klass.__module__.startswith("simpy."):
                names.update(vars(klass))
                names.update(getattr(klass, "__annotations__", {}))
    for obj in instances:
        names.update(vars(obj))
    python = set(dir(object)) | {"_abc_impl", "_is_protocol"}  # set on SimPy's classes by Python's abc/typing
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__") and n not in python)


SIMPY_PRIVATE = _simpy_private_names()


def _module_name(path: Path) -> str:
    return ".".join(("simpy_llm", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")


def _derives_from_simpy(module: str, class_name: str) -> bool:
    """Whether class *class_name* of *module* has a SimPy class among its bases (its own
    ``self._x`` would then be SimPy's)."""
    cls = getattr(importlib.import_module(module), class_name, None)
    if not inspect.isclass(cls):
        return True  # a nested or generated class: no exemption
    return any(k.__module__ == "simpy" or k.__module__.startswith("simpy.") for k in cls.__mro__)


class _Finder(ast.NodeVisitor):
    """Collects the offending lines of one module."""

    def __init__(self, label: str, module: str, tree: ast.Module) -> None:
        self.label = label
        self.module = module
        self.offences: list[str] = []
        self.classes: list[ast.ClassDef] = []
        self.own: dict[ast.ClassDef, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.own[node] = self._own_names(node)

    @staticmethod
    def _own_names(klass: ast.ClassDef) -> set[str]:
        """The names the class itself defines: its methods and class attributes, and the
        ``self._x``/``cls._x`` its methods assign."""
        names: set[str] = set()
        for stmt in klass.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
        for node in ast.walk(klass):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
        return names

    def _offend(self, node: ast.AST, what: str) -> None:
        self.offences.append(f"{self.label}:{node.lineno}: {what}")

    def _exempt(self, node: ast.Attribute) -> bool:
        """``self._x``/``cls._x`` of a class (not derived from SimPy) that defines ``_x``
        itself, for a SimPy private that is not in :data:`STRICT`."""
        if node.attr in STRICT or not self.classes:
            return False
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            return False
        cls = self.classes[-1]
        return node.attr in self.own[cls] and not _derives_from_simpy(self.module, cls.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A method named as a SimPy private (a module-level function is no attribute)."""
        if self.classes and node in self.classes[-1].body and (
            node.name in STRICT
            or (node.name in SIMPY_PRIVATE and _derives_from_simpy(self.module, self.classes[-1].name))
        ):
            self._offend(node, f"defines {node.name}, a SimPy private")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in SIMPY_PRIVATE and not self._exempt(node):
            self._offend(node, f"names .{node.attr}, a SimPy private")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in STRICT:
            self._offend(node, f"spells {node.value!r}, a SimPy private (getattr/setattr?)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and (node.module == "simpy" or node.module.startswith("simpy.")):
            for alias in node.names:
                if alias.name.startswith("_"):
                    self._offend(node, f"imports {alias.name} from {node.module}, a SimPy private")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("simpy.") and any(p.startswith("_") for p in alias.name.split(".")):
                self._offend(node, f"imports {alias.name}, a SimPy private module")


def _offences(source: str, label: str, module: str) -> list[str]:
    tree = ast.parse(source, filename=label)
    finder = _Finder(label, module, tree)
    finder.visit(tree)
    return finder.offences


def test_the_private_name_set_is_simpys():
    """The names checked are SimPy's privates: they include the internals the kernel relies
    on and SimPy's other underscore names, and no dunder."""
    assert {"_queue", "_eid", "_now", "_resume", "_target", "_trigger_get", "_do_get", "_value", "_ok"} <= SIMPY_PRIVATE
    assert {"_capacity", "_level", "_desc"} <= SIMPY_PRIVATE
    assert not any(n.startswith("__") for n in SIMPY_PRIVATE)


def test_only_the_kernel_names_simpy_privates():
    """No module of the package but ``simpy_llm/kernel.py`` reads, writes or defines a SimPy
    private, or imports one; each offence is named by file and line."""
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p != KERNEL)
    assert len(modules) > 50
    offences = [
        o
        for path in modules
        for o in _offences(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)), _module_name(path))
    ]
    assert not offences, "SimPy internals outside simpy_llm/kernel.py:\n" + "\n".join(offences)


def test_the_check_flags_an_offence():
    """The walk finds a SimPy private imported, written, read, defined as a method and
    spelled for ``getattr``, each at its line (so the test above cannot pass by finding
    nothing); a module-level function of that name is no attribute and passes."""
    source = (
        "from simpy.events import _describe_frame\n"
        "def f(env, ev):\n"
        "    ev._ok = True\n"
        "    return env._now\n"
        "class R:\n"
        "    def _do_get(self, event):\n"
        "        return getattr(event, '_value')\n"
        "def _generator(value):\n"
        "    return value\n"
    )
    offences = _offences(source, "probe.py", "probe")
    assert [int(o.split(":")[1]) for o in offences] == [1, 3, 4, 6, 7], offences
    assert offences[0].startswith("probe.py:1: imports _describe_frame")


def test_a_class_may_keep_its_own_underscore_names():
    """``self._count`` in a class of the package that assigns it (and derives from no SimPy
    class) is that class's own attribute; the same name on another object, or a STRICT
    name even on ``self``, is flagged."""
    source = (
        "class Counter:\n"
        "    def __init__(self):\n"
        "        self._count = 0\n"
        "        self._env = None\n"
        "    def bump(self, other):\n"
        "        self._count += 1\n"
        "        return other._count\n"
    )
    offences = _offences(source, "probe.py", __name__)
    assert [int(o.split(":")[1]) for o in offences] == [4, 7], offences


class Counter:
    """Stands for the probe's class in :func:`test_a_class_may_keep_its_own_underscore_names`
    (the walk imports the module to see the class's bases)."""
