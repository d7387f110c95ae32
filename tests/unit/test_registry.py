"""Registries of named implementations."""

from __future__ import annotations

import pytest

from simpy_llm.policies.routing import LeastLoaded, RandomRouting, RoundRobin, routing_policies
from simpy_llm.registry import Registry, RegistryError
from simpy_llm.serving.latency import BlisLinearLatency, latency_models
from simpy_llm.workload.arrivals import GammaArrivals, PoissonArrivals, arrival_processes
from simpy_llm.workload.distributions import (
    ClampedGaussian,
    Constant,
    Exponential,
    LogNormal,
    length_distributions,
)


def test_register_returns_the_object_and_get_finds_it() -> None:
    """The decorator registers its argument under the name and returns it unchanged."""
    reg: Registry[type] = Registry("widget")

    class Widget:
        pass

    assert reg.register("w")(Widget) is Widget
    assert reg.get("w") is Widget
    assert "w" in reg


def test_duplicate_registration_raises() -> None:
    """Registering a taken name raises RegistryError and keeps the first registration."""
    reg: Registry[type] = Registry("widget")

    @reg.register("w")
    class First:
        pass

    with pytest.raises(RegistryError, match=r"widget 'w' is already registered"):

        @reg.register("w")
        class Second:
            pass

    assert reg.get("w") is First


def test_builtin_name_cannot_be_replaced() -> None:
    """A user class cannot silently take over a built-in name."""
    with pytest.raises(RegistryError):
        routing_policies.register("round_robin")(type("Impostor", (), {}))
    assert routing_policies.get("round_robin") is RoundRobin


def test_unknown_name_lists_known_names() -> None:
    """get() of an unknown name raises RegistryError listing every registered name, sorted."""
    reg: Registry[type] = Registry("shape")
    for name in ("square", "circle", "hexagon"):
        reg.register(name)(type(name, (), {}))
    with pytest.raises(RegistryError) as info:
        reg.get("triangle")
    assert str(info.value) == "unknown shape 'triangle'; known: circle, hexagon, square"


def test_registry_error_is_a_key_error_with_a_readable_message() -> None:
    """RegistryError is a KeyError whose str() is not wrapped in quotes."""
    err = RegistryError("unknown x 'y'; known: z")
    assert isinstance(err, KeyError)
    assert str(err) == "unknown x 'y'; known: z"


def test_names_are_sorted_and_iteration_follows_them() -> None:
    """names() is sorted regardless of registration order, and iterating yields the same."""
    reg: Registry[int] = Registry("number")
    for name in ("b", "c", "a"):
        reg.register(name)(1)
    assert reg.names() == ["a", "b", "c"]
    assert list(reg) == ["a", "b", "c"]


def test_contains_is_false_for_unregistered_and_non_string_names() -> None:
    """Membership is by exact registered name."""
    reg: Registry[int] = Registry("number")
    reg.register("one")(1)
    assert "two" not in reg
    assert "ONE" not in reg
    assert 1 not in reg


def test_registries_are_independent() -> None:
    """A name registered in one registry is not visible in another."""
    a: Registry[int] = Registry("a")
    b: Registry[int] = Registry("b")
    a.register("x")(1)
    assert "x" in a and "x" not in b
    b.register("x")(2)
    assert (a.get("x"), b.get("x")) == (1, 2)


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        (length_distributions, {"constant": Constant, "exponential": Exponential, "lognormal": LogNormal, "gaussian": ClampedGaussian}),
        (arrival_processes, {"poisson": PoissonArrivals, "gamma": GammaArrivals}),
        (routing_policies, {"round_robin": RoundRobin, "random": RandomRouting, "least_loaded": LeastLoaded}),
        (latency_models, {"blis_linear": BlisLinearLatency}),
    ],
    ids=["lengths", "arrivals", "routers", "latency"],
)
def test_builtins_are_registered_under_their_documented_names(registry: Registry[type], expected: dict[str, type]) -> None:
    """Each built-in implementation is reachable by the name scenario YAML uses."""
    for name, cls in expected.items():
        assert registry.get(name) is cls
