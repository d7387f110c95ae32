"""Arrival processes.

Kept whole (over 800 lines): one class per registered arrival process, with the renewal and
period machinery they share.

An arrival process is a frozen attrs class, at once config
(``{process: gamma, cv: 3.5}``) and sampler. The generator asks it for
``times(rng, rate, chunk)``: an endless iterator of numpy arrays of
increasing absolute arrival times (seconds, from 0), *chunk* at a time, with
long-run mean rate *rate* (requests/s). Stationary renewal processes only
implement ``gaps(rng, rate, n)`` and inherit ``times`` from
:class:`Renewal`; time-varying processes implement ``times`` themselves.
Register more with ``@arrival_processes.register("name")``.

Renewal processes (``poisson``, ``gamma``, ``weibull``, ``constant``,
``distribution``) state the coefficient of variation of their gaps as ``cv``;
``distribution`` takes its gaps from any registered length distribution,
rescaled to the rate. The modulated ones
(``on_off``, ``windows``) switch between *periods*, each with its own process
and rate; inside a period the period's process is **restarted** at the
period start (its first arrival comes one ordinary gap after the start) and
arrivals past the period end are dropped. For Poisson periods this is exact
(memoryless); for other processes the expected count in a period of length d
is the ordinary renewal function, ``rate * d + (cv**2 - 1) / 2`` for long
periods, so the long-run rate is exact only when periods hold many arrivals
(ServeGen's 600 s windows do).

At a low rate most periods are empty, and drawing every period would take
many draws per arrival (millions at 1e-7 requests/s). Beyond
:data:`SKIP_PERIODS_PER_ARRIVAL` periods per arrival the modulated processes
draw the next period that holds an arrival directly, which is exact: periods
hold an arrival independently, with probability ``1 - P(gap >= length)``
(:meth:`Renewal.log_gap_survival`), so whole cycles are skipped with one
exponential draw, and the first arrival of the period found is the gap
conditioned to fit (:meth:`Renewal.gap_below`). That needs constant periods
with a ``poisson``, ``gamma``, ``weibull`` or ``constant`` process inside (all
of ``windows``; ``on_off`` with ``constant`` lengths), or ``exponential``
lengths with ``poisson`` inside (``on_off``; a skipped period then lasts
Exp(1 / mean + rate), one gamma draw for many). Other periods are drawn one by
one, and a rate at which that would take more than
:data:`MAX_PERIODS_PER_ARRIVAL` periods per arrival (10 when the process inside
is itself modulated) is refused with a
:class:`~simpy_llm.workload.distributions.SamplingError` naming the process
(the simulation reports it at the process's key path).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import attrs
import numpy as np

from simpy_llm.config.common import ArrivalProcess
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.plain import tag_registry
from simpy_llm.config.schema import ArrivalField, LengthField
from simpy_llm.config.validators import (
    MAX_RATE,
    MAX_TIME_S,
    all_of,
    at_least,
    greater_than,
    in_range,
    non_empty,
)
from simpy_llm.registry import Registry
from simpy_llm.workload.distributions import (
    Constant,
    Empirical,
    Exponential,
    Normal,
    SamplingError,
    Uniform,
)

__all__ = [
    "GAMMA_CV_RANGE",
    "MAX_NEGATIVE_GAP_SHARE",
    "MAX_PERIODS_PER_ARRIVAL",
    "MAX_PERIODS_PER_ARRIVAL_RUN_ONE_BY_ONE",
    "SKIP_PERIODS_PER_ARRIVAL",
    "ArrivalProcess",
    "ConstantArrivals",
    "DistributionArrivals",
    "GammaArrivals",
    "OnOffArrivals",
    "PoissonArrivals",
    "RateWindow",
    "Renewal",
    "WeibullArrivals",
    "WindowedArrivals",
    "arrival_processes",
    "weibull_shape_for_cv",
]


class Renewal:
    """Mixin for stationary renewal processes: ``times`` from cumulative ``gaps``.

    A process that also knows its gap's survival function in closed form
    (:meth:`log_gap_survival`, :meth:`gap_below`) lets the modulated processes skip
    periods without arrivals exactly (module docstring); the built-in ``poisson``,
    ``gamma``, ``weibull`` and ``constant`` do.
    """

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        """Draw *n* inter-arrival gaps (seconds) at mean rate *rate* (1/s)."""
        raise NotImplementedError

    def log_gap_survival(self, rate: float, length_s: float) -> float | None:
        """``log P(gap >= length_s)`` at mean rate *rate*: the log-probability that a period of
        *length_s* seconds in which the process is restarted holds no arrival; None when not
        known in closed form."""
        return None

    def gap_below(self, rng: np.random.Generator, rate: float, length_s: float) -> float:
        """One gap drawn conditioned on ``gap < length_s`` (by inversion of the gap's CDF: one
        uniform draw); only called when :meth:`log_gap_survival` is known and below 0."""
        raise NotImplementedError

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        last = 0.0
        while True:
            t = last + np.cumsum(self.gaps(rng, rate, chunk))
            last = float(t[-1])
            yield t


arrival_processes: Registry[type] = Registry("arrival process")
tag_registry(arrival_processes, "process")  # written back out as {process: NAME, ...}


@arrival_processes.register("poisson")
@attrs.frozen(kw_only=True)
class PoissonArrivals(Renewal):
    """Exponential gaps (CV = 1).

    >>> g = PoissonArrivals().gaps(np.random.default_rng(1), rate=10.0, n=100_000)
    >>> round(float(g.mean()), 2)
    0.1
    """

    @property
    def cv(self) -> float:
        return 1.0

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        return rng.exponential(1.0 / rate, n)

    def log_gap_survival(self, rate: float, length_s: float) -> float | None:
        return -rate * length_s

    def gap_below(self, rng: np.random.Generator, rate: float, length_s: float) -> float:
        # F(x) = 1 - exp(-rate x); x = F^-1(u F(length)), written with log1p/expm1 for tiny rate x length.
        x = -math.log1p(float(rng.random()) * math.expm1(-rate * length_s)) / rate
        return min(x, math.nextafter(length_s, 0.0))  # the inversion's rounding stays inside


GAMMA_CV_RANGE = (0.01, 100.0)
"""Coefficients of variation a ``gamma`` arrival process accepts: its shape 1 / cv**2 stays
in [1e-4, 1e4], where numpy's gamma sampler keeps the mean gap (beyond, cv**2 overflows)."""


