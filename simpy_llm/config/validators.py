"""attrs validators that raise :class:`FieldValueError` (so errors carry the key), and the
bounds every numeric setting is held to.

The bounds say what a simulation can represent. Each is a named constant with
its reason; the config classes use them through :func:`at_most` and
:func:`in_range`, so an error states the allowed range::

    serving.replicas: must be <= 100000, got 1180591620717411303424
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Collection
from typing import Any

import attrs

from simpy_llm.config.errors import FieldValueError

__all__ = [
    "MAX_BANDWIDTH_MBPS",
    "MAX_DRAFT_DEVICES",
    "MAX_ITEMS_PER_REQUEST",
    "MAX_KV_BLOCKS",
    "MAX_KV_BLOCK_SIZE",
    "MAX_PRIORITY",
    "MAX_RATE",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_SCALE",
    "MAX_SEED",
    "MAX_TIME_S",
    "MAX_TOKENS",
    "MIN_PERIOD_S",
    "MIN_RATE",
    "MIN_SCALE",
    "all_of",
    "at_least",
    "at_most",
    "greater_than",
    "in_range",
    "interval_within",
    "non_empty",
    "one_of",
    "optional",
    "unless",
]

MAX_TOKENS = 2**24
"""Longest token count of one request (prompt, output, shared prefix, step budget), 16,777,216.
Above the longest context any served model offers (10M tokens); per-request structures
that grow with the length (prefix-block hashes, KV blocks) still fit in memory, and sums
over many requests stay exact in int64 and in float64 time arithmetic."""

MAX_ITEMS_PER_REQUEST = 4096
"""Most images, audio or video segments one request may carry. APIs accept hundreds to a
few thousand; the generator expands every item of a chunk of requests in one vector."""

MAX_REPLICAS = 100_000
"""Most replicas: each is a SimPy process with its own queues and statistics in memory."""

MAX_DRAFT_DEVICES = 100_000
"""Most draft devices of a speculative scenario, over all its draft groups: each is a SimPy
process with its own links, queues and statistics, about 9 KB and 0.2 ms to build (measured:
100,000 devices take 0.85 GB and 18 s before the first event)."""

MAX_KV_BLOCKS = 2**31
"""Most KV-cache blocks on a replica (block counts stay far inside int64 even times the block size)."""

MAX_KV_BLOCK_SIZE = 2**16
"""Most tokens per KV-cache block: the engine keeps one counter per position in a block
and scans them once per decode stretch (real engines use 1 to a few hundred)."""

MAX_TIME_S = 1e9
"""Longest time in seconds (horizons, windows, SLO targets), about 31.7 years: at 1e9 s a
float64 still resolves 0.12 microseconds, finer than any step or gap the model produces."""

MIN_PERIOD_S = 1e-6
"""Shortest period of a periodic process (time-series sampling, view refreshes), a
microsecond: each period is an event, and shorter ones would crowd out the simulation."""

MAX_RATE = 1e6
"""Highest request rate, requests/s: the mean gap (1 microsecond) stays several float64
steps wide at MAX_TIME_S."""

MIN_RATE = 1e-9
"""Lowest positive request rate, requests/s: one request per MAX_TIME_S; below it a source
sends nothing a run can reach, and gaps of 1 / rate leave float64's range."""

MAX_SCALE = 100.0
"""Largest rate or time multiplier of recorded traffic (``rate_scale``, ``time_scale``):
a hundredfold speed-up. A ServeGen window is drawn in pieces of bounded size, so the bound
is not one of memory: at this scale the busiest shipped window (465 requests/s for 600 s)
already asks for 28 million arrivals per window."""

MIN_SCALE = 1e-3
"""Smallest rate or time multiplier, a thousandfold slow-down. Recorded windows are
replayed cycle after cycle until they give arrivals (long runs of empty passes are
skipped at once, see ``simpy_llm.workload.servegen``)."""

MAX_REQUESTS = 2**31
"""Most requests (or rounds) a count may ask for: at tens of thousands of requests per
wall-clock second a run of more would last days; every count stays far inside int64."""

MAX_BANDWIDTH_MBPS = 1e9
"""Highest bandwidth, megabits per second: a petabit per second, beyond any single link."""

MAX_COEFFICIENT_US = 1e9
"""Largest latency-model coefficient, microseconds (1,000 s per step, request or token):
far beyond any hardware, small enough that step times stay finite and ordered."""
MAX_SEED = 2**63 - 1
"""Largest seed: seeds are recorded as signed 64-bit integers."""

MAX_PRIORITY = 2**31 - 1
"""Largest request priority in magnitude (priorities are stored in int64 record columns and
compared by schedulers; 2**31 levels is more than any scheduler distinguishes)."""

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


def at_most(bound: float) -> Validator:
    """Value must be finite and <= *bound*.

    >>> import attrs
    >>> @attrs.frozen
    ... class C:
    ...     n: int = attrs.field(validator=at_most(10))
    >>> C(11)
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: n: must be <= 10, got 11
    """

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        _check_finite(attr, value)
        if not value <= bound:
            raise FieldValueError(attr.name, f"must be <= {bound}, got {reprlib.repr(value)}")

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


def all_of(*validators: Validator) -> Validator:
    """Apply each of *validators* in turn (the first failure is reported)."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        for validator in validators:
            validator(inst, attr, value)

    return check


def each_item(validator: Validator) -> Validator:
    """Apply *validator* to every item of a sequence; a failure names the item (``key[i]``).

    >>> import attrs
    >>> @attrs.frozen
    ... class C:
    ...     sizes: tuple[int, ...] = attrs.field(validator=each_item(at_least(1)))
    >>> C((3, 0))
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: sizes[1]: must be >= 1, got 0
    """

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        for i, item in enumerate(value):
            try:
                validator(inst, attr, item)
            except FieldValueError as exc:
                raise FieldValueError(f"{attr.name}[{i}]", exc.message) from None

    return check


def interval_within(low: float, high: float) -> Validator:
    """Value must be a pair ``(start, end)`` with ``low <= start < end <= high``.

    >>> import attrs
    >>> @attrs.frozen
    ... class C:
    ...     span_s: tuple[float, float] = attrs.field(validator=interval_within(0, 100))
    >>> C((5.0, 200.0))
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: span_s: must be [start, end] with 0 <= start < end <= 100, got (5.0, 200.0)
    """

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise FieldValueError(attr.name, f"must be a pair [start, end], got {reprlib.repr(value)}")
        for item in value:
            _check_finite(attr, item)
        start, end = value
        if not low <= start < end <= high:
            raise FieldValueError(
                attr.name, f"must be [start, end] with {low} <= start < end <= {high}, got {reprlib.repr(tuple(value))}"
            )

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


def unless(literal: Any, validator: Validator) -> Validator:
    """Apply *validator* unless the value is *literal* (e.g. ``"auto"``)."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, str) and value == literal:
            return
        validator(inst, attr, value)

    return check
