"""Wire: the unbounded FIFO Store the components are connected with.

A :class:`Wire` is a SimPy resource (``BaseResource`` with ``Get`` events and
``_do_get``) that behaves like an unbounded :class:`simpy.Store`, with one
difference that matters for speed: since a put can never block, its event is
born *processed*. A producer may still ``yield wire.put(item)`` (it continues
at once), but no event is scheduled for it, and a waiting consumer is served
in the same instant. Over a simulation this saves one scheduled event per hop
per request.

A consumer that never waits for anything but the next item (the router, a
replica's ingress) may instead :meth:`~Wire.connect` a handler: each put then
hands the item to it at once, in the producer's instant, with no get event and
no process switch. The item is taken at the same simulated time and in the
same order as a consumer process blocked on ``get()`` would take it.

Examples
--------
>>> import simpy
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

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from simpy.core import BoundClass
from simpy.events import Event
from simpy.resources.base import BaseResource, Get

if TYPE_CHECKING:
    import simpy

__all__ = ["Wire", "WireGet", "WirePut", "WireStats"]


class WirePut(Event):
    """The (already processed) event of a put: yielding it continues at once."""

    def __init__(self, env: simpy.Environment, item: Any) -> None:
        # Born processed: no callbacks list, a value, ok.
        self.env = env
        self.callbacks = None  # type: ignore[assignment]
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


class Wire(BaseResource):
    """An unbounded FIFO Store whose puts cost no scheduled event.

    Parameters
    ----------
    env
        The SimPy environment.
    """

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env, capacity=float("inf"))
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
        >>> import simpy
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
        >>> import simpy
        >>> env = simpy.Environment()
        >>> wire, seen = Wire(env), []
        >>> wire.connect(seen.append)
        >>> deliver = wire.intercept(lambda item: deliver(item.upper()))
        >>> _ = wire.put("a"); seen
        ['A']
        """
        if self._intercepted:
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
            self._trigger_get(None)

    if TYPE_CHECKING:

        def get(self) -> WireGet:
            """Request the oldest item (waits while the wire is empty)."""
            ...

    else:
        get = BoundClass(WireGet)

    def send(self, item: Any) -> None:
        """Put *item*, as :meth:`put` does, without making the put's event (a sender that
        never looks at it saves the object; components on the hot path use this).

        >>> import simpy
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
            self._trigger_get(None)

    def put(self, item: Any) -> WirePut:  # type: ignore[override]
        """Put *item*; the returned event is already processed (a put never waits)."""
        self.puts += 1
        if self._handler is not None:
            self._handler(item)
            return WirePut(self._env, item)
        self.items.append(item)
        if self.get_queue:
            self._trigger_get(None)
        return WirePut(self._env, item)

    def _do_put(self, event: Any) -> None:  # pragma: no cover - puts bypass the put queue
        raise NotImplementedError("Wire.put serves getters directly")

    def _do_get(self, event: WireGet) -> bool | None:
        if self._consumer is not None:
            raise RuntimeError("this Wire delivers to a connected handler; nothing can get() from it")
        if self.items:
            event.succeed(self.items.popleft())
            return True
        return False

    def statistics(self) -> WireStats:
        """Current counters."""
        return WireStats(puts=self.puts, gets=self.puts - len(self.items), level=len(self.items))
