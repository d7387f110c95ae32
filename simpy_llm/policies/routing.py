"""Routing policies: which replica a request goes to.

A routing policy implements ``choose(request, view) -> int``, where *view*
is a sequence of read-only :class:`ReplicaView` objects, one per replica, and
the return value is an index into it. Policies that need randomness declare
an ``rng`` field; the simulation injects its ``router`` stream.

What a view offers comes in two freshness tiers. ``outstanding_requests`` and
``outstanding_tokens`` are kept by the router itself and are always current.
Everything the replica must report (``waiting_requests``,
``running_requests``, ``queued_prompt_tokens``, the ``kv_*`` fields,
``prefix_hit_tokens``) may be a snapshot refreshed every so often, as a real
gateway scraping metrics sees it; a policy must not assume it is fresh.

Built-ins (``kind:`` in a scenario): ``round_robin``, ``random``,
``least_loaded``, ``jsq``, ``jiq``, ``power_of_d``, ``weighted_power_of_d``,
``least_outstanding_tokens``, ``least_kv``, ``prefix_affinity``,
``semi_clairvoyant`` and ``weighted_score`` (whose scorers live in the
:data:`routing_scorers` registry). ``docs/policies.md`` states each rule.
"""

from __future__ import annotations

import bisect
import heapq
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, at_most
from simpy_llm.policies.predictors import OutputPredictor, mix64
from simpy_llm.registry import Registry

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = [
    "AllowedTargets",
    "JoinIdleQueue",
    "JoinShortestQueue",
    "LeastKV",
    "LeastLoaded",
    "LeastOutstandingTokens",
    "PowerOfD",
    "PrefixAffinity",
    "RandomRouting",
    "ReplicaView",
    "RoundRobin",
    "RoutingPolicy",
    "Scorer",
    "SemiClairvoyant",
    "WeightedPowerOfD",
    "WeightedScore",
    "prefix_key",
    "routing_policies",
    "routing_scorers",
]


class ReplicaView(Protocol):
    """What a routing or admission policy may read about one replica (all read-only).

    ``outstanding_*`` are router-local and always fresh; the other fields and
    :meth:`prefix_hit_tokens` are reported by the replica and may be stale.
    """

    @property
    def index(self) -> int:
        """The replica's fleet index (a cluster's position, in a view of clusters). A policy
        returns positions in the view it was given, not this: a router over part of the
        fleet (a disaggregated pool, a cluster) sees only its replicas."""
        ...

    @property
    def group(self) -> str:
        """Name of the replica's group."""
        ...

    @property
    def capacity(self) -> float:
        """Relative service rate (> 0; bigger is faster)."""
        ...

    @property
    def outstanding_requests(self) -> int:
        """Requests routed to the replica and not yet finished (router-local, fresh)."""
        ...

    @property
    def outstanding_tokens(self) -> int:
        """Prompt tokens of the outstanding requests (router-local, fresh)."""
        ...

    @property
    def waiting_requests(self) -> int:
        """Requests in the replica's waiting queue (may be stale)."""
        ...

    @property
    def running_requests(self) -> int:
        """Requests in the replica's running batch (may be stale)."""
        ...

    @property
    def queued_prompt_tokens(self) -> int:
        """Prompt tokens waiting or still to be prefilled (may be stale)."""
        ...

    @property
    def kv_free_blocks(self) -> int:
        """Free KV-cache blocks (may be stale)."""
        ...

    @property
    def kv_total_blocks(self) -> int:
        """All KV-cache blocks of the replica."""
        ...

    @property
    def kv_utilization(self) -> float:
        """Used / total KV-cache blocks (may be stale)."""
        ...

    @property
    def prefill_s_per_token(self) -> float:
        """Marginal prefill time per prompt token from the replica's latency model, s."""
        ...

    def prefix_hit_tokens(self, request: Request) -> int:
        """Prompt tokens of *request* found in the replica's prefix cache (0 without one; may be stale)."""
        ...


class RoutingPolicy(Protocol):
    """Chooses a replica for each request."""

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        """Return the index in *view* of the replica that gets *request*."""
        ...


routing_policies: Registry[type] = Registry("routing policy")


