"""llama.cpp's prompt cache as its server keeps it: one context per slot, and a host-memory
cache of whole contexts.

The rules are those of ``docs/model.md`` ("The prompt cache, slot by slot"), read from
llama.cpp's server (``get_available_slot``, ``server_prompt_cache``, its context
checkpoints) and checked against its logs:

* each slot keeps the context of the last request it ran (its prompt and output, less the
  last output token, whose KV is never computed) and, for a checkpointed model, the
  checkpoints taken while computing it and the prompts before it;
* a request goes to the idle slot whose context shares the largest part of its prompt, if
  that part exceeds ``prompt_similarity`` (ties: the lowest slot number), else to the least
  recently used idle slot (ties: the highest number). Slots released in the same step count
  as released in slot order: the server walks its slots in order after each step, and each
  that finishes takes the time then (:data:`NEVER_USED`);
* when the context in the chosen slot would mostly be lost (it was chosen as least
  recently used, or less than half of it is shared), it is saved to the host cache, and a
  saved context that keeps more of itself and shares more of the prompt is restored into
  the slot instead (the latency model's ``cache_restore_us``);
* with ``cache_idle_slots`` every other idle slot's context is saved too when a request
  starts;
* the request finds cached what its slot's context shares with its prompt; for a
  checkpointed model only up to the newest checkpoint inside that common prefix (one token
  before the checkpoint: llama.cpp computes at least that one again).

Contents are lists of ``(segment id, tokens)`` (:func:`~simpy_llm.workload.prefix.content_segments`),
compared segment by segment, so every operation costs O(segments), not O(tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simpy_llm.workload.prefix import Segment, content_segments

if TYPE_CHECKING:
    from simpy_llm.config.schema import SlotCacheConfig
    from simpy_llm.entities import Request

__all__ = ["NEVER_USED", "SlotCache", "SlotContext", "SlotIds", "SlotPlan", "common_prefix_tokens", "cut_segments"]

NEVER_USED: tuple[float, int] = (-1.0, 0)
"""A slot's last release before it was ever used. A release at time ``t`` of slot ``i`` is
``(t, i)``: compared as tuples, the least recently used slot comes first and, among those
released in the same step, the lowest number, as llama.cpp's server releases them (it walks
its slots in order after each step, each taking ``ggml_time_us()`` as it ends); among the
never used, all equal, llama.cpp's ``<=`` picks the highest number."""


def common_prefix_tokens(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Tokens from the start on which two contents agree: the same segment id at the same
    position (``docs/model.md``, "Requests and their content").

    >>> common_prefix_tokens([(7, 120), (-2, 50)], [(7, 120), (-4, 30)])
    120
    >>> common_prefix_tokens([(7, 100), (-2, 50)], [(7, 120)])     # a shorter run of one stream
    100
    >>> common_prefix_tokens([(7, 10), (8, 10)], [(7, 10), (8, 4), (9, 6)]), common_prefix_tokens([], [(7, 3)])
    (14, 0)
    """
    i = j = 0
    a_start = b_start = 0
    pos = 0
    while i < len(a) and j < len(b):
        a_id, a_n = a[i]
        b_id, b_n = b[j]
        if a_id != b_id or a_start != b_start:  # another stream, or the same one at another offset
            break
        a_end = a_start + a_n
        b_end = b_start + b_n
        pos = min(a_end, b_end)
        if a_end == pos:
            i += 1
            a_start = a_end
        if b_end == pos:
            j += 1
            b_start = b_end
    return pos


def _head(segments: Sequence[Segment]) -> tuple[int | None, int, int | None]:
    """A content's first segment id and length and its second segment id (None where there is
    none). Two contents with the same first id whose heads differ otherwise, each with two
    segments or more, share exactly the shorter first segment, which is shorter than either:
    the host cache settles most comparisons from the heads alone.

    >>> _head([(7, 120), (-2, 50), (-1, 9)]), _head([(7, 3)]), _head([])
    ((7, 120, -2), (7, 3, None), (None, 0, None))
    """
    if not segments:
        return (None, 0, None)
    return (segments[0][0], segments[0][1], segments[1][0] if len(segments) > 1 else None)


def cut_segments(segments: Sequence[Segment], tokens: int) -> tuple[Segment, ...]:
    """The first *tokens* tokens of *segments*.

    >>> cut_segments([(7, 120), (-2, 50), (-1, 9)], 125)
    ((7, 120), (-2, 5))
    """
    out: list[Segment] = []
    left = tokens
    for seg_id, n in segments:
        if left <= 0:
            break
        take = min(n, left)
        out.append((seg_id, take))
        left -= take
    return tuple(out)


class SlotContext:
    """A context a slot holds or the host cache saved: its tokens and its checkpoints.

    ``checkpoints`` are token counts, in the order they were taken: restoring checkpoint
    ``c`` gives back the context's first ``c - 1`` tokens (``c`` for ``c = 1``).
    """

    __slots__ = ("checkpoints", "head", "segments", "seq", "tokens")

    def __init__(self, segments: tuple[Segment, ...] = (), tokens: int = 0, checkpoints: tuple[int, ...] = ()) -> None:
        self.segments = segments
        self.tokens = tokens
        self.checkpoints = checkpoints
        self.head = _head(segments)
        """``(first segment id, its tokens, second segment id)``: two contents whose heads
        differ in the second id share at most their first segment (:func:`_head`)."""
        self.seq = -1
        """When it was saved to the host cache (its order there)."""

    def __repr__(self) -> str:
        return f"SlotContext(tokens={self.tokens}, checkpoints={self.checkpoints})"


EMPTY = SlotContext()


class _Slot:
    __slots__ = ("busy", "context", "index", "last_used")

    def __init__(self, index: int) -> None:
        self.index = index
        self.context = EMPTY
        self.busy = False
        self.last_used = NEVER_USED
        """When it was last released, and its number, as llama.cpp's ``t_last_used`` (:data:`NEVER_USED`)."""


