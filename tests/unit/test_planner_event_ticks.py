"""The planner's event ticks: a trigger condition that becomes true between two cadence
ticks brings a tick forward to that instant, never closer than ``min_gap_s`` to the
last, and without triggers the ticks are the cadence's."""

from __future__ import annotations

import itertools
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pytest

from simpy_llm import Simulation
from simpy_llm.config.errors import ScenarioError
from simpy_llm.loading import scenario_from_dict

BURST_START_S, BURST_GAP_S, BURST_SIZE = 12.0, 0.01, 80
"""The burst of the trace: requests every 10 ms from 12 s."""


def _trace(path: Path, times: list[float], output_tokens: int = 200) -> str:
    """A CSV trace with a request of 64 prompt tokens at each of *times*."""
    rows = "".join(f"{t:.6f},64,{output_tokens}\n" for t in times)
    path.write_text("arrival_time_s,input_tokens,output_tokens\n" + rows)
    return str(path)


def _scenario(trace: str, ticks: dict | None, *, max_num_seqs: int = 1) -> dict:
    """One Llama-3.1-8B replica (roofline, H100) holding *max_num_seqs* running requests, fed
    *trace*; a planner ticking every 10 s whose ticks evaluate nothing (min_requests is
    never reached), so only their times matter."""
    planner: dict = {"interval_s": 10, "min_requests": 100_000, "candidates": {"max_num_seqs": [max_num_seqs]}}
    if ticks is not None:
        planner["ticks"] = ticks
    return {
        "name": "event_ticks", "seed": 5,
        "workload": {"traces": [{"path": trace, "format": "csv", "slo_class": "chat"}]},
        "serving": {
            "replicas": 1,
            "engine": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 2048, "kv_block_size": 16, "kv_num_blocks": "auto"},
            "latency_model": {"kind": "roofline", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 1}},
        },
        "slo": {"chat": {"ttft_s": 1.0, "tpot_s": 0.05}},
        "planner": planner,
    }


def _burst(path: Path) -> str:
    """Two lone requests, then the burst."""
    return _trace(path, [1.0, 5.0, *(BURST_START_S + i * BURST_GAP_S for i in range(BURST_SIZE))])


def _run(data: dict) -> tuple[Simulation, list[float]]:
    sim = Simulation(scenario_from_dict(data))
    results = sim.run(progress=False)
    return sim, results.planner_decisions()["time_s"].tolist()


def test_a_queue_crossing_between_cadence_ticks_ticks_at_the_crossing(tmp_path: Path):
    """With one running slot, the burst's first request runs (a lone 200-token request
    takes ~0.9 s) and each later one waits, so the queue reaches 64 as the 65th arrives,
    at 12 s + 64 x 10 ms: a tick fires then, between the cadence's ticks at 10 s and 20 s,
    and the cadence counts on from it."""
    sim, times = _run(_scenario(_burst(tmp_path / "t.csv"), {"on": {"queue_over": 64}, "min_gap_s": 1}))
    crossing = float(f"{BURST_START_S + 64 * BURST_GAP_S:.6f}")  # the trace's time of the 65th burst request
    assert times[:3] == [10.0, pytest.approx(crossing, abs=1e-9), pytest.approx(crossing + 10.0, abs=1e-9)]
    assert sim.planner is not None
    assert sim.planner.log.triggers == [(1, pytest.approx(crossing, abs=1e-9), "queue_over", pytest.approx(crossing, abs=1e-9))]


def test_a_crossing_within_min_gap_ticks_when_the_gap_ends(tmp_path: Path):
    """The same crossing with a first tick at 12.5 s and min_gap_s 2: the tick waits until
    14.5 s, and records that its condition became true at the crossing."""
    data = _scenario(_burst(tmp_path / "t.csv"), {"on": {"queue_over": 64}, "min_gap_s": 2})
    data["planner"]["first_tick_s"] = 12.5
    sim, times = _run(data)
    crossing = BURST_START_S + 64 * BURST_GAP_S
    assert times[:2] == [12.5, 14.5]
    assert sim.planner is not None
    assert sim.planner.log.triggers[0] == (1, 14.5, "queue_over", pytest.approx(crossing, abs=1e-9))


