"""When the load generator itself could not keep its schedule (a run's ``saturated`` flag).

:func:`saturation` judges a run from its figures: the schedule delay's p99 (or, under a
concurrency limit, the client lag's), the achieved send rate against the requested one, and
the requests that failed for want of the client's own resources (:func:`client_limited`: no
file descriptor left for a connection, no local port). Those failures come from a client that
fell behind: its requests in flight pile up, each holding a connection, until the process may
open no more. The load generator records each as an ``error`` row, and a run that has any was
not the run the workload asked for, whatever its other figures say. A client whose connections
are capped (:class:`~simpy_llm.observe.client.OpenAIClient`'s *max_connections*) makes such
requests wait for a connection instead: those that waited longer than the threshold are counted too.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest

__all__ = ["CLIENT_LIMIT_ERRNOS", "RATE_SHORTFALL", "SPANS_SHOWN", "SPAN_GAP_S", "behind", "client_limited", "quantile", "saturation", "send_rate"]

RATE_SHORTFALL = 0.05
"""An open-loop run whose achieved send rate is below ``1 - RATE_SHORTFALL`` of the requested
rate saturated the load generator (:func:`saturation`)."""

SPAN_GAP_S = 0.1
"""Late requests whose targets are less than this apart are one span of :func:`behind` (a pause
of the client, or a stretch it spent catching up)."""

SPANS_SHOWN = 3
"""A saturation reason names at most this many spans of late requests, the longest."""

CLIENT_LIMIT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL)
"""The errors of a client out of its own resources: too many open files (the process's limit,
then the system's), and no local address (port) left to connect from."""

_CLIENT_LIMIT_TEXTS = tuple(os.strerror(code) for code in CLIENT_LIMIT_ERRNOS)


def client_limited(message: str | None) -> bool:
    """Whether a request's error *message* says the client ran out of its own resources
    (:data:`CLIENT_LIMIT_ERRNOS`, by their system messages, which both transports keep: the lean
    one as ``OSError: [Errno 24] Too many open files``, aiohttp's as ``... [Too many open files]``).

    >>> client_limited("OSError: [Errno 24] Too many open files"), client_limited("HTTP 429 Too Many Requests")
    (True, False)
    """
    if not message:
        return False
    return any(text in message for text in _CLIENT_LIMIT_TEXTS)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The *q* quantile of *values* (the smallest value with at least ``q`` of them at or below
    it; ``None`` for none).

    >>> quantile([3.0, 1.0, 2.0, 4.0], 0.5), quantile([], 0.99)
    (2.0, None)
    """
    if not values:
        return None
    s = sorted(values)
    return s[min(math.ceil(q * len(s)) - 1, len(s) - 1)] if q > 0 else s[0]


def send_rate(times: Sequence[float]) -> float | None:
    """Events per second between the first and last of *times* (``None`` with fewer than two;
    infinite when they are all at one instant).

    >>> send_rate([0.0, 0.5, 1.0]), send_rate([1.0])
    (2.0, None)
    """
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.inf


def behind(
    records: Iterable[ObservedRequest], threshold_s: float, *, limited: bool = False
) -> tuple[int, tuple[tuple[float, float], ...]]:
    """How many of *records* were sent more than *threshold_s* after their targets, and when: the
    spans of their targets (first, last), late requests less than :data:`SPAN_GAP_S` apart in one
    span. Under a concurrency limit (*limited*) the dispatch is judged instead of the send (the
    waits for a slot are the server's doing), as :func:`saturation` judges the client lag.

    >>> from simpy_llm.observe.client import ObservedRequest
    >>> late = [(0.0, 0.001), (1.0, 0.05), (1.05, 0.02), (3.0, 0.02)]
    >>> behind([ObservedRequest(scheduled_s=t, sent_s=t + d) for t, d in late], 0.010)
    (3, ((1.0, 1.05), (3.0, 3.0)))
    """
    targets = []
    for rec in records:
        target = rec.scheduled_s
        at = rec.dispatched_s if limited else rec.sent_s
        if target is not None and at is not None and at - target > threshold_s:
            targets.append(target)
    targets.sort()
    spans: list[tuple[float, float]] = []
    for t in targets:
        if spans and t - spans[-1][1] < SPAN_GAP_S:
            spans[-1] = (spans[-1][0], t)
        else:
            spans.append((t, t))
    return len(targets), tuple(spans)


def _when(late: int, spans: Sequence[tuple[float, float]]) -> str:
    """The reason's account of *late* requests in *spans*: their number, and the longest spans."""
    if not late or not spans:
        return ""
    longest = sorted(sorted(spans, key=lambda s: s[0] - s[1])[:SPANS_SHOWN])
    shown = ", ".join(f"{a:.2f}-{b:.2f} s" for a, b in longest)
    some = f"the {len(longest)} longest: " if len(spans) > len(longest) else ""
    noun = "span" if len(spans) == 1 else "spans"
    return f" ({late} requests over it, targets in {len(spans)} {noun}; {some}{shown})"


def saturation(
    *,
    delay_p99_s: float | None,
    lag_p99_s: float | None,
    requested_rate: float | None,
    achieved_rate: float | None,
    threshold_s: float,
    limited: bool,
    client_limit_errors: int = 0,
    client_limit_message: str | None = None,
    connection_waits: int = 0,
    late: int = 0,
    late_spans_s: Sequence[tuple[float, float]] = (),
) -> str | None:
    """Why the load generator itself saturated, or ``None`` when it kept the schedule.

    Open loop (*limited* false): the schedule delay's p99 (send - target) above
    *threshold_s*, or an achieved send rate below 95 % of the requested one (not judged
    when every target is at one instant: the requested rate is then infinite). Under a
    concurrency limit the waits for a slot are the server's doing, not the generator's:
    the client lag's p99 (dispatch - target) is judged instead, and the rate is not.
    Either way, *client_limit_errors* requests that failed for want of the client's own
    resources (:func:`client_limited`; *client_limit_message*: the first one's message), and
    *connection_waits* requests that waited longer than *threshold_s* for a connection (the
    client's ``max_connections`` all busy: the client, not the server, held them back).
    *late* and *late_spans_s* (:func:`behind`) say in the reason how many requests were late, and when.

    >>> saturation(delay_p99_s=0.002, lag_p99_s=0.001, requested_rate=100.0, achieved_rate=99.5,
    ...            threshold_s=0.010, limited=False) is None
    True
    >>> saturation(delay_p99_s=0.030, lag_p99_s=0.030, requested_rate=100.0, achieved_rate=80.0,
    ...            threshold_s=0.010, limited=False)
    'schedule delay p99 30.0 ms > 10.0 ms; achieved rate 80.0/s < 95% of the requested 100.0/s'
    >>> saturation(delay_p99_s=0.042, lag_p99_s=0.040, requested_rate=100.0, achieved_rate=99.5, threshold_s=0.010,
    ...            limited=False, late=30, late_spans_s=[(3.91, 4.22), (8.01, 8.02)])
    'schedule delay p99 42.0 ms > 10.0 ms (30 requests over it, targets in 2 spans; 3.91-4.22 s, 8.01-8.02 s)'
    >>> saturation(delay_p99_s=0.002, lag_p99_s=0.001, requested_rate=100.0, achieved_rate=99.5, threshold_s=0.010,
    ...            limited=False, client_limit_errors=3, client_limit_message="OSError: [Errno 24] Too many open files")
    "3 requests failed for want of the client's own resources (the first: OSError: [Errno 24] Too many open files)"
    """
    reasons = []
    delay, name = (lag_p99_s, "client lag") if limited else (delay_p99_s, "schedule delay")
    if delay is not None and delay > threshold_s:
        reasons.append(f"{name} p99 {delay * 1e3:.1f} ms > {threshold_s * 1e3:.1f} ms{_when(late, late_spans_s)}")
    if (
        not limited
        and requested_rate is not None
        and math.isfinite(requested_rate)
        and achieved_rate is not None
        and achieved_rate < (1.0 - RATE_SHORTFALL) * requested_rate
    ):
        reasons.append(
            f"achieved rate {achieved_rate:.1f}/s < {100 * (1 - RATE_SHORTFALL):.0f}% of the requested {requested_rate:.1f}/s"
        )
    if client_limit_errors:
        first = f" (the first: {client_limit_message})" if client_limit_message else ""
        noun = "request" if client_limit_errors == 1 else "requests"
        reasons.append(f"{client_limit_errors} {noun} failed for want of the client's own resources{first}")
    if connection_waits:
        noun = "request" if connection_waits == 1 else "requests"
        reasons.append(
            f"{connection_waits} {noun} waited over {threshold_s * 1e3:.1f} ms for a connection (the client's max_connections)"
        )
    return "; ".join(reasons) or None
