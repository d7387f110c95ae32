"""Token-length distributions.

Kept whole (over 800 lines): one short class per registered distribution, with the registry,
the token rounding and the tail bounds they all share.

Each distribution is a frozen attrs class: it is at once the scenario config
(``{type: exponential, params: {mean: 256}}``) and the sampler. Samplers draw
in vectors from a caller-supplied :class:`numpy.random.Generator`, and every
distribution states its ``mean`` and ``variance`` (of the continuous
distribution, before rounding to whole tokens).

Token counts are whole numbers in [1, :data:`~simpy_llm.config.validators.MAX_TOKENS`]:
:func:`to_tokens` rounds half to even and clamps at 1 (so an unclamped
``normal`` or a ``uniform`` reaching below 1 still yields at least one token)
and at ``MAX_TOKENS`` (a rare draw of a heavy tail, see below). The same
distributions also describe non-token quantities (think times in seconds,
ON/OFF period lengths, reasoning ratios); there the float samples are used as
they are.

Bounds
------
A distribution whose parameters put more than :data:`MAX_TAIL_SHARE` (1%) of
its draws above ``MAX_TOKENS`` is rejected when it is built, naming the
parameter (a log-normal ``mu`` whose median is beyond ``MAX_TOKENS``, an
exponential ``mean`` of a billion): most of what it says would be clamped
away. Within that share, draws above ``MAX_TOKENS`` are clamped by
:func:`to_tokens` rather than rejected, so a heavy tail (``pareto`` with a
small ``alpha``) that rarely draws an enormous value does not stop a long run;
its token counts are those of the tail truncated at ``MAX_TOKENS``. Shape
parameters are bounded where float64 would overflow in the tail
(``sigma <= 20``, Pareto ``alpha >= 0.05``). The built-in samplers that could
overflow check their draws and raise :class:`SamplingError` on NaN or an
infinity (``constant`` and ``empirical`` draw only their own finite values), as
does :func:`to_tokens` for any registered distribution; the simulation reports
it as a :class:`~simpy_llm.config.ScenarioError` naming the distribution's key
path.

Where a parameterisation could be ambiguous the docstring says whether the
parameters describe the variable itself or its logarithm (``lognormal`` and
the log-normal branch of ``pareto_lognormal``: the **log**; everything else:
the variable). ``mean``/``variance`` are ``math.inf`` when the moment does
not exist (Pareto tails with ``alpha <= 1`` / ``<= 2``). Register a new distribution with
``@length_distributions.register("name")`` on a frozen attrs class that has
``sample(rng, n)``, ``mean`` and ``variance``.
"""

from __future__ import annotations

import ast
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import attrs
import numpy as np

from simpy_llm.config.common import LengthDistribution
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.plain import tag_registry
from simpy_llm.config.validators import MAX_TOKENS, at_least, at_most, greater_than, in_range
from simpy_llm.registry import Registry

__all__ = [
    "MAX_LOG_SIGMA",
    "MAX_TAIL_SHARE",
    "MIN_PARETO_ALPHA",
    "ClampedGaussian",
    "Constant",
    "Draws",
    "Empirical",
    "Exponential",
    "Gamma",
    "LengthDistribution",
    "LogNormal",
    "Normal",
    "Pareto",
    "ParetoLogNormal",
    "SamplingError",
    "Uniform",
    "Weibull",
    "draw_tokens",
    "length_distributions",
    "to_tokens",
]

MAX_TAIL_SHARE = 0.01
"""Largest share of a distribution's draws that may lie above ``MAX_TOKENS`` (they are
clamped there); a distribution with more is rejected when built."""

MAX_LOG_SIGMA = 20.0
"""Largest ``sigma`` of a log-normal (of the log of the variable): with ``mu`` in range a
draw then overflows float64 only beyond 34 standard deviations, i.e. never."""

MIN_PARETO_ALPHA = 0.05
"""Smallest Pareto tail index: a draw overflows float64 with probability
``exp(-709.8 * alpha)``, 4e-16 at this bound."""


class SamplingError(ValueError):
    """A distribution drew a value that is not a finite number.

    Attributes
    ----------
    distribution
        The distribution that drew it (None when not known); the simulation uses
        it to name the distribution's key path in the scenario.
    """

    def __init__(self, message: str, distribution: object = None) -> None:
        # Both in args: SimPy re-raises a failed process's exception as type(e)(*e.args).
        super().__init__(message, distribution)
        self.message = message
        self.distribution = distribution

    def __str__(self) -> str:
        return self.message