class AllowedTargets:
    """A routing policy that sees, for a request of a draft group bound to targets, only the
    replicas (or clusters) that group may use (``speculation.drafts[].targets``,
    ``docs/speculative.md``, "Draft groups bound to targets").

    The wrapped policy is asked with the part of the view whose ``index`` is in the request's
    group's allowed set, and its answer is mapped back to a position in the whole view; a
    request of a group with no set sees the whole view. With *routed*, each choice is told
    ``routed(request, view[i].index)`` before the router sends the request on (the draft
    fleet sets the request's per-target drafters and links there).

    Parameters
    ----------
    policy
        The routing policy (one object, shared by every group: a policy keeping memory by
        position sees the positions of the part it was given).
    allowed
        The allowed view indices (fleet indices, or cluster positions in a view of clusters)
        by draft group name.
    routed
        Told of each choice, or None.

    Examples
    --------
    >>> import types
    >>> view = [types.SimpleNamespace(index=i) for i in range(4)]
    >>> bound = AllowedTargets(RoundRobin(), {"phones": frozenset({1, 3})})
    >>> phone, other = types.SimpleNamespace(id=0, draft_group="phones"), types.SimpleNamespace(id=1, draft_group="laptops")
    >>> [bound.choose(phone, view) for _ in range(3)], bound.choose(other, view)   # one round robin, shared
    ([1, 3, 1], 1)
    """

    def __init__(
        self, policy: RoutingPolicy, allowed: Mapping[str, frozenset[int]], routed: Callable[[Request, int], None] | None = None
    ) -> None:
        self.policy = policy
        self._choose = policy.choose
        self.allowed = dict(allowed)
        self.routed = routed

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        allowed = self.allowed.get(request.draft_group)
        if allowed is None:
            i = self._choose(request, view)
        else:
            positions = [k for k, v in enumerate(view) if v.index in allowed]
            if not positions:
                raise ValueError(
                    f"request {request.id} of draft group {request.draft_group!r}: none of the group's targets is among "
                    "the replicas this router may choose now"
                )
            k = self._choose(request, [view[p] for p in positions])
            if not 0 <= k < len(positions):
                raise ValueError(f"routing policy returned replica {k}; there are {len(positions)}")
            i = positions[k]
        if self.routed is not None:
            self.routed(request, view[i].index)
        return i


def _default_rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _queue_len(r: ReplicaView) -> int:
    return r.waiting_requests + r.running_requests


def _least_loaded(view: Sequence[ReplicaView]) -> int:
    """Fewest outstanding requests; ties to the lowest index."""
    best, best_load = 0, view[0].outstanding_requests
    for i in range(1, len(view)):
        load = view[i].outstanding_requests
        if load < best_load:
            best, best_load = i, load
    return best


def _shortest_queue(view: Sequence[ReplicaView]) -> int:
    """Fewest waiting + running requests; ties to the lowest index."""
    best, best_len = 0, _queue_len(view[0])
    for i in range(1, len(view)):
        q = _queue_len(view[i])
        if q < best_len:
            best, best_len = i, q
    return best


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

    rng: np.random.Generator = attrs.field(factory=_default_rng)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return int(self.rng.integers(len(view)))


@routing_policies.register("least_loaded")
@attrs.define
class LeastLoaded:
    """The replica with the fewest outstanding requests; ties go to the lowest index."""

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return _least_loaded(view)


@routing_policies.register("jsq")
@attrs.define
class JoinShortestQueue:
    """Join the shortest queue: fewest ``waiting_requests + running_requests``; ties to the lowest index.

    Reads replica-reported counts, so with stale views every request of a
    refresh interval sees the same "shortest" replica (herding).

    >>> from types import SimpleNamespace as R
    >>> JoinShortestQueue().choose(None, [R(waiting_requests=2, running_requests=1),
    ...                                   R(waiting_requests=0, running_requests=3)])
    0
    """

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return _shortest_queue(view)


@routing_policies.register("jiq")
@attrs.define
class JoinIdleQueue:
    """Join the idle queue: a replica with no outstanding requests, else any replica.

    Among idle replicas (``outstanding_requests == 0``) one is drawn uniformly
    at random (as a dispatcher popping an idle list in the order replicas
    report idle would, without favouring low indices); with none idle, a
    replica is drawn uniformly from all. Reads only router-local counts, so
    stale views do not affect it.
    """

    rng: np.random.Generator = attrs.field(factory=_default_rng)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        idle = [i for i, r in enumerate(view) if r.outstanding_requests == 0]
        if idle:
            return idle[int(self.rng.integers(len(idle)))]
        return int(self.rng.integers(len(view)))


