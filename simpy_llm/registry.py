"""Open registries of named implementations (policies, models, distributions).

A :class:`Registry` maps a short name used in scenario YAML (``kind: least_loaded``)
to a class. Built-ins and user code register the same way, with a decorator::

    @routing_policies.register("my_router")
    class MyRouter: ...

Registering a name twice raises, so a typo in a user module cannot silently
replace a built-in.
"""

from __future__ import annotations

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

    def register(self, name: str) -> Callable[[T], T]:
        """Return a decorator that registers its argument under *name*."""

        def decorate(obj: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.what} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        """Return the implementation registered under *name*."""
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.what} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
