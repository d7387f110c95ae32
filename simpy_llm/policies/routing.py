"""Routing policies: which replica a request goes to.

A routing policy implements ``choose(request, view) -> int``, where *view*
is a sequence of read-only :class:`ReplicaView` objects, one per replica, and
the return value is an index into it. Policies that need randomness declare
an ``rng`` field; the simulation injects its ``router`` stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import numpy as np

from simpy_llm.registry import Registry

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = ["LeastLoaded", "RandomRouting", "ReplicaView", "RoundRobin", "RoutingPolicy", "routing_policies"]


class ReplicaView(Protocol):
    """What a routing policy may read about a replica (all read-only)."""

    @property
    def outstanding_requests(self) -> int:
        """Requests routed to the replica and not yet finished."""
        ...

    @property
    def waiting_requests(self) -> int:
        """Requests in the replica's waiting queue."""
        ...

    @property
    def running_requests(self) -> int:
        """Requests in the replica's running batch."""
        ...

    @property
    def kv_free_blocks(self) -> int:
        """Free KV-cache blocks."""
        ...


class RoutingPolicy(Protocol):
    """Chooses a replica for each request."""

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        """Return the index in *view* of the replica that gets *request*."""
        ...


routing_policies: Registry[type] = Registry("routing policy")


@routing_policies.register("round_robin")
@attrs.define
class RoundRobin:
    """Replicas in turn: 0, 1, ..., N-1, 0, ...

    >>> rr = RoundRobin()
    >>> [rr.choose(None, [None, None, None]) for _ in range(4)]
    [0, 1, 2, 0]
    """

    _next: int = attrs.field(default=0, init=False)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        i = self._next % len(view)
        self._next = i + 1
        return i


@routing_policies.register("random")
@attrs.define
class RandomRouting:
    """A replica chosen uniformly at random from the ``router`` stream."""

    rng: np.random.Generator = attrs.field(factory=lambda: np.random.default_rng(0))

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return int(self.rng.integers(len(view)))


@routing_policies.register("least_loaded")
@attrs.define
class LeastLoaded:
    """The replica with the fewest outstanding requests; ties go to the lowest index."""

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        best, best_load = 0, view[0].outstanding_requests
        for i in range(1, len(view)):
            load = view[i].outstanding_requests
            if load < best_load:
                best, best_load = i, load
        return best
