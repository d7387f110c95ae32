"""Comparison statistics of observed and simulated latencies, and the quality rating.

:func:`compare_metric` takes the *paired* values of one metric — per request
for TTFT, TPOT and E2E, per token gap for ITL, the observed value and the
simulator's prediction for the same request (or gap) — and returns a
:class:`MetricComparison`: quantiles of both sides, the error of the
prediction (MAPE, median APE, signed bias, error at each percentile), how well
it follows the observed ordering (Pearson and Spearman r), whether the two
distributions differ (two-sample Kolmogorov-Smirnov), 100 QQ points, bootstrap
confidence intervals, and the rating of seed 000 §11's quality table
(:func:`rate`).

Definitions
-----------
With ``obs`` and ``sim`` the valid pairs (see below) and ``rel = (sim - obs) / obs``:

* ``mape`` = mean of ``|rel|``, ``median_ape`` = median of ``|rel|`` and
  ``bias`` = mean of ``rel``: fractions (0.1 is 10 %), not percents.
* ``percentile_error[q]`` = ``(sim_q - obs_q) / obs_q`` for q in p50, p90,
  p95, p99, each side's percentile taken on its own (linear interpolation
  between order statistics, numpy's default, as everywhere in the project).
* ``pearson_r`` on the values, ``spearman_r`` on their ranks (ties get the
  mean rank). Both are ``None`` when undefined: fewer than 3 pairs (two points
  always lie on a line) or a side whose values are all equal.
* ``ks_statistic`` and ``ks_pvalue``: :func:`scipy.stats.ks_2samp` of the two
  sides as samples (the pairing plays no part); a p-value below 0.05 rejects
  "same distribution".
* ``qq_observed``/``qq_simulated``: each side's quantiles at the probabilities
  ``(i + 0.5) / 100``, ``i = 0..99``; perfect calibration puts the points on y = x.

Valid pairs
-----------
A pair is left out when either value is NaN or infinite, or the observed
value is <= 0 (a relative error needs a positive denominator); the
comparison's ``warnings`` say how many and why. ``n`` counts the pairs kept.

Confidence intervals
--------------------
:func:`scipy.stats.bootstrap` resamples the *pairs* (``paired=True``) and
takes the percentile interval at ``confidence_level`` over ``n_resamples``
resamples, drawn from ``numpy.random.default_rng(seed)``: the same inputs and
seed give the same intervals. All statistics come from the same resamples.
The percentile method is used rather than scipy's default BCa because BCa's
jackknife evaluates the statistics on n leave-one-out samples of n - 1 values,
2.5 billion values for the 50 000 token gaps of an ITL comparison, while the
percentile interval of a mean or a percentile is first-order accurate at the
sample sizes a calibration has (the test suite measures its coverage). A resample whose Pearson r is
undefined (all its values equal, which ties make possible at small n) is left
out of r's interval, and the warnings say how many were.

Bias direction
--------------
``bias_direction`` is ``"neutral"`` when the bias's confidence interval
(``bias_ci``) contains 0, else ``"over-predict"`` (the simulator's values are
systematically larger) or ``"under-predict"``. With fewer than 2 pairs there is
no interval and no direction (``None``).

Few pairs
---------
With ``n = 0`` every statistic is ``None`` (``qq_*`` empty, the percentile
dicts hold ``None``), and so is the rating. With ``n = 1`` there are
quantiles, errors and KS, but no interval (the bootstrap needs 2 pairs). Below
30 pairs the warnings say the statistics are not significant.

Examples
--------
>>> import numpy as np
>>> obs = np.array([0.10, 0.20, 0.30, 0.40])
>>> c = compare_metric("ttft", obs, obs * 1.15, n_resamples=200)
>>> round(c.mape, 12), round(c.bias, 12), c.bias_direction, c.pearson_r, c.rating
(0.15, 0.15, 'over-predict', 1.0, 'good')
>>> c.warnings[0]
'Insufficient requests for statistical significance (N < 30): N = 4.'
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import scipy.stats

__all__ = [
    "METRICS",
    "PERCENTILES",
    "RATINGS",
    "MetricComparison",
    "Quantiles",
    "compare_metric",
    "rate",
    "to_dict",
    "valid_pairs",
]

METRICS = ("ttft", "itl", "tpot", "e2e")
"""The metrics a calibration compares: time to first token, inter-token latency (one value
per gap between consecutive tokens), time per output token and end-to-end latency."""

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0))
"""The percentiles whose relative error is reported, as ``(key, percent)``."""

RATINGS = ("excellent", "good", "fair", "poor")
"""The quality grades of seed 000 §11, best first."""

MIN_SIGNIFICANT_PAIRS = 30
"""Below this many pairs a comparison warns that it is not statistically significant."""

QQ_POINTS = 100
"""The number of QQ points: quantiles at ``(i + 0.5) / QQ_POINTS``."""

# The grade boundaries of seed 000 §11's table. A value exactly on a boundary
# gets the worse grade: MAPE 10 % is "good", r 0.95 is "good".
_MAPE_UPPER = ((0.10, "excellent"), (0.20, "good"), (0.35, "fair"))
_R_LOWER = ((0.95, "excellent"), (0.85, "good"), (0.70, "fair"))

# Rows of the vectorized statistic (see _statistics).
_ROW_MAPE, _ROW_BIAS, _ROW_R = 0, 1, 2
_ROW_PCT = 3

# Elements per bootstrap batch: bounds the memory of the resampled arrays (a
# handful of float64 arrays of this size) whatever n is.
_BATCH_ELEMENTS = 1 << 20

# scipy >= 1.15 takes the generator as ``rng``; older versions as ``random_state``.
_RNG_KEYWORD = "rng" if "rng" in inspect.signature(scipy.stats.bootstrap).parameters else "random_state"


@attrs.frozen(kw_only=True)
class Quantiles:
    """The mean and percentiles of one side of a comparison, in seconds.

    Percentiles interpolate linearly between order statistics.

    >>> Quantiles.of([0.1, 0.2, 0.3, 0.4, 0.5]).p50
    0.3
    """

    mean: float
    """Mean (s)."""
    p50: float
    """Median (s)."""
    p90: float
    """90th percentile (s)."""
    p95: float
    """95th percentile (s)."""
    p99: float
    """99th percentile (s)."""

    @classmethod
    def of(cls, values: Any) -> Quantiles:
        """The quantiles of *values* (seconds; at least one)."""
        a = np.asarray(values, dtype=np.float64)
        if a.size == 0:
            raise ValueError("Quantiles.of needs at least one value")
        qs = np.percentile(a, [q for _, q in PERCENTILES])
        return cls(mean=float(a.mean()), **{k: float(v) for (k, _), v in zip(PERCENTILES, qs, strict=True)})


@attrs.frozen(kw_only=True)
class MetricComparison:
    """Observed against simulated values of one metric (see the module docstring).

    Errors are fractions of the observed value (0.1 is 10 %); times are seconds.
    ``None`` marks a statistic that is undefined for the pairs at hand.
    """

    metric: str
    """One of :data:`METRICS`."""
    n: int
    """Pairs compared (requests; token gaps for ``itl``), after leaving out invalid pairs."""
    observed: Quantiles | None
    """The observed values' mean and percentiles (s); ``None`` when ``n == 0``."""
    simulated: Quantiles | None
    """The simulated values' mean and percentiles (s); ``None`` when ``n == 0``."""
    mape: float | None
    """Mean absolute percentage error, mean of ``|sim - obs| / obs`` (fraction)."""
    median_ape: float | None
    """Median of ``|sim - obs| / obs`` (fraction)."""
    bias: float | None
    """Mean of ``(sim - obs) / obs`` (fraction, signed: > 0 when the simulator predicts more)."""
    bias_direction: str | None
    """``"over-predict"``, ``"under-predict"`` or ``"neutral"`` (``bias_ci`` contains 0); ``None`` when ``n < 2``."""
    pearson_r: float | None
    """Pearson correlation of observed and simulated values; ``None`` when ``n < 3`` or a side is constant."""
    spearman_r: float | None
    """Spearman rank correlation; ``None`` when ``n < 3`` or a side is constant."""
    percentile_error: dict[str, float | None]
    """``(sim_q - obs_q) / obs_q`` (fraction) for ``p50``, ``p90``, ``p95``, ``p99``."""
    ks_statistic: float | None
    """Two-sample Kolmogorov-Smirnov D (0 to 1)."""
    ks_pvalue: float | None
    """The KS test's p-value; below 0.05 rejects "same distribution"."""
    qq_observed: tuple[float, ...]
    """Observed quantiles (s) at probabilities ``(i + 0.5) / 100``; empty when ``n == 0``."""
    qq_simulated: tuple[float, ...]
    """Simulated quantiles (s) at the same probabilities."""
    confidence_level: float
    """The confidence level of the intervals below (e.g. 0.95)."""
    mape_ci: tuple[float, float] | None
    """Bootstrap interval of ``mape`` (fraction); ``None`` when ``n < 2``."""
    bias_ci: tuple[float, float] | None
    """Bootstrap interval of ``bias`` (fraction); ``None`` when ``n < 2``."""
    pearson_ci: tuple[float, float] | None
    """Bootstrap interval of ``pearson_r``; ``None`` when r is undefined."""
    percentile_error_ci: dict[str, tuple[float, float] | None]
    """Bootstrap interval of each ``percentile_error`` (fraction); ``None`` values when ``n < 2``."""
    rating: str | None
    """``"excellent"``, ``"good"``, ``"fair"`` or ``"poor"`` (:func:`rate`); ``None`` when ``n == 0``."""
    warnings: tuple[str, ...]
    """What the reader should know: pairs left out, too few pairs, undefined r, an uncertain rating."""


