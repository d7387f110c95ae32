"""The Router: admission, then routing.

It takes each request put into its inbox Wire the moment it arrives (a
connected handler: no SimPy event per request), asks its
:class:`~simpy_llm.policies.admission.AdmissionPolicy` whether to admit it
(a rejection is recorded as a drop with the policy's reason and leaves
through the rejected Wire, so sessions see it), and puts each admitted
request into the inbox of the replica its
:class:`~simpy_llm.policies.routing.RoutingPolicy` chooses. Policies read
:mod:`~simpy_llm.serving.views` only; the router changes only its own counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simpy_llm.serving.views import RouterCounts
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    import simpy

    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.policies.admission import AdmissionPolicy
    from simpy_llm.policies.routing import ReplicaView, RoutingPolicy

__all__ = ["Router"]


class Router:
    """Admits and routes each request, instantly.

    Parameters
    ----------
    env
        The SimPy environment.
    inbox
        Wire of arriving requests (the router connects to it).
    outboxes
        One Wire per replica (the replicas' inboxes), index-aligned with *views*.
    views
        Read-only views of the replicas (see :mod:`simpy_llm.serving.views`).
    counts
        The router's own counts of what it sent where (the views read them).
    policy
        Decides the replica.
    recorder
        Told of admission drops.
    admission
        Decides whether to admit (None: admit everything).
    rejected
        Wire that receives each request the admission policy rejects (e.g. the
        completions Wire, so sessions see the drop); None: nobody needs them.
    indices
        The fleet index of the replica behind each outbox (default: 0, 1, ...): a router
        over part of the fleet (a disaggregated pool) records and counts by fleet index,
        while its policy chooses a position among *views*.
    """

    def __init__(
        self,
        env: simpy.Environment,
        inbox: Wire,
        outboxes: Sequence[Wire | simpy.Store],
        views: Sequence[ReplicaView],
        counts: RouterCounts,
        policy: RoutingPolicy,
        recorder: Recorder,
        admission: AdmissionPolicy | None = None,
        rejected: Wire | None = None,
        indices: Sequence[int] | None = None,
    ) -> None:
        if len(outboxes) != len(views) or not views:
            raise ValueError("need one outbox per replica view, and at least one replica")
        self.env = env
        self.inbox = inbox
        self.outboxes = list(outboxes)
        # A Wire's send is its put without the put's event, which nobody here looks at.
        self._puts = [o.send if isinstance(o, Wire) else o.put for o in self.outboxes]
        self.views = list(views)
        self.counts = counts
        self.policy = policy
        self.recorder = recorder
        self.admission = admission
        self.rejected = rejected
        self.indices = list(indices) if indices is not None else list(range(len(views)))
        if len(self.indices) != len(views):
            raise ValueError("need one fleet index per replica view")
        self._admit = admission.admit if admission is not None else None
        self._choose = policy.choose
        self._active: list[int] | None = None
        """Positions the policy may choose among (None: all), see :meth:`set_active`."""
        self._active_views = self.views
        inbox.connect(self.route)

    @property
    def active_views(self) -> Sequence[ReplicaView]:
        """The views of the replicas the policies may choose now (:meth:`set_active`)."""
        return self._active_views

    def set_active(self, positions: Sequence[int] | None) -> None:
        """Let the policies see only the replicas at *positions* (None: all) from now on.

        The planner's pool size (``docs/planner.md``): requests already sent stay where
        they are; admission and routing policies see the active replicas' views only, and
        the position a routing policy returns is among them.
        """
        if positions is None or list(positions) == list(range(len(self.views))):
            self._active, self._active_views = None, self.views
            return
        positions = sorted(set(positions))
        if not positions or not 0 <= positions[0] <= positions[-1] < len(self.views):
            raise ValueError(f"active positions must be a non-empty subset of 0..{len(self.views) - 1}")
        self._active = positions
        self._active_views = [self.views[i] for i in positions]

    def is_active(self, position: int) -> bool:
        """Whether the replica at *position* may receive newly routed requests."""
        return self._active is None or position in self._active

    @property
    def routed(self) -> list[int]:
        """Requests routed to each replica."""
        return self.counts.routed

    def route(self, req: Request) -> None:
        """Admit and route *req* (called for every request put into the inbox)."""
        if self._admit is not None:
            reason = self._admit(req, self._active_views, self.env.now)
            if reason is not None:
                req.dropped_reason = str(reason)
                self.reject(req)
                return
        views = self._active_views
        i = self._choose(req, views)
        if not 0 <= i < len(views):
            raise ValueError(f"routing policy returned replica {i}; there are {len(views)}")
        if self._active is not None:
            i = self._active[i]
        # send(req, i), inline (once per request)
        index = self.indices[i]
        req.replica = index
        counts = self.counts
        counts.routed[index] += 1
        counts.routed_tokens[index] += req.prompt_tokens
        self._puts[i](req)

    def reject(self, req: Request) -> None:
        """Drop *req* now, as an admission policy's rejection is (reason: its
        ``dropped_reason``, ``"rejected"`` when unset): recorded, and put on ``rejected``."""
        if not req.dropped_reason:
            req.dropped_reason = "rejected"
        now = self.env.now
        self.recorder.on_drop(req)
        self.recorder.on_departure(now)
        if self.rejected is not None:
            self.rejected.put(req)

    def send(self, req: Request, i: int) -> None:
        """Send *req* to the replica at position *i* (routed by the policy, or pinned by the caller)."""
        index = self.indices[i]
        req.replica = index
        counts = self.counts
        counts.routed[index] += 1
        counts.routed_tokens[index] += req.prompt_tokens
        self._puts[i](req)