def _sample_distinct(rng: np.random.Generator, n: int, d: int) -> list[int]:
    """*d* distinct indices from ``range(n)``, in a uniformly random order, from one draw of the stream.

    The k-th pick is a uniform rank among the ``n - k`` indices not yet taken.
    """
    picks: list[int] = []
    # one vector of uniforms is several times cheaper than integer draws with per-draw bounds
    for k, u in enumerate(rng.random(d).tolist()):
        rank = int(u * (n - k))
        for p in sorted(picks):
            if p <= rank:
                rank += 1
        picks.append(rank)
    return picks


@routing_policies.register("power_of_d")
@attrs.define
class PowerOfD:
    """JSQ(d): sample *d* distinct replicas uniformly, join the shortest queue among them.

    Queue length is ``waiting_requests + running_requests``; a tie goes to the
    replica sampled first (a uniformly random tie-break). With ``d >= N`` it
    is exactly :class:`JoinShortestQueue` (ties to the lowest index, no draws).

    >>> from types import SimpleNamespace as R
    >>> view = [R(waiting_requests=w, running_requests=0) for w in (3, 0, 5)]
    >>> PowerOfD(d=3).choose(None, view)
    1
    """

    d: int = attrs.field(default=2, validator=at_least(1))
    """Replicas sampled per request."""
    rng: np.random.Generator = attrs.field(factory=_default_rng)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        n = len(view)
        if self.d >= n:
            return _shortest_queue(view)
        sample = _sample_distinct(self.rng, n, self.d)
        return min(sample, key=lambda i: _queue_len(view[i]))


@routing_policies.register("weighted_power_of_d")
@attrs.define
class WeightedPowerOfD:
    """Capacity-weighted JSQ(d) for replicas of different speeds.

    Samples *d* distinct replicas, each draw with probability proportional to
    ``capacity`` among those not yet drawn, and picks the smallest
    ``(waiting_requests + running_requests + 1) / capacity`` (the expected
    drain time the new request would join); a tie goes to the replica drawn
    first. With ``d >= N`` every replica is compared (ties to the lowest
    index, no draws).

    >>> from types import SimpleNamespace as R
    >>> view = [R(waiting_requests=1, running_requests=0, capacity=1.0),
    ...         R(waiting_requests=2, running_requests=0, capacity=4.0)]
    >>> WeightedPowerOfD(d=2).choose(None, view)  # 2/1 > 3/4
    1
    """

    d: int = attrs.field(default=2, validator=at_least(1))
    """Replicas sampled per request."""
    rng: np.random.Generator = attrs.field(factory=_default_rng)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        n = len(view)
        if self.d >= n:
            sample = list(range(n))
        else:
            weights = [r.capacity for r in view]
            remaining = list(range(n))
            total = math.fsum(weights)
            sample = []
            for u in self.rng.random(self.d).tolist():
                target, k = u * total, 0
                acc = weights[remaining[0]]
                # the last index absorbs rounding in the running sum
                while acc <= target and k < len(remaining) - 1:
                    k += 1
                    acc += weights[remaining[k]]
                pick = remaining.pop(k)
                total -= weights[pick]
                sample.append(pick)
        return min(sample, key=lambda i: (_queue_len(view[i]) + 1) / view[i].capacity)


@routing_policies.register("least_outstanding_tokens")
@attrs.define
class LeastOutstandingTokens:
    """The smallest ``outstanding_tokens / capacity`` (prompt work routed and unfinished, per unit speed).

    Ties go to the lowest index. Router-local, so never stale.

    >>> from types import SimpleNamespace as R
    >>> LeastOutstandingTokens().choose(None, [R(outstanding_tokens=300, capacity=2.0),
    ...                                        R(outstanding_tokens=200, capacity=1.0)])
    0
    """

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return min(range(len(view)), key=lambda i: view[i].outstanding_tokens / view[i].capacity)


def _free_kv_fraction(r: ReplicaView) -> float:
    total = r.kv_total_blocks
    return r.kv_free_blocks / total if total > 0 else 0.0


