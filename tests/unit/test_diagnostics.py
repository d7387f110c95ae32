"""Run diagnostics: each fires on the run it describes and stays quiet on a healthy one."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from simpy_llm import Simulation, load_scenario, scenario_from_dict
from simpy_llm.metrics.diagnostics import (
    Diagnostic,
    _mean_context_tokens,
    _mean_context_tokens_array,
    _time_weighted_medians,
    diagnose,
    idle_engine,
    overload,
)
from simpy_llm.serving.hardware import model_spec

# One replica of at most 8 requests, steps of 5 ms + 10 µs per prefill token + 100 µs per
# decode token. With 50-token prompts and 20-token answers a full batch finishes a
# request every (5.8 ms x 20 steps + 8 x 0.5 ms of prefill) / 8 ≈ 15 ms: ~66 requests/s.
_ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "kv_block_size": 16, "kv_num_blocks": 1024}
_STEP = {"beta0_us": 5000.0, "beta1_us": 10.0, "beta2_us": 100.0}
_LENGTHS = {
    "input_distribution": {"type": "constant", "params": {"value": 50}},
    "output_distribution": {"type": "constant", "params": {"value": 20}},
}


def _scenario(rate: float, horizon_s: float, *, burst: dict[str, Any] | None = None, **latency: Any) -> dict[str, Any]:
    clients = [{"id": "base", "rate_fraction": rate, "arrival": {"process": "poisson"}, **_LENGTHS}]
    if burst is not None:
        clients.append({"id": "burst", **burst, **_LENGTHS})
    return {
        "seed": 3,
        "workload": {
            "aggregate_rate": rate + (burst["rate_fraction"] if burst else 0.0),
            "horizon_s": horizon_s,
            "clients": clients,
        },
        "serving": {
            "replicas": 1,
            "engine": dict(_ENGINE),
            "latency_model": {"kind": "blis_linear", "params": {**_STEP, **latency}},
        },
    }


def _run(data: dict[str, Any]):
    return Simulation(scenario_from_dict(copy.deepcopy(data))).run()


def _codes(results) -> list[str]:
    return [d.code for d in diagnose(results)]


# --- overload -------------------------------------------------------------------------
def test_overload_fires_on_a_run_offered_more_than_capacity():
    """90 requests/s offered to a replica that serves ~66/s: the waiting queue grows all run,
    and the reported excess share matches 1 - (start rate / arrival rate) measured
    independently over the saturated last two thirds."""
    res = _run(_scenario(90.0, 30.0))
    found = overload(res)
    assert found is not None and found.severity == "warning"
    fig = found.figures
    w1, w2, w3 = (fig[f"waiting_median_{third}_third"] for third in ("first", "middle", "last"))
    assert w1 < w2 < w3
    c = res.columns
    a0, a1 = c["arrival_s"].min(), c["arrival_s"].max()
    t = a0 + (a1 - a0) / 3
    started = ((c["first_scheduled_s"] >= t) & (c["first_scheduled_s"] <= a1)).sum()
    arrived = ((c["arrival_s"] >= t) & (c["arrival_s"] <= a1)).sum()
    assert found.figures["excess_share"] == pytest.approx(1 - started / arrived, abs=0.04)
    assert found.figures["excess_share"] > 0.2
    assert "overload" in _codes(res)


def test_overload_fires_when_the_run_is_cut_with_requests_never_scheduled():
    """With until_s, the last arrivals of an overloaded run are never scheduled; they count
    as waiting to the end, so the queue's growth is still seen."""
    data = _scenario(90.0, 30.0)
    data["simulation"] = {"until_s": 30.0}
    res = _run(data)
    assert (res.columns["status"] == "in_flight").sum() > 100
    assert overload(res) is not None


def test_overload_quiet_on_a_stable_run_with_a_short_burst_near_its_end():
    """40 requests/s (60 % of capacity) for 90 s, plus a 5 s burst of 60 more per second in
    the last third: the burst builds a real queue (seconds of queueing delay) that drains
    in a few seconds, which is not overload."""
    burst = {
        "rate_fraction": 60.0 * 5 / 90,  # 300 requests over a 90 s cycle
        "arrival": {
            "process": "windows",
            "window_s": 20.0,
            "windows": [{"start_s": 0.0, "rate": 0.0}, {"start_s": 65.0, "rate": 1.0}, {"start_s": 70.0, "rate": 0.0}],
        },
    }
    res = _run(_scenario(40.0, 90.0, burst=burst))
    delay = res.derived()["queue_delay_s"]
    assert np.nanmax(delay) > 1.0  # the burst did congest the replica
    assert overload(res) is None
    assert "overload" not in _codes(res)


def test_overload_quiet_on_a_stable_run():
    """60 % of capacity without bursts: no overload."""
    assert overload(_run(_scenario(40.0, 30.0))) is None


