"""Closed-form behaviour of the network Link: latency, processor sharing, loss, outages, cost.

Each test computes its expected simulated times from the model's formulas
(``simpy_llm.network.link``'s module docstring), independently of the code.
Deterministic cases are compared with ``rel=1e-12``: the link's timers fire at
exact absolute times, so only rounding in a few additions separates the two.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from simpy_llm.kernel import events_scheduled
from simpy_llm.network.link import Link, Message
from simpy_llm.wire import Wire

EXACT = 1e-12
"""Relative tolerance of deterministic closed forms (a few float roundings)."""


def _link(env: simpy.Environment | None = None, **kwargs):
    env = env or simpy.Environment()
    out = Wire(env)
    dropped = Wire(env)
    return env, Link(env, out, dropped=dropped, **kwargs), out, dropped


def _send(env: simpy.Environment, link: Link, schedule: list[tuple[float, float]]) -> list[Message]:
    """Put one message of each (time_s, size_bytes) at its time; the returned list (in schedule
    order) fills in as they are put."""
    messages: list[Message] = [None] * len(schedule)  # type: ignore[list-item]

    def sender(i: int, at_s: float, size: float):
        yield env.timeout(at_s - env.now)
        messages[i] = yield link.put(i, size)

    for i, (at_s, size) in enumerate(schedule):
        env.process(sender(i, at_s, size))
    return messages


# -- latency and processor sharing ---------------------------------------------------------------


def test_one_transfer_takes_overhead_plus_bytes_over_bandwidth_plus_half_rtt():
    """A lone message is delivered overhead + size / bandwidth + rtt / 2 after it was put."""
    rtt, bw, overhead, size, t0 = 0.037, 1.25e9, 3.3e-5, 7_340_032.0, 1.7
    env, link, out, _ = _link(rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead)
    sent = _send(env, link, [(t0, size)])
    env.run()
    (msg,) = sent
    assert msg.delivered_s == pytest.approx(t0 + overhead + size / bw + rtt / 2, rel=EXACT)
    assert list(out.items) == [msg]
    assert msg.attempts == 1 and msg.dropped_reason == ""


@pytest.mark.parametrize("n", [2, 5, 17])
def test_equal_transfers_started_together_share_the_bandwidth(n):
    """n equal messages put together are each delivered at t0 + overhead + n * size / bw + rtt / 2."""
    rtt, bw, overhead, size, t0 = 0.02, 1e6, 0.004, 12_345.0, 0.5
    env, link, _, _ = _link(rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead)
    messages = _send(env, link, [(t0, size)] * n)
    env.run()
    expected = t0 + overhead + n * size / bw + rtt / 2
    for msg in messages:
        assert msg.delivered_s == pytest.approx(expected, rel=EXACT)


def test_staggered_pair_follows_processor_sharing():
    """A message arriving while another is half sent halves both rates until the smaller one ends."""
    rtt, bw, overhead = 0.03, 1.25e6, 0.002
    size_a, size_b = 3e6, 0.9e6
    t_a = 0.1
    # B's bytes start when A has sent half of its bytes alone (both pay the same overhead).
    t_b = t_a + (size_a / 2) / bw
    env, link, _, _ = _link(rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead)
    sent = _send(env, link, [(t_a, size_a), (t_b, size_b)])
    env.run()
    a, b = sent
    shared_from = t_b + overhead
    # Each gets bw / 2; B (0.9 MB) ends before A's remaining 1.5 MB.
    b_ends = shared_from + size_b / (bw / 2)
    a_left = size_a / 2 - size_b  # A sent as much as B while they shared
    a_ends = b_ends + a_left / bw
    assert b.delivered_s == pytest.approx(b_ends + rtt / 2, rel=EXACT)
    assert a.delivered_s == pytest.approx(a_ends + rtt / 2, rel=EXACT)
    # Each was slowed by the time it shared: B by size_b / bw, A by size_b / bw too.
    assert b.queueing_s == pytest.approx(size_b / bw, rel=1e-9)
    assert a.queueing_s == pytest.approx(size_b / bw, rel=1e-9)


def test_infinite_bandwidth_delivers_after_overhead_and_half_rtt():
    """With infinite bandwidth, transmission takes no time however many messages are in flight."""
    rtt, overhead, t0 = 0.25, 0.125, 2.0
    env, link, _, _ = _link(rtt_s=rtt, overhead_s=overhead)
    messages = _send(env, link, [(t0, 1e12)] * 3)
    env.run()
    assert [m.delivered_s for m in messages] == [pytest.approx(t0 + overhead + rtt / 2, rel=EXACT)] * 3
    assert link.statistics().busy_s == 0.0


def test_zero_delays_deliver_in_the_put_instant():
    """With no overhead, rtt or bandwidth limit a message is on ``out`` when put returns, with no event."""
    env, link, out, _ = _link()
    msg = link.put("x", 100).value
    assert msg.delivered_s == 0.0 and list(out.items) == [msg]
    assert events_scheduled(env) == 0  # nothing was scheduled


def test_rtt_jitter_draws_one_clipped_round_trip_per_message():
    """The one-way delay is half of max(0, rtt + rtt_jitter * N(0,1)), drawn per message at its put."""
    rtt, jitter, bw, size = 0.01, 0.02, 1e6, 1000.0
    env, link, _, _ = _link(rtt_s=rtt, rtt_jitter_s=jitter, bandwidth_bytes_per_s=bw, rng=np.random.default_rng(7))
    messages = _send(env, link, [(10.0 * i, size) for i in range(200)])
    env.run()
    z = np.random.default_rng(7).standard_normal(200)
    one_way = np.maximum(0.0, rtt + jitter * z) / 2
    assert (one_way == 0).any()  # the clip is exercised
    for msg, ow in zip(messages, one_way, strict=True):
        assert msg.delivered_s == pytest.approx(msg.sent_s + size / bw + ow, rel=EXACT)


def test_bandwidth_jitter_scales_each_message_work():
    """A message with factor f = max(0.05, 1 + jitter * N(0,1)) is served at f times its fair share."""
    jitter, bw, size = 0.8, 1e6, 50_000.0
    env, link, _, _ = _link(bandwidth_bytes_per_s=bw, bandwidth_jitter=jitter, rng=np.random.default_rng(3))
    messages = _send(env, link, [(100.0 * i, size) for i in range(200)])
    env.run()
    f = np.maximum(0.05, 1 + jitter * np.random.default_rng(3).standard_normal(200))
    assert (f == 0.05).any()
    for msg, fi in zip(messages, f, strict=True):
        assert msg.bandwidth_factor == fi
        assert msg.delivered_s == pytest.approx(msg.sent_s + size / (fi * bw), rel=EXACT)


# -- loss ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_lossy_link_mean_delivery_matches_geometric_retransmissions(p):
    """Mean delivery time is overhead + rtt/2 + (size/bw)/(1-p) + T p/(1-p); retransmissions/message p/(1-p).

    Error analysis: a message's time is overhead + rtt/2 + K size/bw + (K-1) T with
    K ~ Geometric(1-p), so its standard deviation is (size/bw + T) sqrt(p) / (1-p) =
    0.0168 s (p=0.2) and 0.0424 s (p=0.5); over N = 20,000 messages the standard error
    of the mean is 0.16% and 0.32% of the means (0.0725 s, 0.095 s): the 2% tolerance is
    >= 6 standard errors. Retransmissions per message have standard error
    sqrt(p) / (1-p) / sqrt(N) (0.004 and 0.01); the test allows 4 of them.
    """
    n, size, bw, timeout, rtt, overhead = 20_000, 10_000.0, 1e6, 0.02, 0.1, 0.005
    env, link, _, _ = _link(
        rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead, loss_probability=p,
        retransmit_timeout_s=timeout, rng=np.random.default_rng(20240),
    )
    sent: list[Message] = []

    def sender():
        for _ in range(n):
            sent.append(link.put(None, size).value)
            yield env.timeout(10.0)  # far beyond any message's time: no contention

    env.process(sender())
    env.run()
    times = np.array([m.delivered_s - m.sent_s for m in sent])
    expected = overhead + rtt / 2 + (size / bw) / (1 - p) + timeout * p / (1 - p)
    assert times.mean() == pytest.approx(expected, rel=0.02)
    stats = link.statistics()
    assert stats.delivered == n and stats.dropped == 0
    se = math.sqrt(p) / (1 - p) / math.sqrt(n)
    assert abs(stats.retransmissions / n - p / (1 - p)) < 4 * se
    # Each message's time is exactly its own number of attempts' worth.
    attempts = np.array([m.attempts for m in sent])
    assert np.allclose(times, overhead + rtt / 2 + attempts * size / bw + (attempts - 1) * timeout, rtol=EXACT)


def test_certain_loss_drops_after_max_retransmissions():
    """With p = 1 a message is sent 1 + max_retransmissions times, then dropped at the last loss."""
    size, bw, timeout, overhead, k = 2000.0, 1e5, 0.3, 0.01, 3
    env, link, out, dropped = _link(
        bandwidth_bytes_per_s=bw, overhead_s=overhead, rtt_s=1.0, loss_probability=1.0,
        retransmit_timeout_s=timeout, max_retransmissions=k, rng=np.random.default_rng(0),
    )
    sent = _send(env, link, [(0.0, size)])
    env.run()
    (msg,) = sent
    assert msg.dropped_reason == "loss" and math.isnan(msg.delivered_s)
    assert msg.attempts == k + 1
    assert msg.dropped_s == pytest.approx(overhead + (k + 1) * size / bw + k * timeout, rel=EXACT)
    assert list(dropped.items) == [msg] and not out.items
    stats = link.statistics()
    assert (stats.retransmissions, stats.dropped_loss, stats.dropped, stats.in_flight) == (k, 1, 1, 0)


def test_max_retransmissions_follows_the_seeded_loss_draws():
    """Messages spaced apart draw one uniform per transmission; k+1 losses in a row drop one."""
    p, k, n = 0.6, 2, 500
    env, link, _, _ = _link(
        bandwidth_bytes_per_s=1e4, loss_probability=p, retransmit_timeout_s=0.5,
        max_retransmissions=k, rng=np.random.default_rng(11),
    )
    messages = _send(env, link, [(100.0 * i, 1000.0) for i in range(n)])
    env.run()
    # One uniform per transmission, in order: a message ends on a success or on its (k+1)-th loss.
    replay = np.random.default_rng(11)
    fates = []
    for _ in range(n):
        attempts = 0
        while True:
            attempts += 1
            lost = replay.random() < p
            if not lost:
                fates.append((attempts, ""))
                break
            if attempts > k:
                fates.append((attempts, "loss"))
                break
    assert [(m.attempts, m.dropped_reason) for m in messages] == fates
    assert 0 < sum(r == "loss" for _, r in fates) < n
    assert link.statistics().dropped_loss == sum(r == "loss" for _, r in fates)


# -- outages -------------------------------------------------------------------------------------


def test_wait_outage_during_transmission_delays_by_its_overlap():
    """In wait mode an outage inside a transmission pauses it: delivery is later by the outage's length."""
    rtt, bw, overhead, size = 0.2, 1e3, 0.05, 1000.0
    outage = (0.4, 0.65)  # transmission runs 0.05 -> 1.05 alone
    env, link, _, _ = _link(rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead, outages=[outage])
    sent = _send(env, link, [(0.0, size)])
    env.run()
    (msg,) = sent
    overlap = outage[1] - outage[0]
    assert msg.delivered_s == pytest.approx(overhead + size / bw + overlap + rtt / 2, rel=EXACT)
    assert msg.wait_s == pytest.approx(overlap, rel=EXACT)


