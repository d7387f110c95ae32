"""Every shipped scenario validates and runs (cut short where it is large)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpy_llm import Simulation, load_scenario

SCENARIOS = sorted(Path("scenarios").glob("*.yaml"))

#: Overrides that keep each run to a few thousand requests at most.
SHORT = {
    "quickstart.yaml": ["workload.num_requests=1000"],
    "multi_turn_chat.yaml": ["workload.num_requests=300"],
    "reasoning.yaml": ["workload.num_requests=300"],
    "two_clients.yaml": ["workload.num_requests=2000"],
    "servegen_m_large_day.yaml": ["workload.horizon_s=300"],
    "servegen_multimodal.yaml": ["workload.horizon_s=300"],
    "servegen_reasoning.yaml": ["workload.horizon_s=600"],
    "azure_conversation_replay.yaml": ["workload.traces.0.max_requests=2000"],
    "heterogeneous_fleet.yaml": ["workload.num_requests=2000"],
}


def test_every_scenario_has_a_test():
    """Each scenario file is listed here, so none ships untested."""
    assert {p.name for p in SCENARIOS} == set(SHORT)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_runs(path):
    """The scenario loads, runs to completion, and every request is accounted for."""
    res = Simulation(load_scenario(path, SHORT.get(path.name, []))).run()
    s = res.summary()
    assert s["requests"]["arrived"] > 0
    assert s["requests"]["arrived"] == s["requests"]["completed"] + s["requests"]["dropped"] + s["requests"]["in_flight"]
    assert s["requests"]["completed"] > 0.9 * s["requests"]["arrived"]
