"""A Link with a per-message overhead delivers what a fluid processor-sharing model gives,
whichever way its messages enter (``send`` at their time, ``put_at`` announced early), so the
lone message's single timer (its overhead folded into its delivery) changes no delivery."""

from __future__ import annotations

import math

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.network.link import Link
from tests.helpers import delivery_log

MESSAGES = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([0.0, 0.05, 0.1, 0.3]), st.floats(min_value=0.0, max_value=2.0)),  # put time, s
        st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=500.0)),  # size, bytes
        st.booleans(),  # announced at t = 0 with put_at (else sent at its time)
    ),
    min_size=1,
    max_size=12,
)


def _reference(messages, *, overhead_s: float, bandwidth: float, rtt_s: float) -> tuple[list[float], float]:
    """Each message's delivery and the busy time under equal sharing, written from the model in
    ``simpy_llm.network.link``'s docstring: transmission from put + overhead, the bandwidth
    split equally among the messages transmitting, delivery half a round trip after the end."""
    starts = sorted((at_s + overhead_s, i) for i, (at_s, _, _) in enumerate(messages))
    remaining: dict[int, float] = {}
    delivered = [math.nan] * len(messages)
    t, busy, k = 0.0, 0.0, 0
    while k < len(starts) or remaining:
        next_start = starts[k][0] if k < len(starts) else math.inf
        rate = bandwidth / len(remaining) if remaining else 0.0
        next_end = t + min(remaining.values()) / rate if remaining else math.inf
        until = min(next_start, next_end)
        if remaining:
            busy += until - t
            for i in remaining:
                remaining[i] -= (until - t) * rate
        t = until
        for i in [i for i, r in remaining.items() if r <= 1e-9 * bandwidth]:
            del remaining[i]
            delivered[i] = t + rtt_s / 2
        while k < len(starts) and starts[k][0] <= t:
            i = starts[k][1]
            k += 1
            if messages[i][1] == 0:
                delivered[i] = t + rtt_s / 2  # no bytes: no time on the wire
            else:
                remaining[i] = messages[i][1]
    return delivered, busy


def _simulate(messages, *, overhead_s: float, bandwidth: float, rtt_s: float) -> tuple[list[float], Link]:
    env = simpy.Environment()
    out, got = delivery_log(env)
    link = Link(env, out, rtt_s=rtt_s, bandwidth_bytes_per_s=bandwidth, overhead_s=overhead_s)

    def sender(i, at_s, size):
        yield env.timeout(at_s)
        link.send(i, size)

    for i, (at_s, size, early) in enumerate(messages):
        if early:
            link.put_at(i, size, at_s)
        else:
            env.process(sender(i, at_s, size))
    env.run()
    return [got[i] for i in range(len(messages))], link


@settings(max_examples=300, deadline=None)
@given(
    messages=MESSAGES,
    overhead_s=st.sampled_from([0.0, 0.05, 0.2]),
    bandwidth=st.sampled_from([100.0, 1000.0]),
    rtt_s=st.sampled_from([0.0, 0.04]),
)
def test_deliveries_and_busy_time_follow_processor_sharing(messages, overhead_s, bandwidth, rtt_s):
    """Every message is delivered once, when the fluid model delivers it (to rounding), and the
    link's busy time is the model's, with messages put during others' overheads, at the
    same instant, or announced early."""
    expected, busy = _reference(messages, overhead_s=overhead_s, bandwidth=bandwidth, rtt_s=rtt_s)
    got, link = _simulate(messages, overhead_s=overhead_s, bandwidth=bandwidth, rtt_s=rtt_s)
    for i, (t, e) in enumerate(zip(got, expected, strict=True)):
        assert math.isclose(t, e, rel_tol=1e-9, abs_tol=1e-9), (i, t, e)
    s = link.statistics()
    assert (s.puts, s.delivered, s.in_flight) == (len(messages), len(messages), 0)
    assert math.isclose(s.busy_s, busy, rel_tol=1e-9, abs_tol=1e-9)