def _checked(distribution: object, draws: np.ndarray) -> np.ndarray:
    """*draws*, or :class:`SamplingError` if any is NaN or infinite."""
    if not np.isfinite(draws).all():
        bad = draws[~np.isfinite(draws)]
        who = "the distribution" if distribution is None else repr(distribution)
        who = who if len(who) <= 200 else who[:197] + "..."
        raise SamplingError(
            f"{who} drew {bad.size} of {draws.size} values that are not finite numbers "
            f"(first: {float(bad[0])}); its parameters are beyond what float64 can sample",
            distribution,
        )
    return draws


def _unsigned_zero(value: Any) -> Any:
    """-0.0 as 0.0: numpy's samplers refuse a scale whose sign bit is set, though it is >= 0."""
    return 0.0 if isinstance(value, float) and value == 0 else value


def _upper_share(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _check_tail(share: float, field: str, hint: str) -> None:
    """FieldValueError on *field* if *share* of the draws lie above MAX_TOKENS."""
    if share > MAX_TAIL_SHARE:
        raise FieldValueError(
            field,
            f"a share {share:.3g} of the draws would exceed {MAX_TOKENS} (MAX_TOKENS) and be clamped; "
            f"at most {MAX_TAIL_SHARE:g} may: {hint}",
        )


length_distributions: Registry[type] = Registry("length distribution")
tag_registry(length_distributions, "type")  # written back out as {type: NAME, ...}


def to_tokens(values: np.ndarray, distribution: object = None) -> np.ndarray:
    """Round sampled lengths to whole tokens in [1, MAX_TOKENS].

    Draws above ``MAX_TOKENS`` are clamped to it (see the module docstring);
    NaN or an infinity raises :class:`SamplingError` naming *distribution*
    (the one that drew *values*, if given).

    >>> to_tokens(np.array([0.2, 1.5, 2.5, 7.9])).tolist()
    [1, 2, 2, 8]
    >>> to_tokens(np.array([1e30])).tolist()  # clamped to MAX_TOKENS
    [16777216]
    >>> to_tokens(np.array([np.nan]))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    simpy_llm.workload.distributions.SamplingError: the distribution drew 1 of 1 values that are not finite numbers (first: nan);
        its parameters are beyond what float64 can sample
    """
    values = _checked(distribution, np.asarray(values, dtype=float))
    return np.clip(np.rint(values), 1, MAX_TOKENS).astype(np.int64)


def draw_tokens(distribution: LengthDistribution, rng: np.random.Generator, n: int) -> np.ndarray:
    """*n* token counts drawn from *distribution* (:func:`to_tokens` of its samples).

    >>> draw_tokens(Constant(value=7.4), np.random.default_rng(0), 2).tolist()
    [7, 7]
    """
    return to_tokens(distribution.sample(rng, n), distribution)


class Draws:
    """One value at a time of *distribution*, drawn from *rng* in vectors of *chunk*.

    Whole tokens (:func:`to_tokens`) when *tokens*, else the floats as drawn (NaN or an
    infinity raises :class:`SamplingError`). The values come in the order drawn.

    >>> d = Draws(Constant(value=7.4), np.random.default_rng(0), tokens=True, chunk=4)
    >>> [d.next() for _ in range(5)]
    [7, 7, 7, 7, 7]
    """

    __slots__ = ("_buffer", "chunk", "distribution", "rng", "tokens")

    def __init__(self, distribution: LengthDistribution, rng: np.random.Generator, *, tokens: bool, chunk: int = 256) -> None:
        self.distribution = distribution
        self.rng = rng
        self.tokens = tokens
        self.chunk = chunk
        self._buffer: list = []

    def next(self) -> float:
        """The next value."""
        if not self._buffer:
            values = self.distribution.sample(self.rng, self.chunk)
            if self.tokens:
                values = to_tokens(values, self.distribution)
            else:
                values = _checked(self.distribution, np.asarray(values, dtype=np.float64))
            self._buffer = values[::-1].tolist()  # pop() from the end: drawn order
        return self._buffer.pop()


@length_distributions.register("constant")
@attrs.frozen(kw_only=True)
class Constant:
    """Always *value* tokens.

    >>> Constant(value=64).sample(np.random.default_rng(0), 3).tolist()
    [64.0, 64.0, 64.0]
    """

    value: float = attrs.field(validator=[greater_than(0), at_most(MAX_TOKENS)])
    """The length, tokens (at most ``MAX_TOKENS``)."""

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def variance(self) -> float:
        return 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))


