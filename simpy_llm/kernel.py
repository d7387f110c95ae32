"""The kernel: the one module of ``simpy_llm`` that touches SimPy's internals.

Kept whole (over 800 lines): the rule is one module for every touch of SimPy's internals,
checked at import by :func:`check_simpy` against one pinned release; split, a SimPy upgrade
would have two files to update and two contracts to keep in step.

SimPy's public API schedules events at ``now + delay``, makes every put a
scheduled event and moves a process's wait only by throwing an interrupt into
it. The simulator needs a little more, for exactness and for speed, and gets
it by reading and writing a few of SimPy's private names. Every such touch is
here, behind a public, documented function or class; no other module of the
package may name a SimPy private (``tests/unit/test_simpy_privates.py`` walks
the package and fails on any that does). When SimPy changes, this is the one
file to update: :func:`check_simpy` runs at import and names the internal that
moved, and ``pyproject.toml`` pins SimPy to the minor release checked
(:data:`CHECKED_SIMPY`).

Operations
----------
:func:`timer_at`, :class:`TimerAt`
    An event firing at an *absolute* time, at :data:`LATE` priority.
    ``env.timeout(at_s - env.now)`` computes ``now + (at_s - now)``, which can
    land one ulp away from ``at_s``; the engine's step ends are whole
    nanoseconds that must coincide with arrivals to the bit, and they must come
    after every ordinary (NORMAL) event of their instant so that a step's plan
    sees all the requests that arrived at its start. The event is pushed on the
    environment's queue (``_queue``) with the next event id (``_eid``), exactly
    the entry ``env.schedule`` makes, with the exact time.
:class:`Later`
    ``env.timeout(delay)`` with one callback, in one object: the same queue entry (time
    ``now + delay``, NORMAL priority, the next event id), without the Timeout's checks
    and its callbacks list grown afterwards. A replica's queueing delay is one per
    request.
:func:`schedule_at`, :func:`succeed_at`
    The same for an event that already exists: schedule a triggered event, or
    succeed an untriggered one (setting ``_ok`` and ``_value`` as
    ``Event.succeed`` does) and schedule it, at an absolute time and LATE
    priority. An idle engine's wake-up signal is succeeded this way.
:class:`ProcessedEvent`
    An event born *processed* (no callbacks list, a value, ok), scheduled never.
    A put that can never block returns one: the producer may ``yield`` it and
    continues at once, and the run saves a scheduled event per put
    (:class:`WirePut`; the link's ``LinkPut`` subclasses it).
:func:`move_wait`
    Move a process's wait from the event it waits for (``_target``) to another
    one, re-hanging its ``_resume`` callback: what ``Process.interrupt`` does
    before it throws, without the interruption event and the exception. The
    engine cuts a decode stretch short this way.
:func:`events_scheduled`
    The number of events scheduled so far, read from the event-id counter
    (``_eid``); SimPy keeps no other count.
:class:`Environment`
    ``simpy.Environment`` with the operations above as methods (as
    ``simpy.rt.RealtimeEnvironment`` extends it), and an event loop of its own: SimPy's
    ``run`` with its ``step`` inline (one call fewer per event), which pops
    ``_queue`` and sets ``_now`` as ``step`` does; the functions work on any
    ``simpy.Environment``.
:class:`Channel`
    The base of the resources whose put never blocks (:class:`Wire`, the batch
    server's ``BinQueue``, the network ``Link``): a ``BaseResource`` whose
    subclasses serve gets through the public :meth:`Channel.serve` and
    :meth:`Channel.serve_getters` instead of SimPy's ``_do_get`` and
    ``_trigger_get``.

Examples
--------
A timer at an absolute time fires at exactly that float, after the ordinary
events of that instant:

>>> env = Environment()
>>> seen = []
>>> env.timer_at(0.1 + 0.2).callbacks.append(lambda ev: seen.append(("timer", env.now)))
>>> env.timeout(0.1 + 0.2).callbacks.append(lambda ev: seen.append(("timeout", env.now)))
>>> env.run()
>>> seen
[('timeout', 0.30000000000000004), ('timer', 0.30000000000000004)]
>>> env.events_scheduled()  # the two above (reading the count uses an id)
2

A put's event is born processed:

>>> wire = Wire(env)
>>> put = wire.put("x")
>>> put.processed, put.ok, put.item, wire.items
(True, True, 'x', deque(['x']))
"""

