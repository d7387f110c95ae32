"""Blocks taken in two allocations are the blocks taken in one (hypothesis).

The engine takes a step's KV blocks in one allocation: the decoders' new blocks with those of
the requests it admits (``Replica._admit``). That is exact only if ``allocate(a)`` then
``allocate(b)`` leaves a KV cache as ``allocate(a + b)`` does. Both take from the head of
the free queue (fresh blocks, then released blocks in release order, evicting cached ones
tail first), so they should; this checks it on prefix caches brought to random states by
admissions that share prefixes, growth and releases (findable or not, and of content all its
own), and on the plain paged cache.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.serving.kv_cache import PagedKVCache, blocks_for
from simpy_llm.serving.prefix_cache import Holder, PrefixCache

BS = 4
BLOCKS = 24
TEMPLATES = [[(1, 9)], [(1, 9), (2, 6)], [(1, 9), (2, 11)], [(1, 5)], [(4, 16)], []]

ops = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "grow", "release"]), st.integers(0, 10**6), st.integers(1, 40)),
    max_size=50,
)


def _state(cache: PrefixCache) -> tuple:
    """What can be observed of *cache*: its counts, and every template's lookup."""
    lookups = []
    for segs in TEMPLATES:
        if segs:
            target = sum(n for _, n in segs)
            m = cache.match(Holder(segs), target // BS)
            lookups.append((m.blocks, m.evictable))
    return (cache.used_blocks, cache.peak_used_blocks, cache.empty, cache.evictable, cache.cached_blocks, lookups)


def _drive(script: list[tuple[str, int, int]]) -> PrefixCache:
    """A prefix cache after *script*'s admissions, growth and releases, some still running."""
    cache = PrefixCache(BLOCKS, BS)
    running: dict[int, tuple[Holder | None, int, int]] = {}
    for rid, (op, pick, amount) in enumerate(script):
        if op == "admit":
            segs = [*TEMPLATES[pick % len(TEMPLATES)], (-(rid + 1), 1 + pick % 13)]
            target = sum(n for _, n in segs)
            if len(segs) == 1 and pick % 3 == 0:  # content all its own: no holder
                computed = min(target, amount)
                new = blocks_for(computed, BS)
                if new <= cache.free_blocks:
                    cache.allocate(new)
                    running[rid] = (None, computed, target)
                continue
            h = Holder(segs)
            m = cache.match(h, (target - 1) // BS)
            computed = min(target, m.blocks * BS + amount)
            new = blocks_for(computed, BS) - m.blocks
            if new + m.evictable > cache.free_blocks:
                continue
            cache.pin(h, m)
            cache.allocate(new)
            cache.register(h, computed)
            running[rid] = (h, computed, target)
        elif running:
            key = sorted(running)[pick % len(running)]
            h, computed, target = running[key]
            if op == "grow":
                grown = min(target, computed + amount)
                need = blocks_for(grown, BS) - blocks_for(computed, BS)
                if need <= cache.free_blocks:
                    cache.allocate(need)
                    running[key] = (h, grown, target)
            else:
                if h is None:
                    cache.release_own(computed)
                else:
                    cache.unref(h, computed, findable=bool(pick % 2))
                del running[key]
    return cache


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, BLOCKS), st.integers(0, BLOCKS))
def test_prefix_cache_takes_the_same_blocks_in_one_allocation_as_in_two(script, a, b) -> None:
    """From any state, allocate(a) then allocate(b) leaves the prefix cache as allocate(a + b):
    the same counts (used, peak, empty, evictable, cached) and the same lookups, and so do
    the allocations that drain it afterwards."""
    cache = _drive(script)
    free = cache.free_blocks
    a, b = min(a, free), min(b, free - min(a, free))
    one, two = copy.deepcopy(cache), copy.deepcopy(cache)
    one.allocate(a + b)
    two.allocate(a)
    two.allocate(b)
    assert _state(one) == _state(two)
    while one.free_blocks:
        one.allocate(1)
        two.allocate(1)
        assert _state(one) == _state(two)


@given(st.integers(0, BLOCKS), st.integers(0, BLOCKS), st.integers(0, BLOCKS))
def test_paged_cache_takes_the_same_blocks_in_one_allocation_as_in_two(held, a, b) -> None:
    """The paged cache counts the same used and peak blocks after allocate(a), allocate(b)
    as after allocate(a + b)."""
    a = min(a, BLOCKS - held)
    b = min(b, BLOCKS - held - a)
    one, two = PagedKVCache(BLOCKS, BS), PagedKVCache(BLOCKS, BS)
    for kv in (one, two):
        kv.allocate(held)
        kv.release(held // 2)
    one.allocate(a + b)
    two.allocate(a)
    two.allocate(b)
    assert (one.used_blocks, one.peak_used_blocks) == (two.used_blocks, two.peak_used_blocks)
