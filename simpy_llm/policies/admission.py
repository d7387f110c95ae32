"""Admission policies: whether a request enters the system at all.

An admission policy implements ``admit(request, view, now_s) -> str | None``:
``None`` admits the request; a short reason code rejects it, and becomes the
request's recorded drop reason. *view* is the same sequence of read-only
:class:`~simpy_llm.policies.routing.ReplicaView` objects the router sees, and
*now_s* the simulated time of the decision. Admission runs before routing.

Built-ins (``kind:`` in a scenario): ``always``, ``max_queue``,
``token_bucket`` and ``slo_shed``. ``docs/policies.md`` states each rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from simpy_llm.config.validators import MAX_RATE, MAX_REQUESTS, MAX_TOKENS, at_least, at_most, greater_than, one_of
from simpy_llm.registry import Registry

if TYPE_CHECKING:
    from simpy_llm.entities import Request
    from simpy_llm.policies.routing import ReplicaView

__all__ = [
    "AdmissionPolicy",
    "AlwaysAdmit",
    "MaxQueue",
    "SloShed",
    "TokenBucket",
    "admission_policies",
    "predicted_ttft_s",
]


class AdmissionPolicy(Protocol):
    """Admits or rejects each arriving request."""

    def admit(self, request: Request, view: Sequence[ReplicaView], now_s: float) -> str | None:
        """Return None to admit *request*, or a short reason code to reject it."""
        ...


admission_policies: Registry[type] = Registry("admission policy")


@admission_policies.register("always")
@attrs.define
class AlwaysAdmit:
    """Admits every request.

    >>> AlwaysAdmit().admit(None, [], 0.0) is None
    True
    """

    def admit(self, request: Request, view: Sequence[ReplicaView], now_s: float) -> str | None:
        return None


@admission_policies.register("max_queue")
@attrs.define
class MaxQueue:
    """Rejects with ``"max_queue"`` when the waiting queues are full.

    Fleet-wide (the default): reject when the total ``waiting_requests`` over
    all replicas is at least ``max_waiting``. With ``per_replica: true``:
    reject when *every* replica has at least ``max_waiting`` waiting (no
    replica has room). ``waiting_requests`` is replica-reported and may be
    stale: requests admitted since the last refresh are not counted, so a
    burst can overshoot the limit by up to what arrives in one interval.

    >>> from types import SimpleNamespace as R
    >>> view = [R(waiting_requests=3), R(waiting_requests=1)]
    >>> MaxQueue(max_waiting=4).admit(None, view, 0.0)
    'max_queue'
    >>> MaxQueue(max_waiting=2, per_replica=True).admit(None, view, 0.0) is None
    True
    """

    max_waiting: int = attrs.field(validator=at_least(1))
    """Waiting requests at which new ones are rejected (fleet total, or per replica)."""
    per_replica: bool = False
    """Compare each replica's queue with ``max_waiting`` (reject only when all are full)."""

    def admit(self, request: Request, view: Sequence[ReplicaView], now_s: float) -> str | None:
        if self.per_replica:
            full = all(r.waiting_requests >= self.max_waiting for r in view)
        else:
            full = sum(r.waiting_requests for r in view) >= self.max_waiting
        return "max_queue" if full else None