from __future__ import annotations

import heapq
import math
import operator
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import simpy
from simpy.core import BoundClass, StopSimulation
from simpy.events import NORMAL, PENDING, URGENT, Event, EventPriority, Process
from simpy.resources.base import BaseResource, Get

ChannelGet = Get
"""The get event a :class:`Channel` subclass derives its own from (SimPy's ``Get``), offered here
with :class:`BoundClass` (which binds it as the channel's ``get``) so that channels elsewhere in
the package import SimPy's resource machinery from the kernel alone."""

if TYPE_CHECKING:
    from collections.abc import Generator

__all__ = [
    "CHECKED_SIMPY",
    "LATE",
    "URGENT",
    "BoundClass",
    "Channel",
    "ChannelGet",
    "Environment",
    "Later",
    "ProcessedEvent",
    "SimPyContractError",
    "TimerAt",
    "Wire",
    "WireGet",
    "WirePut",
    "WireStats",
    "check_simpy",
    "events_scheduled",
    "move_wait",
    "schedule_at",
    "succeed_at",
    "timer_at",
]

CHECKED_SIMPY = "4.1"
"""The SimPy minor release whose internals this module was checked against (``pyproject.toml``
pins ``simpy>=4.1,<4.2``)."""

LATE = EventPriority(2)
"""SimPy priority of the kernel's timers and LATE successes: after NORMAL (1) events at the
same instant (URGENT is 0)."""

_heappush = heapq.heappush


# --- scheduling at absolute times -------------------------------------------------------


class TimerAt(Event):
    """An event that fires at the absolute time *at_s* (now, if that has passed), at
    :data:`LATE` priority; what :func:`timer_at` returns.

    Parameters
    ----------
    env
        Any ``simpy.Environment``.
    at_s
        When it fires, s (exactly this float).
    """

    def __init__(self, env: simpy.Environment, at_s: float) -> None:
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        now = env._now  # read once (the property costs a call per read)
        _heappush(env._queue, (at_s if at_s > now else now, LATE, next(env._eid), self))  # noqa: FURB136 - faster than max()


class Later(Event):
    """An event that fires *delay_s* from now at NORMAL priority and calls *callback* with
    itself: ``ev = env.timeout(delay_s); ev.callbacks.append(callback)``, in one step.

    The queue entry is the one ``env.timeout`` makes (time ``now + delay_s``, NORMAL, the next
    event id), so the run's order is the same to the event; it spares the Timeout's call
    chain and the callbacks list grown afterwards.

    Parameters
    ----------
    env
        Any ``simpy.Environment``.
    delay_s
        How long from now, s (not negative; the caller checks).
    callback
        Called as ``callback(event)`` when the event is processed.
    priority
        SimPy's priority (default NORMAL, as a timeout's); :data:`URGENT` with no delay is the
        slot a process's start takes (its ``Initialize`` event).

    Examples
    --------
    >>> env = simpy.Environment()
    >>> seen = []
    >>> _ = Later(env, 0.25, lambda ev: seen.append(env.now))
    >>> env.run(); seen
    [0.25]
    """

    def __init__(
        self, env: simpy.Environment, delay_s: float, callback: Callable[[Event], None], priority: EventPriority = NORMAL
    ) -> None:
        self.env = env
        self.callbacks = [callback]
        self._value = None
        self._ok = True
        _heappush(env._queue, (env._now + delay_s, priority, next(env._eid), self))


