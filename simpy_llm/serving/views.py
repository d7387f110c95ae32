"""Read-only views of the replicas, as routing and admission policies see them.

A view combines two kinds of state, as a real gateway does:

* **router-local** counts (``outstanding_requests``, ``outstanding_tokens``):
  the router counts what it sent to each replica, the replica counts what left
  it; the difference is always current, since responses pass the gateway;
* **replica-reported** state (queue lengths, KV use): read live from the
  replica (:class:`LiveView`), or from a snapshot refreshed every
  ``serving.view_refresh_s`` seconds (:class:`SnapshotView`), like metrics a
  gateway scrapes. ``prefix_hit_tokens`` always reads the replica's cache as it
  is (a precise prefix-cache index fed by the replicas' cache events).

With ``serving.view_refresh_fields: all`` (:class:`FullSnapshotView`) the
departures the router-local counts subtract are part of the snapshot too: between
two refreshes a router knows only what it routed itself since the last one, so
its decisions inside a refresh window depend on nothing the replicas do inside
it (the exact lookahead of a sharded run, ``docs/scale.md``).

Views never change anything; each component changes only its own state.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.entities import Request
    from simpy_llm.serving.batching import BatchServer
    from simpy_llm.serving.engine import Replica
    from simpy_llm.speculative.verify import VerifyServer

__all__ = ["ClusterView", "FullSnapshotView", "LiveView", "RouterCounts", "SnapshotView", "refresh_views"]


class RouterCounts:
    """What the router sent to each replica (the router's own state)."""

    __slots__ = ("routed", "routed_tokens")

    def __init__(self, n: int) -> None:
        self.routed = [0] * n
        """Requests routed to each replica."""
        self.routed_tokens = [0] * n
        """Prompt tokens routed to each replica."""


class LiveView:
    """A replica as a policy sees it, read at the moment of the decision.

    Parameters
    ----------
    replica
        The replica.
    counts
        The router's own counts.
    capacity
        The replica's relative service rate.
    """

    __slots__ = ("_counts", "_replica", "capacity", "group", "index", "kv_total_blocks", "prefill_s_per_token")

    def __init__(self, replica: Replica | BatchServer | VerifyServer, counts: RouterCounts, capacity: float) -> None:
        self._replica = replica
        self._counts = counts
        self.index = replica.index
        self.group = replica.group
        self.capacity = capacity
        self.kv_total_blocks = replica.kv.num_blocks
        self.prefill_s_per_token = replica.prefill_s_per_token

    @property
    def outstanding_requests(self) -> int:
        return self._counts.routed[self.index] - self._replica.departed

    @property
    def outstanding_tokens(self) -> int:
        return self._counts.routed_tokens[self.index] - self._replica.departed_tokens

    @property
    def waiting_requests(self) -> int:
        return len(self._replica.waiting)

    @property
    def running_requests(self) -> int:
        return len(self._replica.running)

    @property
    def queued_prompt_tokens(self) -> int:
        return self._replica.queued_prompt_tokens

    @property
    def kv_free_blocks(self) -> int:
        return self._replica.kv.free_blocks

    @property
    def kv_utilization(self) -> float:
        return self._replica.kv.used_blocks / self.kv_total_blocks

    def prefix_hit_tokens(self, request: Request) -> int:
        return self._replica.prefix_hit_tokens(request)


class SnapshotView(LiveView):
    """A :class:`LiveView` whose replica-reported fields are as of the last :meth:`refresh`."""

    __slots__ = ("_kv_free", "_kv_used", "_queued", "_running", "_waiting")

    def __init__(self, replica: Replica | BatchServer | VerifyServer, counts: RouterCounts, capacity: float) -> None:
        super().__init__(replica, counts, capacity)
        self.refresh()

    def refresh(self) -> None:
        """Copy the replica's current state."""
        rep = self._replica
        self._waiting = len(rep.waiting)
        self._running = len(rep.running)
        self._queued = rep.queued_prompt_tokens
        self._kv_free = rep.kv.free_blocks
        self._kv_used = rep.kv.used_blocks

    @property
    def waiting_requests(self) -> int:
        return self._waiting

    @property
    def running_requests(self) -> int:
        return self._running

    @property
    def queued_prompt_tokens(self) -> int:
        return self._queued

    @property
    def kv_free_blocks(self) -> int:
        return self._kv_free

    @property
    def kv_utilization(self) -> float:
        return self._kv_used / self.kv_total_blocks


class FullSnapshotView(SnapshotView):
    """A :class:`SnapshotView` whose departures are as of the last :meth:`refresh` too.

    ``outstanding_requests`` and ``outstanding_tokens`` are the router's own counts, always
    current, less the replica's departures as of the refresh: a request that finished
    since counts as outstanding until the next refresh (``serving.view_refresh_fields: all``).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> replica = NS(index=0, group="g", kv=NS(num_blocks=10, free_blocks=10, used_blocks=0), prefill_s_per_token=1e-4,
    ...              waiting=[], running=[], queued_prompt_tokens=0, departed=0, departed_tokens=0)
    >>> counts = RouterCounts(1)
    >>> view = FullSnapshotView(replica, counts, 1.0)
    >>> counts.routed[0] += 2; counts.routed_tokens[0] += 300   # the router sends two requests
    >>> replica.departed, replica.departed_tokens = 1, 100      # one finishes before the refresh
    >>> view.outstanding_requests, view.outstanding_tokens
    (2, 300)
    >>> view.refresh(); view.outstanding_requests, view.outstanding_tokens
    (1, 200)
    """

    __slots__ = ("_departed", "_departed_tokens")

    def refresh(self) -> None:
        """Copy the replica's current state, its departures included."""
        super().refresh()
        rep = self._replica
        self._departed = rep.departed
        self._departed_tokens = rep.departed_tokens

    @property
    def outstanding_requests(self) -> int:
        return self._counts.routed[self.index] - self._departed

    @property
    def outstanding_tokens(self) -> int:
        return self._counts.routed_tokens[self.index] - self._departed_tokens


class ClusterView:
    """A cluster as the router across clusters sees it: its replicas' views combined.

    Counts and capacities are sums over the cluster's replicas (``outstanding_*``,
    queues, KV blocks, ``capacity``), so a load-aware policy compares clusters by their
    whole load and capacity; ``kv_utilization`` is used over total blocks,
    ``prefill_s_per_token`` the fastest replica's, ``prefix_hit_tokens`` the best
    replica's. ``group`` is the cluster's name.

    Parameters
    ----------
    index
        The cluster's position among the clusters.
    name
        The cluster's name.
    views
        Views of its replicas (live or snapshots, as the fleet's).
    """

    __slots__ = ("_views", "capacity", "group", "index", "kv_total_blocks", "prefill_s_per_token")

    def __init__(self, index: int, name: str, views: Sequence[LiveView]) -> None:
        self.index = index
        self.group = name
        self._views = tuple(views)
        self.capacity = sum(v.capacity for v in views)
        self.kv_total_blocks = sum(v.kv_total_blocks for v in views)
        self.prefill_s_per_token = min(v.prefill_s_per_token for v in views)

    @property
    def outstanding_requests(self) -> int:
        return sum(v.outstanding_requests for v in self._views)

    @property
    def outstanding_tokens(self) -> int:
        return sum(v.outstanding_tokens for v in self._views)

    @property
    def waiting_requests(self) -> int:
        return sum(v.waiting_requests for v in self._views)

    @property
    def running_requests(self) -> int:
        return sum(v.running_requests for v in self._views)

    @property
    def queued_prompt_tokens(self) -> int:
        return sum(v.queued_prompt_tokens for v in self._views)

    @property
    def kv_free_blocks(self) -> int:
        return sum(v.kv_free_blocks for v in self._views)

    @property
    def kv_utilization(self) -> float:
        return 1.0 - self.kv_free_blocks / self.kv_total_blocks

    def prefix_hit_tokens(self, request: Request) -> int:
        return max(v.prefix_hit_tokens(request) for v in self._views)


def refresh_views(
    env: simpy.Environment, views: Sequence[SnapshotView], every_s: float, active: Callable[[], bool]
) -> Generator[Event, None, None]:
    """Process: refresh every snapshot view each *every_s* seconds while *active()* holds.

    Yields
    ------
    Timeout
        Until the next refresh.
    """
    while active():
        yield env.timeout(every_s)
        for view in views:
            view.refresh()
