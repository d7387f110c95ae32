"""Output-length predictors: what a policy may believe about a request's output length.

A real gateway does not know how many tokens a request will generate. Policies
that want to act on it (``semi_clairvoyant`` routing, shortest-job-first
scheduling) ask an :class:`OutputPredictor` instead of reading
``request.output_tokens``, so a scenario states how good that knowledge is:

* ``oracle`` returns the true output length (an upper bound on what prediction
  can buy; no real system has it);
* ``noisy`` returns the true length times a log-normal error.

Predictions are *counter-based*: a pure function of ``(seed, request.id)``, so
the same request gets the same prediction wherever and however often it is
asked (by the router and later by a scheduler), independent of call order and
of every random stream of the simulation.

In a scenario the predictor is a nested mapping in a policy's parameters::

    router:
      kind: semi_clairvoyant
      params: {predictor: {kind: noisy, sigma: 0.8, seed: 3}}
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, one_of

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = ["OutputPredictor", "mix64", "unit_uniform"]

_M64 = (1 << 64) - 1
_STANDARD_NORMAL = NormalDist()


def _splitmix64(x: int) -> int:
    """One splitmix64 output for state *x* (a bijective 64-bit mixer)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def mix64(*values: int) -> int:
    """A 64-bit hash of a tuple of integers, identical in every process and on every machine.

    Python's ``hash()`` of a string changes between processes; this does not.
    Each value is taken modulo 2**64 (so negative integers are fine).

    >>> mix64(0, 7)
    7259628554680249319
    >>> mix64(0, 7) == mix64(0, 7) != mix64(7, 0)
    True
    """
    h = 0
    for v in values:
        h = _splitmix64(h ^ (v & _M64))
    return h


def unit_uniform(*values: int) -> float:
    """A number in the open interval (0, 1) determined by *values* (53 random bits).

    >>> 0.0 < unit_uniform(1, 2) < 1.0
    True
    """
    return ((mix64(*values) >> 11) + 0.5) * 2.0**-53


def _noise_applies_only_to_noisy(inst: OutputPredictor, _attr: Any, _given: Any) -> None:
    if inst.kind == "oracle":
        # An oracle has no error; a sigma or seed given with it would change nothing.
        for name in ("sigma", "seed"):
            if getattr(inst, name) != attrs.fields_dict(OutputPredictor)[name].default:
                raise FieldValueError(name, "applies only to kind 'noisy' (an oracle has no error)")


@attrs.frozen(kw_only=True)
class OutputPredictor:
    """Predicts a request's output length, tokens.

    ``noisy`` predictions are ``output_tokens * exp(sigma * Z - sigma**2 / 2)``
    with ``Z`` standard normal: the log error ``log(predicted / true)`` is
    normal with mean ``-sigma**2 / 2`` and standard deviation ``sigma``. The
    shift makes the error *mean-preserving* (``E[predicted] = true``), so sums
    of predictions (a router's ledger of predicted work) are unbiased; the
    median prediction is ``true * exp(-sigma**2 / 2)``. ``Z`` comes from
    ``(seed, request.id)`` alone.

    Examples
    --------
    >>> from simpy_llm.entities import Request
    >>> r = Request(id=4, client_id="c", prompt_tokens=10, output_tokens=200, arrival_s=0.0)
    >>> OutputPredictor(kind="oracle").predict(r)
    200.0
    >>> p = OutputPredictor(kind="noisy", sigma=0.5, seed=1)
    >>> p.predict(r) == p.predict(r) == OutputPredictor(kind="noisy", sigma=0.5, seed=1).predict(r)
    True
    >>> OutputPredictor(kind="noisy", sigma=0.0).predict(r)
    200.0
    """

    kind: str = attrs.field(validator=one_of(("oracle", "noisy")))
    """``oracle`` (the true output length) or ``noisy`` (true length times a log-normal error)."""
    sigma: float = attrs.field(default=0.5, validator=[at_least(0), _noise_applies_only_to_noisy])
    """Standard deviation of the natural-log error (``noisy`` only); 0.5 means typical errors of a factor ~1.6."""
    seed: int = attrs.field(default=0, validator=[at_least(0), _noise_applies_only_to_noisy])
    """Seed of the error (``noisy`` only); predictions depend only on (seed, request id)."""

    def predict(self, request: Request) -> float:
        """Predicted output tokens of *request* (the same answer every time it is asked)."""
        if self.kind == "oracle" or self.sigma == 0.0:
            return float(request.output_tokens)
        return request.output_tokens * self.factor(request)

    def factor(self, request: Request) -> float:
        """The multiplicative error of *request*'s predictions (1 for an oracle): a predictor
        of another true quantity (a service time) applies it the same way.

        >>> from simpy_llm.entities import Request
        >>> r = Request(id=4, client_id="c", prompt_tokens=10, output_tokens=200, arrival_s=0.0)
        >>> p = OutputPredictor(kind="noisy", sigma=0.5, seed=1)
        >>> p.predict(r) == 200 * p.factor(r)
        True
        """
        if self.kind == "oracle" or self.sigma == 0.0:
            return 1.0
        z = _STANDARD_NORMAL.inv_cdf(unit_uniform(self.seed, request.id))
        sigma = self.sigma
        return math.exp(sigma * z - 0.5 * sigma * sigma)