@arrival_processes.register("gamma")
@attrs.frozen(kw_only=True)
class GammaArrivals(Renewal):
    """Gamma gaps with coefficient of variation *cv* (CV > 1 is bursty).

    Shape k = 1 / cv², scale = 1 / (rate k), so the mean gap is 1 / rate.
    """

    cv: float = attrs.field(validator=all_of(greater_than(0), in_range(*GAMMA_CV_RANGE)))
    """Coefficient of variation of the gaps, in [0.01, 100]."""

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (rate * shape), n)

    def log_gap_survival(self, rate: float, length_s: float) -> float | None:
        from scipy import special

        shape = 1.0 / self.cv**2
        x = length_s * rate * shape  # length / scale
        below = float(special.gammainc(shape, x))
        return math.log1p(-below) if below < 0.5 else math.log(float(special.gammaincc(shape, x)))

    def gap_below(self, rng: np.random.Generator, rate: float, length_s: float) -> float:
        from scipy import special

        shape = 1.0 / self.cv**2
        below = float(special.gammainc(shape, length_s * rate * shape))
        x = float(special.gammaincinv(shape, float(rng.random()) * below)) / (rate * shape)
        return min(x, math.nextafter(length_s, 0.0))  # the inversion's rounding stays inside


# --------------------------------------------------------------------------- more renewal processes


@arrival_processes.register("constant")
@attrs.frozen(kw_only=True)
class ConstantArrivals(Renewal):
    """Evenly spaced arrivals: every gap is exactly 1 / rate (CV = 0).

    >>> next(ConstantArrivals().times(np.random.default_rng(0), rate=4.0, chunk=3)).tolist()
    [0.25, 0.5, 0.75]
    """

    @property
    def cv(self) -> float:
        return 0.0

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        return np.full(n, 1.0 / rate)

    def log_gap_survival(self, rate: float, length_s: float) -> float | None:
        return 0.0 if 1.0 / rate >= length_s else -math.inf

    def gap_below(self, rng: np.random.Generator, rate: float, length_s: float) -> float:
        return 1.0 / rate


WEIBULL_CV_RANGE = (0.01, 100.0)
"""Coefficients of variation a ``weibull`` arrival process accepts (shape ~128 down to ~0.13)."""


@functools.cache
def weibull_shape_for_cv(cv: float) -> float:
    """Weibull shape k whose coefficient of variation is *cv*.

    Solves ``cv**2 = Gamma(1 + 2/k) / Gamma(1 + 1/k)**2 - 1`` with scipy's
    ``brentq`` on log k (the CV decreases monotonically in k). Cached per cv.

    >>> round(weibull_shape_for_cv(1.0), 9)  # the exponential
    1.0
    >>> round(weibull_shape_for_cv(2.0), 4)
    0.5427
    """
    from scipy import optimize, special

    if not WEIBULL_CV_RANGE[0] <= cv <= WEIBULL_CV_RANGE[1]:
        raise ValueError(f"cv must be in [{WEIBULL_CV_RANGE[0]}, {WEIBULL_CV_RANGE[1]}], got {cv!r}")
    target = math.log1p(cv * cv)

    def excess(log_k: float) -> float:
        k = math.exp(log_k)
        return float(special.gammaln(1 + 2 / k) - 2 * special.gammaln(1 + 1 / k)) - target

    return math.exp(optimize.brentq(excess, math.log(0.02), math.log(1e4), xtol=1e-14, rtol=1e-13))