@length_distributions.register("exponential")
@attrs.frozen(kw_only=True)
class Exponential:
    """Exponential lengths with the given *mean* (ServeGen's output-length model)."""

    mean: float = attrs.field(validator=greater_than(0))
    """Mean length, tokens (at most ``MAX_TOKENS / ln 100``, so at most 1% of draws exceed ``MAX_TOKENS``)."""

    def __attrs_post_init__(self) -> None:
        limit = MAX_TOKENS / math.log(1 / MAX_TAIL_SHARE)
        _check_tail(math.exp(-MAX_TOKENS / self.mean), "mean", f"mean must be <= {limit:.8g}")

    @property
    def variance(self) -> float:
        return float(self.mean) ** 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, rng.exponential(self.mean, n))


@length_distributions.register("lognormal")
@attrs.frozen(kw_only=True)
class LogNormal:
    """Log-normal lengths. *mu* and *sigma* describe the **log** of the length.

    The length's own mean is ``exp(mu + sigma**2 / 2)``.

    >>> round(LogNormal(mu=5.0, sigma=0.5).mean, 2)
    168.17
    """

    mu: float = attrs.field(validator=at_least(-1e9))
    """Mean of log(length); ``mu + 2.33 sigma <= ln MAX_TOKENS`` (at most 1% of draws above it)."""
    sigma: float = attrs.field(converter=_unsigned_zero, validator=[at_least(0), at_most(MAX_LOG_SIGMA)])
    """Standard deviation of log(length), at most ``MAX_LOG_SIGMA``."""

    def __attrs_post_init__(self) -> None:
        _check_tail(_lognormal_share(self.mu, self.sigma), "mu", f"mu + 2.33 sigma must be <= ln {MAX_TOKENS} = {math.log(MAX_TOKENS):.4f}")

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    @property
    def variance(self) -> float:
        return (math.exp(self.sigma**2) - 1) * math.exp(2 * self.mu + self.sigma**2)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, rng.lognormal(self.mu, self.sigma, n))


def _lognormal_share(mu: float, sigma: float) -> float:
    """P(X > MAX_TOKENS) for log X ~ Normal(mu, sigma)."""
    gap = math.log(MAX_TOKENS) - mu
    if sigma == 0:
        return 0.0 if gap >= 0 else 1.0
    return _upper_share(gap / sigma)


@length_distributions.register("gaussian")
@attrs.frozen(kw_only=True)
class ClampedGaussian:
    """Normal(*mean*, *std_dev*) clamped to [*min*, *max*] (BLIS's legacy model).

    ``mean``/``variance`` report those of the clamped variable, computed from
    the normal's moments over the clipped tails.
    """

    mean_param: float = attrs.field(alias="mean", validator=greater_than(0))
    """Mean of the unclamped normal, tokens (YAML key ``mean``)."""
    std_dev: float = attrs.field(converter=_unsigned_zero, validator=at_least(0))
    """Standard deviation of the unclamped normal, tokens."""
    min: float = attrs.field(default=1.0, validator=at_least(1))
    """Lower clamp, tokens."""
    max: float = attrs.field(default=1e9, validator=at_least(1))
    """Upper clamp, tokens."""

    def __attrs_post_init__(self) -> None:
        if self.min > self.max:
            raise FieldValueError("max", f"must be >= min ({self.min}), got {self.max}")
        if self.max > MAX_TOKENS:  # draws are clamped to [min, max] first
            m, s = self.mean_param, self.std_dev
            share = (1.0 if m > MAX_TOKENS else 0.0) if s == 0 else _upper_share((MAX_TOKENS - m) / s)
            _check_tail(share, "mean", f"mean + 2.33 std_dev must be <= {MAX_TOKENS}, or max <= {MAX_TOKENS}")

    def _moments(self) -> tuple[float, float]:
        from scipy import stats

        m, s, lo, hi = self.mean_param, self.std_dev, self.min, self.max
        if s == 0:
            v = min(max(m, lo), hi)
            return v, 0.0
        a, b = (lo - m) / s, (hi - m) / s
        pa, pb = stats.norm.cdf(a), stats.norm.cdf(b)
        tn = stats.truncnorm(a, b, loc=m, scale=s)
        mid = pb - pa
        e1 = lo * pa + hi * (1 - pb) + (tn.mean() * mid if mid > 0 else 0.0)
        e2 = lo**2 * pa + hi**2 * (1 - pb) + ((tn.var() + tn.mean() ** 2) * mid if mid > 0 else 0.0)
        return float(e1), float(max(e2 - e1**2, 0.0))

    @property
    def mean(self) -> float:
        return self._moments()[0]

    @property
    def variance(self) -> float:
        return self._moments()[1]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, np.clip(rng.normal(self.mean_param, self.std_dev, n), self.min, self.max))