class _Save:
    """Saving *context* to the host cache: the saved contexts it contains go (*dropped*), then
    the oldest ones until it fits (*evicted*), and it is appended."""

    __slots__ = ("context", "dropped", "evicted")

    def __init__(self, context: SlotContext, dropped: list[SlotContext], evicted: list[SlotContext]) -> None:
        self.context = context
        self.dropped = dropped
        self.evicted = evicted


class SlotPlan:
    """What admitting a request would do (:meth:`SlotCache.plan`); :meth:`SlotCache.admit`
    carries it out."""

    __slots__ = ("by_similarity", "cached", "checkpoints", "clear", "restore", "save", "slot", "update")

    def __init__(self, slot: _Slot, by_similarity: bool, update: bool) -> None:
        self.slot = slot
        """The slot chosen."""
        self.by_similarity = by_similarity
        """Chosen for the prompt it shares (else: least recently used)."""
        self.update = update
        """The slot's context is saved to the host cache and a better one looked for."""
        self.save: _Save | None = None
        """Saving the slot's context (None: nothing to save, or nothing changes)."""
        self.restore: SlotContext | None = None
        """The saved context restored into the slot (None: none)."""
        self.clear = False
        """The slot's context is dropped (nothing saved is better and it shares too little)."""
        self.cached = 0
        """Prompt tokens the request finds cached."""
        self.checkpoints: tuple[int, ...] = ()
        """The slot's checkpoints once the request's prompt is computed."""

    @property
    def restored(self) -> bool:
        """A context was restored from the host cache (a ``cache_restore_us`` is paid)."""
        return self.restore is not None