def timer_at(env: simpy.Environment, at_s: float) -> Event:
    """An event that fires at the absolute time *at_s* (now, if that has passed), after the
    NORMAL events of that instant: exactly at *at_s*, where ``env.timeout(at_s - now)``
    could land one ulp off.

    Examples
    --------
    >>> env = simpy.Environment()
    >>> env.run(until=1.1)
    >>> timer = timer_at(env, 5.2)
    >>> env.run()
    >>> env.now, timer.processed
    (5.2, True)
    >>> 1.1 + (5.2 - 1.1)  # where env.timeout(5.2 - now) at 1.1 would have fired
    5.199999999999999
    """
    return TimerAt(env, at_s)


def schedule_at(env: simpy.Environment, event: Event, at_s: float) -> None:
    """Schedule the triggered *event* at the absolute time *at_s* (now, if that has passed)
    with :data:`LATE` priority.

    ``env.schedule`` takes a delay and adds it to ``now``, which can land one ulp away from
    an exact absolute time; the queue entry is the one ``env.schedule`` would make, with the
    exact time. *event* must be triggered (succeeded or failed) and not yet scheduled.

    Examples
    --------
    An event made triggered and not scheduled (as this module's events are):

    >>> class Ready(Event):
    ...     def __init__(self, env, value):
    ...         super().__init__(env)
    ...         self._ok, self._value = True, value
    >>> env = simpy.Environment()
    >>> env.run(until=1.1)
    >>> ev = Ready(env, "w")
    >>> ev.callbacks.append(lambda ev: print(env.now, ev.value))
    >>> schedule_at(env, ev, 5.2)
    >>> env.run()
    5.2 w
    """
    now = env._now
    _heappush(env._queue, (at_s if at_s > now else now, LATE, next(env._eid), event))  # noqa: FURB136


def succeed_at(env: simpy.Environment, event: Event, at_s: float, value: Any = None) -> Event:
    """Succeed the untriggered *event* with *value*, processed at the absolute time *at_s*
    (now, if that has passed) at :data:`LATE` priority: ``event.succeed(value)`` at a time
    and priority of the caller's choosing. Returns *event*.

    Raises
    ------
    RuntimeError
        If *event* has already been triggered (as ``Event.succeed`` does).

    Examples
    --------
    >>> env = simpy.Environment()
    >>> signal = env.event()
    >>> order = []
    >>> signal.callbacks.append(lambda ev: order.append(("signal", ev.value)))
    >>> env.timeout(0, "t").callbacks.append(lambda ev: order.append(("timeout", ev.value)))
    >>> _ = succeed_at(env, signal, 0.0, "wake")  # created first, processed after the NORMAL timeout
    >>> env.run(); order
    [('timeout', 't'), ('signal', 'wake')]
    """
    if event._value is not PENDING:
        raise RuntimeError(f"{event} has already been triggered")
    event._ok = True
    event._value = value
    now = env._now
    _heappush(env._queue, (at_s if at_s > now else now, LATE, next(env._eid), event))  # noqa: FURB136
    return event


# --- events and processes --------------------------------------------------------------


class ProcessedEvent(Event):
    """An event born processed: ok, with *value*, no callbacks, never scheduled. Yielding it
    continues at once; adding a callback to it is an error (as on any processed event).

    Parameters
    ----------
    env
        Any ``simpy.Environment``.
    value
        The event's value.

    Examples
    --------
    >>> env = simpy.Environment()
    >>> ev = ProcessedEvent(env, 42)
    >>> ev.triggered, ev.processed, ev.ok, ev.value
    (True, True, True, 42)
    """

    def __init__(self, env: simpy.Environment, value: Any) -> None:
        self.env = env
        self.callbacks = None  # type: ignore[assignment]  # SimPy's mark of a processed event; its annotation says list
        self._value = value
        self._ok = True


def move_wait(process: Process, event: Event) -> None:
    """Make *process*, waiting for its current target, wait for *event* instead.

    This is what SimPy's ``Process.interrupt`` does before it throws: the process's resume
    callback leaves the event it waited for and hangs on *event*; the process resumes when
    *event* is processed, with *event*'s value. The old event still fires, with nobody
    waiting. It spares the interruption event and the exception.

    Parameters
    ----------
    process
        A live process waiting for an event (not the active process).
    event
        A pending or triggered, not yet processed event.

    Examples
    --------
    >>> env = simpy.Environment()
    >>> log = []
    >>> def sleeper():
    ...     value = yield env.timeout(10, "far")
    ...     log.append((env.now, value))
    >>> proc = env.process(sleeper())
    >>> env.run(until=1)
    >>> move_wait(proc, env.timeout(2, "near"))
    >>> env.run(); log
    [(3, 'near')]
    """
    resume = process._resume
    process._target.callbacks.remove(resume)
    event.callbacks.append(resume)
    process._target = event