_finite = at_least(-math.inf)
"""Any finite number (the validator rejects NaN and infinities)."""


def _pareto_moment(alpha: float, xm: float, k: int) -> float:
    """E[X**k] of the classical Pareto(alpha, xm); ``inf`` when alpha <= k."""
    return alpha * xm**k / (alpha - k) if alpha > k else math.inf


def _pareto_share(alpha: float, xm: float) -> float:
    """P(X > MAX_TOKENS) for the classical Pareto(alpha, xm)."""
    return 1.0 if xm >= MAX_TOKENS else math.exp(alpha * (math.log(xm) - math.log(MAX_TOKENS)))


def _pareto_tail(alpha: float, xm: float) -> tuple[float, str, str]:
    """(share above MAX_TOKENS, the parameter to name, a hint) for Pareto(alpha, xm)."""
    if xm >= MAX_TOKENS:
        return 1.0, "xm", f"xm must be < {MAX_TOKENS}"
    return _pareto_share(alpha, xm), "alpha", f"(xm / {MAX_TOKENS}) ** alpha must be <= {MAX_TAIL_SHARE:g}"


def _pareto_sample(rng: np.random.Generator, alpha: float, xm: float, n: int) -> np.ndarray:
    # numpy's pareto is the Lomax (Pareto II, minimum 0): shift and scale to the classical one.
    with np.errstate(over="ignore"):  # an overflow becomes inf, which the caller's check reports
        return xm * (1.0 + rng.pareto(alpha, n))


@length_distributions.register("uniform")
@attrs.frozen(kw_only=True)
class Uniform:
    """Uniform on [*low*, *high*); the parameters are the variable's bounds.

    >>> d = Uniform(low=100, high=300)
    >>> d.mean, round(d.variance, 2)
    (200.0, 3333.33)
    """

    low: float = attrs.field(validator=in_range(-MAX_TOKENS, MAX_TOKENS))
    """Lower bound, in [-MAX_TOKENS, MAX_TOKENS]."""
    high: float = attrs.field(validator=in_range(-MAX_TOKENS, MAX_TOKENS))
    """Upper bound (> low), in [-MAX_TOKENS, MAX_TOKENS]."""

    def __attrs_post_init__(self) -> None:
        if not self.high > self.low:
            raise FieldValueError("high", f"must be > low ({self.low}), got {self.high}")

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def variance(self) -> float:
        return (self.high - self.low) ** 2 / 12

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, rng.uniform(self.low, self.high, n))


@length_distributions.register("normal")
@attrs.frozen(kw_only=True)
class Normal:
    """Normal(*mean*, *std_dev*) of the variable itself, **not** clamped.

    Draws below 1 become 1 token when rounded (:func:`to_tokens`), so token
    counts are biased upward when ``mean`` is within a few ``std_dev`` of 1;
    use ``gaussian`` (clamped, with exact clamped moments) for that case.
    ``mean``/``variance`` are those of the unclamped normal.
    """

    mean: float = attrs.field(validator=in_range(-MAX_TOKENS, MAX_TOKENS))
    """Mean of the variable, in [-MAX_TOKENS, MAX_TOKENS]."""
    std_dev: float = attrs.field(converter=_unsigned_zero, validator=at_least(0))
    """Standard deviation of the variable (``mean + 2.33 std_dev <= MAX_TOKENS``)."""

    def __attrs_post_init__(self) -> None:
        share = 0.0 if self.std_dev == 0 else _upper_share((MAX_TOKENS - self.mean) / self.std_dev)
        _check_tail(share, "std_dev", f"mean + 2.33 std_dev must be <= {MAX_TOKENS}")

    @property
    def variance(self) -> float:
        return float(self.std_dev) ** 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, rng.normal(self.mean, self.std_dev, n))


