"""The radix prefix cache against a plain per-block model of the documented rules (hypothesis).

The model keeps one entry per cached block, keyed by the block's full token identity
(every token as ``(segment id, offset)`` from the start of the sequence), a reference
count per block, and vLLM's free queue: one ordered dict of every block nobody holds,
head first (the blocks never used, then each released block in release order, empty or
cached; a copy given back unused goes to the head). Allocation pops the head, evicting a
cached block. Random admissions, growth and releases of requests whose contents share
prefixes must give the same lookups and the same block counts in both, with no reference
count below zero and shared blocks counted once.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.serving.kv_cache import blocks_for
from simpy_llm.serving.prefix_cache import Holder, PrefixCache

BS = 4
BLOCKS = 16
# Content templates sharing prefixes: (segment id, tokens) lists; each request appends
# its own unique tail.
TEMPLATES = [
    [(1, 9)],
    [(1, 9), (2, 6)],
    [(1, 9), (2, 11)],
    [(1, 5)],
    [(1, 9), (3, 4)],
    [(4, 16)],
    [],
]


class BlockModel:
    """The documented cache, one block at a time."""

    def __init__(self) -> None:
        self.refs: dict[tuple, int] = {}
        self._names = count()
        self.queue: OrderedDict[tuple, None] = OrderedDict((self._empty(), None) for _ in range(BLOCKS))
        """Free blocks, head first: an identity (cached, evictable) or an empty block's name."""
        self.held: dict[int, list[tuple]] = {}

    def _empty(self) -> tuple:
        return ("empty", next(self._names))

    @staticmethod
    def tokens(segs):
        out = []
        for seg, n in segs:
            out += [(seg, k) for k in range(n)]
        return out

    def ident(self, segs, b):
        return tuple(self.tokens(segs)[: (b + 1) * BS])

    def match(self, segs, max_blocks):
        hits = []
        for b in range(max_blocks):
            i = self.ident(segs, b)
            if i not in self.refs:
                break
            hits.append(i)
        return hits

    def free(self):
        return len(self.queue)

    @property
    def empty(self):
        return sum(1 for key in self.queue if key[0] == "empty")

    @property
    def evictable(self):
        return self.free() - self.empty

    def allocate(self, n):
        for _ in range(n):
            key, _ = self.queue.popitem(last=False)
            if key[0] != "empty":
                del self.refs[key]  # evicted

    def ref(self, i):
        if self.refs[i] == 0:
            del self.queue[i]
        self.refs[i] += 1

    def register(self, rid, segs, computed):
        held = self.held[rid]
        for b in range(len(held), computed // BS):
            i = self.ident(segs, b)
            if i in self.refs:
                self.ref(i)
                copy = self._empty()  # the request's own copy, never used: to the queue's head
                self.queue[copy] = None
                self.queue.move_to_end(copy, last=False)
            else:
                self.refs[i] = 1
            held.append(i)

    def release(self, rid, segs, computed):
        self.register(rid, segs, computed)
        if computed % BS:
            self.queue[self._empty()] = None  # its partial last block first
        for i in reversed(self.held.pop(rid)):
            self.refs[i] -= 1
            assert self.refs[i] >= 0
            if self.refs[i] == 0:
                self.queue[i] = None

    @property
    def used(self):
        return BLOCKS - self.free()


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "grow", "grow", "release"]), st.integers(0, 10**6), st.integers(1, 40)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_radix_cache_equals_the_per_block_model(script):
    """Lookups, reference counts and empty/evictable/used block counts of the radix cache
    equal a per-block model after every admission, growth and release (releases with and
    without keeping the request's own content findable, and of requests whose content is
    all their own, held without a holder)."""
    cache = PrefixCache(BLOCKS, BS)
    model = BlockModel()
    running: dict[int, tuple[Holder, list, int, int]] = {}  # rid -> (holder, segs, computed, target)
    next_id = 0
    for op, pick, amount in script:
        if op == "admit":
            rid = next_id
            next_id += 1
            segs = [*TEMPLATES[pick % len(TEMPLATES)], (-(rid + 1), 1 + pick % 13)]
            target = sum(n for _, n in segs)
            if len(segs) == 1 and pick % 3 == 0:
                # Content all its own: the engine admits it without a holder (nothing to
                # look up), and it releases without one (release_own) unless preempted.
                computed = min(target, amount)
                new = blocks_for(computed, BS)
                if new > cache.free_blocks:
                    continue
                cache.allocate(new)
                model.held[rid] = []
                model.allocate(new)
                running[rid] = (None, segs, computed, target)
                continue
            h = Holder(segs)
            m = cache.match(h, (target - 1) // BS)
            hits = model.match(segs, (target - 1) // BS)
            assert m.blocks == len(hits)
            assert m.evictable == sum(1 for i in hits if model.refs[i] == 0)
            computed = min(target, len(hits) * BS + amount)
            new = blocks_for(computed, BS) - m.blocks
            if new + m.evictable > cache.free_blocks:
                continue
            cache.pin(h, m)
            cache.allocate(new)
            cache.register(h, computed)
            model.held[rid] = []
            for i in hits:
                model.ref(i)
                model.held[rid].append(i)
            model.allocate(new)
            model.register(rid, segs, computed)
            running[rid] = (h, segs, computed, target)
        elif running:
            rid = sorted(running)[pick % len(running)]
            h, segs, computed, target = running[rid]
            if op == "grow":
                grown = min(target, computed + amount)
                need = blocks_for(grown, BS) - blocks_for(computed, BS)
                if need > cache.free_blocks:
                    continue
                cache.allocate(need)
                model.allocate(need)
                if amount % 2 and h is not None:  # registered as it grows (prefill), or only at release (decode)
                    cache.register(h, grown)
                    model.register(rid, segs, grown)
                running[rid] = (h, segs, grown, target)
            else:
                # A finished request may leave its own content unfindable (an anonymous
                # LRU run): nothing can tell, since no other content is the same.
                if h is None:
                    cache.release_own(computed)
                else:
                    cache.unref(h, computed, findable=bool(pick % 2))
                model.release(rid, segs, computed)
                del running[rid]
        assert cache.empty == model.empty
        assert cache.evictable == model.evictable
        assert cache.used_blocks == model.used
        assert cache.cached_blocks == len(model.refs)
        assert all(r >= 0 for r in model.refs.values())
    for rid, (h, segs, computed, _target) in list(running.items()):
        if h is None:
            cache.release_own(computed)
        else:
            cache.unref(h, computed)
        model.release(rid, segs, computed)
    assert cache.used_blocks == 0 == model.used
    assert cache.free_blocks == BLOCKS
