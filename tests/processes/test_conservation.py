"""Conservation through user processes: every request that arrives is recorded once, whatever
processes stand at whatever seams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, load_scenario
from simpy_llm.processes import between


def jitter(env, ports, delays, drop_every):
    """Hold each item for the next of *delays* (cycling), one at a time, or start a
    process per item that holds it (so items overtake each other); drop every
    *drop_every*-th item when it may."""
    n = 0
    while True:
        item = yield ports.inbox.get()
        n += 1
        delay = delays[n % len(delays)]
        if drop_every and n % drop_every == 0 and ports.rejected is not None:
            yield ports.rejected.put(item)
        elif delay < 0:
            env.process(_later(env, ports.outbox, item, -delay))
        else:
            yield env.timeout(delay)
            yield ports.outbox.put(item)


def _later(env, outbox, item, delay):
    yield env.timeout(delay)
    yield outbox.put(item)


seams = st.sampled_from(["arrivals", "replica:0", "replica:1", "completions"])
stages = st.lists(
    st.tuples(seams, st.lists(st.sampled_from([0.0, 0.01, 0.3, -0.2, -1.0]), min_size=1, max_size=4), st.sampled_from([0, 0, 3, 7])),
    max_size=4,
)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(stages, st.sampled_from(["event_per_change", "event_per_step"]))
def test_every_request_is_recorded_once_whatever_the_processes(placed, mode):
    """With processes that hold, reorder and drop requests at random seams of a multi-turn chat
    fleet, every request that arrived is recorded exactly once, as completed or dropped."""
    scenario = load_scenario("scenarios/multi_turn_chat.yaml", ["workload.num_requests=60", f"simulation.mode={mode}"])
    processes = [between(seam, jitter, delays=delays, drop_every=drop) for seam, delays, drop in placed]
    sim = Simulation(scenario, processes=processes)
    frame = sim.run(progress=False).to_dataframe()
    assert frame["request_id"].is_unique
    assert len(frame) == sim.recorder.arrived
    assert set(frame["status"]) <= {"completed", "dropped"}