def events_scheduled(env: simpy.Environment) -> int:
    """The number of events *env* has scheduled so far (processed or still queued).

    SimPy numbers every scheduled event from one counter (``_eid``, an
    ``itertools.count``); this draws its next value, which is the count. Drawing it uses
    an id: a second call returns one more than the first (nothing else changes, as ids
    only order events of the same time and priority, and they stay increasing). A run's
    reported ``events`` is this, read once at its end.

    Examples
    --------
    >>> env = simpy.Environment()
    >>> _ = env.timeout(1); _ = env.timeout(2)
    >>> events_scheduled(env), events_scheduled(env)
    (2, 3)
    """
    return next(env._eid)


class Environment(simpy.Environment):
    """``simpy.Environment`` with the kernel's operations as methods (the functions of this
    module work on any ``simpy.Environment``; these delegate to them). The simulation runs
    on one, so a process of a user's own may call ``env.timer_at(t)``.

    Examples
    --------
    >>> env = Environment()
    >>> def waiter():
    ...     yield env.timer_at(0.1 + 0.2)
    ...     return env.now
    >>> proc = env.process(waiter())
    >>> env.run(); proc.value == 0.1 + 0.2
    True
    """

    # SimPy's ``now`` is a property whose getter is a Python function; an attrgetter getter
    # reads the same attribute without a Python frame, and the components read ``env.now``
    # several times per request.
    now = property(operator.attrgetter("_now"), doc="The current simulated time (as ``simpy.Environment.now``).")

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.stops_scheduled = 0
        """The events :meth:`run` scheduled to stop (see :meth:`run`)."""

    def run(self, until: float | Event | None = None) -> Any:
        """``simpy.Environment.run``, counting the stop event a time *until* schedules, with
        the event loop of :meth:`_loop` (SimPy's ``step`` inline).

        A run in slices (a progress bar, a projection, a sharded run's windows) stops once
        per slice, and how many slices it takes may follow the wall clock:
        :meth:`events_scheduled` leaves those stops out, so a run's event count is the
        model's alone, the same however it was sliced.
        """
        if until is None:
            return self._run(None)
        # A time schedules an event to stop at; when a stop fires, SimPy's step schedules the
        # stopping event once more (for the callbacks after its own, none here): two ids per
        # slice, one if the run ends otherwise. An event already processed stops at once.
        if isinstance(until, Event):
            if until.callbacks is None:
                return self._run(until)
            scheduled = 0
        else:
            scheduled = 1 if until > self._now else 0
        try:
            value = self._run(until)
        except BaseException:
            self.stops_scheduled += scheduled
            raise
        self.stops_scheduled += scheduled + 1
        return value

    def _run(self, until: float | Event | None) -> Any:
        """``simpy.Environment.run`` (SimPy 4.1) with its ``step`` inline: a call fewer per
        event. A ``step`` of its own, a subclass's (a real-time environment) or one set on the
        instance (a test's event budget, a profiler's hook), keeps SimPy's loop, which calls it."""
        if getattr(self.step, "__func__", None) is not simpy.Environment.step:
            return super().run(until)
        if until is not None:
            if not isinstance(until, Event):
                at = until if isinstance(until, int) else float(until)
                if at <= self._now:
                    raise ValueError(f"until ({at}) must be greater than the current simulation time")
                # Schedule the event before all regular timeouts (as SimPy does).
                until = Event(self)
                until._ok = True
                until._value = None
                self.schedule(until, URGENT, at - self._now)
            elif until.callbacks is None:
                return until.value  # processed already
            until.callbacks.append(StopSimulation.callback)
        try:
            self._loop()
        except StopSimulation as exc:
            return exc.args[0]  # == until.value
        if until is not None:
            assert not until.triggered
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}')
        return None

    def _loop(self) -> None:
        """Process events until none is left (or a callback raises ``StopSimulation``):
        SimPy 4.1's ``step`` in a loop, statement for statement."""
        queue = self._queue
        pop = heapq.heappop
        while queue:
            self._now, _, _, event = pop(queue)
            # Callbacks set to None first, against changes while they run (as SimPy's step).
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]  # SimPy's mark of a processed event
            try:
                for callback in callbacks:
                    callback(event)
            except StopSimulation:
                # The callbacks after the stopping one run when the simulation resumes.
                event.callbacks = callbacks[callbacks.index(callback) + 1 :]
                self.schedule(event, EventPriority(-1))
                raise
            if not event._ok and not hasattr(event, "_defused"):
                # A failed event nobody defused crashes the run, with a fresh copy of its
                # exception (as SimPy's step raises it).
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc

    def timer_at(self, at_s: float) -> Event:
        """:func:`timer_at` on this environment."""
        return timer_at(self, at_s)

    def schedule_at(self, event: Event, at_s: float) -> None:
        """:func:`schedule_at` on this environment."""
        schedule_at(self, event, at_s)

    def succeed_at(self, event: Event, at_s: float, value: Any = None) -> Event:
        """:func:`succeed_at` on this environment."""
        return succeed_at(self, event, at_s, value)

    def events_scheduled(self) -> int:
        """:func:`events_scheduled` on this environment, less the stops :meth:`run` scheduled
        (a method, not a property: each call uses an event id).

        Examples
        --------
        >>> env = Environment()
        >>> _ = env.timeout(3)
        >>> env.run(until=1); env.run(until=2); env.run()
        >>> env.events_scheduled()  # the timeout alone: not the stops
        1
        >>> env = Environment()
        >>> done = env.event()
        >>> env.timeout(1).callbacks.append(lambda _: done.succeed())
        >>> env.run(until=done); env.events_scheduled()  # the timer and the signal
        2
        """
        return events_scheduled(self) - self.stops_scheduled


