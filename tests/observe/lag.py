"""Event-loop lag measured during a test run, and the timing allowances derived from it.

Wall-clock checks of the observer (a token reaches the client so long after its due time, a
request reaches the server so long after it was sent) depend on how busy the machine is. Instead
of a fixed tolerance, a test runs a :class:`LagProbe` on the event loop under test and allows,
for each message, what the loop's hold-ups *during that message's own window* can explain.

The probe is a timer on the same loop, due every :data:`PERIOD_S`; it records how late each one
fires (``perf_counter`` seconds). Suppose the loop, or the whole process, is held up from ``a``
to ``b`` (other callbacks running, the process descheduled, a garbage collection). The probe
timer next due after ``a`` is due by ``a + PERIOD_S`` and fires no earlier than ``b``, so a probe
whose span ``[due, fired]`` overlaps the window records a lateness of at least
``b - a - PERIOD_S``. A callback of the code under test that fell due during the hold-up waited
at most that lateness plus ``PERIOD_S``. A message that needs ``turns`` turns of the loop (a
token: the server's timer writes it, the client's read callback stamps it) can meet a hold-up in
each, so it may be late by ``turns * (lateness + PERIOD_S)``, plus :data:`WORK_S` for the work of
the turns themselves. :meth:`LagProbe.allowance_s` is that sum. A message that is late for a
reason of its own (a token held back a step of 15-30 ms) in a window where the loop was not held
up exceeds it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

PERIOD_S = 0.002
"""The probe timer's period, s."""

WORK_S = 0.002
"""The work of a message's own loop turns (a chunk written, read and parsed while a few dozen
streams share the loop: about 0.1-1 ms measured), s."""


class LagProbe:
    """Records the lateness of a timer due every *period_s* on the running loop while active.

    Use as ``async with LagProbe() as probe: ...``; times are ``time.perf_counter()`` seconds.
    """

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self._due: list[float] = []
        self._fired: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._pending_due: float | None = None

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        # A hold-up still in progress at the end is cut short here, not lost.
        now = time.perf_counter()
        if self._pending_due is not None and now > self._pending_due:
            self._due.append(self._pending_due)
            self._fired.append(now)

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            due = self._pending_due = clock() + self.period_s
            await asyncio.sleep(self.period_s)
            self._fired.append(clock())
            self._due.append(due)
            self._pending_due = None

    @property
    def samples(self) -> int:
        """Probe timers recorded."""
        return len(self._due)

    def latenesses_s(self) -> np.ndarray:
        """Every recorded lateness (fired - due), s."""
        return np.asarray(self._fired) - np.asarray(self._due)

    def lateness_s(self, start: float | None = None, end: float | None = None) -> float:
        """The largest lateness of a probe timer whose ``[due, fired]`` overlaps ``[start, end]``
        (the whole run by default), s."""
        due, fired = np.asarray(self._due), np.asarray(self._fired)
        keep = np.ones(len(due), dtype=bool)
        if start is not None:
            keep &= fired >= start
        if end is not None:
            keep &= due <= end
        late = (fired - due)[keep]
        return float(late.max()) if late.size else 0.0

    def allowance_s(self, start: float, end: float, turns: int) -> float:
        """How late a message crossing *turns* loop turns between *start* and *end* may be:
        ``WORK_S + turns * (lateness in the window + period)`` (see the module docstring)."""
        return WORK_S + turns * (self.lateness_s(start, end) + self.period_s)


def perf_minus_loop_s(loop: asyncio.AbstractEventLoop) -> float:
    """``time.perf_counter() - loop.time()``, read back to back (the smallest of a few readings'
    spans; on Linux both clocks are CLOCK_MONOTONIC and this is 0 to within a microsecond)."""
    best = (float("inf"), 0.0)
    for _ in range(5):
        a = time.perf_counter()
        t = loop.time()
        b = time.perf_counter()
        if b - a < best[0]:
            best = (b - a, (a + b) / 2 - t)
    return best[1]