@length_distributions.register("pareto")
@attrs.frozen(kw_only=True)
class Pareto:
    """Classical Pareto: P(X > x) = (xm / x)**alpha for x >= xm (the variable, not its log).

    numpy's ``Generator.pareto`` is the Lomax distribution (minimum 0); this
    samples ``xm * (1 + pareto(alpha))``, which is scipy's ``pareto(b=alpha,
    scale=xm)``. The mean is infinite for alpha <= 1, the variance for
    alpha <= 2 (reported as ``math.inf``).

    >>> Pareto(alpha=3, xm=100).mean
    150.0
    >>> Pareto(alpha=1.5, xm=100).variance
    inf
    """

    alpha: float = attrs.field(validator=[greater_than(0), at_least(MIN_PARETO_ALPHA)])
    """Tail index, at least ``MIN_PARETO_ALPHA``."""
    xm: float = attrs.field(validator=greater_than(0))
    """Minimum (scale); ``(xm / MAX_TOKENS) ** alpha <= 0.01`` (at most 1% of draws above it)."""

    def __attrs_post_init__(self) -> None:
        _check_tail(*_pareto_tail(self.alpha, self.xm))

    @property
    def mean(self) -> float:
        return _pareto_moment(self.alpha, self.xm, 1)

    @property
    def variance(self) -> float:
        if self.alpha <= 2:
            return math.inf
        a = self.alpha
        return self.xm**2 * a / ((a - 1) ** 2 * (a - 2))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, _pareto_sample(rng, self.alpha, self.xm, n))


class _Moments(NamedTuple):
    mean: float
    variance: float


@length_distributions.register("pareto_lognormal")
@attrs.frozen(kw_only=True)
class ParetoLogNormal:
    """Mixture: with probability *mix_weight* a classical Pareto(*alpha*, *xm*), else a log-normal.

    The Pareto branch is as in :class:`Pareto` (parameters of the variable);
    *mu* and *sigma* of the log-normal branch describe the **log** of the
    variable, as in :class:`LogNormal`. Mean/variance follow the law of total
    variance and are ``math.inf`` when the Pareto branch has weight > 0 and
    alpha <= 1 (mean) or alpha <= 2 (variance).

    >>> d = ParetoLogNormal(alpha=3, xm=100, mu=5, sigma=0, mix_weight=0.5)
    >>> round(d.mean, 3)  # (150 + e**5) / 2
    149.207
    """

    alpha: float = attrs.field(validator=[greater_than(0), at_least(MIN_PARETO_ALPHA)])
    """Tail index of the Pareto branch, at least ``MIN_PARETO_ALPHA``."""
    xm: float = attrs.field(validator=greater_than(0))
    """Minimum of the Pareto branch."""
    mu: float = attrs.field(validator=_finite)
    """Mean of log(variable) in the log-normal branch."""
    sigma: float = attrs.field(converter=_unsigned_zero, validator=[at_least(0), at_most(MAX_LOG_SIGMA)])
    """Standard deviation of log(variable) in the log-normal branch, at most ``MAX_LOG_SIGMA``."""
    mix_weight: float = attrs.field(validator=in_range(0.0, 1.0))
    """Probability of the Pareto branch."""

    def __attrs_post_init__(self) -> None:
        if self.mu > math.log(MAX_TOKENS):  # also keeps the branch's draws inside float64
            raise FieldValueError(
                "mu", f"the log-normal branch's median e**mu must be <= {MAX_TOKENS} (mu <= {math.log(MAX_TOKENS):.4f}), got {self.mu!r}"
            )
        w = self.mix_weight
        pareto_share, pareto_key, pareto_hint = _pareto_tail(self.alpha, self.xm)
        lognormal_share = _lognormal_share(self.mu, self.sigma)
        share = w * pareto_share + (1 - w) * lognormal_share
        if w * pareto_share >= (1 - w) * lognormal_share:
            _check_tail(share, pareto_key, f"in the Pareto branch, {pareto_hint}")
        else:
            _check_tail(share, "mu", f"in the log-normal branch, mu + 2.33 sigma must be <= {math.log(MAX_TOKENS):.4f}")

    def _branches(self) -> tuple[_Moments, _Moments]:
        # Moments only: a branch alone may break the bounds the mixture meets (a rare branch
        # may put most of its own draws above MAX_TOKENS), so no LogNormal/Pareto is built.
        mu, s2, a, xm = self.mu, self.sigma**2, self.alpha, self.xm
        lognormal = _Moments(math.exp(mu + s2 / 2), (math.exp(s2) - 1) * math.exp(2 * mu + s2))
        pareto_variance = math.inf if a <= 2 else xm**2 * a / ((a - 1) ** 2 * (a - 2))
        return lognormal, _Moments(_pareto_moment(a, xm, 1), pareto_variance)

    @property
    def mean(self) -> float:
        w = self.mix_weight
        lognormal, pareto = self._branches()
        if w == 0:
            return lognormal.mean
        if w == 1:
            return pareto.mean
        return w * pareto.mean + (1 - w) * lognormal.mean

    @property
    def variance(self) -> float:
        w = self.mix_weight
        lognormal, pareto = self._branches()
        if w == 0:
            return lognormal.variance
        if w == 1:
            return pareto.variance
        if not math.isfinite(pareto.variance):
            return math.inf
        between = w * (1 - w) * (pareto.mean - lognormal.mean) ** 2
        return w * pareto.variance + (1 - w) * lognormal.variance + between

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        use_pareto = rng.random(n) < self.mix_weight
        with np.errstate(over="ignore"):  # an unused branch may overflow; the used one is checked
            pareto = _pareto_sample(rng, self.alpha, self.xm, n)
            lognormal = rng.lognormal(self.mu, self.sigma, n)
        return _checked(self, np.where(use_pareto, pareto, lognormal))


