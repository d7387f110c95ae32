"""Benchmark profiles: which runs a benchmark makes, and when each run sends its requests.

The profiles of guidellm (``--profile``), each a list of :class:`RunPlan`:

``synchronous``
    One request at a time: all due at once, at most one in flight.
``concurrency``
    A fixed number in flight, one run per ``--max-concurrency`` value.
``throughput``
    All due at once, as fast as the server takes them (bounded by ``--max-concurrency``).
``constant``
    Evenly spaced at each ``--request-rate`` (one run per rate; ``inf``: all at once).
``poisson``
    Exponential gaps at each ``--request-rate``, seeded (vLLM's default arrivals).
``sweep``
    ``synchronous``, then ``throughput``, then ``--rates`` *N* runs at rates evenly spaced
    from the synchronous run's achieved request rate to the throughput run's
    (:func:`sweep_rates`), ``constant`` or ``poisson`` (``--sweep-arrivals``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

__all__ = ["FIXED_PROFILES", "PROFILES", "RunPlan", "SweepRangeWarning", "arrival_times", "fixed_plans", "sweep_rates"]

PROFILES = ("synchronous", "concurrency", "throughput", "constant", "poisson", "sweep")
"""Every ``--profile``."""
FIXED_PROFILES = PROFILES[:-1]
"""The profiles whose runs are known before the first one (all but ``sweep``)."""


@attrs.frozen
class RunPlan:
    """One run of a benchmark: how its requests are spaced and how many may be in flight."""

    strategy: str
    """``synchronous``, ``concurrency``, ``throughput``, ``constant`` or ``poisson``."""
    rate: float = math.inf
    """Requests per second (``inf``: all due at once)."""
    concurrency: int | None = None
    """At most this many in flight (``None``: no limit)."""


def arrival_times(plan: RunPlan, n: int, seed: int = 0) -> list[float]:
    """The *n* target send times of *plan*'s requests, seconds from the run's start.

    ``constant``: ``i / rate``; ``poisson``: the first at 0, then gaps drawn from an
    exponential distribution of mean ``1 / rate`` with ``numpy.random.default_rng(seed)``;
    every other strategy, and an infinite rate: all at 0.

    >>> arrival_times(RunPlan("constant", rate=4.0), 3)
    [0.0, 0.25, 0.5]
    >>> arrival_times(RunPlan("poisson", rate=2.0), 3, seed=1) == arrival_times(RunPlan("poisson", rate=2.0), 3, seed=1)
    True
    """
    if plan.strategy not in ("constant", "poisson") or math.isinf(plan.rate):
        return [0.0] * n
    if plan.strategy == "constant":
        return [i / plan.rate for i in range(n)]
    gaps = np.random.default_rng(seed).exponential(1.0 / plan.rate, size=max(n - 1, 0))
    return [0.0, *(float(t) for t in np.cumsum(gaps))][:n]


def fixed_plans(profile: str, rates: Sequence[float], concurrencies: Sequence[int]) -> list[RunPlan]:
    """The runs of a profile other than ``sweep``.

    *rates* are the ``--request-rate`` values (``constant``, ``poisson``); *concurrencies*
    the ``--max-concurrency`` values: one run each for ``concurrency``, else the first is the
    limit of every run (``synchronous`` is always 1).

    >>> fixed_plans("concurrency", [], [2, 8])
    [RunPlan(strategy='concurrency', rate=inf, concurrency=2), RunPlan(strategy='concurrency', rate=inf, concurrency=8)]
    >>> fixed_plans("poisson", [1.0, 2.0], [])
    [RunPlan(strategy='poisson', rate=1.0, concurrency=None), RunPlan(strategy='poisson', rate=2.0, concurrency=None)]
    """
    limit = concurrencies[0] if concurrencies else None
    if profile == "synchronous":
        return [RunPlan("synchronous", concurrency=1)]
    if profile == "concurrency":
        return [RunPlan("concurrency", concurrency=c) for c in concurrencies]
    if profile == "throughput":
        return [RunPlan("throughput", concurrency=limit)]
    if profile in ("constant", "poisson"):
        return [RunPlan(profile, rate=r, concurrency=limit) for r in rates]
    raise ValueError(f"--profile must be one of {', '.join(FIXED_PROFILES)} here, got {profile!r}")


class SweepRangeWarning(UserWarning):
    """A sweep's throughput run was no faster than its synchronous run: its rates do not lie
    between the synchronous rate and a higher saturation rate."""


def sweep_rates(synchronous_rate: float, throughput_rate: float, n: int) -> list[float]:
    """*n* rates evenly spaced above *synchronous_rate* up to *throughput_rate* (included), as
    guidellm's sweep spaces its asynchronous runs.

    >>> sweep_rates(1.0, 5.0, 4)
    [2.0, 3.0, 4.0, 5.0]
    """
    return [float(r) for r in np.linspace(synchronous_rate, throughput_rate, n + 1)[1:]]
