"""Closed forms for request-level batching with uniform service times (seed 001 §1.4).

A request-level batch server serves ``B`` requests together and stays busy until
the slowest of them finishes, so a batch's service time is the *maximum* of its
requests' service times. With service times i.i.d. ``U(a, b)`` and requests
sorted into ``k`` equal-mass bins by their (exactly known) service time, each
bin batching only its own requests, the expected batch service time under a
saturated server is

    E[S_batch] = a + (b - a) * ((k - 1) / (2k) + B / (k (B + 1)))

and the saturated throughput is ``B / E[S_batch]`` requests per second. As
``k`` grows a batch's requests become alike, the maximum approaches the mean,
and the throughput approaches ``c_max = B / E[S] = 2B / (a + b)``.

Every function here is pure arithmetic: no SimPy, no randomness. The
derivation, its assumptions and what breaks them are in ``docs/batching.md``.
"""

from __future__ import annotations

import operator

__all__ = ["expected_batch_service_s", "max_throughput", "saturated_throughput"]


def _check_batch_params(a: float, b: float, batch_size: int, bins: int | None = None) -> None:
    if not 0.0 <= a <= b:
        raise ValueError(f"service times must satisfy 0 <= a <= b, got a={a!r}, b={b!r}")
    if b <= 0.0:
        raise ValueError(f"the largest service time b must be > 0, got {b!r}")
    for name, value in (("batch_size", batch_size), ("bins", bins)):
        if value is None:
            continue
        if isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, got {value!r}")
        try:
            as_int = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an integer, got {value!r}") from None
        if as_int < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")


def expected_batch_service_s(a: float, b: float, batch_size: int, bins: int) -> float:
    """Expected service time (s) of a batch of ``batch_size`` requests under ``bins`` equal-mass bins.

    Service times are i.i.d. ``U(a, b)`` seconds, the batch takes as long as its
    slowest request, and the server is saturated (it always has a full batch to
    serve, batches served in formation order).

    Derivation, in short: the maximum of ``B`` i.i.d. uniforms on an interval
    ``[lo, lo + w]`` has mean ``lo + w B / (B + 1)``. Equal-mass bins of
    ``U(a, b)`` are the intervals of width ``w = (b - a) / k`` starting at
    ``a + i w`` (``i = 0 .. k-1``), and a request in bin ``i`` is uniform on it.
    Each bin receives ``1/k`` of the requests and so forms ``1/k`` of the
    batches; averaging the per-bin means with equal weights,

        E = a + w (0 + 1 + ... + (k-1)) / k + w B / (B + 1)
          = a + (b - a) ((k - 1) / (2k) + B / (k (B + 1))),

    equivalently ``(a + b) / 2 + (b - a) (B - 1) / (2k (B + 1))``: the mean
    service time plus a penalty that falls as ``1/k`` (and is zero for ``B = 1``).

    Parameters
    ----------
    a, b
        Smallest and largest service time of a request, s (``0 <= a <= b``, ``b > 0``).
    batch_size
        Requests per batch ``B`` (>= 1).
    bins
        Number of equal-mass bins ``k`` (>= 1); ``k = 1`` is plain FIFO batching.

    Examples
    --------
    One bin: the expected maximum of B uniforms on the whole range.

    >>> expected_batch_service_s(1.0, 3.0, batch_size=8, bins=1)  # 1 + 2 * 8/9
    2.7777777777777777

    Four bins shorten it towards the mean service time of 2 s:

    >>> round(expected_batch_service_s(1.0, 3.0, batch_size=8, bins=4), 12)  # 2 + 2 * 7 / (2*4*9)
    2.194444444444
    """
    _check_batch_params(a, b, batch_size, bins)
    k = float(bins)
    B = float(batch_size)
    return a + (b - a) * ((k - 1.0) / (2.0 * k) + B / (k * (B + 1.0)))


def saturated_throughput(a: float, b: float, batch_size: int, bins: int) -> float:
    """Requests per second of a saturated batch server: ``B / E[S_batch]``.

    The server serves batches back to back; each carries ``B`` requests and
    takes ``E[S_batch]`` seconds on average (:func:`expected_batch_service_s`),
    so by the renewal-reward theorem its long-run rate is their ratio.

    >>> round(saturated_throughput(1.0, 3.0, batch_size=8, bins=1), 12)  # 8 / (25/9)
    2.88
    """
    _check_batch_params(a, b, batch_size, bins)
    return batch_size / expected_batch_service_s(a, b, batch_size, bins)


def max_throughput(a: float, b: float, batch_size: int) -> float:
    """The ``k -> inf`` limit of :func:`saturated_throughput`: ``c_max = B / E[S] = 2B / (a + b)``.

    With infinitely narrow bins every request of a batch has the same service
    time, so a batch takes the mean service time ``(a + b) / 2``.

    >>> max_throughput(1.0, 3.0, batch_size=8)
    4.0
    """
    _check_batch_params(a, b, batch_size)
    return batch_size / ((a + b) / 2.0)
