"""A per-token model of one replica, written from ``docs/model.md`` ("A replica, precisely").

This is the test suite's truth for the engine: it shares no code with
``simpy_llm.serving`` and is deliberately plain. One replica is simulated step
by step; every step is planned in the five parts of the specification
(budget, chunks, KV need, fit or preempt, admission), then ended in the
specified order. Blocks are explicit objects: each request holds a list of
them (its block table); the prefix cache maps a block's *identity* to the
block, and a full block gets its identity when the step that fills it is
scheduled (a request that fills a block whose identity is cached already
takes the cached one and gives its own back, to the head of the free queue).
Every block nobody holds sits in one ``OrderedDict``, the free queue: the
blocks never used first, then every released block in release order;
allocation pops its head and a popped cached block loses its identity.

Time is kept as the specification's clock: step ends are whole nanoseconds
(``segment start + k * duration``, each in integer nanoseconds), converted to
seconds by one division.

A block identity is the request's token sequence ``[0, (b + 1) * bs)``
written as its segments cut to that length: a tuple of ``(segment id,
tokens)`` pairs. Two requests' identities are equal exactly when their
segment lists agree on those positions (same ids at the same offsets), which
is the specification's definition of holding the same tokens.

Where the specification leaves a choice open, the choice made here is marked
"Reading:" in the code.

Examples
--------
A lone request: one prefill step, then one decode step per further token.

>>> lat = LinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
>>> out = simulate_replica([RequestInput(request_id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=3)],
...                        EngineSettings(max_num_seqs=4, max_num_batched_tokens=32, kv_block_size=4, kv_num_blocks=16), lat)
>>> rec = out.requests[0]
>>> rec.status, rec.generated_tokens, out.steps
('completed', 3, 3)
>>> d_ns = 1000 * 1000 + 10 * 10 * 1000  # the prefill step in ns; each decode step takes as long
>>> rec.first_token_s == d_ns / NS and rec.completion_s == 3 * d_ns / NS
True
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from simpy_llm.entities import Request

__all__ = [
    "EngineSettings",
    "Fcfs",
    "LinearLatency",
    "ReferenceStuck",
    "ReplicaOutcome",
    "RequestInput",
    "RequestOutcome",
    "SlotSettings",
    "engine_settings",
    "linear_latency",
    "request_segments",
    "requests_from_records",
    "simulate",
    "simulate_replica",
]

NAN = math.nan
NS = 1_000_000_000
"""Nanoseconds per second: the clock's grid."""

Segment = tuple[Hashable, int]
"""(segment id, tokens): a run of tokens from one fixed token stream."""


class SchedulerPolicy(Protocol):
    """What the model needs of a scheduler policy: its sort key."""

    def key(self, request: Request, now_s: float) -> Any: ...


class Fcfs:
    """The ``fcfs`` ordering (every policy key equal, so only arrival order counts)."""

    def key(self, request: Request, now_s: float) -> int:  # noqa: ARG002 - the protocol's signature
        return 0


class ReferenceStuck(RuntimeError):
    """The specification gives no way forward (a step with nothing to do while work waits)."""


