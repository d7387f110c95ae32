"""``Link.put_at`` is a put at a later time: same deliveries, nothing lost or duplicated."""

from __future__ import annotations

import math

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.network.link import Link
from tests.helpers import delivery_log

MESSAGES = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=2.0),  # when it is sent
        st.floats(min_value=0.0, max_value=500.0),  # size, bytes
        st.booleans(),  # announced early with put_at (else put at its time)
    ),
    min_size=1,
    max_size=12,
)


def _deliveries(messages, *, early: bool, rtt_s: float, bandwidth: float) -> dict[int, float]:
    """Delivery time of each message, sending the flagged ones with put_at at t = 0 when
    *early* (else every message is put by a process at its time)."""
    env = simpy.Environment()
    out, got = delivery_log(env)
    link = Link(env, out, rtt_s=rtt_s, bandwidth_bytes_per_s=bandwidth)

    def sender(i, at_s, size):
        yield env.timeout(at_s)
        link.put(i, size)

    for i, (at_s, size, flagged) in enumerate(messages):
        if early and flagged:
            link.put_at(i, size, at_s)
        else:
            env.process(sender(i, at_s, size))
    env.run()
    stats = link.statistics()
    assert stats.delivered == len(messages) and stats.in_flight == 0
    return got


@settings(max_examples=200, deadline=None)
@given(messages=MESSAGES, rtt_s=st.sampled_from([0.0, 0.01, 0.3]), bandwidth=st.sampled_from([100.0, 1000.0, math.inf]))
def test_put_at_delivers_as_a_put_at_that_time(messages, rtt_s, bandwidth):
    """Announcing a message early with put_at changes no delivery time (to rounding), under
    any mix of other messages sharing the bandwidth, and every message arrives once."""
    late = _deliveries(messages, early=False, rtt_s=rtt_s, bandwidth=bandwidth)
    early = _deliveries(messages, early=True, rtt_s=rtt_s, bandwidth=bandwidth)
    assert late.keys() == early.keys()
    for i, t in late.items():
        assert math.isclose(early[i], t, rel_tol=1e-9, abs_tol=1e-9), (i, early[i], t)