def test_wait_outage_overlapping_the_overhead_delays_only_by_its_overlap_with_transmission():
    """The overhead is pure delay: an outage delays a transfer only by its overlap with the transmission."""
    bw, overhead, size = 1e3, 1.0, 500.0
    outage = (0.5, 1.2)  # overhead 0 -> 1; bytes would move 1 -> 1.5
    env, link, _, _ = _link(bandwidth_bytes_per_s=bw, overhead_s=overhead, outages=[outage])
    sent = _send(env, link, [(0.0, size)])
    env.run()
    (msg,) = sent
    assert msg.delivered_s == pytest.approx(overhead + size / bw + (outage[1] - overhead), rel=EXACT)


def test_wait_outage_at_arrival_waits_for_its_end_then_pays_the_overhead():
    """A message put during an outage (wait mode) starts its overhead when the outage ends."""
    rtt, bw, overhead, size = 0.1, 2e3, 0.3, 1000.0
    env, link, _, _ = _link(rtt_s=rtt, bandwidth_bytes_per_s=bw, overhead_s=overhead, outages=[(1.0, 2.5)])
    sent = _send(env, link, [(1.2, size)])
    env.run()
    (msg,) = sent
    assert msg.delivered_s == pytest.approx(2.5 + overhead + size / bw + rtt / 2, rel=EXACT)
    assert msg.wait_s == pytest.approx(2.5 - 1.2, rel=EXACT)


