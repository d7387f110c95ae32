"""``Link.put_ahead``: a lone message's delivery handed to its sender, with the link's
figures as a plain put would give them, and the sender's promise enforced."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from simpy_llm.network.link import Link
from simpy_llm.wire import Wire


def _link(env, **kwargs):
    kwargs.setdefault("rtt_s", 0.04)
    kwargs.setdefault("bandwidth_bytes_per_s", 1000.0)
    return Link(env, Wire(env), **kwargs)


def test_the_delivery_time_is_the_one_a_put_would_give():
    """put_ahead's ``delivered_s`` equals the delivery of the same message put on a twin link."""
    env = simpy.Environment()
    ahead = _link(env, rtt_jitter_s=0.01, bandwidth_jitter=0.2, rng=np.random.default_rng(3))
    env2 = simpy.Environment()
    plain = _link(env2, rtt_jitter_s=0.01, bandwidth_jitter=0.2, rng=np.random.default_rng(3))
    got = []
    plain.out.connect(lambda m: got.append(env2.now))
    times = []
    for size in (10.0, 250.0, 0.0, 40.0):
        msg = ahead.put_ahead("x", size)
        times.append(msg.delivered_s)
        env.run(until=msg.delivered_s)
        plain.put("x", size)
        env2.run()
    assert times == got


def test_figures_count_the_message_when_it_arrives():
    """Until its delivery time the message is in flight; from then on it is delivered, with
    its bytes and transmission time booked as a put's."""
    env = simpy.Environment()
    link = _link(env)
    msg = link.put_ahead("verdict", 20.0)  # 20 ms sending, 20 ms propagation
    assert msg.delivered_s == pytest.approx(0.04)
    env.run(until=0.03)
    s = link.statistics()
    assert (s.puts, s.delivered, s.in_flight, s.bytes_delivered) == (1, 0, 1, 0.0)
    assert s.busy_s == pytest.approx(0.02)
    env.run(until=0.05)
    s = link.statistics()
    assert (s.delivered, s.in_flight, s.bytes_delivered) == (1, 0, 20.0)
    assert s.busy_s == pytest.approx(0.02)
    assert link.out.statistics().puts == 0  # the sender took the delivery over


def test_a_later_message_settles_it_and_goes_lone():
    """A second put_ahead (or put) after the first transmission ended is sent as usual."""
    env = simpy.Environment()
    link = _link(env)
    first = link.put_ahead("a", 10.0)
    env.run(until=first.delivered_s)
    second = link.put_ahead("b", 10.0)
    assert second is not None and second.delivered_s == pytest.approx(first.delivered_s + 0.03)
    env.run(until=second.delivered_s + 0.001)
    third = link.send("c", 10.0)
    env.run()
    assert third.delivered_s == pytest.approx(second.delivered_s + 0.001 + 0.03)
    assert link.statistics().busy_s == pytest.approx(0.03)


def test_a_put_while_it_transmits_breaks_the_promise():
    """Anything entering the link while an ahead message still transmits raises."""
    env = simpy.Environment()
    link = _link(env)
    link.put_ahead("a", 100.0)  # transmits until 0.1 s
    env.run(until=0.05)
    with pytest.raises(RuntimeError, match="put_ahead"):
        link.put("b", 1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss_probability": 0.1, "retransmit_timeout_s": 0.2, "rng": np.random.default_rng(1)},
        {"outages": [(1.0, 2.0)]},
        {"overhead_s": 0.001},
        {"bandwidth_bytes_per_s": math.inf},
    ],
    ids=["loss", "outages", "overhead", "infinite bandwidth"],
)
def test_a_link_that_cannot_promise_sends_nothing(kwargs):
    """With loss, outages, overhead or no shortcut, put_ahead returns None and sends nothing."""
    env = simpy.Environment()
    link = _link(env, **kwargs)
    assert link.put_ahead("a", 10.0) is None
    assert link.statistics().puts == 0


def test_a_busy_link_sends_nothing_ahead():
    """While another message is in flight, put_ahead declines."""
    env = simpy.Environment()
    link = _link(env)
    link.send("a", 100.0)
    assert link.put_ahead("b", 10.0) is None
    assert link.statistics().puts == 1
