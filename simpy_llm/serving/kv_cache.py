"""Paged KV-cache block accounting for one replica.

The cache only counts blocks; which request holds how many is derived by the
engine from each request's computed-token count (``ceil(tokens / block_size)``),
so no per-block objects exist. Allocation never lets ``used_blocks`` exceed
``num_blocks`` nor fall below zero: both raise, because either would be an
engine bug, not a modelling outcome.
"""

from __future__ import annotations

__all__ = ["KVCacheError", "PagedKVCache", "TokenMemory", "blocks_for"]


class KVCacheError(RuntimeError):
    """The engine asked for more blocks than are free, or freed more than it held."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold *tokens* tokens.

    >>> blocks_for(0, 16), blocks_for(1, 16), blocks_for(16, 16), blocks_for(17, 16)
    (0, 1, 1, 2)
    """
    return -(-tokens // block_size)


class PagedKVCache:
    """Counts KV-cache blocks on a replica.

    Parameters
    ----------
    num_blocks
        Blocks on the replica.
    block_size
        Tokens per block.

    Examples
    --------
    >>> kv = PagedKVCache(num_blocks=4, block_size=16)
    >>> kv.allocate(3); kv.free_blocks
    1
    >>> kv.allocate(2)
    Traceback (most recent call last):
    ...
    simpy_llm.serving.kv_cache.KVCacheError: asked for 2 blocks with 1 free
    """

    __slots__ = ("block_size", "num_blocks", "peak_used_blocks", "used_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used_blocks = 0
        self.peak_used_blocks = 0

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request."""
        return self.num_blocks - self.used_blocks

    def allocate(self, n: int) -> None:
        """Take *n* blocks; raises :class:`KVCacheError` if fewer are free."""
        if n > self.num_blocks - self.used_blocks or n < 0:
            raise KVCacheError(f"asked for {n} blocks with {self.num_blocks - self.used_blocks} free")
        self.used_blocks += n
        if self.used_blocks > self.peak_used_blocks:
            self.peak_used_blocks = self.used_blocks

    def release(self, n: int) -> None:
        """Return *n* blocks; raises :class:`KVCacheError` if more than are held."""
        if n > self.used_blocks or n < 0:
            raise KVCacheError(f"released {n} blocks with {self.used_blocks} held")
        self.used_blocks -= n


class TokenMemory:
    """KV memory counted in tokens (one "block" per token), offering the fields views and
    results read from a :class:`PagedKVCache`: for servers that reserve a request's tokens
    whole (a request-level batch server, a speculative verify server).

    >>> m = TokenMemory(100); m.used_blocks = 30; m.free_blocks
    70
    """

    __slots__ = ("num_blocks", "peak_used_blocks", "used_blocks")

    def __init__(self, capacity_tokens: int) -> None:
        self.num_blocks = capacity_tokens
        """Capacity, tokens (0: no limit, for a batch server without one)."""
        self.used_blocks = 0
        """Tokens held now."""
        self.peak_used_blocks = 0
        """Most tokens held at once."""

    @property
    def free_blocks(self) -> int:
        return max(self.num_blocks - self.used_blocks, 0)
