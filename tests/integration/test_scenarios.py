"""Every shipped scenario validates and runs (cut short where it is large)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from simpy_llm import Results, Simulation, load_scenario
from simpy_llm.metrics.diagnostics import diagnose

SCENARIOS = sorted(Path("scenarios").glob("*.yaml"))
"""The shipped scenarios: the YAML files at the top of ``scenarios/`` (the bare workload specs
they reference, in ``scenarios/workloads/``, are not scenarios; tests/unit/test_workload_spec.py
loads each of them)."""

#: Overrides that keep each run to a few thousand requests at most (the ServeGen day: a
#: busy window and the calm one after it, 20 minutes from 19:20; see its header).
SHORT = {
    "quickstart.yaml": ["workload.num_requests=1000"],
    "multi_turn_chat.yaml": ["workload.num_requests=300"],
    "reasoning.yaml": ["workload.num_requests=300"],
    "two_clients.yaml": ["workload.num_requests=2000"],
    "two_clients_by_reference.yaml": ["workload.num_requests=1000"],
    "servegen_m_large_day.yaml": ["workload.servegen_data.span_s=[69600, 70800]", "workload.horizon_s=1200"],
    "servegen_multimodal.yaml": ["workload.horizon_s=300"],
    "servegen_reasoning.yaml": ["workload.horizon_s=600"],
    "azure_conversation_replay.yaml": ["workload.traces.0.max_requests=4000"],
    "blis_linear.yaml": [],
    "heterogeneous_fleet.yaml": ["workload.num_requests=2000"],
    "llamacpp_cpu.yaml": [],
    "multi_bin_only.yaml": ["workload.num_requests=4000"],
    "dynamic_only.yaml": ["workload.num_requests=3000"],
    "multi_bin_dynamic.yaml": ["workload.num_requests=3000"],
    "continuous_vs_static.yaml": ["workload.num_requests=2000"],
    "agentic_react.yaml": ["workload.num_requests=300"],
    "agentic_mcts.yaml": ["workload.num_requests=200"],
    "agentic_fork_join.yaml": ["workload.num_requests=500"],
    "agentic_chain.yaml": ["workload.num_requests=500"],
    "disaggregated.yaml": ["workload.num_requests=3000"],
    "planner_pool_split.yaml": ["workload.num_requests=2000"],
    "planner_disaggregated_split.yaml": ["workload.num_requests=1500"],
    "planner_speculative.yaml": ["workload.num_requests=200"],
    "seed003_single_target.yaml": ["workload.num_requests=200"],
    "seed003_heterogeneous_cluster.yaml": ["workload.horizon_s=60"],
    "seed003_multi_cluster.yaml": ["workload.horizon_s=30"],
    "speculative_mobile_cloud.yaml": ["workload.horizon_s=30"],
    "speculative_modes.yaml": ["workload.num_requests=150"],
    "seed003_speculative_single_target.yaml": ["workload.num_requests=150"],
    "seed003_speculative_heterogeneous_cluster.yaml": ["workload.horizon_s=20"],
    "seed003_speculative_multi_cluster.yaml": ["workload.horizon_s=15"],
}


@functools.cache
def run_short(name: str) -> Results:
    """The shortened run of the scenario file *name*, run once per test session (the runs
    are deterministic, and the scenario-point tests read the same runs)."""
    return Simulation(load_scenario(Path("scenarios") / name, SHORT[name])).run()


def test_every_scenario_has_a_test():
    """Each scenario file is listed here, so none ships untested."""
    assert {p.name for p in SCENARIOS} == set(SHORT)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_runs(path):
    """The scenario loads, runs to completion, and every request is accounted for."""
    s = run_short(path.name).summary()
    assert s["requests"]["arrived"] > 0
    assert s["requests"]["arrived"] == s["requests"]["completed"] + s["requests"]["dropped"] + s["requests"]["in_flight"]
    assert s["requests"]["completed"] > 0.9 * s["requests"]["arrived"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_raises_no_warning(path):
    """No shipped scenario is overloaded or runs on a latency profile whose figures mislead
    (``simpy_llm.metrics.diagnostics``): what a scenario shows is the serving system's doing."""
    assert [(d.code, d.message) for d in diagnose(run_short(path.name)) if d.severity == "warning"] == []