# SimPy binds its event factories (timeout, event, process, ...) to each environment in
# __init__, so that a call skips the descriptor, but only those the instance's own class
# defines (BoundClass.bind_early reads type(env).__dict__). Declaring them on the subclass
# lets SimPy bind them as it does for a plain Environment, inside __init__; binding them
# afterwards would also work, but adding attributes to an instance after __init__ makes
# CPython give up its compact attribute layout, and every env attribute read gets slower.
for _name, _factory in vars(simpy.Environment).items():
    if type(_factory) is BoundClass:
        setattr(Environment, _name, _factory)
del _name, _factory


# --- resources whose put never blocks --------------------------------------------------


class Channel(BaseResource):
    """The base of every resource whose put never blocks and returns a processed event.

    A subclass implements its own ``put`` (returning a :class:`ProcessedEvent`, or nothing),
    calls :meth:`serve_getters` when something arrives that a waiting getter may take, and
    implements :meth:`serve` to serve one get event. It never touches SimPy's privates. Its
    ``get`` may be ``BoundClass(SomeGet)`` (``simpy.core.BoundClass``, public), with
    ``SomeGet`` a subclass of ``simpy.resources.base.Get``.

    Parameters
    ----------
    env
        The SimPy environment.

    Examples
    --------
    >>> from simpy.resources.base import Get
    >>> class Mailbox(Channel):
    ...     get = BoundClass(Get)
    ...     def __init__(self, env):
    ...         super().__init__(env)
    ...         self.letters = []
    ...     def put(self, letter):
    ...         self.letters.append(letter)
    ...         if self.get_queue:
    ...             self.serve_getters()
    ...         return ProcessedEvent(self.env, letter)
    ...     def serve(self, event):
    ...         if not self.letters:
    ...             return False
    ...         event.succeed(self.letters.pop(0))
    ...         return True
    >>> env = simpy.Environment(); box = Mailbox(env)
    >>> got = box.get(); got.triggered
    False
    >>> _ = box.put("hello"); got.value
    'hello'
    """

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env, capacity=math.inf)
        self.env = env
        """The environment (a plain attribute: hot paths read ``self.env.now``)."""

    def serve_getters(self) -> None:
        """Offer the waiting get events, oldest first, to :meth:`serve` until one is not
        served or none is left (SimPy's ``_trigger_get``)."""
        self._trigger_get(None)

    def serve(self, event: Get) -> bool | None:
        """Serve the get *event* if possible (``event.succeed(value)``) and say whether to
        go on serving the next one; a subclass implements it. Called by SimPy when a get
        event is made and by :meth:`serve_getters`.

        Raises
        ------
        NotImplementedError
            Always, in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} has no get side")

    def _do_get(self, event: Get) -> bool | None:
        return self.serve(event)

    def _do_put(self, event: Any) -> None:  # pragma: no cover - puts bypass the put queue
        raise NotImplementedError(f"{type(self).__name__}.put never waits: it bypasses the put queue")


# --- the Wire ----------------------------------------------------------------------------


class WirePut(ProcessedEvent):
    """The (already processed) event of a put: yielding it continues at once."""

    def __init__(self, env: simpy.Environment, item: Any) -> None:
        # ProcessedEvent's fields set here rather than through super(): one call fewer per put.
        self.env = env
        self.callbacks = None  # type: ignore[assignment]  # SimPy's mark of a processed event; its annotation says list
        self._value = None
        self._ok = True
        self.item = item
        """The item put."""


class WireGet(Get):
    """Request to take the oldest item from a :class:`Wire`; its value is the item."""


@attrs.frozen
class WireStats:
    """Counters of a :class:`Wire`."""

    puts: int
    """Items put so far."""
    gets: int
    """Items taken so far."""
    level: int
    """Items waiting to be taken."""


class Wire(Channel):
    """An unbounded FIFO Store whose puts cost no scheduled event.

    The unbounded FIFO Store the components are connected with. It behaves like an
    unbounded :class:`simpy.Store`, with one difference that matters for speed: since a
    put can never block, its event is born *processed* (a :class:`Channel`). A producer
    may still ``yield wire.put(item)`` (it continues at once), but no event is scheduled
    for it, and a waiting consumer is served in the same instant. Over a simulation this
    saves one scheduled event per hop per request.

    A consumer that never waits for anything but the next item (the router, a replica's
    ingress) may instead :meth:`connect` a handler: each put then hands the item to it at
    once, in the producer's instant, with no get event and no process switch. The item is
    taken at the same simulated time and in the same order as a consumer process blocked
    on ``get()`` would take it.

    Parameters
    ----------
    env
        The SimPy environment.

    Examples
    --------
    >>> env = simpy.Environment()
    >>> wire = Wire(env)
    >>> got = []
    >>> def consumer():
    ...     while True:
    ...         item = yield wire.get()
    ...         got.append((env.now, item))
    >>> def producer():
    ...     for i in range(3):
    ...         yield env.timeout(1)
    ...         yield wire.put(i)
    >>> _ = env.process(consumer()); _ = env.process(producer())
    >>> env.run()
    >>> got
    [(1, 0), (2, 1), (3, 2)]
    >>> wire.statistics()
    WireStats(puts=3, gets=3, level=0)
    """

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env)
        self.items: deque[Any] = deque()
        """Items put and not yet taken, oldest first."""
        self.puts = 0
        self._handler: Callable[[Any], None] | None = None
        """What a put calls: the connected consumer, or an interceptor (None: queue the item)."""
        self._consumer: Callable[[Any], None] | None = None
        """The connected consumer (None: the items go to ``get()``)."""
        self._intercepted = False

    def connect(self, handler: Callable[[Any], None]) -> None:
        """Deliver every item put from now on to *handler* at once (instead of to ``get()``).

        Examples
        --------
        >>> env = simpy.Environment()
        >>> wire = Wire(env)
        >>> seen = []
        >>> wire.connect(lambda item: seen.append((env.now, item)))
        >>> _ = wire.put("a"); seen, wire.statistics()
        ([(0, 'a')], WireStats(puts=1, gets=1, level=0))
        """
        if self.items or self.get_queue or self._consumer is not None:
            raise RuntimeError("connect a handler to a fresh Wire, before anything is put or waited for")
        self._consumer = handler
        if not self._intercepted:
            self._handler = handler

    def intercept(self, handler: Callable[[Any], None]) -> Callable[[Any], None]:
        """Hand every item put from now on to *handler* instead of this Wire's consumer; return
        the function that delivers an item to where puts went before (the consumer, connected
        now or later, or the previous interceptor).

        This is how a process is put between two components (:mod:`simpy_llm.processes`):
        the producers keep their Wire, the consumer keeps its handler or its ``get()``.

        Examples
        --------
        >>> env = simpy.Environment()
        >>> wire, seen = Wire(env), []
        >>> wire.connect(seen.append)
        >>> deliver = wire.intercept(lambda item: deliver(item.upper()))
        >>> _ = wire.put("a"); seen
        ['A']
        """
        before: Callable[[Any], None]
        if self._intercepted:
            assert self._handler is not None  # the previous interceptor
            before = self._handler
        elif self._consumer is not None:
            before = self._consumer
        else:
            before = self._deliver
        self._intercepted = True
        self._handler = handler
        return before

    def _deliver(self, item: Any) -> None:
        """Give *item* to the consumer: its handler, or the queue ``get()`` takes from."""
        consumer = self._consumer
        if consumer is not None:
            consumer(item)
            return
        self.items.append(item)
        if self.get_queue:
            self.serve_getters()

    if TYPE_CHECKING:

        def get(self) -> WireGet:
            """Request the oldest item (waits while the wire is empty)."""
            ...

    else:
        get = BoundClass(WireGet)

    def send(self, item: Any) -> None:
        """Put *item*, as :meth:`put` does, without making the put's event (a sender that
        never looks at it saves the object; components on the hot path use this).

        >>> env = simpy.Environment(); wire = Wire(env); got = []
        >>> wire.connect(got.append)
        >>> wire.send("a"); got, wire.statistics().puts
        (['a'], 1)
        """
        self.puts += 1
        handler = self._handler
        if handler is not None:
            handler(item)
            return
        self.items.append(item)
        if self.get_queue:
            self.serve_getters()

    def put(self, item: Any) -> WirePut:  # type: ignore[override]  # never waits: a processed event, not SimPy's Put
        """Put *item*; the returned event is already processed (a put never waits)."""
        self.puts += 1
        if self._handler is not None:
            self._handler(item)
            return WirePut(self.env, item)
        self.items.append(item)
        if self.get_queue:
            self.serve_getters()
        return WirePut(self.env, item)

    def serve(self, event: WireGet) -> bool | None:  # type: ignore[override]  # a Wire's get queue holds its WireGets only
        """Give *event* the oldest item, if there is one."""
        if self._consumer is not None:
            raise RuntimeError("this Wire delivers to a connected handler; nothing can get() from it")
        if self.items:
            event.succeed(self.items.popleft())
            return True
        return False

    def statistics(self) -> WireStats:
        """Current counters."""
        return WireStats(puts=self.puts, gets=self.puts - len(self.items), level=len(self.items))


# --- the contract with SimPy ---------------------------------------------------------------


class SimPyContractError(RuntimeError):
    """The installed SimPy lacks an internal :mod:`simpy_llm.kernel` relies on, or gives it
    another shape."""


def check_simpy() -> None:
    """Check that every SimPy internal this module relies on is there, with the expected
    shape; run once at import.

    Raises
    ------
    SimPyContractError
        Naming ``simpy_llm.kernel``, the SimPy version found, the internal that changed and
        the release the kernel was checked against (:data:`CHECKED_SIMPY`).

    Examples
    --------
    >>> check_simpy()  # the installed SimPy keeps the contract
    """
    version = getattr(simpy, "__version__", "unknown")

    def broken(internal: str, found: str) -> SimPyContractError:
        return SimPyContractError(
            f"simpy_llm.kernel: SimPy {version} does not keep the contract the kernel relies on: "
            f"{internal} {found}. The kernel was checked against SimPy {CHECKED_SIMPY}.x "
            f"(pyproject.toml pins simpy>={CHECKED_SIMPY},<4.2): install such a release, or update "
            "simpy_llm/kernel.py, the one module that touches SimPy internals."
        )

    if (URGENT, NORMAL) != (0, 1):
        raise broken("simpy.events.URGENT, NORMAL", f"are {URGENT!r}, {NORMAL!r}, not 0, 1 (LATE is 2)")
    try:
        env = simpy.Environment()
    except Exception as exc:  # any failure is a broken contract
        raise broken("simpy.Environment()", f"fails: {exc!r}") from exc
    queue = getattr(env, "_queue", None)
    if not isinstance(queue, list):
        raise broken("Environment._queue", f"is {type(queue).__name__}, not the list of the event heap")
    eid = getattr(env, "_eid", None)
    if not isinstance(eid, Iterator):
        raise broken("Environment._eid", f"is {type(eid).__name__}, not the event-id counter")
    if next(eid) != 0 or next(eid) != 1:
        raise broken("Environment._eid", "does not count event ids from 0")
    now = getattr(env, "_now", None)
    if not isinstance(now, (int, float)) or now != env.now:
        raise broken("Environment._now", "is not the number Environment.now reads")
    probe = env.event()
    env.schedule(probe, NORMAL, 1.0)
    entry = queue[0] if queue else None
    if not (isinstance(entry, tuple) and len(entry) == 4 and entry == (1.0, NORMAL, 2, probe)):
        raise broken("Environment._queue", f"holds {entry!r}, not (time, priority, event id, event) entries")
    queue.clear()

    if not callable(getattr(StopSimulation, "callback", None)):
        raise broken("simpy.core.StopSimulation.callback", "is missing (Environment._run stops a run with it)")
    for name in ("_resume",):
        if not callable(getattr(Process, name, None)):
            raise broken(f"Process.{name}", "is missing or not a method")
    if getattr(Event, "_value", None) is not PENDING:
        raise broken("Event._value", "does not default to simpy.events.PENDING")
    for name in ("_trigger_get", "_do_get"):
        if not callable(getattr(BaseResource, name, None)):
            raise broken(f"BaseResource.{name}", "is missing or not a method")

    # The operations themselves, on a throwaway environment.
    try:
        done = ProcessedEvent(env, 7)
        if not (done.triggered and done.processed and done.ok and done.value == 7):
            raise broken("Event._value, Event._ok", "no longer make an event processed, ok, with its value")
        signal = succeed_at(env, env.event(), 0.0, "s")
        if not (signal.triggered and signal.ok and signal.value == "s" and not signal.processed):
            raise broken("Event._value, Event._ok", "no longer make an event triggered and ok")

        def sleeper() -> Generator[Event, Any, float]:
            yield env.timeout(10.0, "far")
            return env.now

        proc = env.process(sleeper())
        target = getattr(proc, "_target", None)
        if not isinstance(target, Event) or proc._resume not in target.callbacks:
            raise broken("Process._target", "is not the event the process waits for, with _resume among its callbacks")
        env.run(until=1e-9)
        move_wait(proc, timer_at(env, 0.1 + 0.2))
        wire = Wire(env)
        got = wire.get()
        if not wire.get_queue or got.triggered:
            raise broken("BaseResource.get_queue", "does not hold a waiting get event")
        wire.send("item")
        env.run()
    except SimPyContractError:
        raise
    except Exception as exc:  # any failure is a broken contract
        raise broken("the kernel's operations", f"fail on it: {exc!r}") from exc
    if proc.value != 0.1 + 0.2:
        raise broken("Process._target, Process._resume", f"no longer move a wait (the process resumed at {proc.value!r})")
    if env.now != 10.0 or not (got.triggered and got.value == "item") or wire.get_queue:
        raise broken("BaseResource._trigger_get, BaseResource._do_get", "no longer serve a waiting get event")


check_simpy()
