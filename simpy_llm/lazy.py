"""Package exports imported on first use (PEP 562), so that importing a package costs only
what is used: the command line imports the packages whose verbs it declares, and a
``simpy-llm run`` should not pay for SciPy, pandas or aiohttp."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], homes: Mapping[str, str | tuple[str, str]], *, package: str | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for names imported on first use.

    Parameters
    ----------
    namespace
        The module's ``globals()``: a name, once imported, is kept there.
    homes
        Each lazily exported name's module, relative to *package*: a module name (the
        attribute has the exported name) or ``(module, attribute)``.
    package
        What the module names are relative to (default: the module itself, a package).

    Examples
    --------
    >>> ns = {"__name__": "collections", "__all__": ["abc_module"]}
    >>> getattr_, dir_ = lazy_exports(ns, {"Mapping": "abc", "abc_module": ("abc", "__name__")})
    >>> getattr_("Mapping").__name__, getattr_("abc_module"), "Mapping" in ns, dir_()[:2]
    ('Mapping', 'collections.abc', True, ['Mapping', '__all__'])
    """
    base = package if package is not None else namespace["__name__"]
    owner = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        module, attribute = (home, name) if isinstance(home, str) else home
        value = getattr(importlib.import_module(f"{base}.{module}"), attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
