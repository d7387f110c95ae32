"""Conservation and order of the Wire resource under random producers and impatient consumers."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.wire import Wire

gaps = st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7]), min_size=0, max_size=30)


def _simulate(put_gaps, consumers):
    env = simpy.Environment()
    wire = Wire(env)
    received: list[tuple[float, int]] = []

    def producer(gs, base):
        for i, g in enumerate(gs):
            yield env.timeout(g)
            yield wire.put(base + i)

    def consumer(patience_list):
        for patience in patience_list:
            with wire.get() as req:
                if patience is None:
                    item = yield req
                    received.append((env.now, item))
                    continue
                yield req | env.timeout(patience)
                # Decide by state, never by membership (a get may be triggered
                # but not yet processed when the timeout wins).
                if req.triggered:
                    received.append((env.now, req.value))

    for p, gs in enumerate(put_gaps):
        env.process(producer(gs, 1000 * p))
    for patience_list in consumers:
        env.process(consumer(patience_list))
    env.run(until=1000)
    return wire, received


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(gaps, min_size=1, max_size=3),
    st.lists(st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.3, 1.0, 5.0])), max_size=40), max_size=3),
)
def test_every_item_is_taken_once_or_still_waiting(put_gaps, consumers):
    """Items put are either received exactly once or still on the wire; none is lost or duplicated."""
    wire, received = _simulate(put_gaps, consumers)
    put = sorted(1000 * p + i for p, gs in enumerate(put_gaps) for i in range(len(gs)))
    got = [item for _, item in received]
    assert len(got) == len(set(got))
    assert sorted(got + list(wire.items)) == put
    stats = wire.statistics()
    assert stats.puts == len(put) and stats.gets == len(got) and stats.level == len(wire.items)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(gaps, st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.3, 1.0])), max_size=40))
def test_items_leave_in_put_order(put_gaps, patience_list):
    """With one producer and one consumer, items are received in the order they were put."""
    _wire, received = _simulate([put_gaps], [patience_list])
    got = [item for _, item in received]
    assert got == sorted(got)
    assert [t for t, _ in received] == sorted(t for t, _ in received)


def _intercepted(put_gaps, stages, consumer_is_process):
    """Puts at the given gaps into a Wire with *stages* user processes placed between it and its
    consumer (each holds every item for its delay, one at a time), as ``between`` places them."""
    env = simpy.Environment()
    wire = Wire(env)
    received: list[int] = []
    if consumer_is_process:
        def consumer():
            while True:
                received.append((yield wire.get()))

        env.process(consumer())
    else:
        wire.connect(received.append)

    def stage(inbox, outbox, delay):
        while True:
            item = yield inbox.get()
            if delay:
                yield env.timeout(delay)
            yield outbox.put(item)

    for delay in reversed(stages):  # placed last first: items pass them in the order given
        inbox, outbox = Wire(env), Wire(env)
        outbox.connect(wire.intercept(inbox.send))
        env.process(stage(inbox, outbox, delay))

    def producer():
        for i, g in enumerate(put_gaps):
            yield env.timeout(g)
            yield wire.put(i)

    env.process(producer())
    env.run(until=10_000)
    return received


@settings(max_examples=200, deadline=None, derandomize=True)
@given(gaps, st.lists(st.sampled_from([0.0, 0.0, 0.2, 1.0, 3.0]), max_size=4), st.booleans())
def test_processes_between_a_wire_and_its_consumer_lose_nothing_and_keep_order(put_gaps, stages, consumer_is_process):
    """Items put on a Wire with first-in-first-out processes placed between it and its consumer
    (a handler or a process blocked on get) all reach the consumer once, in the order put."""
    assert _intercepted(put_gaps, stages, consumer_is_process) == list(range(len(put_gaps)))


def test_a_consumer_connected_after_the_interception_still_receives():
    """A consumer that connects after a process was placed between (the session registry is
    built after the processes) receives what the process passes on."""
    env = simpy.Environment()
    wire, received = Wire(env), []
    inbox, outbox = Wire(env), Wire(env)
    outbox.connect(wire.intercept(inbox.send))
    wire.connect(received.append)

    def stage():
        while True:
            yield outbox.put((yield inbox.get()))

    env.process(stage())
    for i in range(3):
        wire.send(i)
    env.run()
    assert received == [0, 1, 2] and wire.statistics().puts == 3