# --- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotSettings:
    """The slot cache's settings ("The prompt cache, slot by slot")."""

    prompt_similarity: float = 0.1
    host_cache_tokens: int = 262_144
    cache_idle_slots: bool = True
    checkpoints: bool = True
    max_checkpoints: int = 32


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings the specification uses (names as in the scenario's ``serving.engine``)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    kv_block_size: int = 16
    kv_num_blocks: int = 8192
    max_model_len: int | None = None
    """None: what the KV cache can hold (``kv_num_blocks * kv_block_size``)."""
    prefix_caching: bool = True
    preemption_mode: str = "recompute"
    swap_space_blocks: int = 0
    """CPU swap space, blocks of ``kv_block_size`` tokens."""
    swap_kv_bytes_per_token: float = 0.0
    swap_bandwidth_gb_per_s: float = 1.0
    ubatch_tokens: int | None = None
    """Forward passes of at most this many tokens per step (None: one pass)."""
    prefill_breaks: tuple[int, ...] = ()
    """Tokens-left counts at which a prefill chunk stops."""
    reusable_prompt_tail: int | None = None
    """A finished request's own blocks past ``prompt - tail`` tokens cannot be found."""
    slot_cache: SlotSettings | None = None
    """llama.cpp's prompt cache, slot by slot (then no block is cached)."""

    @property
    def model_len_limit(self) -> int:
        # Reading: the section does not state the default; the config's docstring says
        # "what the KV cache can hold".
        if self.max_model_len is not None:
            return self.max_model_len
        return self.kv_num_blocks * self.kv_block_size

    def swap_s(self, tokens: int) -> float:
        """Seconds to copy *tokens* tokens' KV between GPU and CPU."""
        return tokens * self.swap_kv_bytes_per_token / (self.swap_bandwidth_gb_per_s * 1e9)


@dataclass(frozen=True)
class LinearLatency:
    """The ``blis_linear`` latency model, coefficients in microseconds."""

    beta0_us: float = 0.0
    beta1_us: float = 0.0
    beta2_us: float = 0.0
    alpha0_us: float = 0.0
    alpha1_us: float = 0.0
    alpha2_us: float = 0.0
    cache_restore_us: float = 0.0

    @property
    def cache_restore_s(self) -> float:
        """Added to a step per request it admits with cached blocks found."""
        return self.cache_restore_us * 1e-6

    def step_s(self, prefill_tokens: int, decode_tokens: int) -> float:
        """One step computing *prefill_tokens* chunk tokens and *decode_tokens* decode tokens."""
        return (self.beta0_us + self.beta1_us * prefill_tokens + self.beta2_us * decode_tokens) * 1e-6

    def queueing_s(self, prompt_tokens: int) -> float:
        """From reaching the replica to entering its waiting queue."""
        return (self.alpha0_us + self.alpha1_us * prompt_tokens) * 1e-6

    @property
    def alpha2_s(self) -> float:
        """Post-processing per output token, added to each token's client-side time."""
        return self.alpha2_us * 1e-6


# --- inputs and outputs ------------------------------------------------------------------


@dataclass(frozen=True)
class RequestInput:
    """One request reaching the replica (at ``arrival_s``) and its content."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    segments: tuple[Segment, ...] = ()
    """Its token sequence (prompt then output) as segments; empty: one unique
    segment for the prompt and one for the output."""
    client_id: str = "c"
    tenant_id: str = ""
    slo_class: str = "default"
    priority: int = 0
    session_id: str = ""
    round_index: int = 0
    prefix_group: str = ""
    prefix_tokens: int = 0

    def all_segments(self) -> tuple[Segment, ...]:
        if self.segments:
            segs = self.segments
        else:
            segs = ((("prompt", self.request_id), self.prompt_tokens), (("output", self.request_id), self.output_tokens))
        total = sum(n for _, n in segs)
        if total != self.prompt_tokens + self.output_tokens:
            raise ValueError(f"request {self.request_id}: segments cover {total} tokens, not prompt + output")
        return segs


@dataclass
class RequestOutcome:
    """What the model says about one request (the compared record fields)."""

    request_id: int
    status: str
    enqueue_s: float = NAN
    first_scheduled_s: float = NAN
    first_token_s: float = NAN
    completion_s: float = NAN
    generated_tokens: int = 0
    num_preemptions: int = 0
    cached_tokens: int = 0


@dataclass
class ReplicaOutcome:
    """One replica's requests, preemptions and step statistics."""

    requests: dict[int, RequestOutcome] = field(default_factory=dict)
    preemptions: list[tuple[int, int, float, str]] = field(default_factory=list)
    """(request_id, replica, time_s, mode) per preemption, in the order they happened."""
    steps: int = 0
    busy_s: float = 0.0
    """Sum of the durations of the steps that happened, in step order."""


# --- blocks --------------------------------------------------------------------------------


class _Block:
    """One KV block: empty or private (``identity`` None) or cached (``identity`` set, ``refs`` >= 0)."""

    __slots__ = ("identity", "number", "refs")

    def __init__(self, number: int) -> None:
        self.number = number
        self.identity: tuple | None = None
        self.refs = 0


class _Pool:
    """The replica's blocks: the free queue and the prefix cache."""

    def __init__(self, num_blocks: int) -> None:
        self.queue: OrderedDict[int, _Block] = OrderedDict((i, _Block(i)) for i in range(num_blocks))
        """Every block no request holds, head first: the blocks never used, then each
        released block in release order (empty ones and evictable cached ones alike)."""
        self.cache: dict[tuple, _Block] = {}
        """identity -> cached block (referenced or evictable)."""

    def free(self) -> int:
        return len(self.queue)

    def allocate(self, table: list[_Block], n: int) -> None:
        """Append *n* blocks popped from the head of the free queue to *table*; a cached
        block popped loses its identity (it is evicted)."""
        if n > self.free():
            raise AssertionError("allocating more blocks than are free")
        for _ in range(n):
            _, blk = self.queue.popitem(last=False)
            if blk.identity is not None:
                del self.cache[blk.identity]
                blk.identity = None
            blk.refs = 0
            table.append(blk)

    def pin(self, table: list[_Block], blocks: Iterable[_Block]) -> None:
        """Append cached *blocks* to *table*, one reference each (an unreferenced one leaves
        the free queue)."""
        for blk in blocks:
            if blk.refs == 0:
                del self.queue[blk.number]
            blk.refs += 1
            table.append(blk)

    def release(self, table: list[_Block]) -> None:
        """Drop a request's blocks, last block first: private ones join the free queue's tail
        empty, cached ones lose a reference and join it (keeping their identity) at zero."""
        for blk in reversed(table):
            if blk.identity is None:
                self.queue[blk.number] = blk
            else:
                blk.refs -= 1
                if blk.refs == 0:
                    self.queue[blk.number] = blk
        table.clear()

    def register(self, table: list[_Block], b: int, identity: tuple) -> None:
        """Block *b* of *table* became full. It becomes cached under *identity*; if a cached
        block has that identity already, the table references that one instead and its
        own copy, unused, goes back to the head of the free queue."""
        blk = table[b]
        other = self.cache.get(identity)
        if other is None:
            blk.identity = identity
            blk.refs = 1
            self.cache[identity] = blk
            return
        if other.refs == 0:
            del self.queue[other.number]
        other.refs += 1
        table[b] = other
        self.queue[blk.number] = blk
        self.queue.move_to_end(blk.number, last=False)


def _identity(segments: Sequence[Segment], length: int) -> tuple:
    """The tokens ``[0, length)`` as segments cut to that length."""
    out = []
    remaining = length
    for seg_id, n in segments:
        if remaining <= 0:
            break
        take = n if n < remaining else remaining
        out.append((seg_id, take))
        remaining -= take
    if remaining > 0:
        raise AssertionError("block beyond the request's sequence")
    return tuple(out)


# --- llama.cpp's slots ------------------------------------------------------------------------


def _tokens(segments: Sequence[Segment], length: int) -> list[tuple[Hashable, int]]:
    """The first *length* tokens, each as (segment id, offset in its segment)."""
    out: list[tuple[Hashable, int]] = []
    for seg_id, n in segments:
        for k in range(n):
            if len(out) == length:
                return out
            out.append((seg_id, k))
    if len(out) < length:
        raise AssertionError("tokens beyond the request's sequence")
    return out


def _common(a: Sequence[tuple[Hashable, int]], b: Sequence[tuple[Hashable, int]]) -> int:
    """Leading positions at which two token lists hold the same token."""
    n = 0
    for x, y in zip(a, b, strict=False):  # the lists may differ in length
        if x != y:
            break
        n += 1
    return n


class _Context:
    """What a slot holds, or the host cache saved: tokens and checkpoints (oldest first)."""

    def __init__(self, tokens: list[tuple[Hashable, int]], checkpoints: list[int]) -> None:
        self.tokens = tokens
        self.checkpoints = checkpoints


class _Slot:
    def __init__(self, number: int) -> None:
        self.number = number
        self.context = _Context([], [])
        self.busy = False
        self.released: tuple[float, int] = (-1.0, -1)
        """When it was last released, and its number: the server walks its slots in number order
        after a step, so those freed by one step count as released in that order ((-1, -1): never
        used)."""


# --- the model ---------------------------------------------------------------------------


class _Live:
    """A request's state inside the model."""

    def __init__(self, inp: RequestInput, entity: Request) -> None:
        self.inp = inp
        self.entity = entity
        self.segments = inp.all_segments()
        self.identities: list[tuple] = []
        self.enqueue_s = NAN
        self.seq = -1
        self.sort_key: tuple = ()
        self.target = inp.prompt_tokens
        self.computed = 0
        """Tokens whose KV the request holds (as of the last step end)."""
        self.incoming = 0
        """Swapped-in tokens copied back in the current step (counted at its end)."""
        self.chunk = 0
        """Tokens of the current step's chunk."""
        self.emitted = 0
        self.decoding = False
        self.table: list[_Block] = []
        self.swapped: int | None = None
        """Tokens held in CPU swap space while waiting (None: not swapped out)."""
        self.admitted = False
        self.first_scheduled_s = NAN
        self.first_token_s = NAN
        self.completion_s = NAN
        self.cached_tokens = 0
        self.preemptions: list[float] = []
        self.completed = False
        self.slot: _Slot | None = None
        self.slot_checkpoints: list[int] = []
        """The checkpoints its slot holds once it is done."""

    def identity(self, b: int, bs: int) -> tuple:
        while len(self.identities) <= b:
            self.identities.append(_identity(self.segments, (len(self.identities) + 1) * bs))
        return self.identities[b]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Replica:
    def __init__(
        self,
        settings: EngineSettings,
        latency: LinearLatency,
        policy: SchedulerPolicy,
        replica: int,
        until_s: float | None,
        trace: list[dict[str, Any]] | None = None,
    ) -> None:
        if settings.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"unknown preemption_mode {settings.preemption_mode!r}")
        self.s = settings
        self.bs = settings.kv_block_size
        self.lat = latency
        self.policy = policy
        self.replica = replica
        self.until_s = until_s
        self.pool = _Pool(settings.kv_num_blocks)
        self.waiting: list[_Live] = []
        self.running: list[_Live] = []
        """In key order."""
        self.swap_used = 0
        self.step_swap_tokens = 0
        self.out = ReplicaOutcome()
        self.trace = trace
        self.slot_mode = settings.slot_cache is not None
        self.block_cache = settings.prefix_caching and not self.slot_mode
        """Blocks are cached and shared (the block cache), not a slot's own."""
        self.slots = [_Slot(i) for i in range(settings.max_num_seqs)] if self.slot_mode else []
        self.host: list[_Context] = []

    # --- queue entries -------------------------------------------------------------
    def _enter_waiting(self, r: _Live, now_s: float) -> None:
        r.sort_key = (self.policy.key(r.entity, now_s), r.seq)
        self.waiting.append(r)

    def _chunk(self, remaining: int, budget: int) -> int:
        if self.s.chunked_prefill:
            c = min(remaining, budget)
            # a chunk ends where the tokens left reach a break (counted back from the prompt's end)
            for left in range(remaining - 1, remaining - c, -1):
                if left in self.s.prefill_breaks:
                    return remaining - left
            return c
        return remaining if remaining <= budget else 0

    def _blocks(self, tokens: int) -> int:
        return _ceil_div(tokens, self.bs)

    # --- preemption ------------------------------------------------------------------
    def _preempt(self, victim: _Live, now_s: float) -> None:
        if self.slot_mode:
            raise AssertionError("slots own their whole context: nothing is preempted")
        self.running.remove(victim)
        self._register_rest(victim, findable=True)
        self.pool.release(victim.table)
        victim.target = victim.inp.prompt_tokens + victim.emitted
        mode = "recompute"
        if self.s.preemption_mode == "swap":
            need = self._blocks(victim.computed)
            if self.swap_used + need <= self.s.swap_space_blocks:
                self.swap_used += need
                victim.swapped = victim.computed
                self.step_swap_tokens += victim.computed
                mode = "swap"
        victim.computed = 0
        victim.decoding = False
        victim.chunk = 0
        victim.preemptions.append(now_s)
        victim.entity.preemption_times_s = list(victim.preemptions)
        self.out.preemptions.append((victim.inp.request_id, self.replica, now_s, mode))
        self._enter_waiting(victim, now_s)

    # --- prefix cache ---------------------------------------------------------------------
    def _lookup(self, r: _Live) -> list[_Block]:
        if not self.block_cache:
            return []
        found = []
        # Only blocks entirely within the first target - 1 tokens.
        for b in range((r.target - 1) // self.bs):
            blk = self.pool.cache.get(r.identity(b, self.bs))
            if blk is None:
                break
            found.append(blk)
        return found

    def _shared_prefix(self, r: _Live) -> int:
        """Its leading shared-prefix tokens (``S``)."""
        return sum(n for seg, n in itertools.takewhile(lambda sn: sn[0][0] == "prefix", r.segments))

    def _scheduled_limit(self, r: _Live) -> float:
        """Tokens whose full blocks are cached when the step filling them is scheduled:
        all, or with a reusable tail k the first max(P - k, S) (the rest at its release)."""
        tail = self.s.reusable_prompt_tail
        if tail is None:
            return math.inf
        return max(r.inp.prompt_tokens - tail, self._shared_prefix(r))

    def _register(self, r: _Live, old: int, new: int) -> None:
        """A step filling *r*'s tokens [old, new) is scheduled: its full blocks are cached."""
        if not self.block_cache:
            return
        limit = self._scheduled_limit(r)
        for b in range(old // self.bs, new // self.bs):
            if r.table[b].identity is not None:
                raise AssertionError("a block filled in this step was already cached")
            if (b + 1) * self.bs <= limit:
                self.pool.register(r.table, b, r.identity(b, self.bs))

    def _register_rest(self, r: _Live, findable: bool) -> None:
        """At its release, *r*'s full blocks not cached yet (past its scheduled limit) are:
        under their identity (*findable*, a preemption), or under one nobody else has (a
        completion: a later request may not find them)."""
        if not self.block_cache:
            return
        for b in range(r.computed // self.bs):
            if r.table[b].identity is None:
                if findable:
                    self.pool.register(r.table, b, r.identity(b, self.bs))
                else:
                    blk = r.table[b]
                    blk.identity = ("unfindable", r.inp.request_id, b)
                    blk.refs = 1
                    self.pool.cache[blk.identity] = blk

    def _saved_to(self, host: list[_Context], ctx: _Context) -> list[_Context]:
        """The host cache after saving *ctx* (a copy)."""
        limit = self.s.slot_cache.host_cache_tokens
        n = len(ctx.tokens)
        if n == 0 or n > limit:
            return list(host)
        if any(_common(e.tokens, ctx.tokens) == n for e in host):
            return list(host)  # contained in a saved context
        kept = [e for e in host if _common(e.tokens, ctx.tokens) < len(e.tokens)]
        while kept and sum(len(e.tokens) for e in kept) + n > limit:
            kept.pop(0)
        return [*kept, ctx]

    def _choose_slot(self, h: _Live) -> dict[str, Any]:
        """What giving *h* a slot would do (nothing changes yet)."""
        cfg = self.s.slot_cache
        p = h.inp.prompt_tokens
        prompt = _tokens(h.segments, p)
        idle = [sl for sl in self.slots if not sl.busy]
        chosen = None
        update = False
        if cfg.prompt_similarity > 0:
            best = None
            for sl in idle:
                n = len(sl.context.tokens)
                if n == 0:
                    continue
                lcp = _common(sl.context.tokens, prompt)
                if lcp > 0 and lcp / p > cfg.prompt_similarity and (best is None or lcp > best):
                    best, chosen = lcp, sl
            if chosen is not None:
                update = 2 * best < len(chosen.context.tokens)
        if chosen is None:
            # least recently used; among equals the higher slot
            oldest = min(sl.released for sl in idle)
            chosen = [sl for sl in idle if sl.released == oldest][-1]
            update = True
        ctx = chosen.context
        host = list(self.host)
        restore = None
        clear = False
        if update and cfg.host_cache_tokens > 0:
            host = self._saved_to(host, ctx)
            share = _common(ctx.tokens, prompt)
            keep = Fraction(share, len(ctx.tokens)) if ctx.tokens else Fraction(-1)
            base = share
            for e in host:
                lcp = _common(e.tokens, prompt)
                if 4 * lcp < len(e.tokens):
                    continue
                # Reading: the fractions are compared exactly
                if Fraction(lcp, len(e.tokens)) > keep and lcp > share:
                    restore, keep, share = e, Fraction(lcp, len(e.tokens)), lcp
            if restore is not None:
                ctx = restore
            elif base / p < cfg.prompt_similarity:
                clear = True
                ctx = _Context([], [])
        lcp = _common(ctx.tokens, prompt)
        if cfg.checkpoints:
            cached = 0
            for c in reversed(ctx.checkpoints):
                if c - 1 <= lcp:
                    cached = min(lcp, max(1, c - 1))
                    break
            # the checkpoints past the restored position go, then the cap at P - 1
            points = [c for c in ctx.checkpoints if c - 1 <= cached]
            cached = min(cached, p - 1)
            taken = ([cached] if cached > 0 else []) + [p - b for b in sorted(self.s.prefill_breaks, reverse=True) if p - b > cached]
            for c in taken:
                if c in points:
                    points.remove(c)
                points.append(c)
            points = points[-cfg.max_checkpoints:]
        else:
            cached = min(lcp, p - 1)
            points = []
        return {"slot": chosen, "host": host, "restore": restore, "clear": clear, "cached": cached, "checkpoints": points}

    def _take_slot(self, h: _Live, choice: dict[str, Any]) -> None:
        """Give *h* the slot *choice* chose: save, restore, and save the other idle slots."""
        self.host = choice["host"]
        if choice["restore"] is not None:
            self.host = [e for e in self.host if e is not choice["restore"]]
        slot = choice["slot"]
        slot.busy = True
        h.slot = slot
        h.slot_checkpoints = choice["checkpoints"]
        if self.s.slot_cache.cache_idle_slots:
            for sl in self.slots:
                if not sl.busy:
                    self.host = self._saved_to(self.host, sl.context)

    def _complete(self, r: _Live, end_s: float) -> None:
        self.running.remove(r)
        # With a reusable tail k, past the first max(P - k, S) tokens the blocks this request
        # computed were not cached while it ran: now they are, each under an identity nobody
        # else can have (they keep their place in the free queue but can no longer be found).
        self._register_rest(r, findable=False)
        self.pool.release(r.table)
        if r.slot is not None:
            # the slot keeps the request's computed tokens (prompt and output but the last)
            r.slot.context = _Context(_tokens(r.segments, r.computed), r.slot_checkpoints)
            r.slot.busy = False
            r.slot.released = (end_s, r.slot.number)
        r.completed = True
        r.completion_s = end_s + r.inp.output_tokens * self.lat.alpha2_s

    # --- one step ---------------------------------------------------------------------------
    def _plan(self, T: float) -> tuple[list[_Live], list[_Live], bool]:
        """Plan the step starting at *T*: (decoders that run, requests with a chunk, preempted?)."""
        s, pool = self.s, self.pool
        running = self.running
        decoding = [r for r in running if r.decoding]
        budget = s.max_num_batched_tokens - len(decoding)
        # 2. chunks, in key order; the first request that gets nothing ends the handing out
        chunked: list[_Live] = []
        for r in running:
            if r.decoding:
                continue
            c = self._chunk(r.target - r.computed, budget)
            if c == 0:
                break
            r.chunk = c
            budget -= c
            chunked.append(r)
        # 3. KV need
        need = {}
        for r in decoding:
            need[r] = 1 if r.computed % self.bs == 0 else 0
        for r in chunked:
            need[r] = self._blocks(r.computed + r.chunk) - self._blocks(r.computed)
        preempted = False
        if sum(need.values()) <= pool.free():
            for r in running:
                if r in need:
                    pool.allocate(r.table, need[r])
            # the blocks this step fills are cached as it is scheduled (after all of the
            # running requests' blocks were allocated), in key order
            for r in running:
                if r in need:
                    self._register(r, r.computed, r.computed + (1 if r.decoding else r.chunk))
            runs_decode = decoding
        else:
            # 4. the walk
            for r in chunked:
                r.chunk = 0
            chunked = []
            runs_decode = []
            walk_budget = s.max_num_batched_tokens - len(decoding)
            i = 0
            while i < len(running):
                r = running[i]
                if r.decoding:
                    c = 0
                    n = 1 if r.computed % self.bs == 0 else 0
                else:
                    # Reading: "a prefilling request whose chunk is 0 is skipped", taken
                    # literally: the walk goes on to the next request. (Stopping instead
                    # gives the same steps: a chunk is 0 only when the budget is spent, and
                    # without chunking a running request never waits for its prefill.)
                    c = self._chunk(r.target - r.computed, walk_budget)
                    if c == 0:
                        i += 1
                        continue
                    n = self._blocks(r.computed + c) - self._blocks(r.computed)
                gone = False
                while n > pool.free():
                    victim = running[-1]
                    self._preempt(victim, T)
                    preempted = True
                    if victim is r:
                        gone = True
                        break
                if gone:
                    break
                pool.allocate(r.table, n)
                self._register(r, r.computed, r.computed + (1 if r.decoding else c))
                if r.decoding:
                    runs_decode.append(r)
                else:
                    r.chunk = c
                    walk_budget -= c
                    chunked.append(r)
                i += 1
        # 5. admission, only in a step that preempted nobody
        if not preempted:
            while self.waiting and budget > 0 and len(running) < s.max_num_seqs:
                h = min(self.waiting, key=lambda w: w.sort_key)
                found = self._lookup(h)
                cached = len(found) * self.bs
                choice = None
                if self.slot_mode:
                    choice = self._choose_slot(h)
                    cached = choice["cached"]
                start = cached if h.swapped is None else max(cached, h.swapped)
                c = self._chunk(h.target - start, budget)
                if c == 0:
                    break
                # Reading: the blocks the swapped-in tokens occupy are counted with the
                # chunk's (they must be allocated too); without swap this is the chunk's need.
                new_blocks = self._blocks(start + c) - len(found)
                pin_unreferenced = sum(1 for blk in found if blk.refs == 0)
                if new_blocks + pin_unreferenced > pool.free():
                    break
                self.waiting.remove(h)
                if found:
                    self.step_restores += 1
                if choice is not None:
                    self._take_slot(h, choice)
                    if choice["restore"] is not None:
                        self.step_restores += 1
                pool.pin(h.table, found)
                pool.allocate(h.table, new_blocks)
                if h.swapped is not None:
                    self.step_swap_tokens += max(h.swapped - cached, 0)
                    self.swap_used -= self._blocks(h.swapped)
                    h.swapped = None
                h.computed = cached
                h.incoming = start - cached
                h.chunk = c
                # its blocks filled by swapped-in tokens and by its chunk are cached now
                self._register(h, cached, start + c)
                budget -= c
                if not h.admitted:
                    h.admitted = True
                    h.first_scheduled_s = T
                    h.entity.first_scheduled_s = T
                    h.cached_tokens = cached
                bisect.insort(running, h, key=lambda w: w.sort_key)
                chunked.append(h)
        # chunks stay in hand-out order: running requests in key order, then admissions
        return runs_decode, chunked, preempted

    def _end_step(self, end_s: float, decoders: list[_Live], chunked: list[_Live]) -> bool:
        """End the step at *end_s*; True if the batch composition changed."""
        alpha2 = self.lat.alpha2_s
        changed = False
        # 1. decoders
        for r in decoders:
            # (a block its token fills was registered when the step was scheduled)
            r.computed += 1
            r.emitted += 1
            r.entity.generated_tokens = r.emitted
        for r in decoders:
            if r.emitted == r.inp.output_tokens:
                self._complete(r, end_s)
                changed = True
        # 2. chunks in hand-out order, each request in turn
        for r in chunked:
            r.computed += r.incoming + r.chunk
            r.incoming = 0
            r.chunk = 0
            if r.computed == r.target:
                r.emitted += 1
                r.entity.generated_tokens = r.emitted
                r.decoding = True
                changed = True
                if r.emitted == 1:
                    r.first_token_s = end_s + 1 * alpha2
                    r.entity.first_token_s = r.first_token_s
                if r.emitted == r.inp.output_tokens:
                    self._complete(r, end_s)
        return changed

    # --- the run ------------------------------------------------------------------------------
    def _step_duration(self, prefill_tokens: int, decode_tokens: int) -> float:
        """The step's time: one latency-model call, or with ``ubatch_tokens`` one per forward
        pass, the step's tokens laid out decode tokens first and cut every ``ubatch_tokens``."""
        u = self.s.ubatch_tokens
        if u is None or prefill_tokens + decode_tokens <= u:
            return self.lat.step_s(prefill_tokens, decode_tokens)
        layout = ["decode"] * decode_tokens + ["prefill"] * prefill_tokens
        total = 0.0
        for start in range(0, len(layout), u):
            piece = layout[start : start + u]
            total += self.lat.step_s(piece.count("prefill"), piece.count("decode"))
        return total

    def run(self, requests: Sequence[RequestInput]) -> ReplicaOutcome:
        s, out, until = self.s, self.out, self.until_s
        lives: list[_Live] = []
        arrivals: list[tuple[float, int, _Live]] = []
        for inp in sorted(requests, key=lambda q: q.request_id):
            if inp.prompt_tokens + inp.output_tokens > s.model_len_limit:
                out.requests[inp.request_id] = RequestOutcome(request_id=inp.request_id, status="dropped")
                continue
            entity = Request(
                id=inp.request_id,
                client_id=inp.client_id,
                prompt_tokens=inp.prompt_tokens,
                output_tokens=inp.output_tokens,
                arrival_s=inp.arrival_s,
                tenant_id=inp.tenant_id or inp.client_id,
                slo_class=inp.slo_class,
                priority=inp.priority,
                session_id=inp.session_id,
                round_index=inp.round_index,
                prefix_group=inp.prefix_group,
                prefix_tokens=inp.prefix_tokens,
                replica=self.replica,
            )
            r = _Live(inp, entity)
            lives.append(r)
            arrivals.append((inp.arrival_s + self.lat.queueing_s(inp.prompt_tokens), inp.request_id, r))
        # entries at the same time in request-id order
        arrivals.sort(key=lambda a: (a[0], a[1]))
        next_arrival = 0
        seq = 0

        def enter_until(t: float) -> None:
            nonlocal next_arrival, seq
            while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= t:
                enq, _, r = arrivals[next_arrival]
                next_arrival += 1
                r.enqueue_s = enq
                r.entity.enqueue_s = enq
                r.seq = seq
                seq += 1
                self._enter_waiting(r, enq)

        last_end = NAN
        last_end_ns = 0
        idle = True
        prev_d_ns = -1
        changed_before = False
        seg_start_ns = 0
        seg_start = NAN
        seg_k = 0
        while True:
            if idle:
                if next_arrival == len(arrivals):
                    break
                T = arrivals[next_arrival][0]
            else:
                T = last_end
            if until is not None and T >= until:
                break
            enter_until(T)
            self.step_swap_tokens = 0
            self.step_restores = 0
            decoders, chunked, preempted = self._plan(T)
            if not decoders and not chunked and not preempted:
                raise ReferenceStuck(f"replica {self.replica}: nothing can run at {T!r} while requests wait")
            d = self._step_duration(sum(r.chunk for r in chunked), len(decoders))
            if self.step_swap_tokens:
                # the step lasts the copy time of all the tokens it copies longer
                d = d + s.swap_s(self.step_swap_tokens)
            if self.step_restores:
                # each request admitted onto a cached prefix costs the model's restore time
                d = d + self.step_restores * self.lat.cache_restore_s
            # the clock counts whole nanoseconds: the duration rounded to the nearest (at
            # least 1 for a positive one), a segment's start after idle rounded likewise;
            # steps that take no time end where they start
            d_ns = round(d * NS)
            if d_ns == 0 and d > 0:
                d_ns = 1
            if idle or chunked or preempted or d_ns != prev_d_ns or changed_before:
                seg_start_ns = round(T * NS) if idle else last_end_ns
                seg_start = T
                seg_k = 1
            else:
                seg_k += 1
            end_ns = seg_start_ns + seg_k * d_ns
            end = end_ns / NS if d_ns else seg_start
            if self.trace is not None:
                self.trace.append({
                    "start_s": T,
                    "end_s": end,
                    "segment_step": seg_k,
                    "decode": [r.inp.request_id for r in decoders],
                    "chunks": {r.inp.request_id: r.chunk + r.incoming for r in chunked},
                    "preempted": [p[0] for p in out.preemptions if p[2] == T],
                    "waiting": sorted(r.inp.request_id for r in self.waiting),
                    "free_blocks": self.pool.free(),
                    "swap_tokens": self.step_swap_tokens,
                })
            if until is not None and end >= until:
                break
            out.steps += 1
            out.busy_s += d_ns / NS
            changed_before = self._end_step(end, decoders, chunked)
            prev_d_ns = d_ns
            last_end = end
            last_end_ns = end_ns
            idle = not self.running and not self.waiting and not (
                next_arrival < len(arrivals) and arrivals[next_arrival][0] <= end
            )
        # requests that entered the queue before the run stopped but after the last plan
        while next_arrival < len(arrivals) and (until is None or arrivals[next_arrival][0] < until):
            enq, _, r = arrivals[next_arrival]
            next_arrival += 1
            r.enqueue_s = enq
        for r in lives:
            # A client-side time at or after the cut (tokens post-processed after it) has not
            # happened: no first token, and a request whose answer comes after it is in flight.
            seen_first = r.first_token_s if until is None or r.first_token_s < until else NAN
            done = r.completed and (until is None or r.completion_s < until)
            out.requests[r.inp.request_id] = RequestOutcome(
                request_id=r.inp.request_id,
                status="completed" if done else "in_flight",
                enqueue_s=r.enqueue_s,
                first_scheduled_s=r.first_scheduled_s,
                first_token_s=seen_first,
                completion_s=r.completion_s if done else NAN,
                generated_tokens=r.emitted,
                num_preemptions=len(r.preemptions),
                cached_tokens=r.cached_tokens,
            )
        return out


def simulate_replica(
    requests: Sequence[RequestInput],
    settings: EngineSettings,
    latency: LinearLatency,
    policy: SchedulerPolicy | None = None,
    *,
    replica: int = 0,
    until_s: float | None = None,
    trace: list[dict[str, Any]] | None = None,
) -> ReplicaOutcome:
    """Run *requests* (all routed to this replica) through one replica.

    Parameters
    ----------
    requests
        The requests, each reaching the replica at its ``arrival_s``.
    settings, latency
        Engine settings and latency model.
    policy
        Scheduler policy (its ``key(request, now_s)``); default FCFS.
    replica
        Index reported in the preemption rows.
    until_s
        Stop the run at this time (``simulation.until_s``).
    trace
        If given, one dict per planned step is appended (start, end, who decodes, the
        chunks with swapped-in tokens, who was preempted, who waits, free blocks after
        the plan), for reading a disagreement step by step.
    """
    return _Replica(settings, latency, policy or Fcfs(), replica, until_s, trace).run(requests)


def simulate(
    requests_by_replica: Mapping[int, Sequence[RequestInput]],
    settings: EngineSettings,
    latency: LinearLatency,
    policy: SchedulerPolicy | None = None,
    *,
    num_replicas: int,
    until_s: float | None = None,
) -> list[ReplicaOutcome]:
    """Every replica, each on its own requests (replicas do not interact)."""
    return [
        simulate_replica(requests_by_replica.get(i, ()), settings, latency, policy, replica=i, until_s=until_s)
        for i in range(num_replicas)
    ]


# --- from a scenario and its records ---------------------------------------------------------


def engine_settings(engine: Mapping[str, Any]) -> EngineSettings:
    """:class:`EngineSettings` from a scenario's ``serving.engine`` mapping (keys it does not
    give take the documented defaults)."""
    known = {f for f in EngineSettings.__dataclass_fields__}
    fields = {k: v for k, v in engine.items() if k in known}
    if fields.get("slot_cache") is not None:
        fields["slot_cache"] = SlotSettings(**fields["slot_cache"])
    return EngineSettings(**fields)


def linear_latency(params: Mapping[str, Any]) -> LinearLatency:
    """:class:`LinearLatency` from explicit ``blis_linear`` coefficients."""
    names = ("beta0_us", "beta1_us", "beta2_us", "alpha0_us", "alpha1_us", "alpha2_us", "cache_restore_us")
    extra = sorted(set(params) - set(names))
    if extra:
        raise ValueError(f"the reference needs explicit coefficients only; got {extra}")
    return LinearLatency(**{k: float(v) for k, v in params.items()})


def request_segments(
    request_id: int,
    prompt_tokens: int,
    output_tokens: int,
    *,
    context: tuple[Segment, ...] = (),
    prefix_hashes: Sequence[int] = (),
    prefix_block_tokens: int = 16,
    prefix_tokens: int = 0,
) -> tuple[Segment, ...]:
    """A request's segments: its context (a previous round's whole sequence) or else its
    shared prefix, then one unique prompt segment and one unique output segment."""
    segs: list[Segment] = []
    if context:
        segs.extend(context)
    else:
        limit = min(prefix_tokens, prompt_tokens)
        for i, h in enumerate(prefix_hashes):
            n = min(prefix_block_tokens, limit - i * prefix_block_tokens)
            if n <= 0:
                break
            segs.append((("prefix", h), n))
    head = sum(n for _, n in segs)
    if head > prompt_tokens:
        raise ValueError(f"request {request_id}: context of {head} tokens exceeds its prompt of {prompt_tokens}")
    if prompt_tokens - head:
        segs.append((("prompt", request_id), prompt_tokens - head))
    segs.append((("output", request_id), output_tokens))
    return tuple(segs)


def requests_from_records(frame: Any, scenario: Mapping[str, Any]) -> dict[int, list[RequestInput]]:
    """Per replica, the requests a run routed there, with their segments.

    *frame* is ``Results.to_dataframe()`` (only its input columns are read: ids, client,
    lengths, arrival, replica, session and prefix fields); *scenario* the scenario as plain
    data (for the workload seed of the prefix hashes and each client's context growth).
    """
    from simpy_llm.workload.prefix import PREFIX_BLOCK_TOKENS, prefix_blocks

    wl = scenario["workload"]
    seed = wl.get("seed")
    if seed is None:
        seed = scenario.get("seed", 0)
    growth = {}
    for c in wl.get("clients", ()):
        mt = c.get("multi_turn")
        growth[c["id"]] = "accumulate" if mt is None else mt.get("context_growth", "accumulate")
    rows = frame.sort_values("request_id").to_dict("records")
    by_session = {(r["session_id"], int(r["round_index"])): r for r in rows if r["session_id"]}
    seg_of: dict[int, tuple[Segment, ...]] = {}
    out: dict[int, list[RequestInput]] = {}
    for r in rows:
        rid = int(r["request_id"])
        p, o = int(r["prompt_tokens"]), int(r["output_tokens"])
        context: tuple[Segment, ...] = ()
        if r["session_id"] and int(r["round_index"]) > 0 and growth.get(r["client_id"], "accumulate") == "accumulate":
            prev = by_session[(r["session_id"], int(r["round_index"]) - 1)]
            context = seg_of[int(prev["request_id"])]
        group, ptoks = str(r["prefix_group"]), int(r["prefix_tokens"])
        hashes = prefix_blocks(seed, group, ptoks) if group and ptoks else ()
        segs = request_segments(
            rid, p, o, context=context, prefix_hashes=hashes, prefix_block_tokens=PREFIX_BLOCK_TOKENS, prefix_tokens=ptoks
        )
        seg_of[rid] = segs
        inp = RequestInput(
            request_id=rid,
            arrival_s=float(r["arrival_s"]),
            prompt_tokens=p,
            output_tokens=o,
            segments=segs,
            client_id=str(r["client_id"]),
            tenant_id=str(r["tenant_id"]),
            slo_class=str(r["slo_class"]),
            priority=int(r["priority"]),
            session_id=str(r["session_id"]),
            round_index=int(r["round_index"]),
            prefix_group=group,
            prefix_tokens=ptoks,
        )
        out.setdefault(int(r["replica"]), []).append(inp)
    return out
