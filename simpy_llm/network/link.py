"""Link: a one-way network link between two endpoints, as a SimPy resource.

Kept whole (over 800 lines): the link's transmission, its faults (loss, jitter, outages)
and the fast path for a lone message share one clock and one queue, read together.

A :class:`Link` carries messages from the endpoint that calls :meth:`Link.put`
to a :class:`~simpy_llm.wire.Wire` (``out``), where each message is put at the
instant it is delivered. Time is simulated float seconds, sizes are bytes.

The model
---------
A message put at ``t0`` (its ``sent_s``) goes through, exactly:

1. **Outage at arrival.** If ``t0`` falls in an outage window ``[start_s, end_s)``,
   in ``"wait"`` mode the message waits until the link is up again (the end of
   the outage, or of a chain of touching ones); in ``"drop"`` mode it is dropped
   at once (``dropped_reason="outage"``).
2. **Overhead.** ``overhead_s`` of pure delay (setup, serialization in the
   host), during which the message uses no bandwidth; outages do not stop it.
3. **Transmission under processor sharing.** The link's bandwidth is shared
   equally among all messages transmitting at that instant: with *n* of them,
   each is served at ``bandwidth_bytes_per_s / n``. Each message carries a
   bandwidth factor ``f = max(0.05, 1 + bandwidth_jitter * Z)``, ``Z ~ N(0, 1)``,
   drawn once per message at its put; it sees ``f`` times its fair share, which
   is modelled as a *work* of ``size_bytes / f`` served at the fair share. An
   infinite bandwidth (or a message of 0 bytes) transmits in no time.
4. **Loss.** When a transmission ends it is lost with probability
   ``loss_probability`` (one uniform draw per transmission); the loss is
   detected by timeout, and the sender starts a new transmission of the whole
   message ``retransmit_timeout_s`` after the lost one ended (again sharing the
   bandwidth; the overhead is not paid again). A loss after
   ``max_retransmissions`` retransmissions drops the message
   (``dropped_reason="loss"``); ``None`` retransmits forever.
5. **Propagation.** The successful transmission is delivered a one-way delay
   after it ended. Per message, a round trip ``max(0, rtt_s + rtt_jitter_s * Z')``,
   ``Z' ~ N(0, 1)``, is drawn once at its put (after ``f``), and the one-way delay
   is half of it: ``rtt_s / 2`` without jitter. Propagation is not affected by
   outages, nor by other messages.

So without contention, jitter or loss, ``delivered_s = t0 + overhead_s +
size_bytes / bandwidth_bytes_per_s + rtt_s / 2``; *n* equal messages put
together each arrive at ``t0 + overhead_s + n * size_bytes / bandwidth + rtt_s /
2``; and with loss *p*, timeout *T* and no contention the mean of ``delivered_s -
t0`` is ``overhead_s + rtt_s / 2 + (size / bandwidth) / (1 - p) + T p / (1 - p)``
(the number of transmissions is geometric with mean ``1 / (1 - p)``).

**Outages** (``[start_s, end_s)`` windows) stop every byte. In ``"wait"`` mode
transmissions in progress pause and resume at the outage's end with their
remaining bytes, and transmissions that would start during one (after the
overhead, or a retransmission) start paused. In ``"drop"`` mode messages
transmitting when an outage starts are dropped then, and so is any transmission
that would start during one. Messages in their overhead, waiting to retransmit
or propagating are not affected until they next need the link.

Assumptions and caveats
-----------------------
* Sharing is equal among the messages in flight (ideal fair queueing); there is
  no TCP slow start, congestion control, windowing or head-of-line blocking, and
  a message's bytes are one fluid flow, not packets.
* Processor sharing is the standard fluid model of fair bandwidth sharing among
  flows (Kleinrock, "Time-shared systems: a theoretical treatment", J. ACM 14(2),
  1967; Massoulie and Roberts, "Bandwidth sharing: objectives and algorithms",
  IEEE/ACM Trans. Networking 10(3), 2002; Ben Fredj et al., "Statistical bandwidth
  sharing", SIGCOMM 2001).
* Loss is all-or-nothing per transmission and is detected by a fixed timeout
  (no duplicate ACKs, no adaptive RTO, no backoff).
* The bandwidth factor stands for a message-specific share (e.g. a flow whose
  path is faster or slower than its fair share); it does not slow other messages.

How it runs
-----------
The put never blocks, so like :class:`~simpy_llm.wire.Wire` the link is a
:class:`~simpy_llm.kernel.Channel` whose put event is born processed
(:class:`LinkPut`) and no event is scheduled for it. A link has no get side:
consumers take delivered messages from ``out``.

Processor sharing runs in *virtual time* (the technique of GPS/WFQ schedulers,
Parekh and Gallager 1993): ``V`` is the work served so far to each message that
has been transmitting all along; it grows at ``bandwidth / n`` while bytes move,
so a transmission that starts at ``V0`` with work ``w`` ends when ``V`` reaches
``V0 + w``, whatever starts and ends in between. Transmitting messages sit in a
heap keyed by that finish ``V``; on every change (a start, an end, an outage
boundary with messages in flight) ``V`` is brought up to date and one timer is
set for the next change. A superseded timer is recognised by a version number
and ignored. Timers fire at exact absolute times
(:func:`~simpy_llm.kernel.timer_at`), so the closed forms above hold to
rounding. A message costs O(1) scheduled events: its overhead timer, about two
sharing timers, a retransmission timer per loss and its delivery timer (none
for a zero overhead or a zero one-way delay).

**A lone transmission** (the link idle, no loss and no outages configured: the
common case of a device with one message in flight) takes one timer, straight to
its delivery at ``start + work / bandwidth + one_way``, the instant the sharing
path would give. A message put on such a link while nothing transmits and no other
message is in its overhead takes that timer at its put, its overhead included
(``start = sent_s + overhead_s``): every message pays the same overhead from its
put, so none can start before it, and the overhead costs no event of its own.
If another transmission starts before it has ended, it joins the sharing heap as if
it had started there all along (``V`` from 0 at its start) and its shortcut timer
is ignored; if one starts after it ended, only its busy time is booked and its
delivery stands.
"""

