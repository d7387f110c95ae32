"""The recorder's per-replica step tallies, its in-system level and its one-value columns: what
the engines report comes out as the same numbers, to the bit, as adding each report when it
came would give, however the recorder keeps them meanwhile."""

from __future__ import annotations

import itertools
import struct
from collections import Counter

import numpy as np
import pytest

from simpy_llm import Request
from simpy_llm.config.schema import ClientConfig
from simpy_llm.metrics.monitors import LevelMonitor
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.rng import RandomStreams
from simpy_llm.workload.arrivals import PoissonArrivals
from simpy_llm.workload.distributions import Constant
from simpy_llm.workload.generator import CHUNK, ClientSource


def _reports(seed: int, n: int, replicas: int) -> list[tuple]:
    """*n* on_steps argument tuples with float times that do not add exactly."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        steps = int(rng.integers(1, 40))
        prefill = int(rng.integers(0, 3)) * int(rng.integers(1, 500))
        out.append((
            int(rng.integers(replicas)), float(rng.uniform(1e-3, 5e-2)), steps, int(rng.integers(1, 300)),
            prefill, int(rng.integers(0, 64)), float(rng.uniform(0, 1e4)),
        ))
    return out


def _by_hand(reports: list[tuple], replicas: int, busy_extra: dict[int, tuple[int, float]]) -> dict[str, object]:
    """The tallies as adding each report in turn gives them (*busy_extra*: at report index k,
    on_busy(replica, seconds))."""
    steps, busy, kv = [0] * replicas, [0.0] * replicas, [0.0] * replicas
    prefill, decode = [0] * replicas, [0] * replicas
    sizes: Counter[int] = Counter()
    for k, (r, step_s, n, size, p, d, kv_s) in enumerate(reports):
        if k in busy_extra:
            busy[busy_extra[k][0]] += busy_extra[k][1]
        steps[r] += n
        busy[r] += step_s * n
        kv[r] += kv_s
        prefill[r] += p * n
        decode[r] += d * n
        sizes[size] += n
    return {"steps": steps, "busy_s": busy, "kv_block_seconds": kv, "prefill_tokens": prefill,
            "decode_tokens": decode, "batch_steps": list(sizes.items())}


def _bits(values: list[float]) -> bytes:
    return struct.pack(f"{len(values)}d", *values)


def test_step_tallies_are_the_reports_added_one_by_one() -> None:
    """Over several of the recorder's flushes, with a busy time added between reports, every
    per-replica tally is what adding each report in turn gives: the same integers, the same
    float bits, and the batch sizes in the order they were first seen."""
    replicas = 3
    reports = _reports(1, 10_000, replicas)
    extra = {5_000: (1, 0.123456789), 9_999: (2, 1e-9)}
    rec = Recorder(num_replicas=replicas)
    for k, report in enumerate(reports):
        if k in extra:
            rec.on_busy(*extra[k])
        rec.on_steps(*report)
    want = _by_hand(reports, replicas, extra)
    assert rec.steps == want["steps"]
    assert rec.prefill_tokens == want["prefill_tokens"]
    assert rec.decode_tokens == want["decode_tokens"]
    assert _bits(rec.busy_s) == _bits(want["busy_s"])  # type: ignore[arg-type]
    assert _bits(rec.kv_block_seconds) == _bits(want["kv_block_seconds"])  # type: ignore[arg-type]
    assert list(rec.batch_steps.items()) == want["batch_steps"]


def test_a_tally_written_between_reports_keeps_their_order() -> None:
    """A component adding to a tally itself between reports (as the speculative verify pool
    adds KV block-seconds) adds after the reports before it and before those after it."""
    rec = Recorder(num_replicas=1)
    rec.on_steps(0, 0.1, 1, 1, 0, 1, 0.1)
    rec.kv_block_seconds[0] += 1e16
    rec.on_steps(0, 0.1, 1, 1, 0, 1, 1.0)
    # In that order: (0.1 + 1.0) + 1e16 would round to another float.
    assert rec.kv_block_seconds[0] == ((0.0 + 0.1) + 1e16) + 1.0 != (0.1 + 1.0) + 1e16


def test_reports_that_are_not_machine_numbers_are_added_as_python_adds_them() -> None:
    """A token count given as a float (no 64-bit integer) still tallies, as Python's + gives it."""
    rec = Recorder(num_replicas=2)
    rec.on_steps(1, 0.5, 2, 3, 1.5, 4, 2.0)
    rec.on_steps(1, 0.25, 1, 3, 0, 1, 1.0)
    assert rec.prefill_tokens == [0, 3.0]
    assert rec.busy_s == [0.0, 1.25]
    assert rec.decode_tokens == [0, 9]
    assert rec.batch_steps == Counter({3: 3})


def test_a_replaced_tally_takes_the_reports_already_made_first() -> None:
    """Setting a tally (as a merge of shards does) adds the pending reports to the old one
    first, and later reports go to the new one."""
    rec = Recorder(num_replicas=1)
    rec.on_steps(0, 0.5, 2, 7, 0, 1, 0.0)
    old = rec.batch_steps
    rec.batch_steps = Counter({1: 1})
    rec.on_steps(0, 0.5, 1, 7, 0, 1, 0.0)
    assert old == Counter({7: 2})
    assert rec.batch_steps == Counter({1: 1, 7: 1})


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
