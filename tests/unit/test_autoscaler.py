"""The autoscaler (``docs/autoscaling.md``): a metric sampled, seen late and averaged, a
scaling policy, Kubernetes' stabilisation windows, and the fleet's active pool resized."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from simpy_llm import Simulation, load_scenario
from simpy_llm.config import ScenarioError
from simpy_llm.loading import scenario_from_dict, scenario_to_dict

STEP = Path(__file__).resolve().parents[1] / "data" / "autoscaler" / "step.yaml"
"""Constant arrivals, 15/s throughout and 30/s more in [100, 400) s; 8 replicas, one active at
first; the autoscaler watches the arrival rate per replica against a target of 10."""


def _reference(arrivals: np.ndarray, *, interval: float, lag: float, window: float, sync: float, target: float,
               tolerance: float, low: int, high: int, initial: int, down_s: float, end_s: float) -> list[tuple[float, int, int]]:
    """The autoscaler's rules written out again from docs/autoscaling.md, on the recorded arrival
    times: ``(time, recommended, replicas)`` per decision."""
    samples: list[tuple[float, float]] = []
    recommendations: list[tuple[float, int]] = []
    replicas = initial
    out = []
    t_sample, t_sync = interval, sync
    while min(t_sample, t_sync) <= end_s:
        t = min(t_sample, t_sync)
        if t_sample == t:
            routed = np.count_nonzero((arrivals > t - interval) & (arrivals <= t))
            samples.append((t, routed / interval / replicas))
            t_sample += interval
        if t_sync == t:
            seen = [v for s, v in samples if t - lag - window < s <= t - lag]
            if seen:
                ratio = sum(seen) / len(seen) / target
                rec = replicas if abs(ratio - 1) <= tolerance else math.ceil(replicas * ratio - 1e-9)
                recommendations.append((t, rec))
                down = max(r for s, r in recommendations if s > t - down_s)
                stabilized = min(max(replicas, rec), down)
                replicas = min(max(stabilized, low), high)
                out.append((t, rec, replicas))
            t_sync += sync
    return out


@pytest.fixture(scope="module")
def step_run():
    """The step scenario, run once."""
    return Simulation(load_scenario(STEP)).run(progress=False)


def test_a_step_in_load_is_answered_as_the_rules_say(step_run):
    """Against the rules written out independently on the recorded arrivals: every decision's
    recommendation and resulting replica count agree. The lag shows: the surge at 100 s moves
    the pool at 135 s (to 4), at 150 s samples taken with 2 replicas are read against 4 and the
    pool overshoots to the maximum of 8 where 5 carry 45/s, and the 60 s stabilisation holds it
    there before it settles at 5."""
    frame = step_run.autoscaler_decisions()
    arrivals = np.sort(step_run.to_dataframe()["arrival_s"].to_numpy())
    expected = _reference(arrivals, interval=5, lag=10, window=30, sync=15, target=10, tolerance=0.1, low=1, high=8,
                          initial=1, down_s=60, end_s=float(frame["time_s"].iloc[-1]))
    got = list(zip(frame["time_s"], frame["recommended"], frame["replicas"], strict=True))
    assert got == expected
    replicas = frame.set_index("time_s")["replicas"]
    assert replicas[120.0] == 2 and replicas[135.0] == 4 and replicas[150.0] == 8
    assert replicas[165.0:225.0].tolist()[:4] == [8, 8, 8, 8] and replicas[300.0] == 5


def test_requests_go_only_to_active_replicas_and_all_complete(step_run):
    """Every request completes, and each was routed to a replica that was active when it
    arrived (the activity log's intervals): removing a replica loses nothing it held."""
    frame = step_run.to_dataframe()
    assert (frame["status"] == "completed").all()
    spans: dict[int, list[tuple[float, float]]] = {}
    opened: dict[int, float] = {}
    for t, i, on in step_run.autoscaler_log.activity:
        if on:
            opened[i] = t
        else:
            spans.setdefault(i, []).append((opened.pop(i), t))
    for i, t in opened.items():
        spans.setdefault(i, []).append((t, math.inf))
    for replica, arrival in zip(frame["replica"], frame["arrival_s"], strict=True):
        assert any(a <= arrival <= b for a, b in spans[int(replica)]), (replica, arrival)


def test_the_summary_counts_the_replicas_used(step_run):
    """The summary's replica-seconds integrate the activity log; GPU-seconds weigh them by
    each replica's two GPUs; the changes are the decisions that moved the count."""
    section = step_run.summary()["autoscaler"]
    frame = step_run.autoscaler_decisions()
    assert section["decisions"] == len(frame)
    assert section["changes"] == int((frame["replicas"] != frame["current"]).sum())
    assert section["gpu_seconds"] == pytest.approx(2 * section["replica_seconds"])
    # replica-seconds by hand: the count in force between decisions, from 0 to the end
    times = [0.0, *frame["time_s"], step_run.end_s]
    counts = [1, *frame["replicas"]]
    assert section["replica_seconds"] == pytest.approx(sum(c * (b - a) for c, a, b in zip(counts, times, times[1:], strict=False)))


def test_a_threshold_policy_steps_one_replica_at_a_time():
    """The threshold policy moves by one replica per decision at most."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"]["policy"] = {"kind": "threshold", "params": {"high": 12, "low": 6}}
    frame = Simulation(scenario_from_dict(data)).run(progress=False).autoscaler_decisions()
    assert (frame["replicas"] - frame["current"]).abs().max() == 1
    assert frame["replicas"].max() > 1


@pytest.mark.parametrize(("change", "message"), [
    ({"max_replicas": 1, "min_replicas": 2}, "autoscaler.max_replicas: must be >= min_replicas"),
    ({"initial_replicas": 3, "max_replicas": 2}, "autoscaler.initial_replicas: must lie in [min_replicas, max_replicas] = [1, 2]"),
    ({"initial_replicas": 9}, "autoscaler.initial_replicas: must be at most the fleet's 8 replica"),
    ({"max_replicas": 9}, "autoscaler.max_replicas: must be at most the fleet's 8 replica"),
    ({"metric": "latency"}, "autoscaler.metric"),
    ({"policy": {"kind": "threshold", "params": {"high": 2, "low": 6}}}, "autoscaler.policy.params.low: must be at most high"),
    ({"policy": {"kind": "target", "params": {"goal": 2}}}, "autoscaler.policy.params.goal: unknown key; allowed: target, tolerance"),
    ({"policy": {"kind": "hpa"}}, "autoscaler.policy.kind: unknown scaling policy 'hpa'; one of: event, target, threshold"),
])
def test_bad_autoscaler_settings_are_refused_by_key_path(change, message):
    """Each bad setting is refused, naming its key path and what is allowed."""
    data = scenario_to_dict(load_scenario(STEP))
    data["autoscaler"].update(change)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        scenario_from_dict(data)


def test_an_autoscaler_and_a_planner_are_not_both_allowed():
    """Both would resize the same pool: refused, naming both."""
    data = scenario_to_dict(load_scenario(STEP))
    data["planner"] = {"interval_s": 10, "candidates": {"active_replicas": [1, 2]}}
    with pytest.raises(ScenarioError, match="autoscaler: and a planner would both resize the fleet"):
        scenario_from_dict(data)


def test_the_decisions_plot_over_time_in_words(step_run):
    """The decisions drawn with ``simpy_llm.plot.time_series``: one line per column, labelled in
    words, replica counts on integer ticks."""
    from simpy_llm.plot import time_series

    fig = time_series(step_run.autoscaler_decisions(), ["replicas", "recommended"], by=None)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["replicas", "recommended replicas"]
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "replicas, recommended replicas"
    assert all(float(t).is_integer() for t in ax.get_yticks())
