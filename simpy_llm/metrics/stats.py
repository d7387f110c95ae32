"""The statistics every part of a run's summary takes: mean and percentiles of a latency.

Percentiles of per-request values use numpy's default (linear) interpolation; those of
weighted values (the engine's inter-token gaps) the inverted CDF of the weights. This
module imports nothing of the package but the summary's schema, so each subsystem's
results can use it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simpy_llm.metrics.monitors import WeightedTally
    from simpy_llm.metrics.summary import CountedLatencyStats, LatencyStats

__all__ = ["QUANTILES", "counted_stats", "latency_stats", "mean_of_known", "move_to_front", "squeeze", "weighted_quantiles", "weighted_stats"]

QUANTILES = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))
"""The percentiles of every latency statistic: ``(key, percent)``."""


_SQUEEZE_BLOCK = 1 << 16
"""Values :func:`squeeze` moves at a time."""


def squeeze(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``values[keep]`` written over the start of *values* itself (a view of it): the same
    values in the same order, without a second array of their size.

    >>> v = np.array([1.0, 2.0, 3.0, 4.0])
    >>> squeeze(v, np.array([False, True, False, True])), v[:2]
    (array([2., 4.]), array([2., 4.]))
    """
    kept = 0
    for start in range(0, values.size, _SQUEEZE_BLOCK):
        part = values[start:start + _SQUEEZE_BLOCK][keep[start:start + _SQUEEZE_BLOCK]]  # a copy: never overwritten before it is read
        values[kept:kept + part.size] = part
        kept += part.size
    return values[:kept]


def move_to_front(values: np.ndarray, front: np.ndarray) -> int:
    """Move ``values[front]`` to the start of *values*, in their order, and the others behind
    them (in some order), in place; return how many were moved. Then ``values[:k]`` holds
    what ``values[front]`` would, while the whole array keeps every value: a group's figures
    and the whole's percentiles from one array.

    >>> v = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> k = move_to_front(v, np.array([False, True, False, True, True]))
    >>> v[:k], sorted(v[k:])
    (array([2., 4., 5.]), [np.float64(1.0), np.float64(3.0)])
    """
    kept = 0
    for start in range(0, values.size, _SQUEEZE_BLOCK):
        part = values[start:start + _SQUEEZE_BLOCK]
        mask = front[start:start + _SQUEEZE_BLOCK]
        moved, others = part[mask], part[~mask]  # copies, read before anything is written
        k = moved.size
        # values[kept:start] holds others moved back by earlier blocks: the k at its start make
        # room for this block's front values and take their place in this block.
        if start - kept >= k:
            displaced = values[kept:kept + k].copy()
            values[kept:kept + k] = moved
            values[start:start + part.size] = np.concatenate((displaced, others))
        else:
            values[kept:start + part.size] = np.concatenate((moved, values[kept:start], others))
        kept += k
    return kept


def latency_stats(values: np.ndarray, *, own: bool = False) -> LatencyStats:
    """Mean and :data:`QUANTILES` of the values that are not NaN (``None`` each when none is).

    *own*: *values* is the caller's to overwrite (the NaNs are squeezed out of it and the
    percentiles reorder it), so no copy is made; the figures are the same.

    >>> latency_stats(np.array([1.0, 2.0, np.nan, 3.0]))
    {'mean': 2.0, 'p50': 2.0, 'p90': 2.8, 'p95': 2.9, 'p99': 2.98}
    >>> latency_stats(np.array([np.nan]))["p99"] is None
    True
    """
    known = ~np.isnan(values)
    # Else a copy of its own, so that the percentiles may reorder it.
    values = (values if known.all() else squeeze(values, known)) if own else values[known]
    del known
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    mean = float(values.mean())  # before the percentiles reorder the values (the same sum, in the same order)
    p50, p90, p95, p99 = (float(v) for v in np.percentile(values, [q for _, q in QUANTILES], overwrite_input=True))
    return {"mean": mean, "p50": p50, "p90": p90, "p95": p95, "p99": p99}


def counted_stats(values: np.ndarray, *, own: bool = False) -> CountedLatencyStats:
    """:func:`latency_stats` with the ``count`` of values that are not NaN (*own*: as there)."""
    count = int((~np.isnan(values)).sum())
    s = latency_stats(values, own=own)
    return {"mean": s["mean"], "p50": s["p50"], "p90": s["p90"], "p95": s["p95"], "p99": s["p99"], "count": count}


_BLOCK = 1 << 16
"""Values whose cumulative weight :func:`weighted_quantiles` sums at a time."""


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """For each of *qs*, the smallest of *values* whose cumulative weight (values in ascending
    order, ties in their order) reaches that share of the total weight:
    :meth:`~simpy_llm.metrics.monitors.WeightedTally.quantile`, every quantile from one sort.

    The cumulative weights are summed a block of :data:`_BLOCK` values at a time (integers:
    the same sums as over the whole array at once), so besides the sort order nothing per
    value is held.

    >>> weighted_quantiles(np.array([0.5, 0.1, 0.3]), np.array([1, 3, 1]), (0.5, 0.8, 0.9, 1.0))
    [0.1, 0.3, 0.5, 0.5]
    """
    order = np.argsort(values, kind="stable")
    total = weights.sum()
    targets = [q * total for q in qs]
    found: list[int | None] = [None] * len(qs)
    running = 0
    for start in range(0, order.size, _BLOCK):
        cum = np.cumsum(weights[order[start:start + _BLOCK]])
        cum += running
        for i, target in enumerate(targets):
            if found[i] is None:
                k = int(np.searchsorted(cum, target, side="left"))
                if k < cum.size:
                    found[i] = start + k
        running = int(cum[-1])
        if all(f is not None for f in found):
            break
    last = order.size - 1
    return [float(values[order[last if f is None else f]]) for f in found]


def weighted_stats(tally: WeightedTally) -> CountedLatencyStats:
    """Mean and :data:`QUANTILES` (inverted CDF) of a tally's weighted values, with their count."""
    count = tally.count
    if count == 0:
        return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "count": 0}
    p50, p90, p95, p99 = weighted_quantiles(*tally.arrays(), (0.50, 0.90, 0.95, 0.99))
    return {"mean": tally.mean(), "p50": p50, "p90": p90, "p95": p95, "p99": p99, "count": count}


def mean_of_known(values: list[float]) -> float:
    """Mean of the values that are not NaN (a batch server without a memory limit has no KV
    utilisation); NaN when none is known.

    >>> mean_of_known([0.5, float("nan"), 0.25]), math.isnan(mean_of_known([]))
    (0.375, True)
    """
    known = [v for v in values if v == v]
    return float(np.mean(known)) if known else math.nan
