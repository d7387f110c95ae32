"""Which coefficients a trace determines: profiles of the fit's loss.

The fit (:mod:`simpy_llm.calibrate.fit`) scores a candidate latency model by
replaying the trace and taking, request by request, how far the simulated TTFT
and E2E are from the observed ones (:func:`paired_t` compares two candidates on
the same requests). To judge one coefficient it moves that coefficient alone
along a ladder of factors of its value, the other coefficients re-estimated from
the trace's steps for each value (so a term the others can stand in for, such as
a per-pair attention cost over short prompts that a per-token cost imitates,
shows a flat profile), and replays each candidate:

* a value is **plausible** when its loss is not significantly worse than the
  fitted value's: the mean per-request increase is at most :data:`Z` standard
  errors (a paired test at the 5 % level: the trace's own resampling noise, and
  the replay's sensitivity to small changes, set the tolerance);
* the plausible values form the coefficient's interval ``[low, high]``, located
  by walking the ladder of :data:`DOWN_FACTORS` and :data:`UP_FACTORS` to the first
  implausible value on each side, bisecting twice between it and the last
  plausible one (geometrically), then putting the end where a statistic growing
  as the square of the log-distance from the fitted value through the first
  implausible point would cross :data:`Z` (exact for a loss quadratic in the log
  of the coefficient, wider for a sharper one; :func:`profile_coefficient`);
* the coefficient is **determined** when the walk finds an implausible value on
  both sides and the ends are at most :data:`MAX_RATIO` apart: the trace pins it
  within a factor of 4 (from half to twice a middle value, say). When a
  sixteenth of it is still plausible, the trace cannot tell the term from absent;
  when sixteen times it is, it cannot bound it; when the ends are further apart,
  it cannot pin it. It then comes from a prior or its documented default instead
  of from wherever the optimiser drifted, moved to the nearest bound the trace did
  find when it lies beyond (:meth:`Profile.clip`). A coefficient fitted at 0 is
  not determined either (the trace cannot tell "absent" from "small"; its default
  is 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

__all__ = ["BISECTIONS", "DOWN_FACTORS", "MAX_RATIO", "UP_FACTORS", "Profile", "Z", "paired_t", "profile_coefficient"]

Z = 1.96
"""A value is implausible when its loss exceeds the fitted value's by more than this many
standard errors of the mean per-request difference (two-sided 5 % level)."""
MAX_RATIO = 4.0
"""A coefficient is determined when its interval's ends are at most this factor apart."""
DOWN_FACTORS = (0.5, 0.25, 1 / 16)
"""Factors of the fitted value tried below it, nearest first."""
UP_FACTORS = (2.0, 4.0, 16.0)
"""Factors of the fitted value tried above it, nearest first."""
BISECTIONS = 2
"""Geometric bisections between the last plausible and the first implausible factor on each side."""


