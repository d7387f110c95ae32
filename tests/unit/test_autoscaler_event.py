"""The ``event`` scaling policy (``docs/autoscaling.md``): KEDA's ScaledObject on a
queue-length trigger, ``ceil(total / target)`` replicas, and the moves to zero after a
cooldown and back when a poll finds work held."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, load_scenario
from simpy_llm.config import ScenarioError
from simpy_llm.loading import scenario_from_dict, scenario_to_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "autoscaler"
STEP = DATA / "step.yaml"
"""Constant arrivals, 15/s throughout and 30/s more in [100, 400) s; 8 replicas, one active at first."""
ZERO = DATA / "zero.yaml"
"""Two bursts of 2 requests/s, [0, 20) s and [202, 230) s, on 4 replicas that start at zero,
load their weights from local NVMe and unload after 30 s idle; the event policy on the
queue depth, polled every 5 s, with a 60 s cooldown."""


def _step_reference(arrivals: np.ndarray, *, interval: float, lag: float, window: float, sync: float, target: float,
                    low: int, high: int, initial: int, down_s: float, end_s: float) -> list[tuple[float, int, int]]:
    """KEDA's rule written out again on the recorded arrival times: each sample is the arrival
    rate of the whole fleet, a decision recommends ``ceil(mean / target)``, stabilised and
    bounded as HPA does; ``(time, recommended, replicas)`` per decision."""
    samples: list[tuple[float, float]] = []
    recommendations: list[tuple[float, int]] = []
    replicas = initial
    out = []
    t_sample, t_sync = interval, sync
    while min(t_sample, t_sync) <= end_s:
        t = min(t_sample, t_sync)
        if t_sample == t:
            samples.append((t, np.count_nonzero((arrivals > t - interval) & (arrivals <= t)) / interval))
            t_sample += interval
        if t_sync == t:
            seen = [v for s, v in samples if t - lag - window < s <= t - lag]
            rec = math.ceil(sum(seen) / len(seen) / target - 1e-9)
            recommendations.append((t, rec))
            down = max(r for s, r in recommendations if s > t - down_s)
            replicas = min(max(min(max(replicas, rec), down), low), high)
            out.append((t, rec, replicas))
            t_sync += sync
    return out


def test_a_load_step_is_answered_by_the_total_over_the_target():
    """On the step load, every decision recommends ``ceil(fleet arrival rate / 10)`` from the
    lagged window of samples, computed here from the recorded arrivals: 2 replicas for 15/s,
    5 for the 45/s surge, without the overshoot HPA's per-replica formula shows on the same
    lagged samples."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"]["policy"] = {"kind": "event", "params": {"target": 10}}
    run = Simulation(scenario_from_dict(data)).run(progress=False)
    frame = run.autoscaler_decisions()
    arrivals = np.sort(run.to_dataframe()["arrival_s"].to_numpy())
    expected = _step_reference(arrivals, interval=5, lag=10, window=30, sync=15, target=10, low=1, high=8, initial=1,
                               down_s=60, end_s=float(frame["time_s"].iloc[-1]))
    assert list(zip(frame["time_s"], frame["recommended"], frame["replicas"], strict=True)) == expected
    replicas = frame.set_index("time_s")["replicas"]
    assert replicas[30.0] == 2 and replicas.max() == 5 and replicas[450.0] == 5  # held by the 60 s window: 2 at 480
    assert replicas.iloc[-1] == 2


@pytest.fixture(scope="module")
def zero_run():
    """The two-burst scenario, run once: ``(simulation, results)``."""
    sim = Simulation(load_scenario(ZERO))
    return sim, sim.run(progress=False)


def test_the_fleet_goes_to_zero_after_the_cooldown(zero_run):
    """The poll that takes the fleet to zero is the first at least ``cooldown_s`` (60 s) after
    the last poll that saw work (a sample at the same instant reads the same total)."""
    _sim, run = zero_run
    samples = run.autoscaler_log.samples
    decisions = run.autoscaler_decisions()
    to_zero = decisions[(decisions["replicas"] == 0) & (decisions["current"] > 0)]
    assert len(to_zero) == 1
    t_zero = float(to_zero["time_s"].iloc[0])
    last_busy = max(t for t, v, _n in samples if v > 0 and t < t_zero)
    assert t_zero == math.ceil((last_busy + 60) / 5) * 5
    assert [(t, on) for t, i, on in run.autoscaler_log.activity if t == t_zero] == [(t_zero, False)]