@arrival_processes.register("weibull")
@attrs.frozen(kw_only=True)
class WeibullArrivals(Renewal):
    """Weibull gaps with coefficient of variation *cv* (CV > 1 is bursty, < 1 regular).

    The shape k is solved from cv (:func:`weibull_shape_for_cv`); the scale is
    ``1 / (rate * Gamma(1 + 1/k))`` so the mean gap is 1 / rate.

    >>> g = WeibullArrivals(cv=2.0).gaps(np.random.default_rng(3), rate=10.0, n=200_000)
    >>> round(float(g.mean()), 2)
    0.1
    """

    cv: float = attrs.field(validator=in_range(*WEIBULL_CV_RANGE))
    """Coefficient of variation of the gaps, in [0.01, 100]."""

    @property
    def shape(self) -> float:
        """The Weibull shape k matching ``cv``."""
        return weibull_shape_for_cv(float(self.cv))

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        k = self.shape
        return rng.weibull(k, n) / (rate * math.gamma(1 + 1 / k))

    def log_gap_survival(self, rate: float, length_s: float) -> float | None:
        k = self.shape
        return -((length_s * rate * math.gamma(1 + 1 / k)) ** k)  # -(length / scale) ** k

    def gap_below(self, rng: np.random.Generator, rate: float, length_s: float) -> float:
        k = self.shape
        scale = 1.0 / (rate * math.gamma(1 + 1 / k))
        below = -math.expm1(-((length_s / scale) ** k))
        x = scale * (-math.log1p(-float(rng.random()) * below)) ** (1.0 / k)
        return min(x, math.nextafter(length_s, 0.0))


MAX_NEGATIVE_GAP_SHARE = 1e-3
"""Largest share of a ``distribution`` process's gap draws that may be negative (they count
as 0, which shifts the mean gap a little); a distribution known to draw more is rejected."""


def _negative_share(dist: Any) -> float:
    """P(draw < 0) for the built-in families that can draw negative values (0 for the others)."""
    if isinstance(dist, Uniform):
        return min(max(-float(dist.low) / (float(dist.high) - float(dist.low)), 0.0), 1.0)
    if isinstance(dist, Normal):
        if dist.std_dev == 0:
            return 1.0 if dist.mean < 0 else 0.0
        return 0.5 * math.erfc(float(dist.mean) / (float(dist.std_dev) * math.sqrt(2.0)))
    if isinstance(dist, Empirical):
        return math.fsum(p for v, p in zip(dist.values, dist.probabilities, strict=True) if v < 0)
    return 0.0


@arrival_processes.register("distribution")
@attrs.frozen(kw_only=True)
class DistributionArrivals(Renewal):
    """Gaps drawn from a registered length distribution, rescaled to the rate.

    Written ``{process: distribution, gaps: {type: uniform, params: {low: 0.5, high: 1.5}}}``.
    Each gap is a draw of *gaps* (read as seconds) multiplied by ``(1 / rate) / mean``,
    where ``mean`` is the distribution's own mean: the mean gap is 1 / rate whatever the
    distribution's scale, and the distribution gives the shape (so the gap CV is its
    ``sqrt(variance) / mean``). The mean must be finite and > 0 (a ``pareto`` with
    ``alpha <= 1`` is rejected). A negative draw counts as 0 (an arrival at the same
    instant as the previous one); a distribution known to draw negative values more often
    than :data:`MAX_NEGATIVE_GAP_SHARE` (a ``uniform`` with ``low < 0``, a ``normal`` whose
    mean is within about 3 standard deviations of 0, an ``empirical`` with negative
    values) is rejected, since the mean gap would no longer be 1 / rate.

    >>> from simpy_llm.workload.distributions import Uniform
    >>> p = DistributionArrivals(gaps=Uniform(low=0.5, high=1.5))
    >>> round(p.cv, 4)  # (1 / sqrt(12)) / 1
    0.2887
    >>> g = p.gaps(np.random.default_rng(0), rate=4.0, n=3)  # uniform on [0.125, 0.375)
    >>> bool(((g >= 0.125) & (g < 0.375)).all())
    True
    """

    gap_distribution: LengthField = attrs.field(alias="gaps")
    """The gap distribution (YAML key ``gaps``): its shape is kept, its mean rescaled to 1 / rate."""

    def __attrs_post_init__(self) -> None:
        dist = self.gap_distribution
        mean = getattr(dist, "mean", None)
        if not callable(getattr(dist, "sample", None)) or isinstance(mean, bool) or not isinstance(mean, (int, float)):
            raise FieldValueError("gaps", f"must be a length distribution ({{type: NAME, params: {{...}}}}), got {dist!r}")
        if not (math.isfinite(mean) and mean > 0):
            raise FieldValueError(
                "gaps",
                f"the gap distribution's mean must be finite and > 0 (gaps are multiplied by "
                f"(1 / rate) / mean), got mean {mean!r}",
            )
        share = _negative_share(dist)
        if share > MAX_NEGATIVE_GAP_SHARE:
            raise FieldValueError(
                "gaps",
                f"draws a negative gap with probability {share:.3g}; at most {MAX_NEGATIVE_GAP_SHARE:g} "
                "may be negative (they count as 0 and would shift the mean gap)",
            )

    @property
    def cv(self) -> float:
        """Coefficient of variation of the gaps: the distribution's ``sqrt(variance) / mean``
        (``inf`` when its variance is infinite)."""
        dist = self.gap_distribution
        return math.sqrt(float(dist.variance)) / float(dist.mean)

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        dist = self.gap_distribution
        draws = np.asarray(dist.sample(rng, n), dtype=float)
        if not np.isfinite(draws).all():
            raise SamplingError(f"{dist!r} drew gaps that are not finite numbers", dist)
        return np.maximum(draws, 0.0) * ((1.0 / rate) / float(dist.mean))


