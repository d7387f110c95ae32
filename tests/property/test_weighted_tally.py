"""The inter-token gap tally keeps the exact multiset of its values, whatever the order and
batching of what it is given: quantiles, count and mean equal those of the plain list."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.metrics.monitors import WeightedTally
from simpy_llm.metrics.stats import weighted_stats

QS = (0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0)

# A small pool makes ties common (as the engine's step times are); the rest are any finite
# non-negative floats, tiny and huge included, so the exact sum meets every exponent range.
_POOL = st.sampled_from([0.0, 0.1, 0.008735766, 0.01379251, 1e-300, 5e-324, 3.0, 1e300])
_VALUE = st.one_of(_POOL, st.floats(min_value=0.0, max_value=1e300, allow_nan=False))
_ENTRIES = st.lists(st.tuples(_VALUE, st.integers(min_value=0, max_value=2**40)), max_size=60)


def _plain_quantile(entries: list[tuple[float, int]], q: float) -> float:
    """The inverted CDF of the plain list: the smallest value whose cumulative weight, values
    in ascending order, reaches *q* of the total (every value with its weight, none merged)."""
    ordered = sorted((v, w) for v, w in entries if w > 0)
    total = sum(w for _, w in ordered)
    running = 0
    for v, w in ordered:
        running += w
        if running >= q * total:
            return v
    return ordered[-1][0]


def _exact_mean(entries: list[tuple[float, int]]) -> float:
    """The weighted mean in rational arithmetic, rounded once."""
    kept = [(v, w) for v, w in entries if w > 0]
    return float(sum(Fraction(v) * w for v, w in kept) / sum(w for _, w in kept))


def _fill(entries: list[tuple[float, int]], merge_every: int, cuts: list[int]) -> WeightedTally:
    """A tally given *entries* in runs split at *cuts*: even runs by ``add``, odd by ``extend``."""
    tally = WeightedTally(merge_every=merge_every)
    bounds = [0, *sorted(c % (len(entries) + 1) for c in cuts), len(entries)]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        run = entries[lo:hi]
        if i % 2 == 0:
            for value, weight in run:
                tally.add(value, weight)
        elif run:
            tally.extend(np.array([v for v, _ in run], dtype=np.float64), np.array([w for _, w in run], dtype=np.int64))
    return tally


@settings(max_examples=300, deadline=None)
@given(entries=_ENTRIES, merge_every=st.integers(1, 8), cuts=st.lists(st.integers(0, 100), max_size=6), data=st.data())
def test_quantiles_count_and_mean_are_those_of_the_plain_list_in_any_order_and_batching(
    entries: list[tuple[float, int]], merge_every: int, cuts: list[int], data: st.DataObject
) -> None:
    """Given in any order, in runs of ``add`` and ``extend`` and merged every few values, the
    tally's count, every quantile and its mean equal those of the plain list of values (the
    mean: the exact rational mean rounded once), and two orders give the same arrays."""
    shuffled = data.draw(st.permutations(entries))
    tally = _fill(shuffled, merge_every, cuts)
    kept = [(v, w) for v, w in entries if w > 0]
    assert tally.count == sum(w for _, w in kept)
    if not kept:
        assert np.isnan(tally.mean()) and np.isnan(tally.quantile(0.5))
        return
    for q in QS:
        assert tally.quantile(q) == _plain_quantile(entries, q)
    assert tally.mean() == _exact_mean(entries)
    other = _fill(entries, 1 << 16, [])
    assert [a.tobytes() for a in tally.arrays()] == [a.tobytes() for a in other.arrays()]
    assert weighted_stats(tally) == weighted_stats(other)


def test_the_tally_holds_each_distinct_value_once_however_many_are_added() -> None:
    """A million additions of 100 distinct values, merged as they come, leave 100 values
    with their total weights."""
    rng = np.random.default_rng(7)
    pool = rng.exponential(0.01, 100)
    picks = rng.integers(0, 100, 1_000_000)
    weights = rng.integers(1, 300, 1_000_000)
    tally = WeightedTally(merge_every=4096)
    for start in range(0, picks.size, 1000):
        tally.extend(pool[picks[start:start + 1000]], weights[start:start + 1000])
    values, totals = tally.arrays()
    assert values.tolist() == sorted(pool.tolist())
    assert totals.tolist() == np.bincount(picks, weights=weights, minlength=100)[np.argsort(pool)].astype(np.int64).tolist()


def test_a_zero_of_either_sign_is_one_value() -> None:
    """-0.0 and +0.0 are one value of the tally, kept as +0.0, whichever came first."""
    tally = WeightedTally(merge_every=1)
    tally.add(-0.0, 2)
    tally.add(0.0, 3)
    values, totals = tally.arrays()
    assert values.tobytes() == np.array([0.0]).tobytes() and totals.tolist() == [5]


def test_the_mean_does_not_depend_on_the_order_where_a_float_dot_product_does() -> None:
    """Four gaps whose float dot product with their weights differs in its last bit between
    the two orders give one mean in both, the exactly rounded one."""
    entries = [(0.01073029, 869025), (0.003084531, 423327), (0.053754369, 273170), (0.003664271, 827702)]
    values, weights = np.array([v for v, _ in entries]), np.array([w for _, w in entries])
    assert np.dot(values, weights) != np.dot(values[::-1], weights[::-1])  # the premise
    forward, backward = WeightedTally(), WeightedTally()
    for value, weight in entries:
        forward.add(value, weight)
    for value, weight in reversed(entries):
        backward.add(value, weight)
    assert forward.mean() == backward.mean() == _exact_mean(entries)


def test_a_merge_interval_below_one_is_refused() -> None:
    """``merge_every`` must be at least 1."""
    with pytest.raises(ValueError, match="merge_every"):
        WeightedTally(merge_every=0)


def test_the_mean_of_more_distinct_values_than_a_block_is_the_exact_one() -> None:
    """With 10,000 distinct values (more than the mean sums at a time), of exponents far
    apart, the mean is the exact rational mean rounded once."""
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.exponential(0.01, 9_000), rng.exponential(1e6, 500), rng.exponential(1e-9, 500)])
    weights = rng.integers(1, 2**40, values.size)
    tally = WeightedTally()
    tally.extend(values, weights)
    assert tally.arrays()[0].size == 10_000
    assert tally.mean() == _exact_mean(list(zip(values.tolist(), weights.tolist(), strict=True)))