@routing_policies.register("least_kv")
@attrs.define
class LeastKV:
    """The highest free KV-cache fraction ``kv_free_blocks / kv_total_blocks``.

    Ties go to the fewest outstanding requests, then to the lowest index. The
    KV fields are replica-reported and may be stale.

    >>> from types import SimpleNamespace as R
    >>> LeastKV().choose(None, [R(kv_free_blocks=10, kv_total_blocks=100, outstanding_requests=0),
    ...                         R(kv_free_blocks=30, kv_total_blocks=200, outstanding_requests=5)])
    1
    """

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        return min(range(len(view)), key=lambda i: (-_free_kv_fraction(view[i]), view[i].outstanding_requests))


def prefix_key(request: Request) -> int | None:
    """The key that prefix-aware routing keeps together, or None.

    The first prefix-block hash when the request has shared prefix blocks,
    else the CRC-32 of its session id when it belongs to a session, else
    None. Both are the same in every process.

    >>> from simpy_llm.entities import Request
    >>> r = Request(id=0, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=0.0)
    >>> prefix_key(r) is None
    True
    >>> prefix_key(attrs.evolve(r, session_id="s1")) == zlib.crc32(b"s1")
    True
    >>> prefix_key(attrs.evolve(r, session_id="s1", prefix_blocks=(42, 43)))
    42
    """
    if request.prefix_blocks:
        return request.prefix_blocks[0]
    if request.session_id:
        return zlib.crc32(request.session_id.encode())
    return None


_RING_SALT = 0x52494E47  # separates ring positions from key positions in the hash space


@routing_policies.register("prefix_affinity")
@attrs.define
class PrefixAffinity:
    """Consistent hashing with bounded loads on the request's :func:`prefix_key`.

    Each replica owns ``virtual_nodes`` points on a 64-bit hash ring (built
    from replica indices only, so the same in every run and process). A key
    hashes to a ring position; the ring is walked clockwise from there to the
    first replica whose ``outstanding_requests`` is at most
    ``ceil((1 + load_bound) * (total_outstanding + 1) / N)``. While a
    replica stays under that bound a key always lands on the same replica
    (its cache stays warm); when it is over, the key spills to the next
    replica on the ring, the same one every time. Such a replica always
    exists (the loads sum to the total), and no replica ever holds more than
    the bound + 1. Requests without a key go to :class:`LeastLoaded`. Reads
    only router-local counts, so stale views do not affect it.

    >>> from types import SimpleNamespace as R
    >>> from simpy_llm.entities import Request
    >>> req = Request(id=0, client_id="c", prompt_tokens=10, output_tokens=1, arrival_s=0.0,
    ...               session_id="chat-7")
    >>> view = [R(outstanding_requests=0) for _ in range(4)]
    >>> policy = PrefixAffinity()
    >>> policy.choose(req, view) == policy.choose(req, view)
    True
    """

    virtual_nodes: int = attrs.field(default=100, validator=[at_least(1), at_most(10_000)])
    """Ring points per replica (more: a more even split of keys)."""
    load_bound: float = attrs.field(default=0.25, validator=[at_least(0), at_most(1e6)])
    """Epsilon: a replica accepts a key while its load is at most (1 + epsilon) x the mean load, rounded up."""
    _ring_n: int = attrs.field(default=0, init=False, repr=False)
    _positions: list[int] = attrs.field(factory=list, init=False, repr=False)
    _owners: list[int] = attrs.field(factory=list, init=False, repr=False)

    def _build_ring(self, n: int) -> None:
        points = sorted(
            (mix64(_RING_SALT, replica, v), replica) for replica in range(n) for v in range(self.virtual_nodes)
        )
        self._positions = [p for p, _ in points]
        self._owners = [o for _, o in points]
        self._ring_n = n

    def replica_for_key(self, key: int, loads: Sequence[int]) -> int:
        """The replica a key goes to given each replica's outstanding requests *loads*."""
        n = len(loads)
        if n != self._ring_n:
            self._build_ring(n)
        # ceil of a float product can overshoot an exact integer by one ulp
        bound = math.ceil((1.0 + self.load_bound) * (sum(loads) + 1) / n - 1e-9)
        owners = self._owners
        m = len(owners)
        start = bisect.bisect_right(self._positions, mix64(key))
        for step in range(m):
            replica = owners[(start + step) % m]
            if loads[replica] <= bound:
                return replica
        raise AssertionError("unreachable: some replica is always at or below the mean load")

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        key = prefix_key(request)
        if key is None:
            return _least_loaded(view)
        return self.replica_for_key(key, [r.outstanding_requests for r in view])