@admission_policies.register("token_bucket")
@attrs.define
class TokenBucket:
    """Per-tenant rate limit: a token bucket for each ``request.tenant_id``.

    A tenant's bucket holds at most ``burst`` units and starts full when the
    tenant's first request arrives. It refills continuously at ``rate`` units
    per second of simulated time: at a decision at *now_s* the level becomes
    ``min(burst, level + rate * (now_s - last_s))``. A request costs 1 unit
    (``unit: requests``) or its ``prompt_tokens`` (``unit: tokens``); it is
    admitted and the cost taken when the level covers it, else rejected with
    ``"token_bucket"`` and nothing is taken. A request costing more than
    ``burst`` is always rejected.

    >>> from types import SimpleNamespace as Req
    >>> tb = TokenBucket(rate=1.0, burst=2.0)
    >>> a = Req(tenant_id="a", prompt_tokens=5)
    >>> [tb.admit(a, [], 0.0), tb.admit(a, [], 0.0), tb.admit(a, [], 0.0), tb.admit(a, [], 1.0)]
    [None, None, 'token_bucket', None]
    """

    rate: float = attrs.field(validator=[greater_than(0), at_most(MAX_RATE * MAX_TOKENS)])
    """Refill rate, units per second."""
    burst: float = attrs.field(validator=[greater_than(0), at_most(MAX_REQUESTS * float(MAX_TOKENS))])
    """Bucket size, units (the largest burst admitted at once)."""
    unit: str = attrs.field(default="requests", validator=one_of(("requests", "tokens")))
    """What a request costs: ``requests`` (1 each) or ``tokens`` (its prompt tokens)."""
    _buckets: dict[str, list[float]] = attrs.field(factory=dict, init=False, repr=False)

    def level(self, tenant_id: str) -> float:
        """Units in *tenant_id*'s bucket after its last decision (``burst`` for an unseen tenant)."""
        bucket = self._buckets.get(tenant_id)
        return self.burst if bucket is None else bucket[0]

    def admit(self, request: Request, view: Sequence[ReplicaView], now_s: float) -> str | None:
        bucket = self._buckets.get(request.tenant_id)
        if bucket is None:
            bucket = self._buckets[request.tenant_id] = [self.burst, now_s]
        level, last_s = bucket
        if now_s > last_s:  # time never runs backwards in a simulation; do not refund if asked out of order
            level = min(self.burst, level + self.rate * (now_s - last_s))
            bucket[1] = now_s
        cost = 1.0 if self.unit == "requests" else float(request.prompt_tokens)
        if level >= cost:
            bucket[0] = level - cost
            return None
        bucket[0] = level
        return "token_bucket"


def predicted_ttft_s(request: Request, replica: ReplicaView) -> float:
    """Lower estimate of *request*'s time to first token on *replica*, s.

    The prefill work ahead of it plus its own uncached prompt, at the
    replica's marginal prefill time per token::

        (queued_prompt_tokens + prompt_tokens - prefix_hit_tokens) * prefill_s_per_token

    It leaves out step overheads, decode steps interleaved with the prefills
    and the network, so real TTFTs are at least this long.

    >>> from types import SimpleNamespace as R
    >>> from simpy_llm.entities import Request
    >>> req = Request(id=0, client_id="c", prompt_tokens=1000, output_tokens=1, arrival_s=0.0)
    >>> replica = R(queued_prompt_tokens=3000, prefill_s_per_token=1e-4, prefix_hit_tokens=lambda r: 0)
    >>> round(predicted_ttft_s(req, replica), 6)
    0.4
    """
    own = max(0, request.prompt_tokens - replica.prefix_hit_tokens(request))
    return (replica.queued_prompt_tokens + own) * replica.prefill_s_per_token


@admission_policies.register("slo_shed")
@attrs.define
class SloShed:
    """Rejects with ``"slo_shed"`` a request that would miss its TTFT target even on the best replica.

    The TTFT on each replica is estimated by :func:`predicted_ttft_s`; the
    request is shed when the smallest estimate exceeds the TTFT target of its
    ``slo_class``. Because the estimate is a lower bound, only requests that
    cannot make their target are shed. Classes without a TTFT target are
    never shed. The targets (``slo``) are set by the simulation from the
    scenario's SLO classes, not in the policy's parameters.
    ``queued_prompt_tokens`` and ``prefix_hit_tokens`` are replica-reported
    and may be stale.

    >>> from types import SimpleNamespace as R
    >>> from simpy_llm.entities import Request
    >>> view = [R(queued_prompt_tokens=q, prefill_s_per_token=1e-3, prefix_hit_tokens=lambda r: 0)
    ...         for q in (900, 400)]
    >>> req = Request(id=0, client_id="c", prompt_tokens=100, output_tokens=1, arrival_s=0.0,
    ...               slo_class="interactive")
    >>> SloShed(slo={"interactive": 0.4}).admit(req, view, 0.0)
    'slo_shed'
    >>> SloShed(slo={"interactive": 0.5}).admit(req, view, 0.0) is None
    True
    """

    slo: dict[str, float] = attrs.field(factory=dict)
    """SLO class -> TTFT target, s (set by the simulation)."""

    def admit(self, request: Request, view: Sequence[ReplicaView], now_s: float) -> str | None:
        target_s = self.slo.get(request.slo_class)
        if target_s is None or not view:
            return None
        best_s = min(predicted_ttft_s(request, r) for r in view)
        return "slo_shed" if best_s > target_s else None
