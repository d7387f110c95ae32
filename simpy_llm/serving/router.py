"""The Router process: takes requests from its inbox and puts each into the
inbox of the replica its :class:`~simpy_llm.policies.routing.RoutingPolicy` chooses."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from simpy_llm.wire import Wire
    from simpy.events import Event

    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.policies.routing import RoutingPolicy
    from simpy_llm.serving.engine import Replica

__all__ = ["Router"]


class Router:
    """Routes each request to a replica, instantly.

    Parameters
    ----------
    env
        The SimPy environment.
    inbox
        Store of arriving requests.
    outboxes
        One Store per replica (the replicas' inboxes), index-aligned with *replicas*.
    replicas
        The replicas, read through their :class:`~simpy_llm.policies.routing.ReplicaView` surface.
    policy
        Decides the replica.
    recorder
        Kept for symmetry with the other components (routing records nothing yet).
    """

    def __init__(
        self,
        env: simpy.Environment,
        inbox: Wire | simpy.Store,
        outboxes: Sequence[Wire | simpy.Store],
        replicas: Sequence[Replica],
        policy: RoutingPolicy,
        recorder: Recorder,
    ) -> None:
        if len(outboxes) != len(replicas) or not replicas:
            raise ValueError("need one outbox per replica, and at least one replica")
        self.env = env
        self.inbox = inbox
        self.outboxes = list(outboxes)
        self.replicas = list(replicas)
        self.policy = policy
        self.recorder = recorder
        self.routed = [0] * len(replicas)
        self.process = env.process(self._run())

    def _run(self) -> Generator[Event, Request, None]:
        """Route requests as they arrive.

        Yields
        ------
        StoreGet
            The next arriving request.
        """
        get = self.inbox.get
        choose = self.policy.choose
        replicas = self.replicas
        outboxes = self.outboxes
        while True:
            req = yield get()
            i = choose(req, replicas)
            if not 0 <= i < len(replicas):
                raise ValueError(f"routing policy returned replica {i}; there are {len(replicas)}")
            req.replica = i
            replicas[i].outstanding += 1
            self.routed[i] += 1
            outboxes[i].put(req)
