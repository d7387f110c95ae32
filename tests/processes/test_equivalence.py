"""A user process that does what a built-in component does gives byte-identical records.

Each test runs a scenario twice, once with the built-in component and once with a SimPy process
written as a user would (``docs/processes.md``), in both engine modes, and compares the whole
request table.
"""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, load_scenario
from simpy_llm.processes import between, instead_of

MODES = ["event_per_change", "event_per_step"]


def gate(env, ports):
    """Forward each item the moment it arrives."""
    while True:
        req = yield ports.inbox.get()
        yield ports.outbox.put(req)


def round_robin(env, ports):
    """Replicas in turn, as the built-in ``round_robin`` policy."""
    i = 0
    while True:
        req = yield ports.inbox.get()
        yield ports.outboxes[i].put(req)
        i = (i + 1) % len(ports.outboxes)


def static_batcher(env, ports, batch_size):
    """Batches of *batch_size* in arrival order, each served for its slowest request's time,
    as the built-in batch server with one bin and no wait limit."""
    service = ports.replica.service
    while True:
        reqs, sizes = [], []
        while len(reqs) < batch_size:
            req = yield ports.inbox.get()
            reqs.append(req)
            sizes.append(service.size(req))
        for r in reqs:
            r.first_scheduled_s, r.bin = env.now, 0
        yield env.timeout(service.batch_time_s(reqs, sizes))
        for r in reqs:
            yield ports.done.put(r)


def records(path, overrides, processes=()):
    """The request table of one run."""
    sim = Simulation(load_scenario(path, overrides), processes=list(processes))
    return sim.run(progress=False).to_dataframe()


QUICKSTART = ["workload.num_requests=2000", "serving.replicas=3"]


@pytest.mark.parametrize("mode", MODES)
def test_a_round_robin_router_process_matches_the_built_in_router(mode):
    """A round-robin router written as a process, standing in for the router, gives the same
    records as the built-in router with the ``round_robin`` policy."""
    overrides = [*QUICKSTART, f"simulation.mode={mode}", "serving.router.kind=round_robin"]
    base = records("scenarios/quickstart.yaml", overrides)
    ours = records("scenarios/quickstart.yaml", overrides, [instead_of("router", round_robin)])
    assert ours.equals(base)
    assert sorted(base["replica"].unique()) == [0, 1, 2]


@pytest.mark.parametrize("mode", MODES)
def test_a_fifo_gate_between_router_and_replicas_changes_nothing(mode):
    """A process between the router and each replica that forwards at once leaves every record
    as it was."""
    overrides = [*QUICKSTART, f"simulation.mode={mode}", "serving.router.kind=least_loaded"]
    base = records("scenarios/quickstart.yaml", overrides)
    ours = records("scenarios/quickstart.yaml", overrides, [between(f"replica:{i}", gate) for i in range(3)])
    assert ours.equals(base)


@pytest.mark.parametrize("mode", MODES)
def test_a_static_batcher_process_matches_the_built_in_batch_server(mode):
    """A static batcher written as a process, standing in for a batch server, gives the records
    of the built-in batch server with one bin of the same batch size."""
    overrides = ["workload.num_requests=1000", "workload.aggregate_rate=3.0", "serving.batch_server.bins.count=1",
                 "serving.batch_server.batch_size=8", f"simulation.mode={mode}"]
    base = records("scenarios/multi_bin_only.yaml", overrides)
    ours = records("scenarios/multi_bin_only.yaml", overrides, [instead_of("replica:0", static_batcher, batch_size=8)])
    assert ours.equals(base)
    assert (base["status"] == "completed").sum() == 1000


SEAMED = {
    "multi-turn chat (completions)": ("scenarios/multi_turn_chat.yaml", ["workload.num_requests=600"]),
    "disaggregated pools (handoffs)": ("scenarios/disaggregated.yaml", ["workload.num_requests=600"]),
    "speculative decoding (sent, clusters)": ("scenarios/speculative_mobile_cloud.yaml", ["workload.horizon_s=15"]),
}


@pytest.mark.parametrize("case", sorted(SEAMED))
def test_a_gate_at_any_seam_changes_nothing(case):
    """At every seam of a scenario with sessions, disaggregated pools, or draft devices and
    clusters, a process that forwards at once leaves every record as it was."""
    path, overrides = SEAMED[case]
    sim = Simulation(load_scenario(path, overrides))
    seams = list(sim.wires)
    base = sim.run(progress=False).to_dataframe()
    assert len(seams) >= 3
    for seam in seams:
        assert records(path, overrides, [between(seam, gate)]).equals(base), seam
