"""Flow control in front of the router (``serving.gateway``, ``docs/gateway.md``).

An inference gateway holds requests back while the pool behind it is saturated, so that a
burst waits in queues it can order (by priority, fairly between tenants) instead of in the
replicas' own queues, where they are served as they came. :class:`Gateway` is that rule
standing between the arrivals and the router: it intercepts the Wire requests reach the router
by (``arrivals``) and the Wire requests leave the replicas by (``completions``), so neither
side knows it is there, and it schedules no event of its own.

* A request arriving goes on to the router at once when nothing waits at the gateway and some
  replica the router may choose has fewer than ``max_outstanding_per_replica`` requests routed
  to it and not ended (as the router's views count them); else it waits in the sub-queue of
  its ``queue_by`` value, or is dropped (``gateway_queue_full``) when ``max_queue`` are
  waiting.
* Whenever a request ends (answered or dropped), while requests wait and a replica has room,
  the dispatch policy (:mod:`simpy_llm.policies.gateway`) picks the sub-queue whose oldest
  request goes on.

A request keeps its arrival time: the time it waited at the gateway is part of its TTFT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import simpy

from simpy_llm.entities import Request
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    from simpy_llm.config.gateway import GatewayConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.metrics.summary import GatewayStats
    from simpy_llm.policies.gateway import DispatchPolicy
    from simpy_llm.policies.routing import ReplicaView

__all__ = ["Gateway", "queue_key"]


def queue_key(req: Request, by: str) -> Hashable:
    """The sub-queue of *req* when the queue is split by *by*
    (:data:`~simpy_llm.config.gateway.GATEWAY_QUEUE_KEYS`).

    >>> r = Request(id=1, client_id="chat", tenant_id="acme", prompt_tokens=1, output_tokens=1, arrival_s=0.0, priority=2)
    >>> [queue_key(r, by) for by in ("none", "tenant", "client", "slo_class", "priority")]
    ['', 'acme', 'chat', 'default', 2]
    """
    if by == "tenant":
        return req.tenant_id
    if by == "client":
        return req.client_id
    if by == "slo_class":
        return req.slo_class
    if by == "priority":
        return req.priority
    return ""


class Gateway:
    """Flow control between *arrivals* and the router (module docstring).

    Parameters
    ----------
    env
        The SimPy environment.
    arrivals
        The Wire the router takes requests from; the gateway intercepts it.
    completions
        The Wire every request that leaves the serving system is put into; the gateway
        intercepts it (and passes each request on) or, with *consumer_waits* false, is its
        only consumer.
    views
        Returns the views of the replicas the router may choose now.
    config
        The ``serving.gateway`` section.
    policy
        The dispatch policy built from ``config.dispatch``.
    recorder
        Told of the requests dropped at a full queue.
    consumer_waits
        Whether *completions* has another consumer that must still get every request.
    """

    def __init__(
        self, env: simpy.Environment, arrivals: Wire, completions: Wire, views: Callable[[], Sequence[ReplicaView]],
        config: GatewayConfig, policy: DispatchPolicy, recorder: Recorder, *, consumer_waits: bool,
    ) -> None:
        self.env = env
        self.config = config
        self.policy = policy
        self.recorder = recorder
        self._views = views
        self.limit = config.max_outstanding_per_replica
        self.queues: dict[Hashable, deque[Request]] = {}
        """The waiting requests by sub-queue key, oldest first (empty sub-queues removed)."""
        self.waiting = 0
        """Requests waiting now."""
        self.stats = {"queued": 0, "dropped": 0, "max_waiting": 0}
        self._wait: dict[Hashable, list[float]] = {}
        """Per sub-queue: total wait of its dispatched requests, and their count."""
        self._deliver = arrivals.intercept(self._arrive)
        if consumer_waits:
            self._pass_on: Callable[[Request], None] | None = completions.intercept(self._ended)
        else:
            self._pass_on = None
            completions.connect(self._ended)

    def _room(self) -> bool:
        """Whether some replica the router may choose is below the limit."""
        limit = self.limit
        return any(v.outstanding_requests < limit for v in self._views())

    def _arrive(self, req: Request) -> None:
        if not self.waiting and self._room():
            self._deliver(req)
            return
        cap = self.config.max_queue
        if cap is not None and self.waiting >= cap:
            req.dropped_reason = "gateway_queue_full"
            self.stats["dropped"] += 1
            self.recorder.on_drop(req)
            self.recorder.on_departure(self.env.now)
            self._ended_here(req)
            return
        key = queue_key(req, self.config.queue_by)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = deque()
        queue.append(req)
        self.waiting += 1
        self.stats["queued"] += 1
        if self.waiting > self.stats["max_waiting"]:
            self.stats["max_waiting"] = self.waiting

    def _ended_here(self, req: Request) -> None:
        """A request dropped at the gateway leaves by the completions Wire's consumers."""
        if self._pass_on is not None:
            self._pass_on(req)

    def _ended(self, req: Request) -> None:
        """A request left the serving system: its consumer hears of it, and waiting requests go
        on while a replica has room."""
        if self._pass_on is not None:
            self._pass_on(req)
        now = self.env.now
        while self.waiting and self._room():
            key = self.policy.choose(self.queues)
            queue = self.queues[key]
            nxt = queue.popleft()
            if not queue:
                del self.queues[key]
            self.waiting -= 1
            total = self._wait.setdefault(key, [0.0, 0])
            total[0] += now - nxt.arrival_s
            total[1] += 1
            self._deliver(nxt)

    def summary(self) -> GatewayStats:
        """What the gateway did so far (:class:`GatewayStats`)."""
        return {
            "queued": self.stats["queued"],
            "dropped": self.stats["dropped"],
            "max_waiting": self.stats["max_waiting"],
            "waiting_at_end": self.waiting,
            "mean_wait_s": {str(k): s / n for k, (s, n) in sorted(self._wait.items(), key=lambda kv: str(kv[0]))},
        }