def test_overload_not_judged_on_a_run_too_short_to_tell():
    """Fewer than 300 arrivals: the queue's trend is not judged, however loaded."""
    res = _run(_scenario(200.0, 1.0))
    assert len(res) < 300
    assert overload(res) is None


def test_time_weighted_medians_of_a_hand_made_queue():
    """Intervals [0, 4), [1, 2), [5, 10) give levels 1, 2, 1, 0, 1: over [0, 3) the level is
    1 for 2 s and 2 for 1 s (median 1); over [3, 6) it is 1, 0, 1 for 1 s each (median 1);
    over [4, 5) it is 0."""
    start = np.array([0.0, 1.0, 5.0])
    end = np.array([4.0, 2.0, 10.0])
    assert _time_weighted_medians(start, end, np.array([0.0, 3.0, 6.0])) == [1.0, 1.0]
    assert _time_weighted_medians(start, end, np.array([4.0, 5.0])) == [0.0]
    assert _time_weighted_medians(start, np.array([np.inf, np.inf, np.inf]), np.array([6.0, 7.0])) == [3.0]



def _medians_over_every_event(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> list[float]:
    """The time-weighted medians as first written: every event of the run in one sorted
    array, every spell clipped to each third (a reference that shares no code)."""
    times = np.concatenate([start, end])
    deltas = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    order = np.argsort(times, kind="stable")
    times = times[order]
    levels = np.concatenate([[0.0], np.cumsum(deltas[order])])
    bounds = np.concatenate([[-np.inf], times, [np.inf]])
    out = []
    for a, b in itertools.pairwise(edges):
        durations = np.clip(bounds[1:], a, b) - np.clip(bounds[:-1], a, b)
        keep = durations > 0
        lv, du = levels[keep], durations[keep]
        by_level = np.argsort(lv, kind="stable")
        cum = np.cumsum(du[by_level])
        out.append(float(lv[by_level][np.searchsorted(cum, 0.5 * cum[-1])]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_time_weighted_medians_equal_those_over_every_event_to_the_bit(seed: int) -> None:
    """Looking only at the events inside each third gives the medians of the whole-run
    computation exactly, with tied times (rounded to a grid), spells of zero length, events
    on the thirds' edges and spells never ended."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    start = np.round(rng.uniform(0.0, 100.0, n), int(rng.integers(0, 3)))
    end = start + np.round(rng.exponential(rng.uniform(0.1, 30.0), n), int(rng.integers(0, 3)))
    end[rng.random(n) < 0.1] = np.inf
    edges = np.linspace(float(start.min()), float(start.max()) + 1.0, 4)
    if seed % 2:
        edges = np.array([0.0, 25.0, 50.0, 100.0])  # edges on the grid of the event times
    assert _time_weighted_medians(start, end, edges) == _medians_over_every_event(start, end, edges)



@pytest.mark.parametrize("seed", range(20))
def test_time_weighted_medians_taken_a_few_events_at_a_time_equal_those_over_every_event(seed: int) -> None:
    """The counting sort of the spells, a block of 1 to 7 events at a time, gives the
    whole-run medians to the bit, also for intervals that end before they start (counts
    below zero)."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 300))
    start = np.round(rng.uniform(0.0, 100.0, n), int(rng.integers(0, 3)))
    end = start + np.round(rng.exponential(rng.uniform(0.1, 30.0), n), int(rng.integers(0, 3)))
    end[rng.random(n) < 0.1] = np.inf
    if seed % 4 == 3:
        end[rng.random(n) < 0.3] -= 40.0
    edges = np.linspace(float(start.min()), float(start.max()) + 1.0, 4)
    block = int(rng.integers(1, 8))
    assert _time_weighted_medians(start, end, edges, block=block) == _medians_over_every_event(start, end, edges)


@pytest.mark.parametrize("streamed", [False, True])
def test_the_mean_context_summed_as_integers_is_numpys_mean_of_the_contexts(tmp_path: Path, streamed: bool) -> None:
    """The latency-model check's mean context (prompt plus half the output of each served
    request), summed as integers part by part, is numpy's mean of every context to the bit,
    in memory and streamed, with dropped requests left out."""
    scenario = load_scenario("scenarios/quickstart.yaml", {
        "workload.num_requests": 3000, "workload.aggregate_rate": 60.0,
        "serving.admission": {"kind": "max_queue", "params": {"max_waiting": 20}}})
    results = Simulation(scenario, **({"stream_to": tmp_path, "stream_chunk_requests": 512} if streamed else {})).run(progress=False)
    assert results.summary()["requests"]["dropped"] > 0
    fast = _mean_context_tokens(results)
    assert np.float64(fast).tobytes() == np.float64(_mean_context_tokens_array(results)).tobytes()
    assert fast > 0

# --- latency models -------------------------------------------------------------------
def test_post_processing_dominates_when_the_token_overhead_exceeds_the_decode_step():
    """alpha2 = 8 ms against decode steps of ~5.5 ms fires; alpha2 = 1 ms does not."""
    found = [d for d in diagnose(_run(_scenario(40.0, 10.0, alpha2_us=8000.0))) if d.code == "post_processing_dominates"]
    assert len(found) == 1
    fig = found[0].figures
    assert fig["output_token_overhead_s"] == pytest.approx(0.008)
    assert 0.005 < fig["decode_step_s"] < 0.0058  # 5 ms + 0.1 ms per request of a batch of 1..8
    assert "8.00 ms per output token" in found[0].message
    assert "post_processing_dominates" not in _codes(_run(_scenario(40.0, 10.0, alpha2_us=1000.0)))


def test_blis_h100_tp4_row_is_flagged_and_tp2_is_not():
    """Llama-3.1-8B on H100: BLIS's TP4 fit (42 µs intercept, 6 ms per output token) gets both
    model warnings, and its 48 µs steps leave the engine idle at 20 requests/s; the TP2 fit
    (6.9 ms intercept, 1.8 ms per token) gets none."""
    data = _scenario(20.0, 10.0)
    data["serving"]["latency_model"] = {
        "kind": "blis_linear",
        "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 4},
    }
    tp4 = {d.code: d for d in diagnose(_run(data))}
    assert set(tp4) == {"step_below_weight_read", "post_processing_dominates", "idle_engine"}
    weight = tp4["step_below_weight_read"].figures
    assert weight["one_request_step_s"] == pytest.approx((41.8 + 5.91) * 1e-6)
    # Every weight but the embedding table (128256 x 4096), bf16, a quarter per GPU, at 3.35 TB/s;
    # the 64 all-reduces of one token's 8 KiB add about 2 µs.
    params = model_spec("llama-3.1-8b-instruct").param_count
    read_s = (params - 128256 * 4096) * 2 / 4 / 3.35e12
    assert weight["weight_read_s"] == pytest.approx(read_s, rel=0.01)
    data["serving"]["latency_model"]["params"]["tp"] = 2
    assert _codes(_run(data)) == []


def test_roofline_never_steps_below_a_weight_read():
    """The roofline's decode step includes the weight read, so it is never flagged."""
    data = _scenario(20.0, 10.0)
    data["serving"]["latency_model"] = {
        "kind": "roofline",
        "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 4},
    }
    assert "step_below_weight_read" not in _codes(_run(data))


def test_model_warnings_name_only_the_odd_group_of_a_fleet():
    """A fleet of a TP4 group and a TP2 group: only the TP4 group is flagged, once though it
    has two replicas."""
    data = _scenario(20.0, 10.0)
    serving = data["serving"]
    profile = {"model": "llama-3.1-8b-instruct", "gpu": "H100"}
    data["serving"] = {
        "replica_groups": [
            {"name": "tp4", "count": 2, "engine": serving["engine"],
             "latency_model": {"kind": "blis_linear", "params": {**profile, "tp": 4}}},
            {"name": "tp2", "count": 1, "engine": serving["engine"],
             "latency_model": {"kind": "blis_linear", "params": {**profile, "tp": 2}}},
        ],
    }
    found = [d for d in diagnose(_run(data)) if d.code != "idle_engine"]
    assert [(d.code, d.group) for d in found] == [
        ("step_below_weight_read", "tp4"),
        ("post_processing_dominates", "tp4"),
    ]


# --- idle engines ---------------------------------------------------------------------
def test_idle_engine_on_a_mostly_idle_replica():
    """0.5 requests/s of ~0.13 s of engine work each keep the replica busy ~6.5 %: not idle;
    0.2 requests/s (~2.6 %) are reported as information, with the utilisation."""
    busy = _run(_scenario(0.5, 200.0))
    assert idle_engine(busy) is None
    res = _run(_scenario(0.2, 200.0))
    found = idle_engine(res)
    assert found is not None and found.severity == "info"
    utilization = sum(res._recorder.busy_s) / res.end_s
    assert found.figures["gpu_utilization_mean"] == pytest.approx(utilization)
    assert 0.01 < utilization < 0.05
    assert _codes(res) == ["idle_engine"]


# --- the record ---------------------------------------------------------------------------
def test_diagnostics_are_frozen_json_ready_records():
    """A run with every diagnostic: each is a frozen record whose figures are plain floats
    and whose dict form survives JSON."""
    data = _scenario(90.0, 30.0, alpha2_us=8000.0)
    found = diagnose(_run(data))
    assert [d.code for d in found] == ["overload", "post_processing_dominates"]
    for d in found:
        assert all(type(v) is float for v in d.figures.values())
        assert json.loads(json.dumps(d.to_dict())) == d.to_dict()
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            d.code = "x"  # type: ignore[misc]


def test_diagnostic_severity_is_checked():
    """Only warning and info are severities."""
    with pytest.raises(ValueError, match="severity"):
        Diagnostic(code="x", severity="error", message="m")