from __future__ import annotations

import functools
import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import numpy as np

from simpy_llm.kernel import Channel, ProcessedEvent, TimerAt, timer_at

if TYPE_CHECKING:
    import simpy
    from simpy.events import Event

    from simpy_llm.wire import Wire

__all__ = ["OUTAGE_MODES", "Link", "LinkPut", "LinkStats", "Message"]

OUTAGE_MODES = ("wait", "drop")
"""What an outage does to the messages that need the link during it."""

NORMAL_CHUNK = 256
"""Standard normals a link without loss draws from its stream at a time (its jitter)."""
_FINISH_RTOL = 1e-12
"""A transmission whose remaining virtual work is within this fraction of ``V`` has ended:
the timer set for its end lands there up to rounding."""


@attrs.define(eq=False, slots=True)
class Message:
    """A message carried by a :class:`Link` (created by :meth:`Link.put`).

    Examples
    --------
    >>> m = Message(payload="hello", size_bytes=5.0, sent_s=1.0)
    >>> m.delivered_s, m.attempts, m.dropped_reason
    (nan, 0, '')
    """

    payload: Any
    """What the message carries (the link never looks at it)."""
    size_bytes: float
    """Its size, bytes."""
    sent_s: float
    """When it was put on the link, s."""
    delivered_s: float = math.nan
    """When it was put on the link's ``out`` Wire, s (nan until then)."""
    dropped_s: float = math.nan
    """When it was dropped, s (nan unless dropped)."""
    dropped_reason: str = ""
    """``"outage"`` or ``"loss"`` if it was dropped, else ``""``."""
    attempts: int = 0
    """Transmissions started (1 + retransmissions)."""
    wait_s: float = 0.0
    """Time spent waiting for outages to end, s: before its overhead, and paused
    while transmitting."""
    queueing_s: float = 0.0
    """Time beyond what it would have taken alone on an idle, always-up link given the
    same losses, s: the outage wait before its overhead plus, per transmission, its
    span minus ``size_bytes / (bandwidth_factor x bandwidth)``."""
    bandwidth_factor: float = 1.0
    """The multiple of its fair share of the bandwidth it is served at (dimensionless)."""
    one_way_s: float = 0.0
    """Its propagation delay, s (half its round-trip sample)."""
    lone: bool = False
    """Its delivery is scheduled by the lone-transmission shortcut (see "How it runs")."""
    ahead: bool = False
    """Its delivery was handed to its sender (:meth:`Link.put_ahead`): no event delivers it."""


class LinkPut(ProcessedEvent):
    """The (already processed) event of a put (``LinkPut(env, message)``); its value is the
    :class:`Message`."""

    @property
    def message(self) -> Message:
        """The message put."""
        return cast(Message, self.value)  # Link.put makes it with its Message as the value


