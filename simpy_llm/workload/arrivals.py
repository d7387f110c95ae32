"""Inter-arrival processes.

An arrival process is a frozen attrs class, at once config
(``{process: gamma, cv: 3.5}``) and sampler: ``gaps(rng, rate, n)`` draws *n*
inter-arrival gaps in seconds for a mean rate *rate* (requests/s). Register
more with ``@arrival_processes.register("name")``.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import numpy as np

from simpy_llm.config.validators import greater_than
from simpy_llm.registry import Registry

__all__ = ["ArrivalProcess", "GammaArrivals", "PoissonArrivals", "arrival_processes"]


class ArrivalProcess(Protocol):
    """What every registered arrival process provides."""

    @property
    def cv(self) -> float:
        """Coefficient of variation of the gaps (std / mean)."""
        ...

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        """Draw *n* inter-arrival gaps (seconds) at mean rate *rate* (1/s)."""
        ...


arrival_processes: Registry[type] = Registry("arrival process")


@arrival_processes.register("poisson")
@attrs.frozen(kw_only=True)
class PoissonArrivals:
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
class GammaArrivals:
    """Gamma gaps with coefficient of variation *cv* (CV > 1 is bursty).

    Shape k = 1 / cv², scale = 1 / (rate k), so the mean gap is 1 / rate.
    """

    cv: float = attrs.field(validator=greater_than(0))
    """Coefficient of variation of the gaps."""

    def gaps(self, rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (rate * shape), n)