def test_an_arrival_burst_ticks_at_its_nth_request(tmp_path: Path):
    """arrival_burst 30 fires as the 30th request since the last tick (10 s) reaches the
    replica: the burst's 30th, at 12 s + 29 x 10 ms; the trigger table shows it."""
    results = Simulation(scenario_from_dict(_scenario(_burst(tmp_path / "t.csv"), {"on": {"arrival_burst": 30}, "min_gap_s": 1}))).run(progress=False)
    nth = BURST_START_S + 29 * BURST_GAP_S
    assert results.planner_decisions()["time_s"].tolist()[1] == pytest.approx(nth, abs=1e-9)
    row = results.subsystems.planner.triggers().iloc[0]
    assert (row["tick"], row["trigger"]) == (1, "arrival_burst")
    assert row["time_s"] == row["condition_s"] == pytest.approx(nth, abs=1e-9)


def test_triggers_that_never_fire_leave_the_cadence_and_records_unchanged(tmp_path: Path):
    """A queue bound the burst never reaches gives the cadence's ticks (10 s apart) and the
    same records as a planner without ticks."""
    trace = _burst(tmp_path / "t.csv")
    with_ticks = Simulation(scenario_from_dict(_scenario(trace, {"on": {"queue_over": 10_000}}))).run(progress=False)
    without = Simulation(scenario_from_dict(_scenario(trace, None))).run(progress=False)
    assert with_ticks.planner_decisions().equals(without.planner_decisions())
    assert with_ticks.to_dataframe().equals(without.to_dataframe())
    assert with_ticks.planner_decisions()["time_s"].tolist()[:3] == [10.0, 20.0, 30.0]


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(
    gaps=st.lists(st.sampled_from([0.001, 0.01, 0.1, 0.5, 2.0]), min_size=5, max_size=120),
    min_gap_s=st.sampled_from([0.25, 1.0, 3.0, 10.0]),
    queue_over=st.integers(1, 6),
    arrival_burst=st.integers(1, 20),
)
def test_no_two_ticks_are_closer_than_min_gap(tmp_path_factory, gaps, min_gap_s, queue_over, arrival_burst):
    """Whatever the arrivals and thresholds, consecutive ticks are at least min_gap_s apart
    and at most interval_s apart while the run goes on."""
    times, t = [], 0.0
    for g in gaps:
        t += g
        times.append(t)
    trace = _trace(tmp_path_factory.mktemp("trace") / "t.csv", times, output_tokens=50)
    ticks = {"on": {"queue_over": queue_over, "arrival_burst": arrival_burst}, "min_gap_s": min_gap_s}
    data = _scenario(trace, ticks, max_num_seqs=2)
    data["planner"]["first_tick_s"] = 0.1  # triggers count from the first tick: start early
    _, tick_times = _run(data)
    steps = [b - a for a, b in itertools.pairwise(tick_times)]
    assert all(min_gap_s - 1e-9 <= s <= 10.0 + 1e-9 for s in steps)


def _problem(data: dict) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    return str(info.value)


def test_a_min_gap_longer_than_the_interval_is_refused(tmp_path: Path):
    """A trigger could never fire before the cadence: refused at its key."""
    data = _scenario(_burst(tmp_path / "t.csv"), {"on": {"queue_over": 4}, "min_gap_s": 11})
    assert "planner.ticks.min_gap_s: 11 exceeds interval_s (10)" in _problem(data)


def test_ticks_without_a_trigger_are_refused(tmp_path: Path):
    """``on`` names at least one trigger; an unknown one is refused."""
    assert "planner.ticks.on: name at least one trigger" in _problem(_scenario(_burst(tmp_path / "t.csv"), {"on": {}}))
    assert "planner.ticks.on.slo_miss: unknown key" in _problem(_scenario(_burst(tmp_path / "a.csv"), {"on": {"slo_miss": 0.2}}))
