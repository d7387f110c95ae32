"""Arrival processes.

An arrival process is a frozen attrs class, at once config
(``{process: gamma, cv: 3.5}``) and sampler. The generator asks it for
``times(rng, rate, chunk)``: an endless iterator of numpy arrays of
increasing absolute arrival times (seconds, from 0), *chunk* at a time, with
long-run mean rate *rate* (requests/s). Stationary renewal processes only
implement ``gaps(rng, rate, n)`` and inherit ``times`` from
:class:`Renewal`; time-varying processes implement ``times`` themselves.
Register more with ``@arrival_processes.register("name")``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import attrs
import numpy as np

from simpy_llm.config.validators import greater_than
from simpy_llm.registry import Registry

__all__ = ["ArrivalProcess", "GammaArrivals", "PoissonArrivals", "Renewal", "arrival_processes"]


class ArrivalProcess(Protocol):
    """What every registered arrival process provides."""

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        """Endless chunks of *chunk* increasing absolute arrival times (s) at mean rate *rate*."""
        ...


class Renewal:
    """Mixin for stationary renewal processes: ``times`` from cumulative ``gaps``."""

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        """Draw *n* inter-arrival gaps (seconds) at mean rate *rate* (1/s)."""
        raise NotImplementedError

    def times(self, rng: np.random.Generator, rate: float, chunk: int) -> Iterator[np.ndarray]:
        last = 0.0
        while True:
            t = last + np.cumsum(self.gaps(rng, rate, chunk))
            last = float(t[-1])
            yield t


arrival_processes: Registry[type] = Registry("arrival process")


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


@arrival_processes.register("gamma")
@attrs.frozen(kw_only=True)
class GammaArrivals(Renewal):
    """Gamma gaps with coefficient of variation *cv* (CV > 1 is bursty).

    Shape k = 1 / cv², scale = 1 / (rate k), so the mean gap is 1 / rate.
    """

    cv: float = attrs.field(validator=greater_than(0))
    """Coefficient of variation of the gaps."""

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (rate * shape), n)
