"""The planner section: strict keys, errors naming the key path, combinations rejected."""

from __future__ import annotations

import pytest

from simpy_llm import load_scenario
from simpy_llm.config import PlannerCandidates, ScenarioError
from simpy_llm.loading import scenario_from_dict, scenario_to_dict
from simpy_llm.metrics.summary_paths import summary_metric_path
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


def test_speculation_knobs_need_speculation():
    """gamma and fused_fraction without a speculation section name their key and the need."""
    assert "planner.candidates.gamma: needs a speculation section" in _error({"interval_s": 5, "candidates": {"gamma": [2, 4]}})
    assert "planner.candidates.fused_fraction: needs a speculation section" in _error(
        {"interval_s": 5, "candidates": {"fused_fraction": [0.5]}})


def _spec(planner, **speculation):
    data = scenario_to_dict(load_scenario("scenarios/planner_speculative.yaml"))
    data["speculation"].update(speculation)
    data["planner"] = planner
    return scenario_from_dict(data, "test.yaml")


def _spec_error(planner, **speculation) -> str:
    with pytest.raises(ScenarioError) as info:
        _spec(planner, **speculation)
    return str(info.value)


HYBRID = {"mode": "hybrid", "mode_selector": {"kind": "latency"},
          "fused": {"draft_token_ms": 2.5, "acceptance": "illustrative-mobile"}}


def test_gamma_must_lie_within_k_min_k_max():
    """A γ outside [k_min, k_max] names its index and the bounds; a non-integer or repeated
    value is refused at its path."""
    assert "planner.candidates.gamma[1]: 7 is outside [speculation.k_min, speculation.k_max] = [1, 6]" in _spec_error(
        {"interval_s": 5, "candidates": {"gamma": [2, 7]}})
    assert "planner.candidates.gamma[0]: 2 is outside" in _spec_error(
        {"interval_s": 5, "candidates": {"gamma": [2]}}, k_min=3)
    assert "planner.candidates.gamma[0]: must be an integer" in _spec_error({"interval_s": 5, "candidates": {"gamma": [2.5]}})
    assert "planner.candidates.gamma: lists a value twice" in _spec_error({"interval_s": 5, "candidates": {"gamma": [2, 2]}})


def test_fused_fraction_must_be_a_share():
    """A fused fraction outside [0, 1], not a number, or repeated is refused at its path."""
    for bad in (1.5, -0.1, True, "half"):
        assert "planner.candidates.fused_fraction[0]: must be a number" in _spec_error(
            {"interval_s": 5, "candidates": {"fused_fraction": [bad]}}, **HYBRID)
    assert "planner.candidates.fused_fraction: lists a value twice" in _spec_error(
        {"interval_s": 5, "candidates": {"fused_fraction": [0.5, 0.5]}}, **HYBRID)


def test_fused_fraction_needs_fused_rounds():
    """A fused fraction with a distributed-only speculation section (no fused draft model) is
    refused, naming the key and what it needs."""
    message = _spec_error({"interval_s": 5, "candidates": {"fused_fraction": [0.0, 0.5]}})
    assert "planner.candidates.fused_fraction: needs fused rounds" in message


def test_speculation_knobs_are_accepted_with_speculation():
    """gamma, fused_fraction, active_replicas and max_num_seqs are all accepted with a hybrid
    speculation section, integers in fused_fraction read as shares."""
    planner = _spec({"interval_s": 5, "candidates": {"gamma": [1, 3], "fused_fraction": [0, 0.5, 1],
                                                     "active_replicas": [1], "max_num_seqs": [8]}}, **HYBRID).planner
    assert planner.candidates.fused_fraction == (0.0, 0.5, 1.0)
    assert planner.candidates.count() == 6
    assert planner.candidates.knobs() == ("active_replicas", "max_num_seqs", "gamma", "fused_fraction")


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
