"""What only a process can do: hold requests, wait for the first of two events, interrupt.

Each expected figure is computed from the run's own arrival times by a few lines of plain
Python that share nothing with the simulation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from simpy_llm import Simulation, load_scenario
from simpy_llm.processes import between, instead_of, rate_limit

QUICKSTART = ["workload.num_requests=400", "serving.replicas=2"]
MODES = ["event_per_change", "event_per_step"]


@pytest.fixture(params=MODES)
def quickstart(request):
    """The quickstart's overrides, in each engine mode."""
    return [*QUICKSTART, f"simulation.mode={request.param}"]


def run(processes, overrides):
    """The request table of the quickstart with *processes*, by request id."""
    sim = Simulation(load_scenario("scenarios/quickstart.yaml", list(overrides)), processes=processes)
    return sim, sim.run(progress=False).to_dataframe().sort_values("request_id", ignore_index=True)


def queueing_s(overrides):
    """Each request's time from reaching a replica to entering its queue (the latency model's
    per-request queueing time), read from a run without processes, by request id."""
    _, frame = run([], overrides)
    return (frame["enqueue_s"] - frame["arrival_s"]).to_numpy()


def test_a_rate_limiter_between_router_and_replica_spaces_its_requests(quickstart):
    """A token-bucket limiter (2 per second, burst 1) between the router and replica 0 lets each
    request in at the later of its arrival and one interval after the one before; replica 1 is
    untouched; every request completes."""
    _, frame = run([between("replica:0", rate_limit, rate_per_s=2.0)], quickstart)
    queueing = queueing_s(quickstart)
    limited = (frame["replica"] == 0).to_numpy()
    expected, last = [], -math.inf
    for t in frame.loc[limited, "arrival_s"]:
        last = max(t, last + 0.5)
        expected.append(last)
    assert np.allclose(frame.loc[limited, "enqueue_s"] - queueing[limited], expected, rtol=0, atol=1e-9)
    assert (np.asarray(expected) > frame.loc[limited, "arrival_s"] + 0.1).sum() > 20  # it did hold requests
    assert np.array_equal(frame.loc[~limited, "enqueue_s"] - frame.loc[~limited, "arrival_s"], queueing[~limited])
    assert (frame["status"] == "completed").all()


def pairing_router(env, ports, hold_s):
    """Hold a request until a second one arrives or *hold_s* passes, whichever is first; a
    pair goes to replica 0, a lone request to replica 1."""
    get = ports.inbox.get()
    while True:
        first = yield get
        get = ports.inbox.get()
        timeout = env.timeout(hold_s)
        fired = yield get | timeout
        if get in fired:
            yield ports.outboxes[0].put(first)
            yield ports.outboxes[0].put(get.value)
            get = ports.inbox.get()
        else:
            yield ports.outboxes[1].put(first)


def test_a_router_that_waits_for_the_first_of_two_events(quickstart):
    """A router waiting on ``get | timeout`` pairs requests that arrive within 50 ms of each other
    (both enter replica 0 when the second arrives) and sends a request left alone to replica 1
    50 ms after it arrived."""
    hold = 0.05
    _, frame = run([instead_of("router", pairing_router, hold_s=hold)], quickstart)
    arrivals = frame["arrival_s"].tolist()
    expected_replica, expected_enqueue, i = [], [], 0
    while i < len(arrivals):
        if i + 1 < len(arrivals) and arrivals[i + 1] - arrivals[i] < hold:
            expected_replica += [0, 0]
            expected_enqueue += [arrivals[i + 1]] * 2
            i += 2
        else:
            expected_replica.append(1)
            expected_enqueue.append(arrivals[i] + hold)
            i += 1
    assert frame["replica"].tolist() == expected_replica
    assert np.allclose(frame["enqueue_s"] - queueing_s(quickstart), expected_enqueue, rtol=0, atol=1e-9)
    assert 0 < expected_replica.count(0) < len(arrivals)


def door(env, ports, opens_at_s):
    """Hold every request until another process interrupts this one at *opens_at_s*, then
    let everything through."""

    def alarm(process):
        yield env.timeout(opens_at_s)
        process.interrupt("open")

    env.process(alarm(env.active_process))
    held, get, is_open = [], ports.inbox.get(), False
    while True:
        try:
            req = yield get
            get = ports.inbox.get()
            if is_open:
                yield ports.outbox.put(req)
            else:
                held.append(req)
        except simpy.Interrupt:
            is_open = True
            for req in held:
                yield ports.outbox.put(req)
            held = []


def test_a_process_interrupted_by_another_releases_what_it_held(quickstart):
    """A door between arrivals and the router, opened by an interrupt from a second process at
    t = 5 s, lets each request reach a replica at the later of its arrival and 5 s; the user
    processes are listed on the simulation."""
    sim, frame = run([between("arrivals", door, opens_at_s=5.0)], quickstart)
    reached = frame["enqueue_s"].to_numpy() - queueing_s(quickstart)
    assert np.allclose(reached, np.maximum(frame["arrival_s"].to_numpy(), 5.0), rtol=0, atol=1e-9)
    assert (frame["arrival_s"] < 5.0).sum() > 50
    assert len(sim.user_processes) == 1 and sim.user_processes[0].is_alive  # still waiting for requests


def test_processes_at_one_seam_are_passed_in_the_order_given():
    """Two processes between the same Wires: items pass the first listed, then the second."""
    seen = []

    def tag(env, ports, name):
        while True:
            req = yield ports.inbox.get()
            seen.append((name, req.id))
            yield ports.outbox.put(req)

    run([between("arrivals", tag, name="a"), between("arrivals", tag, name="b")], ["workload.num_requests=3"])
    assert seen == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_a_rejected_put_drops_the_request_as_admission_does(quickstart):
    """A router process that puts every third request on ``rejected`` drops it with the reason
    it set (or ``rejected``); the rest complete."""

    def picky(env, ports):
        n = 0
        while True:
            req = yield ports.inbox.get()
            n += 1
            if n % 3 == 0:
                req.dropped_reason = "picky" if n % 6 == 0 else ""
                yield ports.rejected.put(req)
            else:
                yield ports.outboxes[0].put(req)

    _, frame = run([instead_of("router", picky)], [*quickstart, "workload.num_requests=60"])
    dropped = frame[frame["status"] == "dropped"].sort_values("request_id")
    assert len(dropped) == 20
    assert dropped["dropped_reason"].value_counts().to_dict() == {"picky": 10, "rejected": 10}
    assert (frame.loc[frame["status"] == "completed", "replica"] == 0).all()


@pytest.mark.parametrize("bad", ["replica:9", "handoffs"])
def test_a_seam_the_scenario_lacks_is_refused_with_the_seams_it_has(bad):
    """A process at a seam this simulation does not have is refused, and the message lists the
    seams it has."""
    with pytest.raises(ValueError, match=r"no seam .*its seams: router, arrivals, replica:0, replica:1"):
        Simulation(load_scenario("scenarios/quickstart.yaml", QUICKSTART), processes=[between(bad, rate_limit, rate_per_s=1.0)])
