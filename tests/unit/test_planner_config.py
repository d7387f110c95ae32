"""The planner section: strict keys, errors naming the key path, combinations rejected."""

from __future__ import annotations

import pytest

from simpy_llm import load_scenario
from simpy_llm.config import PlannerCandidates, ScenarioError
from simpy_llm.config.loader import scenario_from_dict, scenario_to_dict
from simpy_llm.config.planner import summary_metric_path
from simpy_llm.policies.planning import BestFeasible, Evaluation


def _with(planner, **serving):
    data = scenario_to_dict(load_scenario("scenarios/quickstart.yaml"))
    data["serving"].update({"replicas": 3, **serving})
    data["planner"] = planner
    return scenario_from_dict(data, "test.yaml")


def _error(planner, **serving) -> str:
    with pytest.raises(ScenarioError) as info:
        _with(planner, **serving)
    return str(info.value)


def test_defaults_follow_interval():
    """window_s and first_tick_s default to interval_s."""
    p = _with({"interval_s": 5, "candidates": {"active_replicas": [1, 2]}}).planner
    assert (p.window_s, p.first_tick_s, p.objective) == (5.0, 5.0, "goodput_per_gpu")


def test_unknown_knob_is_rejected():
    """An unknown knob names its key path and lists the allowed ones."""
    assert "planner.candidates.replicas: unknown key" in _error({"interval_s": 5, "candidates": {"replicas": [1]}})


def test_empty_candidates_are_rejected():
    """No knob, or a knob without values, is an error at its path."""
    assert "planner.candidates: name at least one knob" in _error({"interval_s": 5, "candidates": {}})
    assert "planner.candidates.active_replicas: must be a non-empty list" in _error({"interval_s": 5, "candidates": {"active_replicas": []}})


def test_bad_objective_and_constraint_are_rejected():
    """An objective or constraint that is not a numeric summary metric names its path."""
    assert "planner.objective: unknown summary metric" in _error(
        {"interval_s": 5, "objective": "latency_s.ttft.p42", "candidates": {"active_replicas": [1]}})
    assert "planner.constraints.latency_s.ttft: summary metric" in _error(
        {"interval_s": 5, "constraints": {"latency_s.ttft": 1.0}, "candidates": {"active_replicas": [1]}})


def test_unsupported_knobs_say_so():
    """gamma and fused_fraction are rejected as not supported yet."""
    assert "planner.candidates.gamma: not supported yet" in _error({"interval_s": 5, "candidates": {"gamma": [2, 4]}})


def test_knob_the_fleet_cannot_honour_is_rejected():
    """A pool larger than the fleet, or a pool knob of the other fleet kind, is an error."""
    assert "exceeds serving's replicas (3)" in _error({"interval_s": 5, "candidates": {"active_replicas": [4]}})
    assert "needs serving.disaggregation" in _error({"interval_s": 5, "candidates": {"prefill_replicas": [1]}})


def test_summary_metric_path():
    """Paths into open-ended levels take any key; a non-number is reported."""
    assert summary_metric_path("goodput.by_class.chat.fraction") == ""
    assert "not a number" in summary_metric_path("latency_s")


def test_combinations_are_the_product():
    """Candidates are every combination of the knobs' values."""
    assert PlannerCandidates(active_replicas=[1, 2], max_num_seqs=[8, 16]).count() == 4


def test_best_feasible_prefers_fewer_gpus_then_current():
    """Among tied feasible scores the fewest GPUs win, then the configuration in force."""
    ev = [Evaluation(config={"n": i}, gpus=g, score=1.0, feasible=True, violation=0.0) for i, g in enumerate([4, 2, 2])]
    assert BestFeasible().choose(ev, current=2) == 2
    assert BestFeasible().choose(ev, current=0) == 1


def test_best_feasible_without_feasible_takes_smallest_violation():
    """With nothing feasible the smallest violation wins."""
    ev = [Evaluation(config={"n": i}, gpus=1, score=5.0, feasible=False, violation=v) for i, v in enumerate([2.0, 0.5])]
    assert BestFeasible().choose(ev, current=0) == 1
