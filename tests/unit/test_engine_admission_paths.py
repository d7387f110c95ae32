"""The replica's short admission loop (requests that need no cache lookup) against its general one."""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, load_scenario

CASES = [
    # Multi-turn rounds (looked up in the prefix cache) among first rounds (not), preempted and
    # swapped for lack of KV blocks: the short loop hands requests over to the general one.
    (
        "scenarios/multi_turn_chat.yaml",
        ["workload.num_requests=150", "workload.aggregate_rate=50", "serving.engine.kv_num_blocks=300",
         "serving.engine.preemption_mode=swap", "serving.engine.swap_space_blocks=200"],
    ),
    # Without a prefix cache every request takes the short loop, swapped back in too.
    (
        "scenarios/multi_turn_chat.yaml",
        ["workload.num_requests=150", "workload.aggregate_rate=50", "serving.engine.kv_num_blocks=300",
         "serving.engine.preemption_mode=swap", "serving.engine.swap_space_blocks=200",
         "serving.engine.prefix_caching=false"],
    ),
    # Hand-offs arriving with their prompt's KV at decode replicas.
    ("scenarios/disaggregated.yaml", ["workload.num_requests=1500"]),
]


def _records(path: str, overrides: list[str], short_loop: bool) -> tuple[str, int, list[int]]:
    sim = Simulation(load_scenario(path, overrides))
    for replica in sim.replicas:
        if not short_loop:
            replica._plain_admit = False  # noqa: SLF001 - the general loop for every request
    result = sim.run(progress=False)
    return result.to_dataframe().to_csv(), result.events, [r.num_preemptions for r in sim.replicas]


@pytest.mark.parametrize(("path", "overrides"), CASES)
def test_short_admission_loop_gives_the_general_loops_records(path, overrides):
    """Admitting through the short loop where it applies gives the records, event count and
    preemptions of admitting every request through the general loop."""
    short = _records(path, overrides, short_loop=True)
    general = _records(path, overrides, short_loop=False)
    assert short == general


def test_the_multi_turn_case_exercises_lookups_and_preemptions():
    """The first case mixes requests with content to look up and preemptions (else it would
    not test the hand-over between the loops)."""
    path, overrides = CASES[0]
    sim = Simulation(load_scenario(path, overrides))
    assert all(replica._plain_admit for replica in sim.replicas)  # noqa: SLF001
    result = sim.run(progress=False)
    df = result.to_dataframe()
    assert sum(r.num_preemptions for r in sim.replicas) > 0
    assert (df["cached_tokens"] > 0).any()