def valid_pairs(observed: Any, simulated: Any) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The pairs a comparison uses, and how many were left out.

    Returns ``(obs, sim, non_finite, non_positive)``: float64 arrays of the pairs
    where both values are finite and the observed value is > 0, the number of
    pairs left out for a NaN or infinite value, and the number left out for an
    observed value <= 0. ``pandas`` missing values count as NaN.

    Raises
    ------
    ValueError
        The two are not one-dimensional or differ in length.

    >>> obs, sim, bad, nonpos = valid_pairs([0.1, float("nan"), 0.0, 0.3], [0.1, 0.2, 0.2, float("inf")])
    >>> obs.tolist(), bad, nonpos
    ([0.1], 2, 1)
    """
    o = _as_float_array(observed, "observed")
    s = _as_float_array(simulated, "simulated")
    if o.shape != s.shape:
        raise ValueError(
            f"observed and simulated must pair up one to one: got {o.size} observed and {s.size} simulated values"
        )
    finite = np.isfinite(o) & np.isfinite(s)
    positive = finite & (o > 0)
    return o[positive], s[positive], int((~finite).sum()), int((finite & ~positive).sum())


def _as_float_array(values: Any, name: str) -> np.ndarray:
    if hasattr(values, "to_numpy"):  # pandas: nullable columns hold <NA>, which becomes NaN
        a = values.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def rate(mape: float, pearson_r: float | None) -> str:
    """The quality grade of seed 000 §11's table for a MAPE (fraction) and a Pearson r.

    =========== ============ =============
    grade       MAPE         Pearson r
    =========== ============ =============
    excellent   < 10 %       > 0.95
    good        10 % – 20 %  0.85 – 0.95
    fair        20 % – 35 %  0.70 – 0.85
    poor        >= 35 %      <= 0.70
    =========== ============ =============

    The grade is the worse of the MAPE grade and the r grade; with r undefined
    (``None``), the MAPE grade alone. A value exactly on a boundary gets the
    worse grade: MAPE 0.10 is "good", 0.20 "fair", 0.35 "poor"; r 0.95 is
    "good", 0.85 "fair", 0.70 "poor". The thresholds are guidance, not pass or
    fail: the report always carries the numbers.

    >>> rate(0.05, 0.99), rate(0.10, 0.99), rate(0.05, 0.80), rate(0.40, None)
    ('excellent', 'good', 'fair', 'poor')
    """
    if not _is_number(mape) or not math.isfinite(mape) or mape < 0:
        raise ValueError(f"mape must be a finite fraction >= 0, got {mape!r}")
    grade = next((g for bound, g in _MAPE_UPPER if mape < bound), "poor")
    if pearson_r is None:
        return grade
    if not _is_number(pearson_r) or not -1.0 <= pearson_r <= 1.0:
        raise ValueError(f"pearson_r must be None or within [-1, 1], got {pearson_r!r}")
    r_grade = next((g for bound, g in _R_LOWER if pearson_r > bound), "poor")
    return max(grade, r_grade, key=RATINGS.index)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson r along *axis*; NaN where a side is constant."""
    xm = x - x.mean(axis=axis, keepdims=True)
    ym = y - y.mean(axis=axis, keepdims=True)
    sxy = (xm * ym).sum(axis=axis)
    sxx = (xm * xm).sum(axis=axis)
    syy = (ym * ym).sum(axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    # Rounding can carry |r| a few ulps past 1; clip keeps NaN as NaN.
    return np.clip(r, -1.0, 1.0)


def _statistics(obs: np.ndarray, sim: np.ndarray, axis: int = -1) -> np.ndarray:
    """MAPE, bias, Pearson r and the four percentile errors along *axis*, as rows.

    Written for arrays of any shape so that one call evaluates a whole batch of
    bootstrap resamples (shape ``(batch, n)``) at once.
    """
    rel = (sim - obs) / obs
    qo = np.percentile(obs, [q for _, q in PERCENTILES], axis=axis)
    qs = np.percentile(sim, [q for _, q in PERCENTILES], axis=axis)
    rows = [np.abs(rel).mean(axis=axis), rel.mean(axis=axis), _pearson(obs, sim, axis)]
    return np.concatenate([np.stack(rows), (qs - qo) / qo])


def _power_of_two_scale(obs: np.ndarray, sim: np.ndarray) -> float:
    """A power of two near the largest magnitude: dividing by it is exact, leaves every
    relative statistic bit for bit the same, and keeps Pearson's sums of squares from
    overflowing whatever unit the values come in."""
    top = float(max(np.abs(obs).max(), np.abs(sim).max()))
    return math.ldexp(1.0, math.frexp(top)[1]) if top > 0 else 1.0


def _correlation(obs: np.ndarray, sim: np.ndarray, ranks: bool) -> float | None:
    if obs.size < 3 or np.ptp(obs) == 0 or np.ptp(sim) == 0:
        return None
    if ranks:
        obs, sim = scipy.stats.rankdata(obs), scipy.stats.rankdata(sim)
    else:
        scale = _power_of_two_scale(obs, sim)
        obs, sim = obs / scale, sim / scale
    r = float(_pearson(obs, sim))
    return r if math.isfinite(r) else None


def _ks(obs: np.ndarray, sim: np.ndarray) -> tuple[float, float]:
    with warnings.catch_warnings():
        # "auto" falls back from the exact to the asymptotic p-value when the exact one
        # cannot be computed; it says so with a RuntimeWarning, which is no news to a caller.
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful", category=RuntimeWarning)
        res = scipy.stats.ks_2samp(obs, sim)
    return float(res.statistic), float(res.pvalue)


def _bootstrap(
    obs: np.ndarray, sim: np.ndarray, seed: int, n_resamples: int, confidence_level: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Percentile intervals of :func:`_statistics`' rows: ``(low, high, undefined_r)``."""
    scale = _power_of_two_scale(obs, sim)
    n = obs.size
    with warnings.catch_warnings():
        # scipy warns of a "degenerate" distribution when an interval is NaN, which only
        # r's can be (a constant resample); that case is handled below.
        warnings.filterwarnings("ignore", category=scipy.stats.DegenerateDataWarning)
        res = scipy.stats.bootstrap(
            (obs / scale, sim / scale),
            _statistics,
            paired=True,
            vectorized=True,
            n_resamples=n_resamples,
            batch=max(1, min(n_resamples, _BATCH_ELEMENTS // n)),
            confidence_level=confidence_level,
            method="percentile",
            **{_RNG_KEYWORD: np.random.default_rng(seed)},
        )
    low = np.array(res.confidence_interval.low, dtype=np.float64)
    high = np.array(res.confidence_interval.high, dtype=np.float64)
    r_dist = res.bootstrap_distribution[_ROW_R]
    defined = np.isfinite(r_dist)
    undefined = int((~defined).sum())
    if undefined and defined.any():
        # The percentile interval of r over the resamples where it is defined.
        alpha = (1.0 - confidence_level) / 2.0
        low[_ROW_R], high[_ROW_R] = np.percentile(r_dist[defined], [100.0 * alpha, 100.0 * (1.0 - alpha)])
    return low, high, undefined


def _uncertain_rating_notes(mape_ci: tuple[float, float] | None, pearson_ci: tuple[float, float] | None, level: float) -> list[str]:
    """Notes for each grade boundary inside a confidence interval: the rating could be either side."""
    notes = []
    pct = f"{level * 100:g}%"
    if mape_ci is not None:
        lo, hi = mape_ci
        for (bound, better), worse in zip(_MAPE_UPPER, RATINGS[1:], strict=True):
            if lo < bound <= hi:
                notes.append(
                    f"MAPE {pct} CI [{lo * 100:.1f}%, {hi * 100:.1f}%] includes the {bound * 100:g}% boundary "
                    f"between {better} and {worse}: the rating is uncertain."
                )
    if pearson_ci is not None:
        lo, hi = pearson_ci
        for (bound, better), worse in zip(_R_LOWER, RATINGS[1:], strict=True):
            if lo <= bound < hi:
                notes.append(
                    f"Pearson r {pct} CI [{lo:.3f}, {hi:.3f}] includes the {bound:g} boundary "
                    f"between {better} and {worse}: the rating is uncertain."
                )
    return notes


def compare_metric(
    metric: str,
    observed: Sequence[float] | np.ndarray,
    simulated: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
) -> MetricComparison:
    """Compare the paired *observed* and *simulated* values (seconds) of *metric*.

    Parameters
    ----------
    metric
        One of :data:`METRICS`.
    observed, simulated
        Equal-length one-dimensional arrays (lists, numpy arrays, pandas Series),
        element ``i`` of both being the same request (for ``itl``, the same token gap).
    seed
        Seeds the bootstrap's :class:`numpy.random.Generator`.
    n_resamples
        Bootstrap resamples (at least 1).
    confidence_level
        Of every interval, strictly between 0 and 1.

    Raises
    ------
    ValueError
        An unknown metric, arrays that do not pair up, or a bad bootstrap setting.

    >>> c = compare_metric("e2e", [1.0, 2.0, 4.0], [1.0, 2.0, 4.0], n_resamples=50)
    >>> c.mape, c.pearson_r, c.ks_statistic, c.ks_pvalue, c.rating
    (0.0, 1.0, 0.0, 1.0, 'excellent')
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be an integer >= 1, got {n_resamples!r}")
    if not isinstance(confidence_level, (int, float)) or not 0.0 < confidence_level < 1.0:
        raise ValueError(f"confidence_level must be strictly between 0 and 1, got {confidence_level!r}")
    obs, sim, non_finite, non_positive = valid_pairs(observed, simulated)
    n = int(obs.size)
    what = "token gaps" if metric == "itl" else "requests"
    notes: list[str] = []
    if non_finite or non_positive:
        total = n + non_finite + non_positive
        reasons = [f"{k} with a NaN or infinite value" for k in (non_finite,) if k]
        reasons += [f"{k} with an observed value <= 0" for k in (non_positive,) if k]
        notes.append(f"Left out {non_finite + non_positive} of {total} pairs: {', '.join(reasons)}.")
    if n == 0:
        notes.append(f"No valid pairs of {metric}: nothing to compare.")
        return MetricComparison(
            metric=metric, n=0, observed=None, simulated=None, mape=None, median_ape=None, bias=None,
            bias_direction=None, pearson_r=None, spearman_r=None,
            percentile_error=dict.fromkeys((k for k, _ in PERCENTILES), None),
            ks_statistic=None, ks_pvalue=None, qq_observed=(), qq_simulated=(),
            confidence_level=float(confidence_level), mape_ci=None, bias_ci=None, pearson_ci=None,
            percentile_error_ci=dict.fromkeys((k for k, _ in PERCENTILES), None),
            rating=None, warnings=tuple(notes),
        )
    if n < MIN_SIGNIFICANT_PAIRS:
        notes.append(f"Insufficient {what} for statistical significance (N < {MIN_SIGNIFICANT_PAIRS}): N = {n}.")

    scale = _power_of_two_scale(obs, sim)
    point = _statistics(obs / scale, sim / scale)
    mape, bias = float(point[_ROW_MAPE]), float(point[_ROW_BIAS])
    pct_keys = [k for k, _ in PERCENTILES]
    percentile_error: dict[str, float | None] = {
        k: float(v) for k, v in zip(pct_keys, point[_ROW_PCT:], strict=True)
    }
    pearson_r = _correlation(obs, sim, ranks=False)
    spearman_r = _correlation(obs, sim, ranks=True)
    if pearson_r is None:
        why = f"only {n} pair{'s' if n > 1 else ''}" if n < 3 else "a side whose values are all equal"
        notes.append(f"Pearson and Spearman r are undefined ({why}): the rating rests on MAPE alone.")

    mape_ci = bias_ci = pearson_ci = None
    percentile_error_ci: dict[str, tuple[float, float] | None] = dict.fromkeys(pct_keys, None)
    if n >= 2:
        low, high, undefined_r = _bootstrap(obs, sim, int(seed), int(n_resamples), float(confidence_level))

        def ci(row: int) -> tuple[float, float]:
            return float(low[row]), float(high[row])

        mape_ci, bias_ci = ci(_ROW_MAPE), ci(_ROW_BIAS)
        percentile_error_ci = {k: ci(_ROW_PCT + i) for i, k in enumerate(pct_keys)}
        if pearson_r is not None and math.isfinite(low[_ROW_R]) and math.isfinite(high[_ROW_R]):
            pearson_ci = ci(_ROW_R)
            if undefined_r:
                notes.append(
                    f"Pearson r was undefined in {undefined_r} of {n_resamples} resamples (all values equal); "
                    "its interval is taken over the others."
                )
    else:
        notes.append("One pair: no confidence intervals (the bootstrap needs at least 2).")

    if bias_ci is None:
        direction = None
    elif bias_ci[0] <= 0.0 <= bias_ci[1]:
        direction = "neutral"
    else:
        direction = "over-predict" if bias_ci[0] > 0.0 else "under-predict"

    notes += _uncertain_rating_notes(mape_ci, pearson_ci, float(confidence_level))
    ks_d, ks_p = _ks(obs, sim)
    probs = (np.arange(QQ_POINTS) + 0.5) / QQ_POINTS
    return MetricComparison(
        metric=metric,
        n=n,
        observed=Quantiles.of(obs),
        simulated=Quantiles.of(sim),
        mape=mape,
        median_ape=float(np.median(np.abs((sim - obs) / obs))),
        bias=bias,
        bias_direction=direction,
        pearson_r=pearson_r,
        spearman_r=spearman_r,
        percentile_error=percentile_error,
        ks_statistic=ks_d,
        ks_pvalue=ks_p,
        qq_observed=tuple(float(v) for v in np.quantile(obs, probs)),
        qq_simulated=tuple(float(v) for v in np.quantile(sim, probs)),
        confidence_level=float(confidence_level),
        mape_ci=mape_ci,
        bias_ci=bias_ci,
        pearson_ci=pearson_ci,
        percentile_error_ci=percentile_error_ci,
        rating=rate(mape, pearson_r),
        warnings=tuple(notes),
    )


def to_dict(comparison: MetricComparison) -> dict[str, Any]:
    """*comparison* as JSON-ready plain data: dicts, lists, floats, ints, strings and ``None``.

    >>> import json
    >>> d = to_dict(compare_metric("e2e", [1.0, 2.0, 4.0], [1.5, 2.0, 3.0], n_resamples=50))
    >>> d["observed"]["p50"], d["mape_ci"] == list(d["mape_ci"]), type(json.dumps(d))
    (2.0, True, <class 'str'>)
    """
    if not isinstance(comparison, MetricComparison):
        raise TypeError(f"to_dict takes a MetricComparison, got {type(comparison).__name__}")
    return _plain(comparison)


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return {f.name: _plain(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value
