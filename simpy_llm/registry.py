"""Open registries of named implementations (policies, models, distributions).

A :class:`Registry` maps a short name used in scenario YAML (``kind: least_loaded``)
to a class. Built-ins and user code register the same way, with a decorator::

    @routing_policies.register("my_router")
    class MyRouter: ...

Registering a taken name raises, so a typo in a user module cannot silently
replace a built-in. Registering the same definition again (the same module and
qualified name, as when a notebook cell or a plugin is run a second time)
replaces the entry with the new object.

A registry may also name modules that register more entries when imported
(:meth:`Registry.load_from`): they are imported the first time a name is
missing or the names are listed, so a kind that only a few scenarios use costs
nothing to the others, and a kind named in a scenario is still found.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "RegistryError"]

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate name in a :class:`Registry`."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry(Generic[T]):
    """A name -> implementation table filled by decorator.

    Parameters
    ----------
    what
        What the registry holds, used in error messages ("routing policy").

    Examples
    --------
    >>> shapes = Registry("shape")
    >>> @shapes.register("square")
    ... class Square:
    ...     pass
    >>> shapes.get("square") is Square
    True
    >>> shapes.names()
    ['square']
    >>> shapes.get("circle")
    Traceback (most recent call last):
    ...
    simpy_llm.registry.RegistryError: unknown shape 'circle'; known: square
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}
        self._pending: tuple[str, ...] = ()

    def load_from(self, *modules: str) -> None:
        """Import *modules* (dotted names), which register more entries, on first need.

        They are imported, in order, the first time :meth:`get` or ``in`` misses a name, or
        :meth:`names` or iteration lists them; a name already registered is found without
        them. Declared by the module that makes the registry complete (as an import of them
        would), so that the registry is the same whichever of its entries is looked up.

        Examples
        --------
        >>> from simpy_llm.serving.latency import latency_models
        >>> "lut" in latency_models  # simpy_llm.serving.latency declares simpy_llm.serving.lut, which registers it
        True
        """
        self._pending += modules

    def _load_pending(self) -> bool:
        """Import the modules declared by :meth:`load_from` not imported yet; whether there were any."""
        pending, self._pending = self._pending, ()
        for module in pending:
            importlib.import_module(module)
        return bool(pending)

    def register(self, name: str) -> Callable[[T], T]:
        """Return a decorator that registers its argument under *name*.

        A taken name raises :class:`RegistryError`, unless the new object has the
        same qualified name (``__module__`` and ``__qualname__``) as the registered
        one: that is the same definition run again, and the new object replaces it.

        Examples
        --------
        >>> shapes = Registry("shape")
        >>> def define():
        ...     @shapes.register("square")
        ...     class Square:
        ...         pass
        ...     return Square
        >>> first, second = define(), define()
        >>> shapes.get("square") is second
        True
        >>> @shapes.register("square")
        ... class Impostor:
        ...     pass
        Traceback (most recent call last):
        ...
        simpy_llm.registry.RegistryError: shape 'square' is already registered (to ...Square); ...
        """

        def decorate(obj: T) -> T:
            old = self._items.get(name, obj)
            qualified = _qualified_name(obj)
            if old is not obj and (qualified is None or qualified != _qualified_name(old)):
                raise RegistryError(
                    f"{self.what} {name!r} is already registered (to {_qualified_name(old) or repr(old)}); "
                    f"choose another name (only the same definition, run again, replaces it)"
                )
            self._items[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        """Return the implementation registered under *name*."""
        try:
            return self._items[name]
        except KeyError:
            if self._load_pending():
                return self.get(name)
            raise RegistryError(
                f"unknown {self.what} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted (the modules of :meth:`load_from` imported first)."""
        self._load_pending()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or (self._load_pending() and name in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _qualified_name(obj: object) -> str | None:
    """``module.qualname`` of a class or function (None for objects without one)."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return f"{module}.{qualname}"
