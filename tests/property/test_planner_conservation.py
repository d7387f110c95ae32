"""No request is lost or duplicated across the planner's reconfigurations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, load_scenario


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True),
    seqs=st.lists(st.sampled_from([2, 8, 64]), min_size=1, max_size=2, unique=True),
    interval=st.sampled_from([1.0, 2.5]),
)
def test_every_request_ends_once(seed, sizes, seqs, interval):
    """Whatever the planner applies (pool sizes, batch limits) and when, every request that
    arrived completes exactly once."""
    scenario = load_scenario("scenarios/planner_pool_split.yaml", [
        f"seed={seed}", "workload.num_requests=300", "serving.replicas=3",
        f"planner.interval_s={interval}", f"planner.window_s={interval}", "planner.min_requests=1",
        f"planner.candidates.active_replicas={sizes}", f"planner.candidates.max_num_seqs={seqs}",
        "planner.objective=-latency_s.e2e.mean",
    ])
    results = Simulation(scenario).run(progress=False)
    frame = results.to_dataframe()
    assert frame["request_id"].is_unique
    assert sorted(frame["request_id"]) == list(range(300))
    assert (frame["status"] == "completed").all()
