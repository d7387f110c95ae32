"""The recorder's in-system level and its one-value columns, and a client's rows: kept the
cheap way, they come out as the plain way gives them."""

from __future__ import annotations

import itertools
import struct

import pytest

from simpy_llm import Request
from simpy_llm.config.schema import ClientConfig
from simpy_llm.metrics.monitors import LevelMonitor
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.arrivals import PoissonArrivals
from simpy_llm.workload.distributions import Constant
from simpy_llm.workload.generator import CHUNK, ClientSource


class _Logged(LevelMonitor):
    __slots__ = ("seen",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, int]] = []

    def change(self, now_s: float, delta: int) -> None:
        self.seen.append((now_s, delta))


def test_in_system_level_is_the_monitors_change() -> None:
    """Arrivals and departures move the plain in-system monitor as its own change would, and a
    monitor subclass set in its place gets its own change called."""
    rec, ref = Recorder(), LevelMonitor()
    for i, (t, delta) in enumerate([(0.0, +1), (0.5, +1), (0.5, -1), (2.25, +1), (3.0, -1), (3.0, -1)]):
        if delta > 0:
            rec.on_arrival(Request(id=i, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=t), t)
        else:
            rec.on_departure(t)
        ref.change(t, delta)
    assert (rec.in_system.level, rec.in_system.peak, rec.in_system.area(4.0)) == (ref.level, ref.peak, ref.area(4.0))
    logged = _Logged()
    rec.in_system = logged
    rec.on_arrival(Request(id=9, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=5.0), 5.0)
    rec.on_departure(6.0)
    assert logged.seen == [(5.0, +1), (6.0, -1)]


def test_a_column_read_through_a_function_is_kept_as_one_value() -> None:
    """A record column read through a function (the preemption count, the streaming flag) with
    one value throughout is kept as that value, read once."""
    rec = Recorder()
    for i in range(10):
        req = Request(id=i, client_id="c", prompt_tokens=4, output_tokens=2, arrival_s=float(i), streaming=True)
        rec.on_arrival(req, req.arrival_s)
        rec.on_complete(req)
    assert rec.single_value("num_preemptions") == struct.pack("q", 0)
    assert rec.single_value("streaming") == struct.pack("q", 1)
    req = Request(id=10, client_id="c", prompt_tokens=4, output_tokens=2, arrival_s=10.0, preemption_times_s=[1.0, 2.0])
    rec.on_arrival(req, req.arrival_s)
    rec.on_complete(req)
    assert rec.column_array("num_preemptions").tolist() == [0] * 10 + [2]


@pytest.mark.parametrize("taken", [CHUNK - 1, CHUNK, CHUNK + 1])
def test_a_client_draws_its_next_chunk_when_the_row_after_its_last_is_asked_for(taken: int) -> None:
    """A client's rows draw a chunk of arrivals when its first row is asked for, not before:
    after reading up to a whole chunk its streams have drawn one chunk, one row more draws
    the next."""
    client = ClientConfig(id="a", rate_fraction=1.0, arrival=PoissonArrivals(),
                          input_distribution=Constant(value=10), output_distribution=Constant(value=5))
    streams = RandomStreams(0)
    rows = ClientSource(client, 2.0, streams, 0).rows()
    for _ in range(taken):
        next(rows)
    drawn = streams.stream("workload/a/arrival").bit_generator.state
    expected = RandomStreams(0).stream("workload/a/arrival")
    list(itertools.islice(PoissonArrivals().times(expected, 2.0, CHUNK), 1 if taken <= CHUNK else 2))
    assert drawn == expected.bit_generator.state