class SlotCache:
    """The slots of one llama.cpp server and its host-memory prompt cache.

    Parameters
    ----------
    slots
        Slots (``n_parallel``: ``EngineConfig.max_num_seqs``).
    config
        The :class:`~simpy_llm.config.schema.SlotCacheConfig`.
    breaks
        Where a prompt's computation stops before its end (``EngineConfig.prefill_breaks``,
        tokens counted back from the end): a checkpointed model takes a checkpoint there.

    Examples
    --------
    One slot, no host cache, a conversation opening with a 120-token system prompt: a second
    conversation with that system prompt would find nothing (the slot's only checkpoint lies
    past the common prefix); the first one's next round finds its prompt less 5 tokens.

    >>> from simpy_llm.config.schema import SlotCacheConfig
    >>> from simpy_llm.entities import Request
    >>> cache = SlotCache(1, SlotCacheConfig(host_cache_tokens=0, cache_idle_slots=False), breaks=(516, 4))
    >>> def req(i, prompt, output=20, **kw):
    ...     return Request(id=i, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0, **kw)
    >>> a = req(0, 300, prefix_group="sys", prefix_tokens=120, prefix_blocks=(7,))
    >>> plan = cache.plan(a); plan.cached, plan.checkpoints
    (0, (296,))
    >>> cache.admit(a, plan); cache.release(a, 319, at=1.0)
    >>> b = req(1, 200, prefix_group="sys", prefix_tokens=120, prefix_blocks=(7,))
    >>> cache.plan(b).cached                                   # shares 120 tokens, no checkpoint in them
    0
    >>> a2 = req(2, 400, context=tuple(content_segments(a)))
    >>> cache.plan(a2).cached                                  # a's prompt less 5 tokens
    295
    """

    def __init__(self, slots: int, config: SlotCacheConfig, breaks: tuple[int, ...] = ()) -> None:
        self.config = config
        self.slots = [_Slot(i) for i in range(slots)]
        self.breaks = tuple(sorted(breaks, reverse=True)) if config.checkpoints else ()
        self._host: dict[SlotContext, None] = {}
        """The host-memory cache, oldest first (an ordered set)."""
        self._by_first: dict[int | None, dict[SlotContext, None]] = {}
        """The saved contexts by first segment id, oldest first: only those can share anything
        with a content starting with that segment."""
        self._by_head: dict[tuple[int | None, int, int | None], dict[SlotContext, None]] = {}
        """The saved contexts with two segments or more by head (:func:`_head`), oldest first."""
        self._seq = 0
        self.host_tokens = 0
        """Tokens of the contexts in the host cache."""
        self._running: dict[int, tuple[_Slot, tuple[int, ...]]] = {}
        """Request id -> its slot and the checkpoints it leaves there when it ends."""
        self.restores = 0
        """Contexts restored from the host cache so far."""
        self.saves = 0
        """Contexts saved to the host cache so far."""

    # --- the host cache ------------------------------------------------------------------
    @property
    def host(self) -> list[SlotContext]:
        """The host-memory cache, oldest first."""
        return list(self._host)

    def _sharing(self, head: tuple[int | None, int, int | None]) -> list[SlotContext]:
        """The saved contexts whose common prefix with a content of *head* is not settled by
        the heads alone (:func:`_head`), oldest first: those starting like it, and those of a
        single segment with its first id (every one with its first id if it has one segment)."""
        first = self._by_first.get(head[0])
        if not first:
            return []
        if head[2] is None:
            return list(first)
        same = list(self._by_head.get(head, ()))
        odd = [e for e in first if e.head[2] is None]
        if odd:
            same = sorted(same + odd, key=lambda e: e.seq)
        return same

    def _save_of(self, ctx: SlotContext) -> _Save | None:
        """What saving *ctx* would do (None: nothing): it is empty, larger than the cache, or
        contained in a saved context (their common prefix is the whole of it); otherwise the
        saved contexts it contains go, then the oldest until it fits, and it joins the end."""
        limit = self.config.host_cache_tokens
        n = ctx.tokens
        if n == 0 or n > limit or ctx in self._host:
            return None
        segs = ctx.segments
        dropped = []
        for e in self._sharing(ctx.head):  # a context with another head neither contains nor is contained in it
            common = common_prefix_tokens(e.segments, segs)
            if common >= n:
                return None
            if common >= e.tokens:
                dropped.append(e)
        total = self.host_tokens - sum(e.tokens for e in dropped)
        evicted = []
        if total + n > limit:
            gone = set(dropped)
            for e in self._host:
                if total + n <= limit:
                    break
                if e not in gone:
                    evicted.append(e)
                    total -= e.tokens
        return _Save(ctx, dropped, evicted)

    def _apply(self, save: _Save | None) -> None:
        if save is None:
            return
        for e in (*save.dropped, *save.evicted):
            self._remove(e)
        ctx = save.context
        ctx.seq = self._seq
        self._seq += 1
        self._host[ctx] = None
        self._by_first.setdefault(ctx.head[0], {})[ctx] = None
        if ctx.head[2] is not None:
            self._by_head.setdefault(ctx.head, {})[ctx] = None
        self.host_tokens += ctx.tokens
        self.saves += 1

    def _remove(self, ctx: SlotContext) -> None:
        del self._host[ctx]
        del self._by_first[ctx.head[0]][ctx]
        if ctx.head[2] is not None:
            del self._by_head[ctx.head][ctx]
        self.host_tokens -= ctx.tokens

    # --- admission -----------------------------------------------------------------------
    def plan(self, req: Request) -> SlotPlan | None:
        """What admitting *req* now would do (no side effects); None if no slot is idle."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        cfg = self.config
        p = req.prompt_tokens
        prompt = cut_segments(content_segments(req), p)
        chosen = None
        if cfg.prompt_similarity > 0.0:
            best = 0
            for s in idle:  # llama.cpp's LCP similarity: a strictly larger share, lowest slot first
                if s.context.tokens == 0:
                    continue
                lcp = common_prefix_tokens(s.context.segments, prompt)
                if lcp > best and lcp / p > cfg.prompt_similarity:
                    best = lcp
                    chosen = s
        if chosen is not None:
            # f_keep < 0.5: most of its context would go
            plan = SlotPlan(chosen, by_similarity=True, update=2 * best < chosen.context.tokens)
        else:
            chosen = idle[0]
            for s in idle:  # least recently used; ties to the highest number, as llama.cpp's `<=`
                if s.last_used <= chosen.last_used:
                    chosen = s
            plan = SlotPlan(chosen, by_similarity=False, update=True)
        ctx = chosen.context
        if plan.update and cfg.host_cache_tokens > 0:
            plan.save = self._save_of(ctx)
            ctx = self._load(plan, ctx, prompt, p)
        lcp = common_prefix_tokens(ctx.segments, prompt) if ctx.tokens else 0
        if self.config.checkpoints:
            cached = 0
            for c in reversed(ctx.checkpoints):  # the newest checkpoint inside the common prefix
                if c - 1 <= lcp:
                    cached = min(lcp, max(1, c - 1))
                    break
            # a checkpoint past the restored position is invalid from now on
            kept = [c for c in ctx.checkpoints if c - 1 <= cached]
            if cached >= p:  # at least one prompt token is computed (for its logits)
                cached = p - 1
            plan.cached = cached
            plan.checkpoints = self._taken(kept, cached, p)
        else:
            plan.cached = min(lcp, p - 1)
        return plan

    def _load(self, plan: SlotPlan, ctx: SlotContext, prompt: tuple[Segment, ...], p: int) -> SlotContext:
        """The context the slot holds after looking for a better one in the host cache (once
        ``plan.save`` is done): walking the saved contexts oldest first, one keeping at least
        a quarter of itself that keeps a larger fraction of itself and shares more of the
        prompt than the best so far (at first the slot's own); the last one found is
        restored. Without one: the slot's, or nothing when that shares less than
        ``prompt_similarity`` of the prompt.

        Only contexts that can share more than the slot's are walked: with the slot already
        sharing the prompt's first segment, those starting like the prompt (any other shares
        at most that segment, :func:`_head`); else those with the prompt's first segment
        (any other shares nothing). The slot's own context, saved just before, is never
        better than itself, and a saved context it contains shares no more than it does.
        """
        base = common_prefix_tokens(ctx.segments, prompt) if ctx.tokens else 0
        keep_n, keep_d = (base, ctx.tokens) if ctx.tokens else (-1, 1)  # an empty slot: any context wins
        best = None
        head = _head(prompt)
        p0, p1, p2 = head
        gone = {*plan.save.dropped, *plan.save.evicted} if plan.save is not None else set()
        walk = self._sharing(head) if p2 is not None and base >= p1 else list(self._by_first.get(p0, ()))
        for e in walk:
            if e in gone:
                continue
            _, e1, e2 = e.head  # the first id is the prompt's (see walk)
            if e2 is None or p2 is None or (e1 == p1 and e2 == p2):
                lcp = common_prefix_tokens(e.segments, prompt)
            else:  # different heads: the shorter first segment only (see _head)
                lcp = min(e1, p1)
            if 4 * lcp < e.tokens:  # would keep less than a quarter of itself
                continue
            if keep_n * e.tokens < lcp * keep_d and base < lcp:
                keep_n, keep_d, base, best = lcp, e.tokens, lcp, e
        if best is not None:
            plan.restore = best
            return best
        if base / p < self.config.prompt_similarity:
            plan.clear = True
            return EMPTY
        return ctx

    def _taken(self, kept: list[int], cached: int, p: int) -> tuple[int, ...]:
        """The checkpoints after computing a prompt of *p* tokens from *cached*: one where
        the computation starts (if anything is cached) and one at each break, newest last; a
        checkpoint at a token count already taken replaces it; at most ``max_checkpoints``
        (the oldest go)."""
        out = list(kept)
        new = [cached] if cached > 0 else []
        new += [p - b for b in self.breaks if p - b > cached]
        for c in new:
            if c in out:
                out.remove(c)
            out.append(c)
        limit = self.config.max_checkpoints
        return tuple(out[-limit:]) if len(out) > limit else tuple(out)

    def admit(self, req: Request, plan: SlotPlan) -> None:
        """Give *req* the slot *plan* (from :meth:`plan`, on the same state) chose."""
        slot = plan.slot
        self._apply(plan.save)
        if plan.restore is not None:
            self._remove(plan.restore)
            self.restores += 1
        slot.busy = True
        if self.config.cache_idle_slots:
            for s in self.slots:
                if not s.busy:
                    self._apply(self._save_of(s.context))
        slot.context = EMPTY  # it holds the running request's tokens, which nobody can look up
        self._running[req.id] = (slot, plan.checkpoints)

    def release(self, req: Request, tokens: int, at: float) -> None:
        """*req* left its slot at time *at* holding *tokens* tokens of its content."""
        slot, checkpoints = self._running.pop(req.id)
        slot.context = SlotContext(cut_segments(content_segments(req), tokens), tokens, checkpoints)
        slot.busy = False
        slot.last_used = (at, slot.index)

    def hit_tokens(self, req: Request) -> int:
        """Prompt tokens *req* would find cached if admitted now (0 while no slot is idle)."""
        plan = self.plan(req)
        return 0 if plan is None else plan.cached

    def slot_of(self, request_id: int) -> int:
        """The slot the running request *request_id* holds."""
        return self._running[request_id][0].index


class SlotIds:
    """Which slot each running request holds on a llama.cpp server whose prompt cache is not
    modelled (``cache_prompt`` off): a request takes the least recently used idle slot, ties
    to the highest number, as :class:`SlotCache` does when no slot's context is similar
    enough to the prompt (prompts that share nothing).

    Examples
    --------
    >>> ids = SlotIds(3)
    >>> [ids.take(i) for i in range(3)]          # a fresh server: highest number first
    [2, 1, 0]
    >>> ids.free(1, at=1.0); ids.free(0, at=2.0)  # slots 1, then 2 become idle
    >>> ids.take(3), ids.slot_of(2)              # the one idle longest
    (1, 0)
    >>> ids.free(3, at=3.0); ids.free(2, at=3.0)  # slots 1 and 0 in the same step
    >>> ids.take(4), ids.take(5), ids.take(6)    # slot 2, then those two in slot order
    (2, 0, 1)
    """

    __slots__ = ("_busy", "_last_used", "_of")

    def __init__(self, slots: int) -> None:
        self._last_used = [NEVER_USED] * slots
        self._busy = [False] * slots
        self._of: dict[int, int] = {}

    def take(self, request_id: int) -> int:
        """Give *request_id* the least recently used idle slot; return its number."""
        chosen = -1
        for i, busy in enumerate(self._busy):
            if not busy and (chosen < 0 or self._last_used[i] <= self._last_used[chosen]):
                chosen = i
        if chosen < 0:
            raise RuntimeError(f"request {request_id}: no idle slot (the engine admits at most one request per slot)")
        self._busy[chosen] = True
        self._of[request_id] = chosen
        return chosen

    def free(self, request_id: int, at: float) -> None:
        """*request_id* left its slot at time *at*."""
        slot = self._of.pop(request_id)
        self._busy[slot] = False
        self._last_used[slot] = (at, slot)

    def slot_of(self, request_id: int) -> int:
        """The slot the running request *request_id* holds."""
        return self._of[request_id]