def test_wait_outage_pauses_shared_transmissions_keeping_their_remaining_bytes():
    """Two messages sharing the link both pause during an outage and resume where they were."""
    bw, size = 1e3, 1000.0
    outage = (0.5, 3.0)  # both transmit 0 -> 2 sharing, so 0.25 of each is sent before it
    env, link, _, _ = _link(bandwidth_bytes_per_s=bw, outages=[outage])
    sent = _send(env, link, [(0.0, size), (0.0, size)])
    env.run()
    a, b = sent
    expected = 2 * size / bw + (outage[1] - outage[0])
    assert a.delivered_s == pytest.approx(expected, rel=EXACT)
    assert b.delivered_s == pytest.approx(expected, rel=EXACT)


def test_drop_outage_drops_transmissions_in_progress_at_its_start():
    """In drop mode a message transmitting when an outage starts is dropped then."""
    env, link, out, dropped = _link(bandwidth_bytes_per_s=1e3, rtt_s=0.1, outages=[(0.4, 0.6)], outage_mode="drop")
    sent = _send(env, link, [(0.0, 1000.0), (0.0, 100.0)])  # b ends at 0.2, before the outage
    env.run()
    a, b = sent
    assert a.dropped_reason == "outage" and a.dropped_s == 0.4 and math.isnan(a.delivered_s)
    assert b.delivered_s == pytest.approx(2 * 100.0 / 1e3 + 0.05, rel=EXACT)
    assert list(dropped.items) == [a] and list(out.items) == [b]
    assert link.statistics().dropped_outage == 1