def paired_t(candidate: np.ndarray, reference: np.ndarray) -> float:
    """How much worse *candidate* is than *reference*, per request, in standard errors: the
    mean of ``candidate - reference`` over its standard error (sample standard deviation
    over the square root of the number of requests). 0 when they are equal; infinite when
    every request is worse by the same amount.

    Examples
    --------
    >>> paired_t(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))
    0.0
    >>> round(paired_t(np.array([1.1, 2.3, 3.2]), np.array([1.0, 2.0, 3.0])), 3)   # mean 0.2, sd 0.1, n 3
    3.464
    >>> paired_t(np.array([1.5, 2.5]), np.array([1.0, 2.0]))
    inf
    """
    d = np.asarray(candidate, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if d.size == 0:
        return 0.0
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if d.size > 1 else 0.0
    if sd <= 1e-15 * max(abs(mean), 1e-300):
        return 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return mean / (sd / math.sqrt(d.size))


@attrs.frozen(kw_only=True)
class Profile:
    """One coefficient's profile: the plausible values' bounds, and whether the trace determines it."""

    low: float | None
    """Smallest plausible value (same unit as the coefficient); None when a sixteenth of the
    fitted value is still plausible (the trace cannot tell the term from absent)."""
    high: float | None
    """Largest plausible value; None when sixteen times the fitted value is still plausible."""
    evaluations: int
    """Candidates scored (replays)."""

    @property
    def determined(self) -> bool:
        """Bounded on both sides, the bounds at most :data:`MAX_RATIO` apart (module docstring)."""
        return self.interval is not None

    @property
    def interval(self) -> tuple[float, float] | None:
        """``(low, high)`` when determined, else None."""
        low, high = self.low, self.high
        if low is not None and high is not None and high <= MAX_RATIO * low:
            return (low, high)
        return None

    def clip(self, value: float) -> float:
        """*value* moved to the nearest plausible one (within the bounds found)."""
        if self.low is not None and value < self.low:
            return self.low
        if self.high is not None and value > self.high:
            return self.high
        return value


def profile_coefficient(value: float, t_of: Callable[[float], float]) -> Profile:
    """Profile a coefficient fitted at *value* (> 0; module docstring). *t_of(v)* scores the
    candidate with the coefficient at ``v``: :func:`paired_t` against the fitted candidate.

    Each side is walked until a factor is implausible or the ladder ends; where a side has
    an implausible factor, its bound is then located between the bracketing factors.

    Examples
    --------
    A loss whose test statistic grows as ``40 (log2 f)^2`` crosses 1.96 at ``f = 2^(±0.221)``:
    the interval is 8.58-11.66, found after the two first factors and two bisections a side:

    >>> p = profile_coefficient(10.0, lambda v: 40 * math.log2(v / 10.0) ** 2)
    >>> p.determined, round(p.low, 2), round(p.high, 2), p.evaluations
    (True, 8.58, 11.66, 6)

    A term whose absence the loss cannot tell (flat below, rising above) is not determined;
    its upper bound is still located (the statistic jumps at the fitted value, so the
    bisections close in on it), and a value held for it is clipped below that:

    >>> p = profile_coefficient(10.0, lambda v: 0.0 if v <= 10.0 else 50.0)
    >>> p.determined, p.low, round(p.high, 2), p.evaluations, round(p.clip(25.0), 2)
    (False, None, 10.35, 6, 10.35)
    """
    if not value > 0:
        raise ValueError(f"a coefficient profiled must be > 0, got {value!r}")
    evaluations = 0
    scores: dict[float, float] = {1.0: 0.0}

    def t(f: float) -> float:
        nonlocal evaluations
        if f not in scores:
            evaluations += 1
            scores[f] = float(t_of(value * f))
        return scores[f]

    def walk(factors: tuple[float, ...]) -> tuple[float, float | None]:
        """The last plausible factor and the first implausible one (None: none was)."""
        inside = 1.0
        for f in factors:
            if t(f) > Z:
                return inside, f
            inside = f
        return inside, None

    low_in, low_out = walk(DOWN_FACTORS)
    high_in, high_out = walk(UP_FACTORS)

    def boundary(inside: float, outside: float) -> float:
        for _ in range(BISECTIONS):
            mid = math.sqrt(inside * outside)
            if t(mid) > Z:
                outside = mid
            else:
                inside = mid
        # where Z * (log f / log outside)^2 = t(outside): exact for a statistic quadratic in log f
        t_out = scores[outside]
        share = math.sqrt(Z / t_out) if math.isfinite(t_out) else 0.0
        x = math.log(outside) * share  # never nearer the fitted value than the last plausible factor
        return math.exp(min(x, math.log(inside)) if outside < 1 else max(x, math.log(inside)))

    low = value * boundary(low_in, low_out) if low_out is not None else None
    high = value * boundary(high_in, high_out) if high_out is not None else None
    return Profile(low=low, high=high, evaluations=evaluations)