@attrs.frozen(kw_only=True)
class LinkStats:
    """A snapshot of a :class:`Link`'s counters (``puts == delivered + dropped + in_flight``)."""

    puts: int
    """Messages put."""
    delivered: int
    """Messages put on ``out``."""
    dropped: int
    """Messages dropped (``dropped_outage + dropped_loss``)."""
    dropped_outage: int
    """Messages dropped by an outage in ``"drop"`` mode."""
    dropped_loss: int
    """Messages dropped after their last allowed retransmission was lost."""
    in_flight: int
    """Messages put and neither delivered nor dropped."""
    bytes_delivered: float
    """Bytes of the delivered messages, bytes."""
    retransmissions: int
    """Retransmissions started (transmissions beyond each message's first)."""
    busy_s: float
    """Time during which bytes moved (at least one message transmitting, no outage), s."""
    elapsed_s: float
    """Time since the link was created, s."""
    total_queueing_s: float
    """Sum of the delivered messages' ``queueing_s``, s."""
    mean_queueing_s: float
    """Mean ``queueing_s`` of the delivered messages, s (nan before the first)."""
    total_outage_wait_s: float
    """Sum of the delivered messages' ``wait_s``, s."""

    def utilisation(self, span_s: float | None = None) -> float:
        """Fraction of *span_s* (default ``elapsed_s``) during which bytes moved: ``busy_s / span_s``.

        nan over an empty span.

        Examples
        --------
        >>> LinkStats(puts=0, delivered=0, dropped=0, dropped_outage=0, dropped_loss=0, in_flight=0,
        ...           bytes_delivered=0.0, retransmissions=0, busy_s=1.0, elapsed_s=4.0,
        ...           total_queueing_s=0.0, mean_queueing_s=math.nan, total_outage_wait_s=0.0).utilisation()
        0.25
        """
        span = self.elapsed_s if span_s is None else span_s
        return self.busy_s / span if span > 0 else math.nan


def _check_number(owner: str, name: str, value: Any, *, allow_inf: bool = False, positive: bool = False) -> float:
    bound = "> 0" if positive else ">= 0"
    allowed = f"a number {bound}" + (" (math.inf allowed)" if allow_inf else ", finite")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{owner}{name} must be {allowed}, got {value!r}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < 0 or (positive and v == 0):
        raise ValueError(f"{owner}{name} must be {allowed}, got {value!r}")
    return v