@length_distributions.register("weibull")
@attrs.frozen(kw_only=True)
class Weibull:
    """Weibull with *shape* k and *scale* lambda of the variable: P(X > x) = exp(-(x/lambda)**k).

    >>> round(Weibull(shape=1, scale=200).mean, 6)  # shape 1 is the exponential
    200.0
    """

    shape: float = attrs.field(validator=greater_than(0))
    """Shape k."""
    scale: float = attrs.field(validator=greater_than(0))
    """Scale lambda; ``exp(-(MAX_TOKENS / scale) ** k) <= 0.01`` (at most 1% of draws above ``MAX_TOKENS``)."""

    def __attrs_post_init__(self) -> None:
        power = self.shape * (math.log(MAX_TOKENS) - math.log(self.scale))  # log of (MAX_TOKENS / scale) ** k
        share = 0.0 if power > 700 else math.exp(-math.exp(power))
        _check_tail(share, "scale", f"scale * (ln 100) ** (1 / shape) must be <= {MAX_TOKENS}")

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1 + 1 / self.shape)

    @property
    def variance(self) -> float:
        g1 = math.gamma(1 + 1 / self.shape)
        g2 = math.gamma(1 + 2 / self.shape)
        return self.scale**2 * (g2 - g1**2)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        with np.errstate(over="ignore"):  # an overflow becomes inf, which _checked reports
            return _checked(self, self.scale * rng.weibull(self.shape, n))


@length_distributions.register("gamma")
@attrs.frozen(kw_only=True)
class Gamma:
    """Gamma with *shape* k and *scale* theta of the variable (mean k theta, variance k theta**2).

    >>> d = Gamma(shape=2, scale=50)
    >>> d.mean, d.variance
    (100.0, 5000.0)
    """

    shape: float = attrs.field(validator=greater_than(0))
    """Shape k."""
    scale: float = attrs.field(validator=greater_than(0))
    """Scale theta (at most 1% of draws above ``MAX_TOKENS``)."""

    def __attrs_post_init__(self) -> None:
        from scipy import special

        share = float(special.gammaincc(self.shape, MAX_TOKENS / self.scale))
        _check_tail(share, "scale", f"the gamma's 99% quantile must be <= {MAX_TOKENS}")

    @property
    def mean(self) -> float:
        return float(self.shape * self.scale)

    @property
    def variance(self) -> float:
        return float(self.shape * self.scale**2)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _checked(self, rng.gamma(self.shape, self.scale, n))


