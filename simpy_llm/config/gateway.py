"""The ``serving.gateway`` section: flow control in front of the router
(``docs/gateway.md``, :mod:`simpy_llm.serving.gateway`)::

    serving:
      gateway:
        max_outstanding_per_replica: 8     # a replica is saturated at this many requests routed and not ended
        queue_by: tenant                   # sub-queues: none, tenant, client, slo_class or priority
        dispatch: {kind: fair, params: {weights: {gold: 3, free: 1}}}   # or fifo, priority
        max_queue: 5000                    # requests held at most (default: no limit)

While every replica the router may choose is saturated, arriving requests wait at the
gateway, in one sub-queue per ``queue_by`` value; when a request ends and a replica has room,
the dispatch policy picks the sub-queue to serve. Every key changes what is simulated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NewType, TypeAlias

import attrs

from simpy_llm.config.common import PolicySpec
from simpy_llm.config.validators import MAX_REPLICAS, MAX_REQUESTS, all_of, at_least, at_most, one_of, optional

__all__ = ["GATEWAY_QUEUE_KEYS", "DispatchSpec", "GatewayConfig"]

if TYPE_CHECKING:
    DispatchSpec: TypeAlias = PolicySpec
else:
    DispatchSpec = NewType("DispatchSpec", PolicySpec)
    """A :class:`PolicySpec` naming a gateway dispatch policy (:mod:`simpy_llm.policies.gateway`)."""

GATEWAY_QUEUE_KEYS = ("none", "tenant", "client", "slo_class", "priority")
"""What splits the gateway's queue: nothing (one queue), or a request's tenant, client, SLO
class or priority."""


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """Flow control in front of the router (module docstring)."""

    max_outstanding_per_replica: int = attrs.field(validator=all_of(at_least(1), at_most(MAX_REPLICAS * 1000)))
    """A replica is saturated while this many requests routed to it have not ended."""
    queue_by: str = attrs.field(default="tenant", validator=one_of(GATEWAY_QUEUE_KEYS))
    """The request attribute whose values get a sub-queue each (:data:`GATEWAY_QUEUE_KEYS`)."""
    dispatch: DispatchSpec = attrs.field(factory=lambda: PolicySpec(kind="fifo"))
    """The dispatch policy (:mod:`simpy_llm.policies.gateway`): ``fifo``, ``priority``,
    ``fair`` (weighted by ``queue_by`` value), or a registered one."""
    max_queue: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_REQUESTS))))
    """Requests the gateway holds at most; one arriving beyond is dropped (reason
    ``gateway_queue_full``). Default: no limit."""
