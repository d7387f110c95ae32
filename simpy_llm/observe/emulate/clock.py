"""Run a SimPy environment in wall-clock time, driven from an asyncio event loop.

Simulated time ``t`` happens at ``start + t`` on the event loop's clock
(``loop.time()``, monotonic). A timer (``loop.call_at``) stays armed for the
next scheduled event; when it fires, every event due by then is processed in
SimPy's order and the timer is re-armed. Everything runs on the loop's thread,
between the HTTP handlers, so the simulation needs no lock.

``simpy.rt.RealtimeEnvironment`` is not used: its ``step()`` waits with
``time.sleep``, which would block the loop that serves the HTTP requests, and
running it in a thread would need a lock around every injected request.

External events (a request arriving over HTTP) are injected at
:meth:`RealtimeDriver.arrival_time_s`: the first whole microsecond after both
the wall clock and ``env.now``. Whole microseconds are what a trace v2 stores,
so replaying the arrivals offline gives the same times to the bit; strictly
after ``env.now`` means no event of that instant has been processed yet, so
the arrival comes first at its instant, as a workload generator's would.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import simpy

__all__ = ["RealtimeDriver"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class RealtimeDriver:
    """Processes the events of *env* when the wall clock reaches their simulated time.

    Parameters
    ----------
    env
        The environment (a plain :class:`simpy.Environment`; only this driver may step it).
    on_error
        Called once, with the exception, if a simulation step raises (the driver then stops).

    Examples
    --------
    >>> import asyncio, simpy
    >>> env = simpy.Environment()
    >>> seen = []
    >>> def tick():
    ...     yield env.timeout(0.02)
    ...     seen.append(env.now)
    >>> _ = env.process(tick())
    >>> async def main():
    ...     driver = RealtimeDriver(env)
    ...     driver.start()
    ...     await asyncio.sleep(0.05)  # the timeout is processed when the wall clock reaches 0.02 s
    ...     t = driver.arrival_time_s()  # an external event now: a whole microsecond, after 0.05 s
    ...     driver.close()
    ...     return t
    >>> t = asyncio.run(main())
    >>> seen, t >= 0.05, round(t * 1e6) == t * 1e6
    ([0.02], True, True)
    """

    def __init__(self, env: simpy.Environment, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.env = env
        self.on_error = on_error
        self.error: BaseException | None = None
        """The exception a simulation step raised (the driver stops when one does)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s = math.inf
        self.timer_fires = 0
        """Times the timer fired (each processes the events due by then)."""
        self.lateness_max_s = 0.0
        """The most the timer fired after its event's wall-clock time: how far behind the
        simulation the machine held the server (a busy machine's hold-ups land here)."""
        self.lateness_total_s = 0.0
        """Lateness summed over every firing (over :attr:`timer_fires`, the mean)."""

    # --- clock -----------------------------------------------------------
    def start(self) -> None:
        """Start on the running loop: the environment's current time is now."""
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time() - self.env.now
        self.advance()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the driver has not been started")
        return self._loop

    def now_s(self) -> float:
        """Simulated seconds corresponding to the wall clock now."""
        return self.loop.time() - self._start

    def loop_time(self, t_s: float) -> float:
        """The ``loop.time()`` at which simulated time *t_s* happens."""
        return self._start + t_s

    async def sleep_until(self, t_s: float) -> None:
        """Wait until the wall clock reaches simulated time *t_s* (at once if it has)."""
        delay = self._start + t_s - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    # --- stepping --------------------------------------------------------
    def advance(self) -> None:
        """Process every event due by now, then re-arm the timer."""
        self._guard(self._process_through, self.now_s())

    def arrival_time_s(self) -> float:
        """Bring the environment to the time of an external event happening now, and return it.

        The time is the first whole microsecond after both the wall clock and
        ``env.now``; every event before it is processed, none at it.
        """
        env = self.env
        t = (math.floor(max(self.now_s(), env.now) * 1e6) + 1) / 1e6
        self._guard(env.run, t)
        return t

    def settle(self) -> None:
        """Process what an injected event set off at ``env.now``, then re-arm the timer."""
        self._guard(self._process_through, self.env.now)

    def close(self) -> None:
        """Stop the timer (the environment keeps its state)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._armed_s = math.inf

    # --- internals -------------------------------------------------------
    def _process_through(self, t_s: float) -> None:
        env = self.env
        step = env.step
        while env.peek() <= t_s:
            step()

    def _guard(self, fn: Callable[[float], _T], arg: float) -> None:
        if self.error is not None:
            raise RuntimeError("the simulation stopped after an error") from self.error
        try:
            fn(arg)
        except Exception as exc:
            # A broken simulation cannot go on: keep the cause for every later caller.
            self.error = exc
            self.close()
            if self.on_error is not None:
                self.on_error(exc)
            raise
        self._arm()

    def _arm(self) -> None:
        t = self.env.peek()
        if t == self._armed_s:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_s = t
        if t != math.inf:
            self._timer = self.loop.call_at(self._start + t, self._fire)

    def timing(self) -> dict[str, float | int]:
        """How punctually the timer fired, as plain data (the served trace's ``emulator_timing``).

        >>> import simpy
        >>> RealtimeDriver(simpy.Environment()).timing()
        {'timer_fires': 0, 'lateness_mean_ms': 0.0, 'lateness_max_ms': 0.0}
        """
        mean_s = self.lateness_total_s / self.timer_fires if self.timer_fires else 0.0
        return {"timer_fires": self.timer_fires, "lateness_mean_ms": round(mean_s * 1e3, 4),
                "lateness_max_ms": round(self.lateness_max_s * 1e3, 4)}

    def _fire(self) -> None:
        late = self.loop.time() - (self._start + self._armed_s)
        self.timer_fires += 1
        self.lateness_total_s += late
        if late > self.lateness_max_s:
            self.lateness_max_s = late
        self._timer = None
        self._armed_s = math.inf
        try:
            self.advance()
        except Exception:
            _log.exception("the emulated server's simulation failed")