# --------------------------------------------------------------------------- empirical


def _pmf_number(value: Any, field: str, what: str, text_ok: bool = False) -> float:
    """*value* as a finite float, or FieldValueError on *field* naming *what* it is.

    With *text_ok* a numeric string is accepted (JSON object keys are strings).
    """
    if text_ok and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise FieldValueError(field, f"{what} {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FieldValueError(field, f"{what} {value!r} is not a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise FieldValueError(field, f"{what} must be a finite number, got {value!r}")
    return number


def _checked_pmf(values: Iterable[Any], probabilities: Iterable[Any], field_v: str, field_p: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Validated floats and probabilities normalised to sum to 1."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise FieldValueError(field_v, f"must be a list of numbers, got {values!r}")
    if isinstance(probabilities, (str, bytes, Mapping)) or not isinstance(probabilities, Iterable):
        raise FieldValueError(field_p, f"must be a list of numbers, got {probabilities!r}")
    raw_values, raw_probabilities = list(values), list(probabilities)
    if not raw_values:
        raise FieldValueError(field_v, "must not be empty")
    if len(raw_probabilities) != len(raw_values):
        raise FieldValueError(field_p, f"must have one entry per value ({len(raw_values)}), got {len(raw_probabilities)}")
    vs = tuple(_pmf_number(v, field_v, "value") for v in raw_values)
    ps = tuple(_pmf_number(p, field_p, f"probability of {v:g}") for v, p in zip(vs, raw_probabilities, strict=True))
    for v, p in zip(vs, ps, strict=True):
        if p < 0:
            raise FieldValueError(field_p, f"probability of {v:g} must be >= 0, got {p!r}")
    total = math.fsum(ps)
    if not total > 0:
        raise FieldValueError(field_p, "probabilities sum to 0; at least one must be > 0")
    above = math.fsum(p for v, p in zip(vs, ps, strict=True) if v > MAX_TOKENS) / total
    _check_tail(above, field_v, f"values above {MAX_TOKENS} may carry at most {MAX_TAIL_SHARE:g} of the probability")
    return vs, tuple(p / total for p in ps)


def _pmf_from_mapping(pmf: Any, field: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(values sorted ascending, normalised probabilities) from ``{value: probability}``."""
    if not isinstance(pmf, Mapping):
        raise FieldValueError(field, f"must be a mapping of value -> probability, got {type(pmf).__name__}")
    items = [(_pmf_number(k, field, "value", text_ok=True), p) for k, p in pmf.items()]
    items.sort(key=lambda kv: kv[0])
    return _checked_pmf([k for k, _ in items], [p for _, p in items], field, field)


def _parse_pmf_text(text: str, field: str, where: str = "") -> Mapping[Any, Any]:
    """Parse ServeGen's PMF string (a Python dict literal) with ``ast.literal_eval`` (never eval)."""
    expected = "expected a dict literal of numbers such as '{128: 0.5, 256: 0.5}'"
    try:
        pmf = ast.literal_eval(text.strip())
    except SyntaxError as exc:
        raise FieldValueError(field, f"{where}malformed PMF string ({expected}): {exc.msg}") from None
    except (ValueError, TypeError, MemoryError, RecursionError):
        raise FieldValueError(field, f"{where}malformed PMF string ({expected}); only literal numbers are allowed") from None
    if not isinstance(pmf, dict):
        raise FieldValueError(field, f"{where}malformed PMF string ({expected}), got a {type(pmf).__name__}")
    return pmf


def _read_pmf_file(path: str, key: Any) -> Mapping[Any, Any]:
    """The PMF stored in a JSON file (optionally under *key*)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise FieldValueError("file", f"cannot read PMF file {path}: {exc.strerror or exc}") from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = text  # not JSON: a bare dict literal, as in ServeGen's strings
    if key is not None:
        keys = [key] if isinstance(key, str) else key
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise FieldValueError("key", f"must be a string or a list of strings, got {key!r}")
        for k in keys:
            if not isinstance(data, Mapping) or k not in data:
                raise FieldValueError("key", f"PMF file {path} has no entry {k!r} at this level")
            data = data[k]
    if isinstance(data, str):
        return _parse_pmf_text(data, "file", f"PMF file {path}: ")
    if not isinstance(data, Mapping):
        raise FieldValueError("file", f"PMF file {path} must hold a JSON object of value -> probability or a PMF string, got {type(data).__name__}")
    return data


@length_distributions.register("empirical")
@attrs.frozen(kw_only=True)
class Empirical:
    """A discrete distribution: *values* with *probabilities* (normalised to sum to 1).

    Sampled by inverse CDF (``np.searchsorted`` of uniform draws on the
    cumulative probabilities), in vectors. YAML forms (``params``):

    * ``{pmf: {128: 0.5, 256: 0.5}}`` -- inline value -> probability (the
      mapping may also be ServeGen's string form ``"{128: 0.5, 256: 0.5}"``);
    * ``{file: path}`` -- a JSON file holding an object value -> probability or
      ServeGen's PMF string (a Python dict literal inside a JSON string, parsed
      with ``ast.literal_eval``); optional ``key`` (a string or list of
      strings) selects an entry inside the JSON first, e.g. ``key: ["0",
      input_tokens]`` for a ServeGen ``chunk-*-dataset.json``. Relative paths
      are relative to the scenario file;
    * ``{values: [...], probabilities: [...]}`` -- the fields themselves (the
      form :func:`~simpy_llm.config.scenario_to_dict` writes).

    >>> d = Empirical.from_pmf({128: 1, 256: 3})
    >>> d.probabilities, d.mean
    ((0.25, 0.75), 224.0)
    >>> sorted(set(d.sample(np.random.default_rng(0), 1000).tolist()))
    [128.0, 256.0]
    """

    values: tuple[float, ...]
    """Support points."""
    probabilities: tuple[float, ...]
    """Probability of each value (any non-negative weights; stored normalised)."""

    def __attrs_post_init__(self) -> None:
        values, probabilities = _checked_pmf(self.values, self.probabilities, "values", "probabilities")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "probabilities", probabilities)

    @classmethod
    def from_pmf(cls, pmf: Mapping[Any, Any]) -> Empirical:
        """From a mapping value -> probability (weight); values are sorted ascending."""
        values, probabilities = _pmf_from_mapping(pmf, "pmf")
        return cls(values=values, probabilities=probabilities)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Empirical:
        """From YAML ``params``: exactly one of ``pmf``, ``file`` (+ ``key``), or ``values`` + ``probabilities``.

        Raises :class:`FieldValueError` naming the offending key.
        """
        allowed = ("pmf", "file", "key", "values", "probabilities")
        for k in params:
            if k not in allowed:
                raise FieldValueError(str(k), f"unknown key for empirical; allowed: {', '.join(allowed)}")
        forms = [f for f in ("pmf", "file", "values") if f in params]
        if "probabilities" in params and "values" not in params:
            raise FieldValueError("values", "required with probabilities")
        if len(forms) != 1:
            raise FieldValueError(
                forms[1] if len(forms) > 1 else "pmf",
                "give exactly one of pmf (value -> probability), file (a PMF file) or values + probabilities",
            )
        if "key" in params and forms[0] != "file":
            raise FieldValueError("key", "only used with file")
        form = forms[0]
        if form == "values":
            if "probabilities" not in params:
                raise FieldValueError("probabilities", "required with values")
            return cls(values=params["values"], probabilities=params["probabilities"])
        if form == "pmf":
            pmf = params["pmf"]
            if isinstance(pmf, str):
                pmf = _parse_pmf_text(pmf, "pmf")
            return cls.from_pmf(pmf)
        path = params["file"]
        if not isinstance(path, str) or not path:
            raise FieldValueError("file", f"must be a file path, got {path!r}")
        path = resolve_path(path)
        pmf = _read_pmf_file(path, params.get("key"))
        try:
            return cls.from_pmf(pmf)
        except FieldValueError as exc:
            raise FieldValueError("file", f"PMF file {path}: {exc.message}") from None

    @property
    def mean(self) -> float:
        v, p = np.asarray(self.values), np.asarray(self.probabilities)
        return float(np.dot(v, p))

    @property
    def variance(self) -> float:
        v, p = np.asarray(self.values), np.asarray(self.probabilities)
        return float(np.dot((v - np.dot(v, p)) ** 2, p))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        cdf = np.cumsum(self.probabilities)
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        return np.asarray(self.values, dtype=float)[np.minimum(idx, len(cdf) - 1)]  # finite by construction
