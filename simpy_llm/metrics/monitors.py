"""Monitors: a time-weighted level and a weighted tally."""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["LevelMonitor", "WeightedTally"]


class LevelMonitor:
    """Time-weighted statistics of a level that changes at increasing times.

    Examples
    --------
    >>> m = LevelMonitor()
    >>> m.change(0.0, +2); m.change(1.0, -1); m.change(3.0, -1)
    >>> m.time_average(end_s=4.0)  # (2*1 + 1*2 + 0*1) / 4
    1.0
    """

    __slots__ = ("_area", "_last_s", "level", "peak")

    def __init__(self) -> None:
        self.level = 0
        self.peak = 0
        self._area = 0.0
        self._last_s = 0.0

    def change(self, now_s: float, delta: int) -> None:
        """Add *delta* to the level at time *now_s* (not earlier than the last change)."""
        if now_s > self._last_s:
            self._area += self.level * (now_s - self._last_s)
            self._last_s = now_s
        self.level += delta
        if self.level > self.peak:
            self.peak = self.level

    def replay(self, times: np.ndarray, deltas: np.ndarray) -> None:
        """:meth:`change` for each of *times* and *deltas* in turn, in the order of time and,
        at one time, increases first (as arrivals come before departures at one instant);
        changes at one time and of one sign keep their order.

        Examples
        --------
        >>> m = LevelMonitor()
        >>> m.replay(np.array([1.0, 0.0, 1.0]), np.array([-1, +1, +1]))
        >>> m.level, m.peak, m.area(2.0)
        (1, 2, 2.0)
        """
        order = np.lexsort((-deltas, times))
        area, last, level, peak = self._area, self._last_s, self.level, self.peak
        for now_s, delta in zip(times[order].tolist(), deltas[order].tolist(), strict=True):
            if now_s > last:
                area += level * (now_s - last)
                last = now_s
            level += delta
            if level > peak:
                peak = level
        self._area, self._last_s, self.level, self.peak = area, last, level, peak

    def area(self, end_s: float) -> float:
        """Integral of the level over [0, *end_s*]."""
        return self._area + self.level * max(end_s - self._last_s, 0.0)

    def time_average(self, end_s: float) -> float:
        """Mean level over [0, *end_s*]."""
        return self.area(end_s) / end_s if end_s > 0 else float(self.level)


class WeightedTally:
    """Values with integer weights, for quantiles without storing every sample.

    Examples
    --------
    >>> t = WeightedTally()
    >>> t.add(0.1, 3); t.add(0.5, 1)
    >>> t.count, round(t.mean(), 3), t.quantile(0.5), t.quantile(0.9)
    (4, 0.2, 0.1, 0.5)
    """

    __slots__ = ("_values", "_weights")

    def __init__(self) -> None:
        self._values = array("d")
        self._weights = array("q")

    def add(self, value: float, weight: int = 1) -> None:
        """Record *value* *weight* times."""
        if weight > 0:
            self._values.append(value)
            self._weights.append(weight)

    def extend(self, values: np.ndarray, weights: np.ndarray) -> None:
        """:meth:`add` each of *values* with its weight, in order.

        Examples
        --------
        >>> t = WeightedTally()
        >>> t.extend(np.array([0.1, 0.2, 0.5]), np.array([3, 0, 1]))
        >>> t.count, t.quantile(0.9)
        (4, 0.5)
        """
        kept = weights > 0
        self._values.frombytes(np.ascontiguousarray(values[kept], dtype=np.float64).tobytes())
        self._weights.frombytes(np.ascontiguousarray(weights[kept], dtype=np.int64).tobytes())

    @property
    def count(self) -> int:
        return int(sum(self._weights))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, weights) as numpy arrays."""
        return np.frombuffer(self._values, dtype=np.float64), np.frombuffer(self._weights, dtype=np.int64)

    def mean(self) -> float:
        v, w = self.arrays()
        return float(np.dot(v, w) / w.sum()) if w.size else float("nan")

    def quantile(self, q: float) -> float:
        """The smallest recorded value whose cumulative weight reaches *q* of the total."""
        v, w = self.arrays()
        if not w.size:
            return float("nan")
        order = np.argsort(v, kind="stable")
        cum = np.cumsum(w[order])
        idx = int(np.searchsorted(cum, q * cum[-1], side="left"))
        return float(v[order][min(idx, len(order) - 1)])
