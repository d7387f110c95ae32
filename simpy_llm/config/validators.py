"""attrs validators that raise :class:`FieldValueError` (so errors carry the key)."""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Collection
from typing import Any

import attrs

from simpy_llm.config.errors import FieldValueError

__all__ = ["at_least", "greater_than", "in_range", "one_of", "optional", "non_empty"]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _check_finite(attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FieldValueError(attr.name, f"must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise FieldValueError(attr.name, f"must be a finite number, got {reprlib.repr(value)}")


def greater_than(bound: float) -> Validator:
    """Value must be finite and > *bound*."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        _check_finite(attr, value)
        if not value > bound:
            raise FieldValueError(attr.name, f"must be > {bound}, got {value!r}")

    return check


def at_least(bound: float) -> Validator:
    """Value must be finite and >= *bound*."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        _check_finite(attr, value)
        if not value >= bound:
            raise FieldValueError(attr.name, f"must be >= {bound}, got {value!r}")

    return check


def in_range(low: float, high: float) -> Validator:
    """Value must lie in the closed interval [*low*, *high*]."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        _check_finite(attr, value)
        if not low <= value <= high:
            raise FieldValueError(attr.name, f"must be in [{low}, {high}], got {value!r}")

    return check


def one_of(allowed: Collection[str]) -> Validator:
    """Value must be one of *allowed*."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise FieldValueError(
                attr.name, f"must be one of {', '.join(map(str, allowed))}; got {value!r}"
            )

    return check


def non_empty(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """Value (a string or collection) must not be empty."""
    if len(value) == 0:
        raise FieldValueError(attr.name, "must not be empty")


def optional(validator: Validator) -> Validator:
    """Apply *validator* unless the value is None."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            validator(inst, attr, value)

    return check
