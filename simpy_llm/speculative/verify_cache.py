"""A verify server's KV with prefix caching (``speculation.verify.prefix_caching``).

The blocks are the engine's paged prefix cache
(:class:`~simpy_llm.serving.prefix_cache.PrefixCache`, ``docs/model.md`` "Free blocks,
prefix caching and eviction"); :class:`VerifyCache` is how a verify server admits a
request into it and releases it (``docs/speculative.md``, "Verify servers: prefix caching
and preemption"). A request reserves its whole KV when its prefill starts, as without the
cache (the blocks of its prompt and output less those it finds cached), so nothing runs
out while it runs; it gives them back, cached, when it leaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.serving.kv_cache import blocks_for
from simpy_llm.serving.prefix_cache import Holder, Match, PrefixCache

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = ["VerifyCache"]


class VerifyCache:
    """The prefix cache of a verify server, with its KV guard.

    Parameters
    ----------
    num_blocks
        Blocks on the server (its engine's ``kv_num_blocks``).
    block_size
        Tokens per block (its engine's ``kv_block_size``).
    share
        The KV guard: a request is admitted only while the blocks in use, plus those it
        takes (new, and found cached but evictable), stay within this share of the blocks
        (``max_kv_utilization``; 1 under ``kv_spill: fused``).

    Examples
    --------
    Two requests with the same 8-token system prompt (two blocks of 4): the second finds it.

    >>> from simpy_llm.entities import Request
    >>> kv = VerifyCache(num_blocks=16, block_size=4, share=1.0)
    >>> def req(i):
    ...     return Request(id=i, client_id="c", prompt_tokens=10, output_tokens=3, arrival_s=0.0,
    ...                    prefix_tokens=8, prefix_blocks=(5, 6), prefix_block_tokens=4)
    >>> a, b = req(0), req(1)
    >>> plan = kv.plan(a); plan[2]                  # blocks to take: ceil(13 / 4), nothing found
    4
    >>> kv.admit(a, plan)                           # cached prompt tokens
    0
    >>> kv.admit(b, kv.plan(b)), kv.cache.used_blocks   # b shares a's two prefix blocks
    (8, 6)
    >>> a.generated_tokens = b.generated_tokens = 3
    >>> kv.release(a); kv.release(b); kv.cache.used_blocks, kv.cache.free_blocks
    (0, 16)
    """

    __slots__ = ("cache", "holders", "limit")

    def __init__(self, num_blocks: int, block_size: int, share: float) -> None:
        self.cache = PrefixCache(num_blocks, block_size)
        self.limit = num_blocks * share
        """Most blocks in use after an admission."""
        self.holders: dict[int, Holder] = {}
        """What each admitted request holds in the cache, by id."""

    def plan(self, req: Request) -> tuple[Holder, Match, int] | None:
        """How *req* would be admitted now: its holder, the cached blocks its prompt finds (at
        most those wholly inside its first ``P - 1`` tokens, as the engine looks up: a prefill
        computes at least one token) and the blocks to take for the rest of its prompt and
        its output; None when the guard refuses it."""
        cache = self.cache
        bs = cache.block_size
        holder = cache.holder(req)
        match = cache.match(holder, (req.prompt_tokens - 1) // bs)
        new = blocks_for(req.prompt_tokens + req.output_tokens, bs) - match.blocks
        if cache.used_blocks + new + match.evictable > self.limit:
            return None
        return holder, match, new

    def admit(self, req: Request, plan: tuple[Holder, Match, int]) -> int:
        """Admit *req* as :meth:`plan` found it (on the same state): pin the blocks found, take
        the new ones, and register its shared blocks at once (as the engine does when it
        schedules a prefill), so a prompt admitted after it finds them too. Returns its
        cached prompt tokens."""
        holder, match, new = plan
        cache = self.cache
        cache.pin(holder, match)
        cache.allocate(new)
        cache.register_shared(holder, req.prompt_tokens)
        self.holders[req.id] = holder
        return match.blocks * cache.block_size

    def release(self, req: Request) -> None:
        """*req* leaves: its blocks go back, cached. Its KV holds its prompt and every token it
        made but the last (never fed back); the blocks reserved past that go first, empty,
        then its own from its last to its first (the cache's release order). Its content
        stays findable when a later round of its session may continue it."""
        cache = self.cache
        holder = self.holders.pop(req.id)
        computed = req.prompt_tokens + (req.generated_tokens - 1 if req.generated_tokens else 0)
        bs = cache.block_size
        unused = blocks_for(req.prompt_tokens + req.output_tokens, bs) - blocks_for(computed, bs)
        if unused:
            cache.release(unused)
        cache.unref(holder, computed, findable=req.continuable)
