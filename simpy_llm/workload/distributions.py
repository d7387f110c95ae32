"""Token-length distributions.

Each distribution is a frozen attrs class: it is at once the scenario config
(``{type: exponential, params: {mean: 256}}``) and the sampler. Samplers draw
in vectors from a caller-supplied :class:`numpy.random.Generator`, and every
distribution states its ``mean`` and ``variance`` (of the continuous
distribution, before rounding to whole tokens).

Token counts are whole numbers >= 1: :func:`to_tokens` rounds half to even
and clamps at 1. Register a new distribution with
``@length_distributions.register("name")`` on a frozen attrs class that has
``sample(rng, n)``, ``mean`` and ``variance``.
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, greater_than
from simpy_llm.registry import Registry

__all__ = [
    "ClampedGaussian",
    "Constant",
    "Exponential",
    "LengthDistribution",
    "LogNormal",
    "length_distributions",
    "to_tokens",
]


class LengthDistribution(Protocol):
    """What every registered length distribution provides."""

    @property
    def mean(self) -> float: ...

    @property
    def variance(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw *n* values (floats; see :func:`to_tokens`)."""
        ...


length_distributions: Registry[type] = Registry("length distribution")


def to_tokens(values: np.ndarray) -> np.ndarray:
    """Round sampled lengths to whole tokens, at least 1.

    >>> to_tokens(np.array([0.2, 1.5, 2.5, 7.9])).tolist()
    [1, 2, 2, 8]
    """
    return np.maximum(np.rint(values), 1).astype(np.int64)


@length_distributions.register("constant")
@attrs.frozen(kw_only=True)
class Constant:
    """Always *value* tokens.

    >>> Constant(value=64).sample(np.random.default_rng(0), 3).tolist()
    [64.0, 64.0, 64.0]
    """

    value: float = attrs.field(validator=greater_than(0))
    """The length, tokens."""

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
    """Mean length, tokens."""

    @property
    def variance(self) -> float:
        return float(self.mean) ** 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, n)


@length_distributions.register("lognormal")
@attrs.frozen(kw_only=True)
class LogNormal:
    """Log-normal lengths. *mu* and *sigma* describe the **log** of the length.

    The length's own mean is ``exp(mu + sigma**2 / 2)``.

    >>> round(LogNormal(mu=5.0, sigma=0.5).mean, 2)
    168.17
    """

    mu: float = attrs.field(validator=at_least(-1e9))
    """Mean of log(length)."""
    sigma: float = attrs.field(validator=at_least(0))
    """Standard deviation of log(length)."""

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    @property
    def variance(self) -> float:
        return (math.exp(self.sigma**2) - 1) * math.exp(2 * self.mu + self.sigma**2)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, n)


@length_distributions.register("gaussian")
@attrs.frozen(kw_only=True)
class ClampedGaussian:
    """Normal(*mean*, *std_dev*) clamped to [*min*, *max*] (BLIS's legacy model).

    ``mean``/``variance`` report those of the clamped variable, computed from
    the normal's moments over the clipped tails.
    """

    mean_param: float = attrs.field(alias="mean", validator=greater_than(0))
    """Mean of the unclamped normal, tokens (YAML key ``mean``)."""
    std_dev: float = attrs.field(validator=at_least(0))
    """Standard deviation of the unclamped normal, tokens."""
    min: float = attrs.field(default=1.0, validator=at_least(1))
    """Lower clamp, tokens."""
    max: float = attrs.field(default=1e9, validator=at_least(1))
    """Upper clamp, tokens."""

    def __attrs_post_init__(self) -> None:
        if self.min > self.max:
            raise FieldValueError("max", f"must be >= min ({self.min}), got {self.max}")

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
        return np.clip(rng.normal(self.mean_param, self.std_dev, n), self.min, self.max)