# --------------------------------------------------------------------------- modulated processes


Group = tuple[Any, float, np.ndarray, np.ndarray]
"""(process, rate, period starts, period durations): periods sharing a process and a rate."""


def _cv_hint(process: Any) -> float:
    cv = getattr(process, "cv", None)
    if isinstance(cv, (int, float)) and math.isfinite(cv):
        return min(float(cv), 3.0)
    return 1.0


def _restarted(process: Any, rng: np.random.Generator, rate: float, starts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Arrival times of *process* at *rate* restarted in each period ``[start, start + duration)``.

    Renewal processes are drawn for all periods at once: each period gets a
    block of gaps a little longer than it needs; periods the block did not
    cover draw further blocks (few and rare). Other processes are run period by
    period. The result is not sorted.
    """
    starts = np.asarray(starts, dtype=float)
    durations = np.maximum(np.asarray(durations, dtype=float), 0.0)
    if rate <= 0 or starts.size == 0:
        return np.empty(0)
    if not isinstance(process, Renewal):
        return _restarted_generic(process, rng, rate, starts, durations)
    cv = _cv_hint(process)
    out: list[np.ndarray] = []
    elapsed = np.zeros(starts.size)
    pending = np.flatnonzero(durations > 0)
    while pending.size:
        limit = durations[pending]
        expected = rate * (limit - elapsed[pending])
        m = np.ceil(expected + 3 * cv * np.sqrt(expected) + 2).astype(np.int64)
        cum = np.cumsum(process.gaps(rng, rate, int(m.sum())))
        ends = np.cumsum(m)
        before = np.concatenate(([0.0], cum[ends[:-1] - 1]))
        local = cum - np.repeat(before - elapsed[pending], m)
        keep = local < np.repeat(limit, m)
        out.append(np.repeat(starts[pending], m)[keep] + local[keep])
        last = local[ends - 1]
        unfinished = last < limit
        elapsed[pending[unfinished]] = last[unfinished]
        pending = pending[unfinished]
    return np.concatenate(out) if out else np.empty(0)


def _restarted_generic(process: Any, rng: np.random.Generator, rate: float, starts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    out: list[np.ndarray] = []
    for start, duration in zip(starts.tolist(), durations.tolist(), strict=True):
        if duration <= 0:
            continue
        size = int(min(max(16, math.ceil(rate * duration * 1.2) + 16), 1 << 20))
        for t in process.times(rng, rate, size):
            inside = t[t < duration]
            out.append(start + inside)
            if inside.size < t.size:
                break
    return np.concatenate(out) if out else np.empty(0)


def _chunked(rng: np.random.Generator, batches: Iterable[list[Group]], chunk: int) -> Iterator[np.ndarray]:
    """Exactly-*chunk* arrays of arrival times from time-ordered, non-overlapping batches of periods."""
    buffer = np.empty(0)
    for groups in batches:
        parts = [_restarted(process, rng, r, s, d) for process, r, s, d in groups]
        if parts:
            buffer = np.concatenate([buffer, np.sort(np.concatenate(parts))])
        while buffer.size >= chunk:
            yield buffer[:chunk]
            buffer = buffer[chunk:]


SKIP_PERIODS_PER_ARRIVAL = 200.0
"""Beyond this many periods per arrival on average (periods per cycle / expected arrivals per
cycle), ``on_off`` and ``windows`` draw the next period that holds an arrival directly
instead of drawing every period, when their periods allow it (module docstring). Below it,
drawing every period in vectors is the faster of the two; both are exact."""
MAX_PERIODS_PER_ARRIVAL = 1000.0
"""Most periods a modulated process may have to draw, on average, per arrival when it cannot
draw the next period with an arrival directly (each period costs a few draws; more would
stall the run); a process and rate past it are refused with
:class:`~simpy_llm.workload.distributions.SamplingError`, which names its key path."""
MAX_PERIODS_PER_ARRIVAL_RUN_ONE_BY_ONE = 10.0
"""The same bound when the process inside the periods is not a renewal process (a nested
modulated process): each of its periods is run on its own, about a thousand times slower."""
_MAX_HAZARD = 50.0
"""Cap on a period's ``-log P(no arrival)``: exp(-50) is 2e-22, beyond which the period holds an
arrival for certain in float64; the cap keeps cumulative hazards finite."""


class _Phase(NamedTuple):
    """One period of a cycle, for drawing the next period with an arrival directly."""

    process: Any
    """The renewal process inside (restarted at the period's start)."""
    rate: float
    """Its rate inside, requests/s (0: the period is idle)."""
    length_s: float
    """The period's length when it is constant, seconds (unused when ``exit_rate > 0``)."""
    exit_rate: float
    """1 / mean length when the length is exponential (the process inside is then Poisson);
    0 when the length is constant."""


def _hazard(phase: _Phase) -> float:
    """``-log P(the period holds no arrival)``, capped at :data:`_MAX_HAZARD`."""
    if phase.rate <= 0:
        return 0.0
    if phase.exit_rate > 0:
        # Poisson inside an exponential length: no arrival iff the length ends first.
        h = math.log1p(phase.rate / phase.exit_rate)
    else:
        h = -phase.process.log_gap_survival(phase.rate, phase.length_s)
    return min(max(h, 0.0), _MAX_HAZARD)


def _skippable(phase: _Phase) -> bool:
    """Whether the next arrival after *phase* starts can be drawn without drawing each period."""
    if phase.rate <= 0:
        return True
    if phase.exit_rate > 0:
        return isinstance(phase.process, PoissonArrivals)
    return isinstance(phase.process, Renewal) and phase.process.log_gap_survival(phase.rate, phase.length_s) is not None


def _skipping(rng: np.random.Generator, phases: list[_Phase], chunk: int, owner: object) -> Iterator[np.ndarray]:
    """Exactly-*chunk* arrays of arrival times of a cycle of *phases* repeated from time 0,
    each period restarting its process, drawn one period *with an arrival* at a time.

    Periods hold an arrival independently, period *i* with probability
    ``1 - exp(-h_i)`` (:func:`_hazard`), so the first one that does is where the
    cumulative hazard from the current period first exceeds a standard exponential
    draw: whole cycles are skipped at once. The periods skipped hold no arrival: a
    constant one lasts its length; an exponential one (Poisson inside at rate r,
    lengths at rate a) lasts Exp(a + r) given that, so their sum is one gamma draw.
    In the period found, the first arrival is the process's gap conditioned to fall
    inside (:meth:`Renewal.gap_below`; for an exponential length, Exp(a + r) again) and
    the rest of the period runs as usual.
    """
    hazards = [_hazard(p) for p in phases]
    if not sum(hazards) > 0:
        raise SamplingError(
            f"{owner!r} expects no arrival in a cycle at float64 precision (its rates x period lengths underflow)",
            owner,
        )
    n = len(phases)
    constant = [p.length_s if p.exit_rate == 0 else 0.0 for p in phases]
    cycle_constant_s = math.fsum(constant)
    exponential = [i for i, p in enumerate(phases) if p.exit_rate > 0]
    # Cumulative hazards and constant lengths from each period to the end of the next cycle:
    # from period j, hazard[j:j+k] sums to cum_h[j+k] - cum_h[j].
    cum_h = np.concatenate(([0.0], np.cumsum(hazards + hazards)))
    cum_len = np.concatenate(([0.0], np.cumsum(constant + constant)))
    total = float(cum_h[n])
    out: list[float] = []
    t, j = 0.0, 0  # at the start of period j of a cycle
    while True:
        e = float(rng.standard_exponential())
        cycles = 0.0
        if e >= total:
            cycles = math.floor(e / total)
            e = min(max(e - cycles * total, 0.0), math.nextafter(total, 0.0))
        # the period holding the next arrival: j + m, the first whose cumulative hazard exceeds e
        m = int(np.searchsorted(cum_h, cum_h[j] + e, side="right")) - 1 - j
        m = min(max(m, 0), n - 1)
        while hazards[(j + m) % n] == 0.0:  # rounding ran past the cycle's last busy period: back to it
            m -= 1
        t += cycles * cycle_constant_s + float(cum_len[j + m] - cum_len[j])
        for i in exponential:  # the exponential periods skipped, each Exp(a + r) given no arrival
            count = cycles + (1.0 if (i - j) % n < m else 0.0)
            if count > 0:
                t += float(rng.gamma(count, 1.0 / (phases[i].exit_rate + phases[i].rate)))
        i = (j + m) % n
        phase = phases[i]
        if phase.exit_rate > 0:
            q = phase.exit_rate + phase.rate
            t += float(rng.exponential(1.0 / q))
            out.append(t)
            while True:  # Poisson arrivals race the end of the period
                t += float(rng.exponential(1.0 / q))
                if float(rng.random()) * q >= phase.rate:
                    break
                out.append(t)
        else:
            end = t + phase.length_s
            first = t + phase.process.gap_below(rng, phase.rate, phase.length_s)
            out.append(first)
            second = first + float(phase.process.gaps(rng, phase.rate, 1)[0])
            if second < end:  # (rare in a sparse cycle) the rest of the period in vector draws
                out.append(second)
                out.extend(_restarted(phase.process, rng, phase.rate, np.array([second]), np.array([end - second])).tolist())
            t = end
        j = (i + 1) % n
        while len(out) >= chunk:
            yield np.array(out[:chunk])
            del out[:chunk]


def _direct(
    owner: object,
    rng: np.random.Generator,
    rate: float,
    chunk: int,
    per_cycle: float,
    periods: int,
    inside: Iterable[Any],
    phases: Callable[[], list[_Phase] | None],
    how: str,
) -> Iterator[np.ndarray] | None:
    """The arrivals of a modulated process drawn one period with an arrival at a time
    (:func:`_skipping`) when that pays and its periods allow it; None to draw every period.

    *per_cycle* is the expected arrivals per cycle, *periods* the periods drawn per cycle,
    *inside* the processes inside them, *phases* a callable giving the periods for
    :func:`_skipping` (or None), *how* what would let the process skip. Raises
    :class:`SamplingError` naming *owner* when drawing every period would need more than
    :data:`MAX_PERIODS_PER_ARRIVAL` (or :data:`MAX_PERIODS_PER_ARRIVAL_RUN_ONE_BY_ONE`)
    periods per arrival.
    """
    per_arrival = periods / per_cycle if per_cycle > 0 else math.inf
    if per_arrival > SKIP_PERIODS_PER_ARRIVAL:
        found = phases()
        if found is not None:
            return _skipping(rng, found, chunk, owner)
    one_by_one = any(not isinstance(p, Renewal) for p in inside)
    limit = MAX_PERIODS_PER_ARRIVAL_RUN_ONE_BY_ONE if one_by_one else MAX_PERIODS_PER_ARRIVAL
    if per_arrival > limit:
        raise SamplingError(
            f"at {rate:.6g} requests/s it expects {per_cycle:.3g} arrivals per cycle of {periods} periods: "
            f"about {per_arrival:.3g} periods drawn per arrival, above the {limit:g} allowed; {how}, or "
            "raise the rate or shorten the cycle",
            owner,
        )
    return None


def _period_mean(dist: Any, field: str, positive: bool) -> float:
    mean = getattr(dist, "mean", None)
    if not callable(getattr(dist, "sample", None)) or not isinstance(mean, (int, float)):
        raise FieldValueError(field, f"must be a length distribution, got {dist!r}")
    ok = math.isfinite(mean) and (mean > 0 if positive else mean >= 0)
    if not ok:
        need = "> 0" if positive else ">= 0"
        raise FieldValueError(field, f"the period length must have a finite mean {need} (seconds), got mean {mean!r}")
    return float(mean)


@arrival_processes.register("on_off")
@attrs.frozen(kw_only=True)
class OnOffArrivals:
    """BurstGPT-style ON/OFF arrivals.

    Periods alternate ON, OFF, ON, ... starting with ON at time 0; their
    lengths (seconds) are drawn from *on_duration* and *off_duration*
    (length distributions, e.g. ``{type: exponential, params: {mean: 5}}``;
    negative draws count as 0). During ON the *on_process* runs at rate
    ``r_on``, during OFF the same process at ``r_off = off_rate_ratio * r_on``
    (0 by default: silent OFF periods), restarted at each period start (see
    the module docstring). ``r_on`` is solved so the long-run mean rate is
    *rate*: ``mean_on * r_on + mean_off * r_off = rate * (mean_on + mean_off)``
    (exact for a Poisson ``on_process``).

    The gap CV depends on the rate (:meth:`gap_cv`); it is known in closed
    form for the MMPP case (Poisson inside, exponential ON and OFF lengths).

    >>> from simpy_llm.workload.distributions import Constant
    >>> p = OnOffArrivals(on_duration=Constant(value=1.0), off_duration=Constant(value=3.0))
    >>> p.rates(5.0)
    (20.0, 0.0)
    """

    on_duration: LengthField
    """Distribution of ON period lengths, seconds (finite mean > 0)."""
    off_duration: LengthField
    """Distribution of OFF period lengths, seconds (finite mean)."""
    on_process: ArrivalField = attrs.field(factory=lambda: PoissonArrivals())
    """Process inside the periods (default Poisson)."""
    off_rate_ratio: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """Rate during OFF relative to ON, in [0, 1]."""

    def __attrs_post_init__(self) -> None:
        _period_mean(self.on_duration, "on_duration", positive=True)
        _period_mean(self.off_duration, "off_duration", positive=False)
        if not callable(getattr(self.on_process, "times", None)):
            raise FieldValueError("on_process", f"must be an arrival process, got {self.on_process!r}")

    def rates(self, rate: float) -> tuple[float, float]:
        """``(r_on, r_off)`` giving long-run mean rate *rate*."""
        m_on, m_off = float(self.on_duration.mean), float(self.off_duration.mean)
        r_on = rate * (m_on + m_off) / (m_on + self.off_rate_ratio * m_off)
        return r_on, self.off_rate_ratio * r_on

    def gap_cv(self, rate: float) -> float | None:
        """CV of the stationary gap at mean rate *rate*, or None when not known in closed form.

        Known for Poisson inside exponential ON/OFF periods (a two-state MMPP):
        the gap after an arrival is phase-type with generator ``Q - Lambda``
        and initial phase ``pi Lambda / (pi lambda)``.
        """
        if not (
            isinstance(self.on_process, PoissonArrivals)
            and isinstance(self.on_duration, Exponential)
            and isinstance(self.off_duration, Exponential)
        ):
            return None
        a, b = 1.0 / self.on_duration.mean, 1.0 / self.off_duration.mean
        lam = np.array(self.rates(rate))
        q = np.array([[-a, a], [b, -b]])
        pi = np.array([b, a]) / (a + b)
        alpha = pi * lam / float(pi @ lam)
        inv = np.linalg.inv(np.diag(lam) - q)  # (-D0)^-1
        m1 = float(alpha @ inv @ np.ones(2))
        m2 = 2.0 * float(alpha @ inv @ inv @ np.ones(2))
        return math.sqrt(max(m2 / m1**2 - 1.0, 0.0))

    def _phases(self, rate: float) -> list[_Phase] | None:
        """The ON and OFF periods as :func:`_skipping` takes them at mean rate *rate*, or None
        when the next period with an arrival cannot be drawn directly (lengths other than
        ``constant`` or ``exponential``; an exponential length with a process other than
        Poisson inside; a process without a closed-form gap survival)."""
        r_on, r_off = self.rates(rate)
        out = []
        for dist, r in ((self.on_duration, r_on), (self.off_duration, r_off)):
            if isinstance(dist, Constant):
                phase = _Phase(self.on_process, r, max(float(dist.value), 0.0), 0.0)
            elif isinstance(dist, Exponential):
                phase = _Phase(self.on_process, r, math.nan, 1.0 / float(dist.mean))
            else:
                return None
            if not _skippable(phase):
                return None
            out.append(phase)
        return out

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        r_on, r_off = self.rates(rate)
        per_cycle = rate * (float(self.on_duration.mean) + float(self.off_duration.mean))
        direct = _direct(
            self, rng, rate, chunk, per_cycle, 2, [self.on_process], lambda: self._phases(rate),
            "constant or exponential durations with a poisson on_process (or constant durations with a "
            "gamma, weibull or constant one) skip cycles without arrivals",
        )
        if direct is not None:
            return direct
        cycles = int(min(max(1, math.ceil(chunk / per_cycle)), 1 << 20))

        def batches() -> Iterator[list[Group]]:
            t0 = 0.0
            while True:
                on = np.maximum(self.on_duration.sample(rng, cycles), 0.0)
                off = np.maximum(self.off_duration.sample(rng, cycles), 0.0)
                length = on + off
                starts = t0 + np.concatenate(([0.0], np.cumsum(length[:-1])))
                t0 = float(starts[-1] + length[-1])
                groups: list[Group] = [(self.on_process, r_on, starts, on)]
                if r_off > 0:
                    groups.append((self.on_process, r_off, starts + on, off))
                yield groups

        return _chunked(rng, batches(), chunk)


@attrs.frozen(kw_only=True)
class RateWindow:
    """One window of a :class:`WindowedArrivals` cycle."""

    start_s: float = attrs.field(validator=all_of(at_least(0), in_range(0, MAX_TIME_S)))
    """Start of the window within the cycle, seconds (at most ``MAX_TIME_S``)."""
    rate: float = attrs.field(validator=all_of(at_least(0), in_range(0, MAX_RATE)))
    """Relative rate weight (normalised over the cycle); 0 = idle window."""
    process: ArrivalField = attrs.field(factory=lambda: PoissonArrivals())
    """Process inside the window (default Poisson), e.g. ``{process: gamma, cv: 2.4}``."""


@arrival_processes.register("windows")
@attrs.frozen(kw_only=True)
class WindowedArrivals:
    """Time-varying rate given per window (ServeGen's 600 s windows, each with its own process).

    Window i runs from its ``start_s`` to the next window's ``start_s``; the
    last one lasts ``window_s``. A *cycle* is ``[0, last start + window_s)``;
    before the first window's start there are no arrivals. After the cycle
    ends it repeats, so the process is periodic and never runs dry. The
    windows' ``rate`` values are relative weights, scaled so the time-average
    rate over the cycle equals the *rate* passed to :meth:`times`
    (:meth:`window_rates`). Inside each window its process runs at the
    window's rate, restarted at the window start (see the module docstring);
    there is no single CV: each window's process states its own.

    >>> w = WindowedArrivals(window_s=10, windows=(RateWindow(start_s=0, rate=1), RateWindow(start_s=10, rate=3)))
    >>> w.cycle_s, w.window_rates(2.0).tolist()
    (20.0, [1.0, 3.0])
    """

    window_s: float = attrs.field(default=600.0, validator=all_of(greater_than(0), in_range(0, MAX_TIME_S)))
    """Length of the last window (and ServeGen's window length), seconds."""
    windows: tuple[RateWindow, ...] = attrs.field(converter=tuple, validator=non_empty)
    """Windows in increasing start order."""

    def __attrs_post_init__(self) -> None:
        for i, (a, b) in enumerate(zip(self.windows, self.windows[1:], strict=False)):
            if not b.start_s > a.start_s:
                raise FieldValueError(
                    f"windows[{i + 1}].start_s",
                    f"windows must start in increasing order; {b.start_s} follows {a.start_s}",
                )
        if not any(w.rate > 0 for w in self.windows):
            raise FieldValueError("windows", "at least one window needs rate > 0")

    @property
    def cycle_s(self) -> float:
        """Length of one cycle, seconds (the end of the last window)."""
        return float(self.windows[-1].start_s + self.window_s)

    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        starts = np.array([w.start_s for w in self.windows], dtype=float)
        ends = np.append(starts[1:], self.cycle_s)
        return starts, ends - starts

    def window_rates(self, rate: float) -> np.ndarray:
        """Rate of each window (requests/s) for a time-average of *rate* over the cycle."""
        _, durations = self._layout()
        weights = np.array([w.rate for w in self.windows], dtype=float)
        return weights * (rate * self.cycle_s / float(weights @ durations))

    def _phases(self, rate: float) -> list[_Phase] | None:
        """The cycle's periods (an idle lead before the first window, then the windows) as
        :func:`_skipping` takes them at mean rate *rate*, or None when a window's process has
        no closed-form gap survival."""
        starts, durations = self._layout()
        rates = self.window_rates(rate)
        out = [_Phase(PoissonArrivals(), 0.0, float(starts[0]), 0.0)] if starts[0] > 0 else []
        for w, r, d in zip(self.windows, rates.tolist(), durations.tolist(), strict=True):
            phase = _Phase(w.process, r, d, 0.0)
            if not _skippable(phase):
                return None
            out.append(phase)
        return out

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        starts, durations = self._layout()
        rates = self.window_rates(rate)
        processes = [w.process for w in self.windows]
        cycle = self.cycle_s
        per_cycle = rate * cycle
        active = [i for i in range(len(starts)) if rates[i] > 0]

        def many_cycles(k: int) -> Iterator[list[Group]]:
            c0 = 0
            while True:
                base = cycle * np.arange(c0, c0 + k, dtype=float)
                yield [(processes[i], float(rates[i]), base + starts[i], np.full(k, durations[i])) for i in active]
                c0 += k

        def window_batches() -> Iterator[list[Group]]:
            c = 0
            while True:
                group: list[Group] = []
                expected = 0.0
                for i in active:
                    group.append((processes[i], float(rates[i]), np.array([c * cycle + starts[i]]), durations[i : i + 1]))
                    expected += rates[i] * durations[i]
                    if expected >= chunk:
                        yield group
                        group, expected = [], 0.0
                if group:
                    yield group
                c += 1

        direct = _direct(
            self, rng, rate, chunk, per_cycle, len(active), [processes[i] for i in active],
            lambda: self._phases(rate),
            "windows whose processes are poisson, gamma, weibull or constant skip windows without arrivals",
        )
        if direct is not None:
            return direct
        if per_cycle < chunk:
            batches = many_cycles(int(min(math.ceil(chunk / per_cycle), max(1, (1 << 20) // len(active)))))
        else:
            batches = window_batches()
        return _chunked(rng, batches, chunk)
