"""Conservation, exactly-once delivery, bounds and reproducibility of the network Link.

Random messages (sizes, put times, several at one instant), bandwidths (finite or
not), overheads, round trips, jitters, loss with finite or unlimited
retransmissions, and outages in both modes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.network.link import Link, Message
from simpy_llm.wire import Wire

put_times = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 8.0))
messages = st.lists(st.tuples(put_times, st.one_of(st.just(0.0), st.floats(1.0, 5000.0))), min_size=1, max_size=25)


@st.composite
def outage_windows(draw):
    """Sorted, non-overlapping (touching allowed) windows within [0, 15]."""
    windows, t = [], 0.0
    for gap, length in draw(st.lists(st.tuples(st.sampled_from([0.0, 0.3, 1.0, 2.5]), st.floats(0.05, 2.0)), max_size=4)):
        start = t + gap
        windows.append((start, start + length))
        t = start + length
    return windows


@st.composite
def links(draw):
    """Link keyword arguments (without rng and the wires)."""
    loss = draw(st.sampled_from([0.0, 0.0, 0.3, 0.7, 1.0]))
    max_retransmissions = draw(st.one_of(st.none(), st.integers(0, 3)))
    if loss == 1.0 and max_retransmissions is None:
        max_retransmissions = 2
    return {
        "bandwidth_bytes_per_s": draw(st.sampled_from([1e3, 4e3, math.inf])),
        "rtt_s": draw(st.sampled_from([0.0, 0.1, 1.0])),
        "overhead_s": draw(st.sampled_from([0.0, 0.05, 0.3])),
        "rtt_jitter_s": draw(st.sampled_from([0.0, 0.0, 0.08])),
        "bandwidth_jitter": draw(st.sampled_from([0.0, 0.0, 0.4])),
        "loss_probability": loss,
        "retransmit_timeout_s": draw(st.sampled_from([0.0, 0.2, 1.0])) if loss > 0 else None,
        "max_retransmissions": max_retransmissions,
        "outages": draw(outage_windows()),
        "outage_mode": draw(st.sampled_from(["wait", "drop"])),
    }


def _simulate(kwargs, schedule, checkpoints, seed):
    """Run the link to completion, checking conservation at each checkpoint; returns what happened."""
    env = simpy.Environment()
    out, dropped_wire = Wire(env), Wire(env)
    delivered: list[tuple[float, Message]] = []
    dropped: list[tuple[float, Message]] = []
    out.connect(lambda m: delivered.append((env.now, m)))
    dropped_wire.connect(lambda m: dropped.append((env.now, m)))
    link = Link(env, out, dropped=dropped_wire, rng=np.random.default_rng(seed), **kwargs)
    sent: list[Message] = []

    def sender(at_s, size):
        yield env.timeout(at_s)
        sent.append((yield link.put(len(sent), size)))

    def checker():
        for t in sorted(checkpoints):
            yield env.timeout(t - env.now)
            s = link.statistics()
            # The entities' own state, independently of the link's counters.
            in_flight = sum(math.isnan(m.delivered_s) and not m.dropped_reason for m in sent)
            assert (s.puts, s.delivered, s.dropped, s.in_flight) == (len(sent), len(delivered), len(dropped), in_flight)
            assert s.puts == s.delivered + s.dropped + s.in_flight

    for at_s, size in schedule:
        env.process(sender(at_s, size))
    env.process(checker())
    env.run()
    return link, sent, delivered, dropped


@settings(max_examples=100, deadline=None)
@given(links(), messages, st.lists(st.floats(0.0, 20.0), max_size=8), st.integers(0, 2**32 - 1))
def test_every_message_is_delivered_or_dropped_exactly_once(kwargs, schedule, checkpoints, seed):
    """Conservation holds at every checkpoint; at the end each message is delivered once or dropped once,
    for an allowed reason, never before its lower bound, and the same seed reproduces every time."""
    link, sent, delivered, dropped = _simulate(kwargs, schedule, checkpoints, seed)
    stats = link.statistics()

    # Completion: nothing in flight; each message in exactly one of the two logs, once.
    assert stats.in_flight == 0 and stats.puts == len(sent) == len(schedule)
    delivered_ids = [id(m) for _, m in delivered]
    dropped_ids = [id(m) for _, m in dropped]
    assert len(set(delivered_ids)) == len(delivered_ids) and len(set(dropped_ids)) == len(dropped_ids)
    assert set(delivered_ids).isdisjoint(dropped_ids)
    assert set(delivered_ids) | set(dropped_ids) == {id(m) for m in sent}
    assert stats.delivered == len(delivered) and stats.dropped == len(dropped)

    # Drops only for the reasons the parameters allow.
    for t, m in dropped:
        assert m.dropped_s == t and math.isnan(m.delivered_s)
        if m.dropped_reason == "loss":
            assert kwargs["loss_probability"] > 0 and kwargs["max_retransmissions"] is not None
            assert m.attempts == kwargs["max_retransmissions"] + 1
        else:
            assert m.dropped_reason == "outage" and kwargs["outage_mode"] == "drop"
            assert any(s <= t < e for s, e in kwargs["outages"])

    # Deliveries: at the logged instant, never before the message's own unshared, loss-free time.
    bw = kwargs["bandwidth_bytes_per_s"]
    for t, m in delivered:
        assert m.delivered_s == t and m.dropped_reason == ""
        if kwargs["rtt_jitter_s"] == 0:
            assert m.one_way_s == kwargs["rtt_s"] / 2
        if kwargs["bandwidth_jitter"] == 0:
            assert m.bandwidth_factor == 1.0
        alone = kwargs["overhead_s"] + m.size_bytes / (m.bandwidth_factor * bw) + m.one_way_s
        assert t >= m.sent_s + alone - 1e-9 * max(1.0, t)
        assert t >= m.sent_s + kwargs["overhead_s"] + m.one_way_s
        assert m.queueing_s >= 0 and m.wait_s >= 0
    assert stats.bytes_delivered == sum(m.size_bytes for _, m in delivered)
    assert stats.retransmissions == sum(max(0, m.attempts - 1) for m in sent)

    # Processor sharing conserves work: when no transmission is cut short (wait mode), the
    # bandwidth used over the busy time serves exactly every transmission's work.
    if kwargs["outage_mode"] == "wait" and math.isfinite(bw):
        work = sum(m.attempts * m.size_bytes / m.bandwidth_factor for m in sent)
        assert stats.busy_s * bw == pytest.approx(work, rel=1e-9, abs=1e-6)

    # Same seed, same everything.
    _, sent2, _, _ = _simulate(kwargs, schedule, checkpoints, seed)

    def fates(ms):
        return sorted((m.payload, m.sent_s, m.delivered_s, m.dropped_s, m.dropped_reason, m.attempts) for m in ms)

    assert repr(fates(sent)) == repr(fates(sent2))  # repr: nan == nan

