"""The replicas' token listener: one call per output token, at the times the records hold."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import simpy

from simpy_llm import Results, Simulation, scenario_from_dict
from simpy_llm.config.schema import EngineConfig
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from tests.helpers import tiny_scenario


def _calls(data: dict) -> tuple[Results, dict[int, list[tuple[int, float]]]]:
    """Run *data* in event_per_step mode with a listener; the results and the calls per request id."""
    calls: dict[int, list[tuple[int, float]]] = defaultdict(list)
    data["simulation"] = {"mode": "event_per_step"}
    sim = Simulation(scenario_from_dict(data), token_listener=lambda r, n, t: calls[r.id].append((n, t)))
    return sim.run(), calls


def test_one_call_per_token_first_and_last_match_the_records() -> None:
    """Each request gets calls with token counts 1..output_tokens at non-decreasing times,
    the first at its first_token_s and the last at its completion_s, exactly; preempted
    requests included."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 200.0  # crowded: preemptions happen
    results, calls = _calls(data)
    frame = results.to_dataframe()
    assert (frame.num_preemptions > 0).any()
    for row in frame.itertuples():
        got = calls[row.request_id]
        assert [n for n, _ in got] == list(range(1, row.output_tokens + 1))
        times = [t for _, t in got]
        assert times == sorted(times)
        assert times[0] == row.first_token_s and times[-1] == row.completion_s


def test_listener_does_not_change_the_records() -> None:
    """Records with a listener equal the fast mode's records without one."""
    data = tiny_scenario()
    data["workload"]["aggregate_rate"] = 200.0
    results, _ = _calls(data)
    with_listener = results.to_dataframe()
    plain = Simulation(scenario_from_dict(tiny_scenario(workload=data["workload"]))).run().to_dataframe()
    assert with_listener.equals(plain)


def test_listener_needs_the_per_step_mode() -> None:
    """A replica in fast mode refuses a listener (it would miss the tokens of a stretch)."""
    env = simpy.Environment()
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=4, kv_num_blocks=64)
    latency = BlisLinearLatency(beta0_us=1000.0)
    with pytest.raises(ValueError, match="one event per step"):
        Replica(env, 0, simpy.Store(env), engine, latency, Recorder(), fast=True, token_listener=lambda *a: None)


def test_token_times_include_the_output_overhead() -> None:
    """Token i of a lone request is seen at its step's end plus i x alpha2."""
    env = simpy.Environment()
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=4, kv_num_blocks=64)
    latency = BlisLinearLatency(beta0_us=1000.0, beta2_us=100.0, beta1_us=10.0, alpha2_us=50.0)
    seen: list[tuple[int, float]] = []
    inbox = simpy.Store(env)
    rep = Replica(env, 0, inbox, engine, latency, Recorder(), fast=False, token_listener=lambda r, n, t: seen.append((n, t)))
    req = Request(id=0, client_id="c", prompt_tokens=10, output_tokens=3, arrival_s=0.0)
    rep.recorder.on_arrival(req, 0.0)

    inbox.put(req)
    env.run()
    prefill_end = (1000 + 10 * 10) * 1e-6
    expected = [prefill_end + 50e-6, prefill_end + 1100e-6 + 100e-6, prefill_end + 2 * 1100e-6 + 150e-6]
    assert [n for n, _ in seen] == [1, 2, 3]
    assert all(math.isclose(t, e, abs_tol=1e-12) for (_, t), e in zip(seen, expected, strict=True))
