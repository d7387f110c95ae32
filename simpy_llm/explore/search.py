"""Random search: points of a sweep drawn at random from a space, reproducibly.

A :class:`RandomSearch` is data: the space to draw from, how many points and the
seed. :meth:`RandomSearch.points` draws the same points every time, whatever the
machine; :func:`~simpy_llm.explore.sweeps.sweep` runs them (``random=``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

__all__ = ["RandomSearch"]


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, (float, np.floating))) and not isinstance(value, bool)


def _check_dimension(key: str, spec: Any) -> None:
    """Raise a TypeError or ValueError naming *key* if *spec* is not a dimension of a space."""
    allowed = (
        "a list of choices [v1, v2, ...], a range (low, high), a log range (low, high, 'log') "
        "or a frozen scipy.stats distribution"
    )
    if not isinstance(key, str) or not key:
        raise TypeError(f"RandomSearch.space: keys must be dotted override keys (strings), got {key!r}")
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"RandomSearch.space[{key!r}] has no choices: give at least one")
        return
    if isinstance(spec, tuple):
        if len(spec) not in (2, 3) or (len(spec) == 3 and spec[2] != "log"):
            raise ValueError(f"RandomSearch.space[{key!r}] = {spec!r}: a tuple must be (low, high) or (low, high, 'log')")
        low, high = spec[0], spec[1]
        if not (_is_number(low) and _is_number(high)):
            raise TypeError(f"RandomSearch.space[{key!r}] = {spec!r}: low and high must be numbers")
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise ValueError(f"RandomSearch.space[{key!r}] = {spec!r}: need finite low <= high")
        if len(spec) == 3 and low <= 0:
            raise ValueError(f"RandomSearch.space[{key!r}] = {spec!r}: a log range needs low > 0")
        return
    if callable(getattr(spec, "rvs", None)):
        return
    raise TypeError(f"RandomSearch.space[{key!r}] = {spec!r}: each value must be {allowed}")


def _space(value: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"RandomSearch.space must be a mapping {{'dotted.key': dimension}}, got {type(value).__name__}")
    return dict(value)


def _check_space(_instance: Any, _attribute: Any, space: dict[str, Any]) -> None:
    if not space:
        raise ValueError("RandomSearch.space is empty: give at least one 'dotted.key': dimension")
    for key, spec in space.items():
        _check_dimension(key, spec)


def _check_positive_int(_instance: Any, attribute: Any, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"RandomSearch.{attribute.name} must be an integer >= 1, got {value!r}")


def _check_seed(_instance: Any, _attribute: Any, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"RandomSearch.seed must be an integer >= 0, got {value!r}")


def _plain(value: Any) -> Any:
    """A numpy scalar (or one-element array) as the Python value it holds."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    return value.item() if isinstance(value, np.generic) else value


@attrs.frozen(kw_only=True)
class RandomSearch:
    """*n* points drawn at random from *space*, reproducibly from *seed*.

    Each point draws every key of the space in the order given, from one
    :func:`numpy.random.default_rng` seeded with *seed*: the same search gives the
    same points on any machine and in any executor.

    Examples
    --------
    >>> from scipy import stats
    >>> search = RandomSearch(
    ...     space={
    ...         "serving.engine.max_num_seqs": [32, 64, 128],  # a choice
    ...         "workload.aggregate_rate": (5.0, 25.0),  # uniform
    ...         "serving.engine.kv_num_blocks": (1024, 8192, "log"),  # log-uniform, integer
    ...         "workload.clients.0.rate_fraction": stats.beta(2, 2),  # any frozen distribution
    ...     },
    ...     n=3,
    ...     seed=7,
    ... )
    >>> points = search.points()
    >>> len(points), points == search.points()
    (3, True)
    >>> all(p[0] in (32, 64, 128) and 5.0 <= p[1] <= 25.0 and isinstance(p[2], int) for p in points)
    True
    """

    space: dict[str, Any] = attrs.field(converter=_space, validator=_check_space)
    """``{"dotted.key": dimension}``: a key takes a value from its dimension, which is a
    list of choices (drawn uniformly), a tuple ``(low, high)`` (uniform; integers from
    low to high inclusive when both are integers), a tuple ``(low, high, "log")``
    (log-uniform, same rule for integers) or a frozen :mod:`scipy.stats` distribution
    (its ``rvs``)."""
    n: int = attrs.field(validator=_check_positive_int)
    """How many points to draw."""
    seed: int = attrs.field(default=0, validator=_check_seed)
    """Seed of the draws."""

    @property
    def keys(self) -> list[str]:
        """The keys a point sets, in order."""
        return list(self.space)

    def points(self) -> list[tuple[Any, ...]]:
        """The *n* points, each a tuple of plain Python values in :attr:`keys` order."""
        rng = np.random.default_rng(self.seed)
        return [tuple(_draw(spec, rng) for spec in self.space.values()) for _ in range(self.n)]


def _draw(spec: Any, rng: np.random.Generator) -> Any:
    """One value of the dimension *spec*."""
    if isinstance(spec, list):
        return _plain(spec[int(rng.integers(len(spec)))])
    if isinstance(spec, tuple):
        low, high = _plain(spec[0]), _plain(spec[1])
        integer = _is_int(low) and _is_int(high)
        if len(spec) == 2:
            return int(rng.integers(low, high, endpoint=True)) if integer else float(rng.uniform(low, high))
        if integer:  # log-uniform over [low, high + 1), floored: each integer weighted by its log width
            return min(high, int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))))
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return _plain(spec.rvs(random_state=rng))
