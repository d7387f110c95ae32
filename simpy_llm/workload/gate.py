"""The client's cap on requests in flight (``workload.max_concurrency``).

A benchmark client (``vllm bench --max-concurrency``, guidellm's concurrent runs,
``simpy-llm bench``) sends a request only while fewer than N of its requests are in
flight; one due while N are waits, in the order they fell due, and is sent when one of
the N ends, answered or dropped. :class:`ConcurrencyGate` is that rule standing between
the workload and the serving system: it intercepts the Wire new requests are put into
(``sent``) and the Wire requests leave the replicas by (``completions``), so neither side
knows it is there, and it schedules no event of its own.

A request that waited is sent at the instant a slot frees: its ``arrival_s`` is then that
instant (when the client sent it, as an observer's ``send_time``), and it enters the
serving system's books (``Recorder.on_arrival``) only then.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable

import simpy
from simpy.events import Event

from simpy_llm.entities import Request
from simpy_llm.kernel import timer_at
from simpy_llm.wire import Wire

__all__ = ["ConcurrencyGate"]


class ConcurrencyGate:
    """At most *limit* requests in flight between *sent* and *completions* (module docstring).

    Parameters
    ----------
    env
        The SimPy environment.
    limit
        Requests in flight at most (>= 1).
    sent
        The Wire new requests are put into; the gate intercepts it.
    completions
        The Wire every request that leaves the serving system is put into (answered or
        dropped); the gate intercepts it and passes each request on to its consumer, or,
        with *consumer_waits* false, is its only consumer.
    on_send
        Called with each request as it is sent (the serving system's books: the recorder's
        ``on_arrival`` where the workload would have called it), or None.
    consumer_waits
        Whether *completions* has a consumer (sessions) that must still get every request.

    Examples
    --------
    Two slots; three requests due at 0, each taking 1 s:

    >>> env = simpy.Environment()
    >>> sent, done = Wire(env), Wire(env)
    >>> gate = ConcurrencyGate(env, 2, sent, done, consumer_waits=False)
    >>> started = []
    >>> def server(req):
    ...     started.append((req.id, env.now))
    ...     env.process(finish(req))
    >>> def finish(req):
    ...     yield env.timeout(1.0)
    ...     done.send(req)
    >>> sent.connect(server)
    >>> for i in range(3):
    ...     sent.send(Request(id=i, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=0.0))
    >>> env.run()
    >>> started, gate.in_flight, len(gate.waiting)
    ([(0, 0), (1, 0), (2, 1.0)], 0, 0)
    """

    def __init__(
        self,
        env: simpy.Environment,
        limit: int,
        sent: Wire,
        completions: Wire,
        *,
        on_send: Callable[[Request, float], None] | None = None,
        consumer_waits: bool,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.env = env
        self.limit = limit
        self.in_flight = 0
        """Requests sent and not yet ended."""
        self.waiting: deque[Request] = deque()
        """Requests due and not yet sent, oldest first."""
        self.on_send = on_send
        self._deliver = sent.intercept(self._due)
        if consumer_waits:
            self._pass_on: Callable[[Request], None] | None = completions.intercept(self._ended)
        else:
            self._pass_on = None
            completions.connect(self._ended)

    def _due(self, req: Request) -> None:
        """A request fell due: send it if a slot is free, else keep it waiting."""
        if self.in_flight < self.limit:
            self._send(req)
        else:
            self.waiting.append(req)

    def _send(self, req: Request) -> None:
        self.in_flight += 1
        now = self.env.now
        req.arrival_s = now
        if self.on_send is not None:
            self.on_send(req, now)
        self._deliver(req)

    def _ended(self, req: Request) -> None:
        """A request left the serving system: its slot frees when its client has the answer (at
        its completion plus its download, which a latency model's per-token post-processing can
        put after the engine let it go), or now for a drop."""
        if self._pass_on is not None:
            self._pass_on(req)  # sessions time their next round from the same instant
        seen_s = req.completion_s + req.download_s
        if seen_s > self.env.now:  # NaN (a drop) is not
            timer_at(self.env, seen_s).callbacks.append(functools.partial(self._freed, req))
        else:
            self._freed(req)

    def _freed(self, req: Request, _event: Event | None = None) -> None:
        """The client has *req*'s answer: its slot goes to the oldest waiting request."""
        self.in_flight -= 1
        if self.waiting:
            self._send(self.waiting.popleft())
