"""Registering a taken name: the same definition run again replaces the entry; anything else raises."""

from __future__ import annotations

import pytest

from simpy_llm.registry import Registry, RegistryError

CELL = '''
@policies.register("fewest_waiting")
class FewestWaiting:
    def choose(self, request, view):
        return 0
'''


def test_rerunning_a_notebook_cell_replaces_the_registration() -> None:
    """Running the same registering code twice in one namespace (a notebook cell re-run) keeps
    the newer class instead of raising."""
    policies: Registry[type] = Registry("routing policy")
    namespace = {"__name__": "__main__", "policies": policies}
    exec(CELL, namespace)  # noqa: S102 - the cell as a notebook would run it
    first = namespace["FewestWaiting"]
    exec(CELL, namespace)  # noqa: S102
    second = namespace["FewestWaiting"]
    assert first is not second
    assert policies.get("fewest_waiting") is second


def test_same_qualified_name_replaces_the_entry() -> None:
    """A new object with the registered one's ``__module__`` and ``__qualname__`` replaces it."""
    reg: Registry[type] = Registry("widget")

    def define() -> type:
        @reg.register("w")
        class Widget:
            pass

        return Widget

    first, second = define(), define()
    assert first is not second and first.__qualname__ == second.__qualname__
    assert reg.get("w") is second


def test_same_name_in_another_module_still_raises() -> None:
    """A class with the same ``__qualname__`` from a different module is a different definition: it raises."""
    reg: Registry[type] = Registry("widget")
    reg.register("w")(type("Widget", (), {"__module__": "one"}))
    with pytest.raises(RegistryError, match=r"widget 'w' is already registered \(to one\.Widget\)"):
        reg.register("w")(type("Widget", (), {"__module__": "two"}))
    assert reg.get("w").__module__ == "one"


def test_a_different_object_under_a_taken_name_raises_and_keeps_the_first() -> None:
    """A different class under a taken name raises RegistryError naming the registered one; the first stays."""
    reg: Registry[type] = Registry("widget")

    @reg.register("w")
    class First:
        pass

    with pytest.raises(RegistryError, match=r"already registered \(to .*First\); choose another name"):

        @reg.register("w")
        class Second:
            pass

    assert reg.get("w") is First


def test_registering_the_same_object_twice_is_harmless() -> None:
    """Registering the very object already registered under the name changes nothing."""
    reg: Registry[object] = Registry("number")
    reg.register("one")(1)
    reg.register("one")(1)
    assert reg.get("one") == 1


def test_objects_without_a_qualified_name_cannot_replace_each_other() -> None:
    """Values with no ``__qualname__`` (plain data) are never taken for a redefinition."""
    reg: Registry[object] = Registry("number")
    reg.register("x")(1)
    with pytest.raises(RegistryError):
        reg.register("x")(2)
    assert reg.get("x") == 1