def test_drop_outage_drops_arrivals_at_once():
    """In drop mode a message put during an outage is dropped in that instant, never sent."""
    env, link, _, dropped = _link(bandwidth_bytes_per_s=1e3, overhead_s=0.1, outages=[(1.0, 2.0)], outage_mode="drop")
    sent = _send(env, link, [(0.0, 10.0), (1.0, 10.0), (2.0, 10.0)])
    env.run()
    early, during, after = sent
    assert during.dropped_reason == "outage" and during.dropped_s == 1.0 and during.attempts == 0
    assert early.delivered_s == pytest.approx(0.1 + 0.01, rel=EXACT)
    assert after.delivered_s == pytest.approx(2.0 + 0.1 + 0.01, rel=EXACT)  # the window is [start, end)
    assert list(dropped.items) == [during]


def test_endless_wait_outage_keeps_messages_in_flight_without_events():
    """An outage ending at math.inf holds its messages in flight forever and schedules nothing for them."""
    for overhead, bw in ((0.0, 1e3), (0.2, 1e3), (0.0, math.inf)):
        env, link, _out, _ = _link(bandwidth_bytes_per_s=bw, overhead_s=overhead, outages=[(1.0, math.inf)])
        sent = _send(env, link, [(0.0, 2000.0), (1.5, 10.0)])
        env.run()
        _first, second = sent
        s = link.statistics()
        assert (s.delivered, s.in_flight) == ((1, 1) if bw == math.inf else (0, 2))
        assert math.isnan(second.delivered_s) and env.now == 1.5
        if bw < math.inf:
            assert s.busy_s == pytest.approx(1.0 - overhead, rel=EXACT)


def test_outage_does_not_stop_propagation():
    """A message whose bytes are all sent before an outage is delivered on time, in either mode."""
    for mode in ("wait", "drop"):
        env, link, _, _ = _link(bandwidth_bytes_per_s=1e3, rtt_s=2.0, outages=[(0.5, 5.0)], outage_mode=mode)
        sent = _send(env, link, [(0.0, 100.0)])
        env.run()
        (msg,) = sent
        assert msg.delivered_s == pytest.approx(0.1 + 1.0, rel=EXACT)


# -- cost ----------------------------------------------------------------------------------------


def _events(n: int, *, with_link: bool) -> int:
    env = simpy.Environment()
    link = Link(env, Wire(env), rtt_s=0.01, bandwidth_bytes_per_s=1e6, overhead_s=0.001)
    rng = np.random.default_rng(5)
    gaps, sizes = rng.exponential(0.01, n), rng.exponential(8_000.0, n)  # load 0.8: messages share

    def sender():
        for gap, size in zip(gaps, sizes, strict=True):
            yield env.timeout(gap)
            if with_link:
                link.put(None, size)

    env.process(sender())
    env.run()
    if with_link:
        assert link.statistics().delivered == n
    return events_scheduled(env)


