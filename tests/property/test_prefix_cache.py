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


def _tree_blocks(cache: PrefixCache) -> tuple[int, int, dict[int, int]]:
    """Blocks in the tree, those nobody references, and each node's reference count by id."""
    total = unreferenced = 0
    refs: dict[int, int] = {}
    stack = [cache.root]
    while stack:
        node = stack.pop()
        if node is not cache.root:
            total += node.n
            refs[id(node)] = node.refs
            if node.refs == 0:
                unreferenced += node.n
        if node.children:
            stack.extend(node.children.values())
    return total, unreferenced, refs


def _chain_refs(holders: list[Holder]) -> dict[int, int]:
    """Reference counts the running holders imply: one per holder on each node of its chain."""
    refs: dict[int, int] = {}
    for h in holders:
        node = h.deepest
        while node.parent is not None:
            refs[id(node)] = refs.get(id(node), 0) + 1
            node = node.parent
    return refs


conserving_ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "own", "private", "grow", "release", "release", "evict"]),
        st.integers(0, 10**6),
        st.integers(1, 40),
    ),
    max_size=250,
)


@settings(max_examples=200, deadline=None)
@given(conserving_ops)
def test_blocks_are_conserved_across_allocate_register_release_and_evict(script: list[tuple[str, int, int]]) -> None:
    """Every block is free (empty or evictable) or used, at every point of a random sequence of
    admissions (with a holder, with content all its own, with private blocks), growth,
    registrations, releases (findable, unfindable, own, private) and evictions (allocations
    past the fresh blocks): ``empty + evictable + used`` is the number of blocks, ``used`` is
    what the running requests hold (shared blocks once), the evictable blocks are the tree's
    unreferenced blocks plus the unfindable cached ones, every tree node's reference count is
    the number of running holders whose chain passes it, and the counts equal the per-block
    model's. Scripts are long enough that many releases queue up and are dropped once taken."""
    cache = PrefixCache(BLOCKS, BS)
    model = BlockModel()
    running: dict[int, tuple[Holder | None, list, int, int, str]] = {}  # rid -> (holder, segs, computed, target, kind)
    next_id = 0
    for op, pick, amount in script:
        if op in ("admit", "own", "private"):
            rid = next_id
            next_id += 1
            if op == "admit":
                segs = [*TEMPLATES[pick % len(TEMPLATES)], (-(rid + 1), 1 + pick % 13)]
                target = sum(n for _, n in segs)
                holder = Holder(segs)
                m = cache.match(holder, (target - 1) // BS)
                hits = model.match(segs, (target - 1) // BS)
                assert m.blocks == len(hits)
                computed = min(target, len(hits) * BS + amount)
                new = blocks_for(computed, BS) - m.blocks
                if new + m.evictable > cache.free_blocks:
                    continue
                cache.pin(holder, m)
                cache.allocate(new)
                cache.register(holder, computed)
                model.held[rid] = []
                for i in hits:
                    model.ref(i)
                    model.held[rid].append(i)
                model.allocate(new)
                model.register(rid, segs, computed)
                running[rid] = (holder, segs, computed, target, op)
            else:
                segs = [(-(rid + 1), amount)]
                new = blocks_for(amount, BS)
                if new > cache.free_blocks:
                    continue
                cache.allocate(new)
                model.held[rid] = []
                model.allocate(new)
                running[rid] = (None, segs, amount, amount, op)
        elif op == "evict":
            # Bursts of short requests taken and given straight back: each burst pops the
            # queue's head (evicting), and each release queues one more run: private blocks
            # one by one, or a request's own content (its full blocks cached, unfindable).
            for j in range(amount):
                n = min(1 + (pick + j) % 3, cache.free_blocks)
                cache.allocate(n)
                model.allocate(n)
                if (pick + j) % 2 and n:
                    rid = next_id
                    next_id += 1
                    tokens = n * BS - (pick + j) % BS
                    cache.release_own(tokens)
                    model.held[rid] = []
                    model.release(rid, [(-(rid + 1), tokens)], tokens)
                else:
                    for _ in range(n):
                        cache.release(1)
                        model.queue[model._empty()] = None  # noqa: SLF001 - the model's own block names
                assert (cache.empty, cache.evictable, cache.cached_blocks) == (model.empty, model.evictable, len(model.refs))
        elif running:
            rid = sorted(running)[pick % len(running)]
            h, segs, computed, target, kind = running[rid]
            if op == "grow":
                grown = min(target, computed + amount) if kind == "admit" else computed + amount % 9
                need = blocks_for(grown, BS) - blocks_for(computed, BS)
                if need > cache.free_blocks:
                    continue
                cache.allocate(need)
                model.allocate(need)
                if h is not None and amount % 2:
                    cache.register(h, grown)
                    model.register(rid, segs, grown)
                if kind != "admit":
                    segs = [(segs[0][0], grown)]
                running[rid] = (h, segs, grown, target, kind)
            else:
                if kind == "private":
                    cache.release(blocks_for(computed, BS))
                    for _ in range(blocks_for(computed, BS)):
                        model.queue[model._empty()] = None  # noqa: SLF001 - the model's own block names
                    model.held.pop(rid)
                elif h is None:
                    cache.release_own(computed)
                    model.release(rid, segs, computed)
                else:
                    cache.unref(h, computed, findable=bool(pick % 2))
                    model.release(rid, segs, computed)
                del running[rid]
        tree, unreferenced, refs = _tree_blocks(cache)
        holders = [h for h, *_ in running.values() if h is not None]
        assert cache.empty + cache.evictable + cache.used_blocks == BLOCKS
        assert cache.free_blocks == cache.empty + cache.evictable
        assert min(cache.empty, cache.evictable, cache.used_blocks) >= 0
        own_blocks = sum(blocks_for(c, BS) for h, _s, c, _t, _k in running.values() if h is None)
        shared_blocks = tree - unreferenced + sum(blocks_for(c, BS) - h.blocks for h, _s, c, _t, _k in running.values() if h is not None)
        assert cache.used_blocks == own_blocks + shared_blocks
        unfindable = cache.cached_blocks - tree
        assert unfindable >= 0
        assert cache.evictable == unreferenced + unfindable
        assert {k: v for k, v in refs.items() if v} == _chain_refs(holders)
        assert (cache.empty, cache.evictable, cache.used_blocks, cache.cached_blocks) == (
            model.empty, model.evictable, model.used, len(model.refs))
    for h, _segs, computed, _target, kind in list(running.values()):
        if kind == "private":
            cache.release(blocks_for(computed, BS))
        elif h is None:
            cache.release_own(computed)
        else:
            cache.unref(h, computed)
    assert cache.used_blocks == 0
    assert cache.free_blocks == cache.empty + cache.evictable == BLOCKS