class Link(Channel):
    """A one-way link with latency, processor-shared bandwidth, loss and outages.

    Parameters
    ----------
    env
        The SimPy environment.
    out
        Wire each delivered :class:`Message` is put on, at its delivery instant.
    name
        Label used in error messages.
    rtt_s
        Round-trip time, s; a message propagates for half of it (>= 0).
    bandwidth_bytes_per_s
        Capacity shared equally by the messages transmitting, bytes/s (> 0;
        ``math.inf``: transmission takes no time).
    overhead_s
        Fixed delay per message before its bytes start, s (>= 0); uses no bandwidth.
    rtt_jitter_s
        Standard deviation of the per-message round-trip sample, s (>= 0): the
        sample is ``max(0, rtt_s + rtt_jitter_s * N(0, 1))``.
    bandwidth_jitter
        Relative standard deviation of the per-message bandwidth factor
        ``max(0.05, 1 + bandwidth_jitter * N(0, 1))`` (dimensionless, >= 0).
    loss_probability
        Probability that a transmission is lost, in [0, 1].
    retransmit_timeout_s
        Time from the end of a lost transmission to the start of its retransmission,
        s (>= 0; required when ``loss_probability > 0``).
    max_retransmissions
        Retransmissions allowed per message before a further loss drops it (an
        int >= 0; None: unlimited, which needs ``loss_probability < 1``).
    outages
        ``(start_s, end_s)`` windows, s, during which no byte moves: sorted,
        non-overlapping (touching allowed), ``start_s < end_s``; ``end_s`` may be
        ``math.inf`` for the last.
    outage_mode
        ``"wait"`` (transmissions pause, arrivals wait) or ``"drop"`` (they are dropped).
    rng
        numpy Generator for the jitters and losses (required when any of them is > 0).
    dropped
        Optional Wire each dropped :class:`Message` is put on when it is dropped
        (otherwise drops are only counted).

    Examples
    --------
    >>> import simpy
    >>> from simpy_llm.wire import Wire
    >>> env = simpy.Environment()
    >>> out = Wire(env)
    >>> link = Link(env, out, rtt_s=0.5, bandwidth_bytes_per_s=1000.0, overhead_s=0.25)
    >>> a = link.put("a", 1000).value  # alone: 0.25 + 1000 / 1000 + 0.5 / 2
    >>> env.run()
    >>> a.delivered_s, out.items[0] is a
    (1.5, True)
    >>> b, c = link.put("b", 500).value, link.put("c", 500).value  # at 1.5, sharing the bandwidth
    >>> env.run()
    >>> b.delivered_s, c.delivered_s
    (3.0, 3.0)
    >>> s = link.statistics()
    >>> s.delivered, s.in_flight, s.busy_s, s.utilisation()
    (3, 0, 2.0, 0.6666666666666666)
    """

    def __init__(
        self,
        env: simpy.Environment,
        out: Wire,
        *,
        name: str = "",
        rtt_s: float = 0.0,
        bandwidth_bytes_per_s: float = math.inf,
        overhead_s: float = 0.0,
        rtt_jitter_s: float = 0.0,
        bandwidth_jitter: float = 0.0,
        loss_probability: float = 0.0,
        retransmit_timeout_s: float | None = None,
        max_retransmissions: int | None = None,
        outages: Sequence[tuple[float, float]] = (),
        outage_mode: str = "wait",
        rng: np.random.Generator | None = None,
        dropped: Wire | None = None,
    ) -> None:
        super().__init__(env)
        owner = f"Link {name!r}: " if name else "Link: "
        self.out = out
        """Wire delivered messages are put on."""
        self.dropped = dropped
        """Wire dropped messages are put on (None: they are only counted)."""
        self.name = name
        self.rtt_s = _check_number(owner, "rtt_s", rtt_s)
        self.bandwidth_bytes_per_s = _check_number(
            owner, "bandwidth_bytes_per_s", bandwidth_bytes_per_s, allow_inf=True, positive=True
        )
        self.overhead_s = _check_number(owner, "overhead_s", overhead_s)
        self.rtt_jitter_s = _check_number(owner, "rtt_jitter_s", rtt_jitter_s)
        self.bandwidth_jitter = _check_number(owner, "bandwidth_jitter", bandwidth_jitter)
        p = _check_number(owner, "loss_probability", loss_probability)
        if p > 1:
            raise ValueError(f"{owner}loss_probability must be in [0, 1], got {loss_probability!r}")
        self.loss_probability = p
        if retransmit_timeout_s is None:
            if p > 0:
                raise ValueError(
                    f"{owner}retransmit_timeout_s is required (a number >= 0, s) when loss_probability > 0"
                )
            self.retransmit_timeout_s = math.nan
        else:
            self.retransmit_timeout_s = _check_number(owner, "retransmit_timeout_s", retransmit_timeout_s)
        if max_retransmissions is not None and (
            isinstance(max_retransmissions, bool)
            or not isinstance(max_retransmissions, (int, np.integer))
            or max_retransmissions < 0
        ):
            raise ValueError(f"{owner}max_retransmissions must be None or an int >= 0, got {max_retransmissions!r}")
        if p == 1 and max_retransmissions is None:
            raise ValueError(
                f"{owner}max_retransmissions must be an int >= 0 when loss_probability is 1 "
                "(None would retransmit forever)"
            )
        self.max_retransmissions = None if max_retransmissions is None else int(max_retransmissions)
        if outage_mode not in OUTAGE_MODES:
            raise ValueError(f"{owner}outage_mode must be one of {OUTAGE_MODES}, got {outage_mode!r}")
        self.outage_mode = outage_mode
        self._drop_mode = outage_mode == "drop"
        if (self.rtt_jitter_s > 0 or self.bandwidth_jitter > 0 or p > 0) and not isinstance(rng, np.random.Generator):
            raise ValueError(
                f"{owner}rng must be a numpy.random.Generator when rtt_jitter_s, bandwidth_jitter or "
                f"loss_probability is > 0, got {rng!r}"
            )
        self.rng = rng
        self.outages = self._check_outages(owner, outages)
        """The outage windows, ``(start_s, end_s)``, s."""
        self._starts = [s for s, _ in self.outages]
        self._ends = [e for _, e in self.outages]
        # _cum[i]: total outage time before outage i starts, for O(log K) outage time up to any t.
        self._cum = [0.0]
        for s, e in self.outages:
            self._cum.append(self._cum[-1] + (e - s))

        self._created_s = env.now
        # Processor sharing: (finish V, seq, message, attempt start s, outage time at start).
        self._heap: list[tuple[float, int, Message, float, float]] = []
        self._v = 0.0
        self._t_last = env.now
        self._version = 0
        self._timer_s: float | None = None
        self._seq = 0
        # The lone transmission: (message, start s, transmission end s), or None.
        self._lone: tuple[Message, float, float] | None = None
        self._in_overhead = 0
        """Messages in their overhead with a timer to their start (a lone one's is part of its delivery)."""
        self._normals: list[float] = []
        self._shortcut = not self.outages and p == 0 and self.bandwidth_bytes_per_s < math.inf
        self._plain = self.bandwidth_jitter == 0 and self.rtt_jitter_s == 0
        """No jitter: a message's bandwidth factor is 1 and its one-way delay ``_one_way_s``."""
        self._one_way_s = self.rtt_s / 2
        # Counters.
        self._puts = 0
        self._delivered = 0
        self._dropped_outage = 0
        self._dropped_loss = 0
        self._bytes_delivered = 0.0
        self._retransmissions = 0
        self._busy_s = 0.0
        self._queueing_s = 0.0
        self._outage_wait_s = 0.0

    @staticmethod
    def _check_outages(owner: str, outages: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
        checked: list[tuple[float, float]] = []
        for i, window in enumerate(outages):
            try:
                start, end = (float(x) for x in window)
            except (TypeError, ValueError):
                raise ValueError(f"{owner}outages[{i}] must be a (start_s, end_s) pair of numbers, got {window!r}") from None
            if not math.isfinite(start) or math.isnan(end) or end <= start:
                raise ValueError(
                    f"{owner}outages[{i}] must have a finite start_s < end_s (end_s may be math.inf), got {window!r}"
                )
            if checked and start < checked[-1][1]:
                raise ValueError(
                    f"{owner}outages must be sorted and non-overlapping: outages[{i}] = {window!r} "
                    f"starts before outages[{i - 1}] = {checked[-1]!r} ends"
                )
            checked.append((start, end))
        return tuple(checked)

    # -- the resource contract ------------------------------------------------------------

    def put(self, payload: Any, size_bytes: float) -> LinkPut:  # type: ignore[override]  # never waits; takes the message's size
        """Send *payload* of *size_bytes* bytes now; the returned event is already processed.

        Its value (and ``.message``) is the :class:`Message` tracking the transfer.
        """
        return LinkPut(self.env, self.send(payload, size_bytes))

    def send(self, payload: Any, size_bytes: float) -> Message:
        """Send *payload* of *size_bytes* bytes now, as :meth:`put` does, and return its
        :class:`Message` without making the put's event (senders on the hot path use this).

        >>> import simpy
        >>> from simpy_llm.wire import Wire
        >>> env = simpy.Environment(); link = Link(env, Wire(env), rtt_s=0.02, bandwidth_bytes_per_s=1000.0)
        >>> msg = link.send("prompt", 10.0); env.run(); msg.delivered_s
        0.02
        """
        now = self.env.now
        # Nothing transmits and nothing else will start before this message's overhead ends
        # (every message pays the same overhead from its put): it transmits alone from then
        # on unless another starts meanwhile, so its delivery is one timer.
        alone = self._shortcut and self._lone is None and not self._heap and not self._in_overhead
        if alone and self._plain and type(size_bytes) is float and 0 < size_bytes < math.inf:
            # The common case in one go: a valid size, no jitter to draw (as _message gives).
            msg = Message(payload, size_bytes, float(now))
            msg.one_way_s = self._one_way_s
            self._puts += 1
            self._start_lone(msg, now + self.overhead_s, size_bytes)
            return msg
        msg = self._message(payload, size_bytes, now)
        if alone:
            work = msg.size_bytes / msg.bandwidth_factor
            if work > 0:  # a lone transmission, without the general path's checks
                self._start_lone(msg, now + self.overhead_s, work)
                return msg
        self._send(msg)
        return msg

    def put_at(self, payload: Any, size_bytes: float, at_s: float) -> Message:
        """Send *payload* at the later time *at_s* (its ``sent_s``), as :meth:`put` would then:
        a sender that knows when its message will be ready (a draft device drafting) saves
        the event of waking up to send it. Returns the :class:`Message`; its jitter is drawn
        now, in call order.

        >>> import simpy
        >>> from simpy_llm.wire import Wire
        >>> env = simpy.Environment(); out = Wire(env); got = []
        >>> out.connect(lambda m: got.append((m.sent_s, env.now)))
        >>> link = Link(env, out, rtt_s=0.02, bandwidth_bytes_per_s=1000.0)
        >>> _ = link.put_at("bundle", 10.0, 0.5)
        >>> env.run(); got   # sent at 0.5, 10 B at 1 kB/s, then half the round trip
        [(0.5, 0.52)]
        """
        now = self.env.now
        if at_s <= now:
            return self.send(payload, size_bytes)
        msg = self._message(payload, size_bytes, at_s)
        if self._shortcut and self.overhead_s == 0 and not self._heap and self._lone is None:
            work = msg.size_bytes / msg.bandwidth_factor
            if work > 0:
                self._start_lone(msg, at_s, work)
                return msg
        self._puts -= 1  # counted when it is sent (figures count a message from its sent_s)
        timer_at(self.env, at_s).callbacks.append(functools.partial(self._on_send, msg))
        return msg

    def put_ahead(self, payload: Any, size_bytes: float) -> Message | None:
        """Send *payload* now and hand its delivery to the caller: when it would transmit
        alone (an idle link without outages, loss or overhead), its delivery time is known
        now, and the message is returned with ``delivered_s`` set and counted as delivered
        from then on, without an event and without a put on ``out`` (the caller acts on it
        itself). Otherwise nothing is sent and the result is None: use :meth:`put`.

        A sender whose next step depends on nothing but the delivery's time (a draft device
        under a static γ) saves the delivery's event. The sender promises that nothing else
        enters the link until the message's transmission ends (its delivery time is fixed
        now, so it cannot share the bandwidth): a put before then raises RuntimeError.

        >>> import simpy
        >>> from simpy_llm.wire import Wire
        >>> env = simpy.Environment(); link = Link(env, Wire(env), rtt_s=0.02, bandwidth_bytes_per_s=1000.0)
        >>> msg = link.put_ahead("verdict", 10.0)
        >>> msg.delivered_s, link.statistics().delivered   # 10 ms sending, 10 ms propagation
        (0.02, 0)
        >>> env.run(until=0.02); link.statistics().delivered
        1
        """
        if not self._shortcut or self.overhead_s != 0 or self._heap:
            return None
        now = self.env.now
        lone = self._lone
        if lone is not None:
            if not lone[0].ahead or now < lone[2]:
                return None
            self._lone = None
            self._busy_s += lone[2] - lone[1]
        msg = self._message(payload, size_bytes, now)
        end = now + msg.size_bytes / (msg.bandwidth_factor * self.bandwidth_bytes_per_s)
        msg.attempts = 1
        msg.ahead = True
        msg.delivered_s = end + msg.one_way_s
        self._lone = (msg, now, end)  # its busy time is booked when the next message settles it
        self._delivered += 1
        self._bytes_delivered += msg.size_bytes
        return msg

    def _message(self, payload: Any, size_bytes: float, sent_s: float) -> Message:
        """A new message with its jitter drawn."""
        if not (type(size_bytes) is float and 0 <= size_bytes < math.inf) and (  # the common case, checked first
            isinstance(size_bytes, bool) or not isinstance(size_bytes, (int, float, np.integer, np.floating))
            or not 0 <= size_bytes < math.inf
        ):
            raise ValueError(f"size_bytes must be a finite number >= 0, got {size_bytes!r}")
        msg = Message(payload, float(size_bytes), float(sent_s))
        self._puts += 1
        if self.bandwidth_jitter > 0:
            factor = 1.0 + self.bandwidth_jitter * self._normal()
            msg.bandwidth_factor = factor if factor > 0.05 else 0.05
        if self.rtt_jitter_s > 0:
            rtt = self.rtt_s + self.rtt_jitter_s * self._normal()
            msg.one_way_s = (rtt if rtt > 0.0 else 0.0) / 2
        else:
            msg.one_way_s = self.rtt_s / 2
        return msg

    def _normal(self) -> float:
        """The next standard normal of the link's stream. Without loss the stream serves
        only these, so they are drawn :data:`NORMAL_CHUNK` at a time (the same values, in
        the same order, as one at a time); with loss they interleave with its uniforms."""
        if self.loss_probability > 0:
            return float(self.rng.standard_normal())  # type: ignore[union-attr]  # __init__ requires rng with jitter
        buffer = self._normals
        if not buffer:
            buffer.extend(self.rng.standard_normal(NORMAL_CHUNK)[::-1].tolist())  # type: ignore[union-attr]  # as above
        return buffer.pop()

    def _on_send(self, msg: Message, _event: Event) -> None:
        self._puts += 1
        self._send(msg)

    def _send(self, msg: Message) -> None:
        """*msg* enters the link now: outage at arrival, overhead, then its transmission."""
        now = self.env.now
        if self.overhead_s == 0:
            # Waiting for an outage to end and starting paused until it ends are the same.
            self._start_attempt(msg)
            return
        start_s = now
        if self.outages and self._in_outage(now):
            if self._drop_mode:
                self._drop(msg, "outage")
                return
            start_s = self._up_after(now)
            msg.wait_s += start_s - now
            msg.queueing_s += start_s - now
        if start_s < math.inf:  # else the link never comes back: the message stays in flight
            self._in_overhead += 1
            ev = timer_at(self.env, start_s + self.overhead_s)
            ev.callbacks.append(functools.partial(self._on_start, msg))

    def get(self) -> Any:
        """A link has no get side: take delivered messages from its ``out`` Wire."""
        raise TypeError("a Link delivers to its out Wire; get() from link.out")

    def statistics(self) -> LinkStats:
        """Current counters (computed without changing the link's state)."""
        now = self.env.now
        busy = self._busy_s
        if self._heap and now > self._t_last:
            busy += self._active_time(self._t_last, now)
        puts, delivered, delivered_bytes = self._puts, self._delivered, self._bytes_delivered
        lone = self._lone
        if lone is not None:
            busy += max(0.0, min(now, lone[2]) - lone[1])
            if now < lone[0].sent_s:
                puts -= 1  # a put_at message not sent yet
            if lone[0].ahead and now < lone[0].delivered_s:
                delivered -= 1  # counted when it was sent; not there yet
                delivered_bytes -= lone[0].size_bytes
        dropped = self._dropped_outage + self._dropped_loss
        return LinkStats(
            puts=puts,
            delivered=delivered,
            dropped=dropped,
            dropped_outage=self._dropped_outage,
            dropped_loss=self._dropped_loss,
            in_flight=puts - delivered - dropped,
            bytes_delivered=float(delivered_bytes),
            retransmissions=self._retransmissions,
            busy_s=float(busy),
            elapsed_s=float(now - self._created_s),
            total_queueing_s=float(self._queueing_s),
            mean_queueing_s=float(self._queueing_s / delivered) if delivered else math.nan,
            total_outage_wait_s=float(self._outage_wait_s),
        )

    # -- outages ----------------------------------------------------------------------------

    def _in_outage(self, t: float) -> bool:
        i = bisect_right(self._starts, t)
        return i > 0 and t < self._ends[i - 1]

    def _up_after(self, t: float) -> float:
        """The first instant >= *t* outside every outage (past a chain of touching ones)."""
        i = bisect_right(self._starts, t)
        while i > 0 and t < self._ends[i - 1]:
            t = self._ends[i - 1]
            i = bisect_right(self._starts, t)
        return t

    def _outage_time(self, t: float) -> float:
        """Total outage time in ``(-inf, t]``, s."""
        i = bisect_right(self._starts, t)
        if i == 0:
            return 0.0
        return self._cum[i - 1] + (min(t, self._ends[i - 1]) - self._starts[i - 1])

    def _active_time(self, t0: float, t1: float) -> float:
        """Time in ``[t0, t1]`` outside outages, s."""
        if not self.outages:
            return t1 - t0
        return (t1 - t0) - (self._outage_time(t1) - self._outage_time(t0))

    # -- processor sharing --------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Bring V and the busy time up to *now* (the message count was constant since the last change)."""
        if now > self._t_last:
            if self._heap:
                active = self._active_time(self._t_last, now)
                if active > 0:
                    self._v += active * self.bandwidth_bytes_per_s / len(self._heap)
                    self._busy_s += active
            self._t_last = now

    def _on_start(self, msg: Message, _event: Event) -> None:
        self._in_overhead -= 1
        self._start_attempt(msg)

    def _on_retransmit(self, msg: Message, _event: Event) -> None:
        self._start_attempt(msg)

    def _start_attempt(self, msg: Message) -> None:
        now = self.env.now
        work = msg.size_bytes / msg.bandwidth_factor
        if self._shortcut:
            lone = self._lone
            if lone is not None:
                self._settle_lone(lone, now)
            if not self._heap and work > 0:
                self._start_lone(msg, now, work)
                return
        c_start = self._outage_time(now) if self.outages else 0.0
        if self.outages and self._in_outage(now):
            if self._drop_mode:
                self._drop(msg, "outage")
                return
            if work == 0 or self.bandwidth_bytes_per_s == math.inf:
                # Takes no time once the link is up; one timer to the outage's end.
                self._count_attempt(msg)
                up_s = self._up_after(now)
                if up_s < math.inf:
                    ev = timer_at(self.env, up_s)
                    ev.callbacks.append(functools.partial(self._on_instant_end, msg, now, c_start))
                return
        self._count_attempt(msg)
        if work == 0 or self.bandwidth_bytes_per_s == math.inf:
            self._end_attempt(msg, now, c_start)
            if self._heap and self._timer_s is None:  # a lone transmission just moved into the heap
                self._advance(now)
                self._reschedule(now)
            return
        self._advance(now)
        self._seq += 1
        heapq.heappush(self._heap, (self._v + work, self._seq, msg, now, c_start))
        self._reschedule(now)

    def _start_lone(self, msg: Message, start_s: float, work: float) -> None:
        """*msg* transmits alone from *start_s* (now, or later for :meth:`put_at`): one timer,
        at its delivery."""
        msg.attempts += 1
        msg.lone = True
        end = start_s + work / self.bandwidth_bytes_per_s
        self._lone = (msg, start_s, end)
        TimerAt(self.env, end + msg.one_way_s).callbacks.append(functools.partial(self._on_lone_end, msg))  # timer_at, one call less

    def _settle_lone(self, lone: tuple[Message, float, float], now: float) -> None:
        """Another transmission starts at *now*: book the busy time of the lone one (*lone*,
        the link's ``_lone``) if it has ended, move it into the sharing heap as if it had
        been there since its start if it is transmitting, or give it an ordinary start if it
        has not started yet (a :meth:`put_at` message not sent yet; a message in its overhead
        never gets here: :meth:`send` makes it lone only when no other can start first)."""
        msg, start, end = lone
        if msg.ahead and now < end:
            raise RuntimeError(
                f"link {self.name!r}: a message sent with put_ahead is still transmitting at {now!r} s "
                f"(until {end!r} s); its sender promised the link would stay its own until then"
            )
        self._lone = None
        if now < start:
            msg.lone = False
            msg.attempts -= 1  # its start will count the attempt
            self._puts -= 1  # and the put (figures count a message from its sent_s)
            timer_at(self.env, start).callbacks.append(functools.partial(self._on_send, msg))
            return
        if now >= end:
            self._busy_s += end - start
            return
        msg.lone = False  # its shortcut timer is ignored: the sharing path delivers it
        self._t_last = start
        self._v = 0.0
        self._seq += 1
        heapq.heappush(self._heap, (msg.size_bytes / msg.bandwidth_factor, self._seq, msg, start, 0.0))

    def _on_lone_end(self, msg: Message, _event: Event) -> None:
        if not msg.lone:
            return  # it joined the sharing heap
        msg.lone = False
        lone = self._lone
        if lone is not None and lone[0] is msg:  # still the link's lone one: it has ended
            self._lone = None
            self._busy_s += lone[2] - lone[1]
        # _deliver(msg, now), inline (once per lone message: the usual delivery)
        msg.delivered_s = self.env.now
        self._delivered += 1
        self._bytes_delivered += msg.size_bytes
        self._queueing_s += msg.queueing_s
        self._outage_wait_s += msg.wait_s
        self.out.send(msg)

    def _count_attempt(self, msg: Message) -> None:
        if msg.attempts:
            self._retransmissions += 1
        msg.attempts += 1

    def _on_instant_end(self, msg: Message, start_s: float, c_start: float, _event: Event) -> None:
        self._end_attempt(msg, start_s, c_start)

    def _next_change(self, now: float) -> float:
        """When the next transmission ends or the next outage boundary comes (heap not empty)."""
        if self.outages:
            i = bisect_right(self._starts, now)
            if i > 0 and now < self._ends[i - 1]:
                return self._ends[i - 1]
            boundary = self._starts[i] if i < len(self._starts) else math.inf
        else:
            boundary = math.inf
        finish = now + (self._heap[0][0] - self._v) * len(self._heap) / self.bandwidth_bytes_per_s
        return min(max(finish, now), boundary)

    def _reschedule(self, now: float) -> None:
        target = self._next_change(now) if self._heap else math.inf
        if target == math.inf:  # nothing left to change (idle, or an outage that never ends)
            self._version += 1
            self._timer_s = None
            return
        # A pending timer that fires no later recomputes when it does: keeping it saves an event
        # per start in a burst of starts.
        if self._timer_s is not None and self._timer_s <= target:
            return
        self._version += 1
        self._timer_s = target
        ev = timer_at(self.env, target)
        ev.callbacks.append(functools.partial(self._on_timer, self._version))

    def _on_timer(self, version: int, _event: Event) -> None:
        if version != self._version:
            return  # superseded
        self._timer_s = None
        now = self.env.now
        self._advance(now)
        heap = self._heap
        in_outage = bool(self.outages) and self._in_outage(now)
        bw = self.bandwidth_bytes_per_s
        while heap:
            vf = heap[0][0]
            remaining = vf - self._v
            # Ended: within rounding of V, or so little left that its end rounds to now
            # (then no timer could make progress).
            if remaining > _FINISH_RTOL * max(1.0, abs(self._v)) and (
                in_outage or now + remaining * len(heap) / bw > now
            ):
                break
            _, _, msg, start_s, c_start = heapq.heappop(heap)
            self._end_attempt(msg, start_s, c_start)
        if in_outage and self._drop_mode and heap:
            victims = sorted(heap)
            heap.clear()  # before the drops: a dropped Wire's handler may put again
            for _, _, msg, _, _ in victims:
                self._drop(msg, "outage")
        if not heap:
            self._v = 0.0  # V only matters relative to messages in flight; restart it for precision
        self._reschedule(now)

    # -- ends ------------------------------------------------------------------------------------

    def _end_attempt(self, msg: Message, start_s: float, c_start: float) -> None:
        now = self.env.now
        if self.outages:
            msg.wait_s += self._outage_time(now) - c_start
        alone = msg.size_bytes / (msg.bandwidth_factor * self.bandwidth_bytes_per_s)
        msg.queueing_s += max(0.0, (now - start_s) - alone)
        p = self.loss_probability
        if p > 0 and self.rng.random() < p:  # type: ignore[union-attr]  # __init__ requires rng with loss
            if self.max_retransmissions is not None and msg.attempts > self.max_retransmissions:
                self._drop(msg, "loss")
                return
            ev = timer_at(self.env, now + self.retransmit_timeout_s)
            ev.callbacks.append(functools.partial(self._on_retransmit, msg))
            return
        if msg.one_way_s > 0:
            ev = timer_at(self.env, now + msg.one_way_s)
            ev.callbacks.append(functools.partial(self._on_deliver, msg))
        else:
            self._deliver(msg)

    def _on_deliver(self, msg: Message, _event: Event) -> None:
        self._deliver(msg)

    def _deliver(self, msg: Message, now: float | None = None) -> None:
        msg.delivered_s = self.env.now if now is None else now
        self._delivered += 1
        self._bytes_delivered += msg.size_bytes
        self._queueing_s += msg.queueing_s
        self._outage_wait_s += msg.wait_s
        self.out.send(msg)

    def _drop(self, msg: Message, reason: str) -> None:
        msg.dropped_s = self.env.now
        msg.dropped_reason = reason
        if reason == "loss":
            self._dropped_loss += 1
        else:
            self._dropped_outage += 1
        if self.dropped is not None:
            self.dropped.send(msg)