def _default_predictor() -> OutputPredictor:
    return OutputPredictor(kind="noisy")


@routing_policies.register("semi_clairvoyant")
@attrs.define
class SemiClairvoyant:
    """Balances predicted outstanding work, using an output-length predictor.

    The policy keeps a router-local ledger: for each replica, the *predicted*
    output tokens of every request it routed there and believes unfinished.
    It asks the predictor only about the request being routed, and records
    the answer under the replica it chooses. Before each choice it reconciles
    the ledger with the (fresh) ``outstanding_requests``: when a replica has
    fewer outstanding requests than ledger entries, the entries with the
    smallest predictions are taken as finished (requests decoding in one
    batch finish in order of output length). Requests the ledger does not
    know of (outstanding beyond its entries) count at the mean prediction so
    far.

    It chooses the replica minimising the finish pressure after assignment::

        (outstanding_tokens + output_weight * ledger_output_tokens
         + prompt_tokens + output_weight * predicted_output_tokens) / capacity

    ties to the fewest outstanding requests, then the lowest index. It
    assumes every index it returns is routed (the router counts the request
    as outstanding there before the next choice). Predicted work is not
    reduced as tokens are generated (the view does not say how far each
    request has got), so a replica with long-running requests looks busier
    than it is until they finish.

    >>> from types import SimpleNamespace as R
    >>> from simpy_llm.entities import Request
    >>> policy = SemiClairvoyant(predictor=OutputPredictor(kind="oracle"))
    >>> view = [R(outstanding_requests=0, outstanding_tokens=0, capacity=1.0) for _ in range(2)]
    >>> long = Request(id=0, client_id="c", prompt_tokens=10, output_tokens=1000, arrival_s=0.0)
    >>> policy.choose(long, view)
    0
    >>> view[0].outstanding_requests, view[0].outstanding_tokens = 1, 10
    >>> short = Request(id=1, client_id="c", prompt_tokens=10, output_tokens=5, arrival_s=0.0)
    >>> policy.choose(short, view)
    1
    """

    predictor: OutputPredictor = attrs.field(factory=_default_predictor)
    """Where predicted output lengths come from (default: noisy, sigma 0.5)."""
    output_weight: float = attrs.field(default=1.0, validator=at_least(0))
    """Cost of one output token relative to one prompt token."""
    _ledgers: list[list[float]] = attrs.field(factory=list, init=False, repr=False)
    _ledger_sums: list[float] = attrs.field(factory=list, init=False, repr=False)
    _predicted_total: float = attrs.field(default=0.0, init=False, repr=False)
    _predicted_count: int = attrs.field(default=0, init=False, repr=False)

    def ledger_output_tokens(self) -> list[float]:
        """Predicted output tokens the ledger holds per replica (as of the last choice)."""
        return list(self._ledger_sums)

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        n = len(view)
        if len(self._ledgers) != n:
            self._ledgers = [[] for _ in range(n)]
            self._ledger_sums = [0.0] * n
        predicted = self.predictor.predict(request)
        mean_prediction = self._predicted_total / self._predicted_count if self._predicted_count else predicted
        w = self.output_weight
        new_work = request.prompt_tokens + w * predicted
        best, best_key = 0, (math.inf, 0)
        for i, r in enumerate(view):
            ledger = self._ledgers[i]
            outstanding = r.outstanding_requests
            while len(ledger) > outstanding:
                self._ledger_sums[i] -= heapq.heappop(ledger)
            if not ledger:
                self._ledger_sums[i] = 0.0  # drop accumulated rounding
            unknown = outstanding - len(ledger)
            output = self._ledger_sums[i] + unknown * mean_prediction
            key = ((r.outstanding_tokens + w * output + new_work) / r.capacity, outstanding)
            if key < best_key:
                best, best_key = i, key
        heapq.heappush(self._ledgers[best], predicted)
        self._ledger_sums[best] += predicted
        self._predicted_total += predicted
        self._predicted_count += 1
        return best


Scorer = Callable[["Request", Sequence[ReplicaView]], Sequence[float]]
"""A scorer maps (request, view) to one score in [0, 1] per replica (higher: better)."""