def test_the_fleet_comes_back_at_the_next_poll_and_pays_its_cold_start(zero_run):
    """At zero, the requests arriving wait in front of the router until the next poll (every
    5 s) finds them: the fleet activates one replica then, which loads its weights again (its
    30 s warm retention ran out) for as long as its first load took, and the requests held
    are routed to it at that poll in arrival order."""
    sim, run = zero_run
    frame = run.to_dataframe()
    second = frame[frame["arrival_s"] >= 200].sort_values("arrival_s")
    first_arrival = float(second["arrival_s"].iloc[0])
    back = math.ceil(first_arrival / 5) * 5
    assert back > first_arrival  # the burst's first requests wait for the poll
    decisions = run.autoscaler_decisions().set_index("time_s")
    assert decisions.loc[back, "current"] == 0 and decisions.loc[back, "replicas"] == 1
    held = second[second["arrival_s"] <= back]
    assert (held["replica"] == 0).all() and (held["enqueue_s"] >= back).all()
    loads = sim.recorder.cold_starts
    assert [r for r, _a, _b in loads] == [0, 1, 0]
    (_r, start, end), (_r0, start0, end0) = loads[-1], loads[0]
    assert back <= start < back + 0.01 and end - start == pytest.approx(end0 - start0, rel=1e-12)
    assert held["first_token_s"].min() > end


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.floats(5, 150), min_size=1, max_size=3),
    rate=st.sampled_from([0.5, 2.0, 6.0]),
    cooldown=st.sampled_from([0, 10, 40]),
    polling=st.sampled_from([1, 5, 12]),
)
def test_every_request_ends_exactly_once_across_scale_to_zero_cycles(gaps, rate, cooldown, polling):
    """Bursts separated by idle gaps, with any cooldown and polling interval: every request that
    arrived completes, once, whatever the fleet's trips to zero and back."""
    data = scenario_to_dict(load_scenario(ZERO))
    windows, t = [], 0.0
    for gap in gaps:
        windows.append({"start_s": t, "end_s": t + 8.0})
        t += 8.0 + gap
    data["workload"]["aggregate_rate"] = rate
    data["workload"]["horizon_s"] = t
    data["workload"]["clients"][0]["lifecycle"] = {"windows": windows}
    data["autoscaler"]["policy"]["params"].update(cooldown_s=cooldown, polling_interval_s=polling)
    sim = Simulation(scenario_from_dict(data))
    run = sim.run(progress=False)
    frame = run.to_dataframe()
    assert len(frame) == sim.recorder.arrived > 0
    assert frame["request_id"].is_unique
    assert (frame["status"] == "completed").all()
    assert not sim.recorder.live


@pytest.mark.parametrize(("change", "message"), [
    ({"policy": {"kind": "target", "params": {"target": 2}}}, "autoscaler.min_replicas: 0 (scale to zero) needs policy kind 'event'"),
    ({"metric": "running"}, "autoscaler.metric: with min_replicas 0 must be one of queue_depth, in_system"),
    ({"policy": {"kind": "event", "params": {"target": 2, "activation": 3}}}, "params.activation: with min_replicas 0 must be below 1"),
    ({"min_replicas": 1}, "autoscaler.policy.params.activation: acts only on scaling to zero"),
    ({"policy": {"kind": "event", "params": {"target": 0}}}, "autoscaler.policy.params.target"),
    ({"policy": {"kind": "event", "params": {"target": 2, "cooldown": 5}}}, "autoscaler.policy.params.cooldown: unknown key"),
])
def test_bad_event_settings_are_refused_by_key_path(change, message):
    """Each setting the event policy or scale to zero cannot honour is refused by its key path."""
    data = scenario_to_dict(load_scenario(ZERO))
    data["autoscaler"].update(change)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        scenario_from_dict(data)


def test_the_event_policy_refuses_a_latency_metric():
    """A TTFT is not a total over the replicas: the event policy on it is refused by key path."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"].update(metric="ttft_p90", policy={"kind": "event", "params": {"target": 0.1}})
    with pytest.raises(ScenarioError, match=re.escape("autoscaler.metric: policy 'event' scales on a total")):
        scenario_from_dict(data)
