"""The real-time driver: a SimPy environment stepped by the asyncio loop's clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import simpy

from simpy_llm.observe.emulate.clock import RealtimeDriver


def test_events_are_never_processed_before_their_time() -> None:
    """Each timeout's process runs at a wall time no earlier than its simulated time."""
    env = simpy.Environment()
    driver = RealtimeDriver(env)
    seen: list[tuple[float, float]] = []

    def proc(delay: float) -> Any:
        yield env.timeout(delay)
        seen.append((env.now, driver.now_s()))

    async def main() -> None:
        for d in (0.01, 0.03, 0.02):
            env.process(proc(d))
        driver.start()
        await asyncio.sleep(0.06)
        driver.close()

    asyncio.run(main())
    assert [t for t, _ in seen] == [0.01, 0.02, 0.03]
    assert all(wall >= t for t, wall in seen)


def test_arrival_times_are_distinct_whole_microseconds_after_now() -> None:
    """Arrival times are whole microseconds, strictly after env.now and each other, and the
    environment is brought to them: earlier events are processed, none at that instant."""
    env = simpy.Environment()
    driver = RealtimeDriver(env)
    processed: list[float] = []

    def at(t: float) -> Any:
        yield env.timeout(t)
        processed.append(t)

    async def main() -> list[float]:
        driver.start()
        await asyncio.sleep(0.01)
        t0 = driver.arrival_time_s()
        env.process(at(0.0))  # starts at t0 and is processed there
        env.process(at(1.0))  # far in the future
        times = [t0] + [driver.arrival_time_s() for _ in range(5)]
        driver.close()
        return times

    times = asyncio.run(main())
    assert all(round(t * 1e6) / 1e6 == t for t in times)
    assert times == sorted(set(times)) and times[0] >= 0.01
    assert env.now == times[-1] and processed == [0.0]


def test_a_failing_step_stops_the_driver_and_reports_once() -> None:
    """An exception in a simulation step is kept, reported to on_error, and re-raised to later callers."""
    env = simpy.Environment()
    errors: list[BaseException] = []
    driver = RealtimeDriver(env, on_error=errors.append)

    def broken() -> Any:
        yield env.timeout(0.005)
        raise ValueError("boom")

    async def main() -> None:
        env.process(broken())
        driver.start()
        await asyncio.sleep(0.03)

    asyncio.run(main())
    assert isinstance(driver.error, ValueError) and errors == [driver.error]
    with pytest.raises(RuntimeError, match="stopped after an error"):
        driver.settle()