routing_scorers: Registry[Scorer] = Registry("routing scorer")
"""Scorers for ``weighted_score``; register a function to add one."""


def _inverse_min_max(values: Sequence[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if hi == lo:  # nothing to tell apart: every replica is as good as the best
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


@routing_scorers.register("queue")
def score_queue(request: Request, view: Sequence[ReplicaView]) -> list[float]:
    """Min-max normalised inverse of ``waiting_requests``: 1 for the shortest queue, 0 for the longest.

    All replicas score 1 when their queues are equal.
    """
    return _inverse_min_max([r.waiting_requests for r in view])


@routing_scorers.register("load")
def score_load(request: Request, view: Sequence[ReplicaView]) -> list[float]:
    """``1 / (1 + outstanding_requests)``: 1 for an idle replica, halving by the second request."""
    return [1.0 / (1 + r.outstanding_requests) for r in view]


@routing_scorers.register("kv")
def score_kv(request: Request, view: Sequence[ReplicaView]) -> list[float]:
    """``1 - kv_utilization`` (clamped to [0, 1])."""
    return [min(1.0, max(0.0, 1.0 - r.kv_utilization)) for r in view]


@routing_scorers.register("prefix")
def score_prefix(request: Request, view: Sequence[ReplicaView]) -> list[float]:
    """Share of the prompt in the replica's prefix cache, ``prefix_hit_tokens / prompt_tokens``.

    An empty prompt scores 0 everywhere.
    """
    prompt = request.prompt_tokens
    if prompt <= 0:
        return [0.0] * len(view)
    return [min(1.0, r.prefix_hit_tokens(request) / prompt) for r in view]


@routing_scorers.register("capacity")
def score_capacity(request: Request, view: Sequence[ReplicaView]) -> list[float]:
    """``capacity / max capacity``: 1 for the fastest replicas."""
    top = max(r.capacity for r in view)
    return [r.capacity / top for r in view]


def _known_scorers(_inst: Any, _attr: Any, value: dict[str, float]) -> None:
    if not value:
        raise FieldValueError("scorers", f"give at least one scorer; known: {', '.join(routing_scorers.names())}")
    for name, weight in value.items():
        if name not in routing_scorers:
            raise FieldValueError(f"scorers.{name}", f"unknown scorer; known: {', '.join(routing_scorers.names())}")
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise FieldValueError(f"scorers.{name}", f"weight must be a finite number >= 0, got {weight!r}")
    if not any(w > 0 for w in value.values()):
        raise FieldValueError("scorers", "at least one weight must be > 0")


def _default_scorers() -> dict[str, float]:
    return {"prefix": 2.0, "queue": 1.0, "kv": 1.0}


@routing_policies.register("weighted_score")
@attrs.define
class WeightedScore:
    """The replica with the highest weighted sum of scorer scores; ties go to the lowest index.

    Each named scorer (from :data:`routing_scorers`) gives every replica a
    score in [0, 1]; the policy adds them with the given weights (only their
    ratios matter). The default, ``{prefix: 2, queue: 1, kv: 1}``, is the
    usual prefix-aware gateway profile.

    >>> from types import SimpleNamespace as R
    >>> view = [R(waiting_requests=4, outstanding_requests=4), R(waiting_requests=0, outstanding_requests=1)]
    >>> WeightedScore(scorers={"queue": 1.0, "load": 1.0}).choose(None, view)
    1
    >>> WeightedScore(scorers={"queues": 1.0})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: scorers.queues: unknown scorer; known: capacity, kv, load, prefix, queue
    """

    scorers: dict[str, float] = attrs.field(factory=_default_scorers, validator=_known_scorers)
    """Scorer name -> weight (>= 0)."""
    _weighted: list[tuple[float, Any]] = attrs.field(factory=list, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._weighted = [(w, routing_scorers.get(name)) for name, w in self.scorers.items() if w > 0]

    def scores(self, request: Request, view: Sequence[ReplicaView]) -> list[float]:
        """The weighted total of every replica."""
        totals = [0.0] * len(view)
        for weight, scorer in self._weighted:
            for i, s in enumerate(scorer(request, view)):
                totals[i] += weight * s
        return totals

    def choose(self, request: Request, view: Sequence[ReplicaView]) -> int:
        totals = self.scores(request, view)
        return max(range(len(totals)), key=lambda i: (totals[i], -i))
