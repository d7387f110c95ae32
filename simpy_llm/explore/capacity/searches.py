"""The searches of :mod:`simpy_llm.explore.capacity`: :func:`max_stable_load` (bracketing
then bisecting a continuous load, :func:`_search_continuous`) and :func:`min_replicas`
(doubling then bisecting a replica count, :func:`fewest_passing`; over two counts,
:func:`cheapest_pair`), their input checks (:func:`_check_common`,
:func:`_positive`) and :func:`_doctest_scenario`, the small scenario of the examples.
The top layer: it imports the criteria, the probing and the cards."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.explore.capacity.cards import CapacityCard, ReplicaCard
from simpy_llm.explore.capacity.criteria import StabilityCriteria, _check_before_probes
from simpy_llm.explore.capacity.probing import Probe, _build, _Prober, _run_probe, _value_at, _window

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario


MAX_BRACKET_STEPS = 30
"""Doublings or halvings the bracketing may take before giving up."""


def fewest_passing(passes: Callable[[int], bool], cap: int, *, bad: int = 0, good: int | None = None) -> int | None:
    """The fewest replicas in ``(bad, cap]`` for which *passes* holds (None: not even *cap*),
    when a count that passes means every larger one passes too: galloping from ``bad + 1``,
    doubling up to *cap*, then bisecting between the last count that failed and the first
    that passed. *good*, a count known to pass, skips the gallop.

    >>> tried = []
    >>> fewest_passing(lambda n: tried.append(n) or n >= 5, 64), tried
    (5, [1, 2, 4, 8, 6, 5])
    >>> fewest_passing(lambda n: n >= 100, 64), fewest_passing(lambda n: n >= 3, 64, bad=3, good=9)
    (None, 4)
    """
    if good is None:
        n = bad + 1
        while n <= cap:
            if passes(n):
                good = n
                break
            bad = n
            n = min(n * 2, cap) if n < cap else cap + 1
    if good is not None:
        while good - bad > 1:
            mid = (good + bad) // 2
            if passes(mid):
                good = mid
            else:
                bad = mid
    return good


def cheapest_pair(
    passes: Callable[[int, int], bool],
    cost: Callable[[int, int], float],
    max_total: int,
    *,
    limit: float = math.inf,
    failing: Callable[[int], int] | None = None,
    bound: bool = True,
) -> tuple[int, int] | None:
    """The cheapest ``(p, d)`` with ``p, d >= 1`` and ``p + d <= max_total`` for which
    *passes* holds and ``cost(p, d) <= limit`` (None: none), when passing is monotone in
    both counts (a pair that passes means every pair at least as large in each count passes
    too) and *cost* increases in each count. Ties in cost go to the smaller *p*.

    For ``p = 1, 2, ...`` the fewest *d* is :func:`fewest_passing`'s, up to the largest
    *d* costing no more than the cheapest found (or *limit*); the fewest *d* of *p* is
    known to pass at ``p + 1``, so only the counts below it are searched there. It stops
    at the first *p* whose ``cost(p, 1)`` is above that bound: every larger *p* costs more.
    *failing(p)*, the largest *d* known to fail at *p* (0: none), starts a count's search
    above it and skips a *p* whose ``cost(p, failing(p) + 1)`` is above the bound. With
    *bound* False every *p* is searched up to *limit* (the exhaustive search, to check).

    >>> tried = []
    >>> def passes(p, d):   # d decode replicas carry 6 / p of the load each
    ...     tried.append((p, d))
    ...     return p >= 2 and p * d >= 6
    >>> cheapest_pair(passes, lambda p, d: 3.0 * p + 1.0 * d, 8)
    (2, 3)
    >>> cheapest_pair(passes, lambda p, d: 1.0 * p + 3.0 * d, 8, bound=False)   # (3, 2) costs 9, (6, 1) 9 too
    (3, 2)
    """
    best: tuple[float, int, int] | None = None
    prev: int | None = None
    for p in range(1, max_total):
        lim = limit if best is None or not bound else min(limit, best[0])
        if cost(p, 1) > lim:
            break
        bad = 0 if failing is None else failing(p)
        top = max_total - p
        if bad >= top or cost(p, bad + 1) > lim:
            continue
        cap = bad
        while cap < top and cost(p, cap + 1) <= lim:
            cap += 1
        good = prev if prev is not None and bad < prev <= cap else None
        d = fewest_passing(functools.partial(passes, p), cap, bad=bad, good=good)
        if d is not None:
            prev = d
            if best is None or cost(p, d) < best[0]:
                best = (cost(p, d), p, d)
    return None if best is None else (best[1], best[2])


def _search_continuous(
    prober: _Prober, which: int, start: float, high: float | None, tolerance: float
) -> tuple[float, float]:
    """``(lower, upper)``: the largest passing and smallest failing load, ``upper / lower - 1 <= tolerance``
    (lower NaN if no load passed; upper inf if none failed up to *high* or the doubling limit)."""
    lo, hi = prober.bounds(which)
    if math.isnan(lo) and math.isinf(hi):
        x = start
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    if math.isinf(hi) and high is not None and high > lo:
        if not prober(high)[which]:
            hi = high
        else:
            lo = high
    steps = 0
    while math.isinf(hi) and high is None and steps < MAX_BRACKET_STEPS:
        x = lo * 2
        steps += 1
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    steps = 0
    while math.isnan(lo) and steps < MAX_BRACKET_STEPS:
        x = hi / 2
        steps += 1
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    if math.isnan(lo) or math.isinf(hi):
        return lo, hi
    while hi / lo - 1 > tolerance:
        x = (lo + hi) / 2
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    return lo, hi



# --- searches -------------------------------------------------------------------
def _check_common(scenario: Any, tolerance: float | None, seeds: Iterable[int] | None) -> list[int | None]:
    if not isinstance(scenario, (str, Path, Mapping)):
        raise TypeError(f"scenario must be a YAML path or a scenario mapping, got {type(scenario).__name__}")
    if tolerance is not None and not (0 < tolerance < 1):
        raise ValueError(f"tolerance must be a relative width in (0, 1), got {tolerance!r}")
    if seeds is None:
        return [None]
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a list of integers, got {seeds!r}")
    out = [s.item() if isinstance(s, np.generic) else s for s in seeds]
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"seeds must be integers, got {s!r}")
    if not out:
        raise ValueError("seeds is empty: give None to use the scenario's seed, or at least one seed")
    return list(dict.fromkeys(out))


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _name(scenario: Any, loaded: Scenario) -> str:
    return loaded.name or (str(scenario) if not isinstance(scenario, Mapping) else "<scenario>")


def max_stable_load(
    scenario: str | Path | Mapping[str, Any],
    *,
    load_key: str = "workload.aggregate_rate",
    low: float | None = None,
    high: float | None = None,
    tolerance: float = 0.02,
    criteria: StabilityCriteria | None = None,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    warmup_s: float | None = None,
    measure_s: float | None = None,
    seeds: Iterable[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> CapacityCard:
    """Search the largest stable load and the largest load meeting the SLOs (seed 003's mode B).

    Parameters
    ----------
    scenario
        A scenario YAML path, or the scenario as plain data (a mapping as YAML would give).
    load_key
        The dotted key holding the load (any key an override accepts; it must take
        positive numbers and more of it must mean more load).
    low, high
        The search starts at *low* (default: the scenario's value at *load_key*) and
        brackets by doubling (or halving) from it; *high*, when given, closes the
        bracket from above instead (a load stable at *high* is reported as at least
        *high*, with ``upper_*`` infinite).
    tolerance
        Relative width ``upper / lower - 1`` each bracket is closed to, in (0, 1).
    criteria
        What a load must satisfy (default :class:`StabilityCriteria()`: stability only).
    warmup_requests, measure_requests
        Requests per probe left out as warm-up, then measured (default 1000 and 10000).
    warmup_s, measure_s
        Instead of request counts: seconds of arrivals as warm-up, then measured.
    seeds
        Run every probe under each of these root seeds (a load passes only under all);
        default: the scenario's seed. Each is the whole run's root seed: it sets
        ``seed`` and ``workload.seed`` (a workload with a seed of its own varies with
        it), unless *overrides* give ``workload.seed``, which then holds the workload.
    overrides
        ``{"dotted.key": value}`` applied to every probe before the load and window.
    progress
        Print one line per probe on standard error.

    Returns
    -------
    CapacityCard

    Raises
    ------
    ScenarioError
        If the scenario (with the overrides, at the starting load) is not valid.
    ValueError
        If a bound, the tolerance, a window or the seeds are out of range, or the
        scenario has no number at *load_key* and *low* is not given.
    TypeError
        If *scenario* is neither a path nor a mapping, or a seed is not an integer.
    """
    seed_list = _check_common(scenario, tolerance, seeds)
    criteria = StabilityCriteria() if criteria is None else criteria
    if not isinstance(criteria, StabilityCriteria):
        raise TypeError(f"criteria must be a StabilityCriteria, got {type(criteria).__name__}")
    window = _window(warmup_requests, measure_requests, warmup_s, measure_s)
    low, high = _positive("low", low), _positive("high", high)
    if low is not None and high is not None and not high > low:
        raise ValueError(f"high ({high:g}) must be above low ({low:g})")
    fixed = {**dict(overrides or {}), **window.overrides()}
    loaded = _build(scenario, fixed)
    _check_before_probes(criteria, loaded)
    if low is None:
        current = _value_at(loaded, load_key)
        if isinstance(current, bool) or not isinstance(current, (int, float)) or not current > 0:
            raise ValueError(
                f"the scenario has no positive number at {load_key!r} (found {current!r}): give low= "
                f"(the load to start from) or a load_key the scenario sets"
            )
        low = float(current)
        if high is not None and low >= high:
            low = high / 2

    def probe(x: float, ov: dict[str, Any]) -> Probe:
        return _run_probe(scenario, ov, load=x, replicas=None, window=window, criteria=criteria)

    prober = _Prober(scenario, fixed, load_key, seed_list, probe, progress)
    g_lo, g_hi = _search_continuous(prober, 1, low, high, tolerance)
    s_lo, s_hi = _search_continuous(prober, 0, low, high, tolerance)
    return CapacityCard(
        scenario=_name(scenario, loaded),
        load_key=load_key,
        tolerance=tolerance,
        criteria=criteria,
        max_stable_load=s_lo,
        upper_stable_load=s_hi,
        max_goodput_load=g_lo,
        upper_goodput_load=g_hi,
        probes=prober.probes,
    )


def min_replicas(
    scenario: str | Path | Mapping[str, Any],
    *,
    load: float | None = None,
    criteria: StabilityCriteria | None = None,
    load_key: str = "workload.aggregate_rate",
    replicas_key: str = "serving.replicas",
    max_replicas: int = 1024,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    warmup_s: float | None = None,
    measure_s: float | None = None,
    seeds: Iterable[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> ReplicaCard:
    """The fewest replicas that are stable and meet the SLO criteria at *load*.

    Doubles the replica count from 1 until one passes, then bisects the integers
    between the last failing and the first passing count (passing is taken to be
    monotone in the count). Probes, windows, seeds and criteria are as in
    :func:`max_stable_load`.

    Parameters
    ----------
    load
        The load every probe runs at (set at *load_key*; default: the scenario's own).
    replicas_key
        The dotted key holding the replica count (``serving.replicas``; a group's
        ``serving.replica_groups.0.count``).
    max_replicas
        Give up above this count (the card's ``min_replicas`` is then None).

    Returns
    -------
    ReplicaCard

    Raises
    ------
    ScenarioError, ValueError, TypeError
        As :func:`max_stable_load`; ValueError also for *max_replicas* < 1.

    Examples
    --------
    Twenty M/D/1-like requests per second, each 40 ms alone on a replica, with a
    mean queueing delay of at most 10 ms:

    >>> from simpy_llm.explore.capacity import _doctest_scenario
    >>> card = min_replicas(_doctest_scenario(), load=20.0, criteria=StabilityCriteria(slo={"queue_delay_mean": 0.01}),
    ...                     warmup_requests=100, measure_requests=2000)
    >>> card.min_replicas
    2
    """
    seed_list = _check_common(scenario, None, seeds)
    criteria = StabilityCriteria() if criteria is None else criteria
    if not isinstance(criteria, StabilityCriteria):
        raise TypeError(f"criteria must be a StabilityCriteria, got {type(criteria).__name__}")
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise ValueError(f"max_replicas must be an integer >= 1, got {max_replicas!r}")
    window = _window(warmup_requests, measure_requests, warmup_s, measure_s)
    load = _positive("load", load)
    fixed = {**dict(overrides or {}), **window.overrides()}
    if load is not None:
        fixed[load_key] = load
    loaded = _build(scenario, fixed)
    _check_before_probes(criteria, loaded)
    if load is None:
        current = _value_at(loaded, load_key)
        if isinstance(current, bool) or not isinstance(current, (int, float)) or not current > 0:
            raise ValueError(f"the scenario has no positive number at {load_key!r} (found {current!r}): give load=")
        load = float(current)

    def probe(n: float, ov: dict[str, Any]) -> Probe:
        return _run_probe(scenario, ov, load=load, replicas=int(n), window=window, criteria=criteria)

    prober = _Prober(scenario, fixed, replicas_key, seed_list, probe, progress, more_is_harder=False)
    good = fewest_passing(lambda n: prober(n)[1], max_replicas)
    return ReplicaCard(
        scenario=_name(scenario, loaded),
        replicas_key=replicas_key,
        load_key=load_key,
        load=load,
        criteria=criteria,
        min_replicas=good,
        probes=prober.probes,
    )


def _doctest_scenario(mean_service_s: float = 0.04) -> dict[str, Any]:
    """A small single-server scenario for examples: Poisson arrivals, one request at a
    time, constant *mean_service_s* service (an M/D/1 queue per replica)."""
    beta1_us = 10.0
    beta0_us = mean_service_s * 1e6 - 3500 * beta1_us
    return {
        "seed": 1,
        "workload": {"aggregate_rate": 10.0, "num_requests": 100, "clients": [{
            "id": "only", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 3500}},
            "output_distribution": {"type": "constant", "params": {"value": 1}}}]},
        "serving": {"replicas": 1, "router": {"kind": "least_loaded"},
                    "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "chunked_prefill": False},
                    "latency_model": {"kind": "blis_linear", "params": {
                        "beta0_us": beta0_us, "beta1_us": beta1_us, "beta2_us": 1.0}}},
    }