def test_events_per_message_are_bounded_and_do_not_grow_with_load_length():
    """Under contention a message costs a small constant number of SimPy events, whatever n is."""
    per_message = {}
    for n in (1_000, 10_000):
        per_message[n] = (_events(n, with_link=True) - _events(n, with_link=False)) / n
    assert per_message[1_000] <= 6 and per_message[10_000] <= 6
    assert per_message[10_000] <= per_message[1_000] + 0.1


# -- statistics ----------------------------------------------------------------------------------


def test_statistics_count_bytes_busy_time_and_queueing():
    """Bytes, busy time, utilisation and queueing of a hand-computed schedule, mid-run and at the end."""
    env, link, _, _ = _link(bandwidth_bytes_per_s=1e3)
    # 1000 B alone over [0, 1]; two 500 B messages sharing over [3, 4].
    sent = _send(env, link, [(0.0, 1000.0), (3.0, 500.0), (3.0, 500.0)])
    env.run(until=3.5)
    a, b, c = sent
    mid = link.statistics()
    assert (mid.puts, mid.delivered, mid.in_flight) == (3, 1, 2)
    assert mid.busy_s == pytest.approx(1.5, rel=EXACT)
    env.run(until=10.0)
    s = link.statistics()
    assert (s.puts, s.delivered, s.dropped, s.in_flight) == (3, 3, 0, 0)
    assert s.bytes_delivered == 2000.0
    assert s.busy_s == pytest.approx(2.0, rel=EXACT)
    assert s.elapsed_s == 10.0
    assert s.utilisation() == pytest.approx(0.2, rel=EXACT)
    assert s.utilisation(4.0) == pytest.approx(0.5, rel=EXACT)
    # Alone, b and c take 0.5 s each; sharing, 1 s.
    assert (a.queueing_s, b.queueing_s, c.queueing_s) == (0.0, pytest.approx(0.5), pytest.approx(0.5))
    assert s.total_queueing_s == pytest.approx(1.0, rel=1e-9)
    assert s.mean_queueing_s == pytest.approx(1.0 / 3, rel=1e-9)
    assert s.total_outage_wait_s == 0.0


def test_statistics_exclude_outages_from_busy_time_and_count_their_waits():
    """A paused transmission is not busy time; the pause is its outage wait and its queueing."""
    env, link, _, _ = _link(bandwidth_bytes_per_s=1e3, outages=[(0.25, 0.75)])
    sent = _send(env, link, [(0.0, 1000.0)])
    env.run()
    (msg,) = sent
    s = link.statistics()
    assert msg.delivered_s == pytest.approx(1.5, rel=EXACT)
    assert s.busy_s == pytest.approx(1.0, rel=EXACT)
    assert s.total_outage_wait_s == pytest.approx(0.5, rel=EXACT)
    assert s.total_queueing_s == pytest.approx(0.5, rel=1e-9)


# -- the resource contract and bad input -------------------------------------------------------


def test_put_is_born_processed_and_get_is_refused():
    """``put`` returns a processed event whose value is the Message; a Link has no get side."""
    env, link, _, _ = _link(bandwidth_bytes_per_s=1e3, rtt_s=1.0)
    event = link.put("p", 10)
    assert event.processed and event.ok and isinstance(event.value, Message) and event.value.payload == "p"
    assert events_scheduled(env) == 1  # only the transmission's timer, none for the put
    with pytest.raises(TypeError, match=r"link\.out"):
        link.get()


RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rtt_s": -0.1}, r"rtt_s must be a number >= 0"),
        ({"bandwidth_bytes_per_s": 0.0}, r"bandwidth_bytes_per_s must be a number > 0 \(math.inf allowed\)"),
        ({"overhead_s": math.nan}, r"overhead_s must be a number >= 0"),
        ({"rtt_jitter_s": -1.0, "rng": RNG}, r"rtt_jitter_s must be a number >= 0"),
        ({"loss_probability": 1.5, "retransmit_timeout_s": 1.0, "rng": RNG}, r"loss_probability must be in \[0, 1\]"),
        ({"loss_probability": 0.1, "rng": RNG}, r"retransmit_timeout_s is required .* when loss_probability > 0"),
        ({"loss_probability": 1.0, "retransmit_timeout_s": 1.0, "rng": RNG}, r"max_retransmissions must be an int"),
        ({"max_retransmissions": -1}, r"max_retransmissions must be None or an int >= 0"),
        ({"rtt_jitter_s": 0.1}, r"rng must be a numpy.random.Generator when rtt_jitter_s"),
        ({"bandwidth_jitter": 0.1}, r"rng must be a numpy.random.Generator"),
        ({"loss_probability": 0.1, "retransmit_timeout_s": 1.0}, r"rng must be a numpy.random.Generator"),
        ({"outages": [(0.0, 2.0), (1.0, 3.0)]}, r"outages must be sorted and non-overlapping: outages\[1\]"),
        ({"outages": [(5.0, 6.0), (1.0, 2.0)]}, r"outages must be sorted and non-overlapping"),
        ({"outages": [(2.0, 2.0)]}, r"outages\[0\] must have a finite start_s < end_s"),
        ({"outages": [(1.0,)]}, r"outages\[0\] must be a \(start_s, end_s\) pair"),
        ({"outage_mode": "pause"}, r"outage_mode must be one of \('wait', 'drop'\), got 'pause'"),
    ],
)
def test_bad_parameters_name_the_parameter_and_what_is_allowed(kwargs, match):
    """Each invalid constructor argument raises ValueError naming it and its allowed values."""
    env = simpy.Environment()
    with pytest.raises(ValueError, match=match):
        Link(env, Wire(env), name="up", **kwargs)


def test_bad_size_is_refused():
    """A negative or infinite size raises ValueError naming size_bytes."""
    env = simpy.Environment()
    link = Link(env, Wire(env))
    for size in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="size_bytes must be a finite number >= 0"):
            link.put(None, size)
    assert link.statistics().puts == 0


def test_an_empty_message_during_a_lone_transmission_strands_nothing():
    """A zero-byte message put while another transmits alone is delivered at once, and the
    other still arrives when its transmission ends (it moved into the sharing heap)."""
    env = simpy.Environment()
    out = Wire(env)
    got = []
    out.connect(lambda m: got.append((m.payload, env.now)))
    link = Link(env, out, rtt_s=0.0, bandwidth_bytes_per_s=1000.0)
    link.put("a", 1.0)
    link.put("b", 0.0)
    env.run()
    assert got == [("b", 0.0), ("a", 0.001)]
    assert link.statistics().in_flight == 0


def test_a_lone_message_with_an_overhead_costs_one_event():
    """A message put on an idle link with an overhead is delivered by one scheduled event (its
    overhead has no timer of its own), at overhead + size / bandwidth + rtt / 2."""
    env = simpy.Environment()
    out = Wire(env)
    link = Link(env, out, rtt_s=0.02, bandwidth_bytes_per_s=1000.0, overhead_s=0.25)
    msg = link.send("a", 500.0)
    env.run()
    assert msg.delivered_s == pytest.approx(0.25 + 0.5 + 0.01, rel=EXACT)
    assert events_scheduled(env) == 1
    assert list(out.items) == [msg]


def test_a_message_in_its_overhead_is_counted_in_flight_and_busies_nothing():
    """During a lone message's overhead the link counts it put and in flight, and no busy time."""
    env = simpy.Environment()
    link = Link(env, Wire(env), rtt_s=0.0, bandwidth_bytes_per_s=1000.0, overhead_s=0.25)
    link.send("a", 500.0)
    env.run(until=0.125)
    s = link.statistics()
    assert (s.puts, s.delivered, s.in_flight, s.busy_s) == (1, 0, 1, 0.0)
    env.run(until=0.5)
    assert link.statistics().busy_s == pytest.approx(0.25, rel=EXACT)


def test_a_message_put_during_another_s_overhead_starts_after_it_and_shares():
    """B put while A is in its overhead starts transmitting an overhead after its own put and
    shares the bandwidth with A from then: A alone over [0.1, 0.15] (50 B), then both at
    500 B/s until A's last 450 B end at 1.05, then B's last 50 B alone until 1.1; each adds
    half the round trip."""
    env = simpy.Environment()
    out = Wire(env)
    got = {}
    out.connect(lambda m: got.setdefault(m.payload, env.now))
    link = Link(env, out, rtt_s=0.2, bandwidth_bytes_per_s=1000.0, overhead_s=0.1)

    def sender():
        link.send("a", 500.0)
        yield env.timeout(0.05)
        link.send("b", 500.0)

    env.process(sender())
    env.run()
    assert got["a"] == pytest.approx(1.05 + 0.1, rel=EXACT)
    assert got["b"] == pytest.approx(1.1 + 0.1, rel=EXACT)
