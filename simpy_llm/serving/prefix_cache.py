"""A paged KV cache with automatic prefix caching, as a radix tree of block runs.

The semantics are those of ``docs/model.md`` ("Free blocks, prefix caching and
eviction"), stated there block by block and following vLLM's V1 engine: full
blocks are cached under their content identity from the moment the step that
computes them is scheduled, a request reuses the cached blocks of its longest
cached prefix, and every block nobody holds waits in **one** LRU free queue: the
blocks never used yet at its head, then every released block in release order
(a request releases its partial last block, then its full blocks from last to
first). Allocating pops the queue's head; a popped cached block loses its
identity (it is evicted).

Doing that block by block would cost a hash and a dictionary entry per block
(a 1,000-token prompt is 63 blocks of 16). Here a request's content is a short
list of *segments* (:func:`content_segments`) and the cache stores *runs* of
consecutive blocks of one segment as single tree nodes, so every operation
costs O(segments), not O(blocks):

* a node is a run of ``n`` blocks whose tokens lie in one segment (its block
  ``j`` covers the segment's tokens ``[off + j*bs, off + (j+1)*bs)``), or a
  block spanning a segment boundary followed by the run of full blocks after it
  in the segment where it ends (one node where a growing context would otherwise
  make two at each boundary); its children are keyed by the content of their
  first block;
* every holder (a running request) references the whole chain of nodes from
  the root to its *deepest* node, so a node's reference count is uniform over
  its blocks; a lookup that matches only part of a node splits it where the
  new holder's reference ends;
* the free queue is a count of fresh blocks at its head followed by the released
  blocks in release order, kept in two interleaved streams: an ordered dict of the
  *tree nodes* whose count dropped to zero, and one *anonymous stream* of blocks outside
  the tree (a released partial block, empty, followed by cached blocks no lookup can
  find; or a request's private blocks). A tree node joining the queue notes how many
  anonymous blocks were released before it (``qpos``), which places it in the stream.
  A released chain joins deepest node first (a request releases tail first), and a node
  is only ever referenced together with its ancestors, so a node's descendants are never
  released after it: the first tree node in the queue is always a leaf and the cache
  stays prefix-closed. Popping the queue's head takes the anonymous blocks before the
  first tree node (one counter moves: their content cannot be looked up, so evicting
  them changes no lookup), then trims that node's tail block by block, which is
  exactly the block-level queue. A request whose content is all its own therefore
  costs a counter on allocation and two list appends on release, whatever the state
  of the cache; which anonymous blocks are empty and which cached is read back from
  those lists only when a count asks for it (:attr:`PrefixCache.empty`,
  :attr:`PrefixCache.evictable`, :attr:`PrefixCache.cached_blocks`).

The cache also counts the blocks themselves (``empty``, evictable, used) and
offers :class:`~simpy_llm.serving.kv_cache.PagedKVCache`'s interface
(``allocate``, ``release``, ``free_blocks``, ``used_blocks``), so the engine
allocates decode growth and private partial blocks the same way with or
without prefix caching.

Kept whole (over 800 lines): the tree, the free queue's two streams and the CPU tier are
one structure whose invariants (prefix-closed, ``qpos`` ordered along the queue, uniform
reference counts per node) every method keeps together; split apart, each part would
reach into the others' state.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from itertools import accumulate
from typing import TYPE_CHECKING

from simpy_llm.serving.kv_cache import KVCacheError
from simpy_llm.workload.prefix import Segment, content_segments

if TYPE_CHECKING:
    from simpy_llm.entities import Request

__all__ = ["CpuTier", "Holder", "Match", "PrefixCache"]

_NO_NODE = 1 << 62
"""``PrefixCache._head_qpos`` while no tree node is in the free queue: past any stream position."""


def _span_key(ids: tuple[int, ...], starts: list[int], i: int, pos: int, end: int) -> tuple[tuple[int, int, int], ...]:
    """Content key of the block ``[pos, end)`` that starts in segment *i* and spans more than
    two segments: its pieces ``(segment id, offset in the segment, tokens)``.

    A block spanning two segments, the usual case, is keyed ``(first segment id, offset in
    it, tokens in it, second segment id)`` instead (the second piece starts its segment and
    fills the block: that names the same content, in one flat tuple, cheaper to make and to
    hash), built where it is looked up; a block inside one segment is keyed ``(segment id,
    offset)``, and starts a run of that segment's full blocks. The three forms never compare
    equal (2 and 4 integers, or 3 or more tuples)."""
    pieces = []
    while pos < end:
        stop = starts[i + 1]
        if stop > end:
            stop = end
        pieces.append((ids[i], pos - starts[i], stop - pos))
        pos = stop
        i += 1
    return tuple(pieces)


class _Node:
    """A run of cached blocks (see the module docstring)."""

    __slots__ = ("children", "cpu", "key", "n", "off", "parent", "qpos", "refs", "seg")

    def __init__(self, parent: _Node | None, key: object, seg: int | None, off: int, n: int, refs: int) -> None:
        self.parent = parent
        self.children: dict[object, _Node] | None = None
        self.key = key
        """Content of the first block: ``(seg, off)`` for a run, the spanning block's key for a
        node starting with a block spanning segments (:func:`_span_key`)."""
        self.seg = seg
        """Segment id of the run (after the spanning block, if it starts with one); None for a
        spanning block alone (then ``n == 1``)."""
        self.off = off
        """Offset within the segment of the run's first block (if the node starts with a
        spanning block: where its block 0 would start in the segment of the run after it, so
        its block ``j >= 1`` starts at ``off + j * block_size`` as in any run)."""
        self.n = n
        """Blocks in the run."""
        self.refs = refs
        """Holders referencing the node (each references its whole chain from the root)."""
        self.qpos = 0
        """Anonymous blocks released before it joined the free queue (its place in the queue
        relative to them; meaningful while it waits there)."""
        self.cpu = False
        """Its blocks are held by the CPU tier only (never referenced; see :class:`CpuTier`)."""


class Holder:
    """What a request holds in the cache: its content and the deepest node it references.

    The request references every block of the chain from the root to ``deepest``:
    ``blocks`` full blocks, its first ``blocks * block_size`` tokens.
    """

    __slots__ = ("blocks", "deepest", "ids", "run_end", "shared_tokens", "starts", "total")

    deepest: _Node
    """The deepest node it references (the root: none); set by :meth:`PrefixCache.holder` or
    :meth:`PrefixCache.pin`, before which the holder is used only to look its content up."""

    def __init__(self, segs: list[Segment], shared_tokens: int | None = None) -> None:
        ids, lengths = zip(*segs, strict=True) if segs else ((), ())
        self.ids: tuple[int, ...] = ids
        """Id of each segment."""
        self.starts = [0, *accumulate(lengths)]
        """Absolute start of each segment, plus the end of the last."""
        self.total = self.starts[-1]
        if shared_tokens is None:
            shared_tokens = 0
            for seg_id, tokens in segs:
                if seg_id < 0:
                    break
                shared_tokens += tokens
        self.shared_tokens = shared_tokens
        """Leading tokens other running requests may look up (a prefix group's or a trace's
        blocks, the context of an earlier round; by default the leading segments with
        non-negative ids). The rest is this request's own content, which nobody can look up
        while it runs, so its blocks can be registered when it releases them."""
        self.blocks = 0
        self.run_end = 0
        """Absolute end of the segment of ``deepest`` when this holder created or extended
        it as a run (a hint that lets registration extend it without a lookup)."""


class Match:
    """A lookup's result: ``blocks`` cached full blocks from the start, ``evictable`` of
    them currently unreferenced (pinning them takes them out of the free blocks), ``cpu``
    of those held by the CPU tier only (pinning restores them into free GPU blocks)."""

    __slots__ = ("blocks", "cpu", "evictable", "last", "last_blocks")

    def __init__(self, blocks: int, evictable: int, last: _Node | None, last_blocks: int, cpu: int) -> None:
        self.blocks = blocks
        self.evictable = evictable
        self.last = last
        """The deepest node matched (None: nothing)."""
        self.last_blocks = last_blocks
        """Blocks matched in ``last`` (it is split there if fewer than ``last.n``)."""
        self.cpu = cpu
        """Matched blocks held by the CPU tier only: the last ones matched (the GPU tier
        holds a prefix of every cached chain)."""


class CpuTier:
    """The CPU tier of a prefix cache (``EngineConfig.kv_offload_blocks``): its capacity and
    its counters over the run.

    A findable block (a tree node's) evicted from the GPU is copied here; when the tier is
    full it drops its least recently offloaded blocks. A lookup that matches blocks held here
    restores them into GPU blocks (they leave the tier: the two tiers hold disjoint blocks).
    The lookup counters are kept by the engine, which knows the tokens looked up and the
    copy's bandwidth.
    """

    __slots__ = (
        "capacity",
        "cpu_hit_tokens",
        "gpu_hit_tokens",
        "held",
        "looked_up_tokens",
        "offloaded_blocks",
        "restore_s",
        "restored_blocks",
    )

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        """Blocks the tier can hold."""
        self.held = 0
        """Blocks it holds now."""
        self.offloaded_blocks = 0
        """Blocks copied to it from the GPU so far."""
        self.restored_blocks = 0
        """Blocks restored from it to the GPU so far."""
        self.looked_up_tokens = 0
        """Tokens (prefill targets) of the admissions that looked the cache up."""
        self.gpu_hit_tokens = 0
        """Tokens those lookups found on the GPU tier."""
        self.cpu_hit_tokens = 0
        """Tokens those lookups found on the CPU tier only (restored)."""
        self.restore_s = 0.0
        """Transfer time charged to steps for the restores, s."""


class PrefixCache:
    """Paged KV blocks with automatic prefix caching.

    Parameters
    ----------
    num_blocks
        Blocks on the replica.
    block_size
        Tokens per block.
    cpu_blocks
        Capacity of a CPU tier, in blocks (:class:`CpuTier`; 0: none).

    Examples
    --------
    Two requests of one prefix group: the second finds the first's prefix blocks.

    >>> from simpy_llm.entities import Request
    >>> cache = PrefixCache(num_blocks=16, block_size=4)
    >>> def req(i):
    ...     return Request(id=i, client_id="c", prompt_tokens=10, output_tokens=2, arrival_s=0.0,
    ...                    prefix_tokens=8, prefix_blocks=(5, 6), prefix_block_tokens=4)
    >>> a = req(0); ha = cache.holder(a)
    >>> m = cache.match(ha, max_blocks=(10 - 1) // 4); m.blocks
    0
    >>> cache.allocate(3); cache.pin(ha, m); cache.register(ha, 10)   # prefill computes 10 tokens
    0
    >>> cache.used_blocks, cache.cached_blocks
    (3, 2)
    >>> b = req(1); hb = cache.holder(b)
    >>> cache.match(hb, max_blocks=2).blocks                        # the shared 8-token prefix
    2
    >>> cache.unref(ha, 10); cache.used_blocks, cache.free_blocks, cache.cached_blocks   # still cached, evictable
    (0, 16, 2)
    """

    __slots__ = (
        "_anon_out",
        "_compact_at",
        "_cpu_lru",
        "_fresh",
        "_head_qpos",
        "_lru",
        "_run_cached",
        "_run_ends",
        "block_size",
        "num_blocks",
        "peak_used_blocks",
        "root",
        "tier",
        "used_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int, cpu_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used_blocks = 0
        """Blocks referenced by running requests or held privately (shared blocks counted once)."""
        self.peak_used_blocks = 0
        self.root = _Node(None, None, None, 0, 0, 0)
        self._fresh = num_blocks
        """Empty blocks at the head of the free queue: never used yet, or given back unused
        (a copy whose content was already cached, :meth:`register`)."""
        self._lru: OrderedDict[_Node, None] = OrderedDict()
        """The tree nodes in the free queue, in release order: the head is popped first."""
        self._head_qpos = _NO_NODE
        """At most the ``qpos`` of the free queue's first tree node (``_NO_NODE``: none is
        queued). Nodes join the queue at its tail with the stream's end as their ``qpos``, so
        ``qpos`` never decreases along the queue and a value kept after the head left stays a
        lower bound: an allocation that fits before it takes anonymous blocks only, without
        looking at the queue; one that does not reads the head again."""
        self._run_ends = [0]
        """The anonymous stream's runs (one per release), as the stream position where each
        ends: anonymous blocks released since the start; the first entry is where the first
        run kept starts."""
        self._run_cached = [0]
        """Cached (not empty) blocks among the anonymous blocks released up to each entry of
        ``_run_ends``; a run holds its empty blocks first, then its cached ones."""
        self._anon_out = 0
        """Stream position of the anonymous stream's head: anonymous blocks taken so far."""
        self._compact_at = 64
        """Length of ``_run_ends`` past which the runs already taken are dropped."""
        self.tier = CpuTier(cpu_blocks) if cpu_blocks else None
        """The CPU tier (None: none)."""
        self._cpu_lru: OrderedDict[_Node, None] = OrderedDict()
        """The tree nodes held by the CPU tier, least recently offloaded first. A node's
        descendants always come before it (a GPU node's descendants leave the GPU first),
        so its head is a leaf and dropping it keeps the tree prefix-closed."""

    # --- counting (PagedKVCache's interface) -----------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks an allocation may take: empty plus evictable."""
        return self.num_blocks - self.used_blocks

    def _anon_cached(self) -> int:
        """Cached blocks in the anonymous stream not taken yet."""
        ends = self._run_ends
        cached = self._run_cached
        p = self._anon_out
        i = bisect_right(ends, p)  # the run holding the stream's head spans [ends[i-1], ends[i])
        if i == len(ends):
            return 0
        start = ends[i - 1]
        empty = ends[i] - start - (cached[i] - cached[i - 1])
        taken = p - start - empty  # cached blocks of that run already taken
        return cached[-1] - cached[i - 1] - (taken if taken > 0 else 0)

    @property
    def evictable(self) -> int:
        """Cached blocks nobody references."""
        return sum(node.n for node in self._lru) + self._anon_cached()

    @property
    def empty(self) -> int:
        """Free blocks holding nothing (fresh, or released empty and not taken since)."""
        return self.num_blocks - self.used_blocks - self.evictable

    @property
    def cached_blocks(self) -> int:
        """Blocks with a content identity (referenced or evictable)."""
        total = self._anon_cached()
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.cpu:  # held by the CPU tier, and so is everything below it
                continue
            total += node.n
            if node.children:
                stack.extend(node.children.values())
        return total

    def allocate(self, n: int) -> None:
        """Take *n* blocks from the head of the free queue: fresh blocks first, then released
        blocks in release order, evicting the cached blocks among them (a tree node's tail
        first)."""
        used = self.used_blocks + n
        fresh = self._fresh
        if n <= fresh:
            if n < 0:
                raise KVCacheError(f"asked for {n} blocks")
            self._fresh = fresh - n
        else:
            if used > self.num_blocks:
                raise KVCacheError(f"asked for {n} blocks with {self.num_blocks - self.used_blocks} free")
            self._fresh = 0
            need = n - fresh
            anon_out = self._anon_out
            taken = anon_out + need
            if taken <= self._head_qpos:  # (a comparison: no arithmetic on the large sentinel)
                # Only anonymous blocks ahead of the first tree node are taken: one counter moves.
                self._anon_out = taken
            else:
                self._evict(need, anon_out)
        self.used_blocks = used
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used

    def _evict(self, need: int, anon_out: int) -> None:
        """Take *need* released blocks from the free queue's head (the stream's head at
        *anon_out*), reaching into its tree nodes: the anonymous blocks before the first
        node, then that node's tail block by block, and so on."""
        lru = self._lru
        tier = self.tier
        head_qpos = _NO_NODE  # the new head's qpos, once known
        while lru:
            node = next(iter(lru))
            head_qpos = node.qpos
            room = head_qpos - anon_out  # anonymous blocks queued before it (never negative)
            if room >= need:
                break
            anon_out += room
            need -= room
            m = node.n
            if m > need:  # part of the node: its tail, released first, goes first
                node.n = m - need
                if tier is not None:
                    self._offload_tail(node, need)
                need = 0
                break
            del lru[node]
            need -= m
            if tier is not None:
                self._offload(node)
            else:
                node.n = 0
                parent = node.parent
                assert parent is not None and parent.children is not None  # a queued node hangs below the root
                del parent.children[node.key]
                node.parent = None
            head_qpos = _NO_NODE
            if not need:
                if lru:
                    head_qpos = next(iter(lru)).qpos
                break
        self._anon_out = anon_out + need
        self._head_qpos = head_qpos

    def release(self, n: int) -> None:
        """Return *n* private blocks (blocks of a request without a :class:`Holder`): they
        join the free queue's tail, empty."""
        if n < 0 or n > self.used_blocks:
            raise KVCacheError(f"released {n} blocks with {self.used_blocks} used")
        if n:
            ends = self._run_ends
            ends.append(ends[-1] + n)
            cached = self._run_cached
            cached.append(cached[-1])
            self.used_blocks -= n
            if len(ends) > self._compact_at:
                self._compact()

    def _compact(self) -> None:
        """Drop the anonymous runs wholly taken (keeps the lists as long as the queue's runs)."""
        ends = self._run_ends
        i = bisect_right(ends, self._anon_out) - 1  # the last run end not past the stream's head
        if i > 0:
            del ends[:i]
            del self._run_cached[:i]
        self._compact_at = 2 * len(ends) + 64

    # --- the CPU tier --------------------------------------------------------
    def _offload(self, node: _Node) -> None:
        """Move *node*, just evicted from the GPU, to the CPU tier (it stays in the tree)."""
        tier = self.tier
        assert tier is not None  # called only with a CPU tier
        node.cpu = True
        self._cpu_lru[node] = None
        tier.held += node.n
        tier.offloaded_blocks += node.n
        if tier.held > tier.capacity:
            self._trim_cpu()

    def _offload_tail(self, node: _Node, k: int) -> None:
        """Move the *k* blocks just evicted from the tail of run *node* (now ``node.n`` blocks
        long) to the CPU tier, as a new node below it that takes over its children (all held
        by the CPU tier: *node* was a leaf of the GPU tier)."""
        off = node.off + node.n * self.block_size
        tail = _Node(node, (node.seg, off), node.seg, off, k, 0)
        children = node.children
        if children:
            for child in children.values():
                child.parent = tail
            tail.children = children
        node.children = {tail.key: tail}
        self._offload(tail)

    def _trim_cpu(self) -> None:
        """Drop the CPU tier's least recently offloaded blocks until it is within capacity
        (a node's tail first, as on the GPU)."""
        tier = self.tier
        assert tier is not None  # called only with a CPU tier
        over = tier.held - tier.capacity
        cpu_lru = self._cpu_lru
        while over > 0:
            node = next(iter(cpu_lru))
            m = node.n
            if m > over:
                node.n = m - over
                tier.held -= over
                return
            del cpu_lru[node]
            tier.held -= m
            over -= m
            parent = node.parent
            assert parent is not None and parent.children is not None and not node.children  # a leaf below the root
            del parent.children[node.key]
            node.parent = None
            node.n = 0

    # --- requests ----------------------------------------------------------
    def holder(self, req: Request, reusable_prompt_tail: int | None = None) -> Holder:
        """A fresh :class:`Holder` for *req* (referencing nothing: the root).

        Its shared tokens are everything before its own segments (its own prompt tail and
        its output, see :func:`content_segments`): a shared prefix, or an earlier round's
        content carried as context, which a concurrent request may hold too (the parallel
        calls of an agentic step share one context). With a *reusable_prompt_tail* ``k``
        (``EngineConfig.reusable_prompt_tail``) they stop at ``max(P - k, S)`` tokens (``P``
        its prompt, ``S`` its leading shared-prefix tokens): the blocks past that become
        unfindable when it completes, so they are only registered if it is preempted."""
        segs = content_segments(req)
        # Its own content: its output, the last segment, and its own prompt tail before it if it has one.
        own = segs[-1][1]
        if len(segs) > 1 and segs[-2][0] == -(2 * req.id + 2):
            own += segs[-2][1]
        h = Holder(segs, shared_tokens=0)
        shared = h.total - own
        if reusable_prompt_tail is not None:
            prefix = 0
            for seg_id, tokens in segs:
                if seg_id < 0:
                    break
                prefix += tokens
            shared = min(shared, max(req.prompt_tokens - reusable_prompt_tail, prefix))
        h.shared_tokens = shared
        h.deepest = self.root
        return h

    def release_own(self, tokens: int) -> None:
        """Release the blocks of a request that holds *tokens* tokens of its own content
        only (no context, no shared prefix), referenced nothing in the tree and need not
        stay findable: :meth:`unref` with ``findable=False`` for such a request, without a
        :class:`Holder`. Its partial last block joins the free queue empty, then its full
        blocks, cached as one anonymous run (no lookup could find them)."""
        partial = 1 if tokens % self.block_size else 0
        own = tokens // self.block_size
        if partial or own:
            ends = self._run_ends
            ends.append(ends[-1] + partial + own)
            cached = self._run_cached
            cached.append(cached[-1] + own)
            self.used_blocks -= partial + own
            if len(ends) > self._compact_at:
                self._compact()

    def match(self, h: Holder, max_blocks: int) -> Match:
        """The longest cached prefix of *h*'s content, at most *max_blocks* blocks (no side effects)."""
        hits = 0
        evictable = 0
        last = None
        last_blocks = 0
        cpu = 0
        children = self.root.children
        if children and max_blocks > 0:
            bs = self.block_size
            starts = h.starts
            ids = h.ids
            i = 0  # the segment holding block `hits`'s first token (the walk only moves forward)
            seg_end = starts[1]
            while True:
                p = hits * bs
                while seg_end <= p:
                    i += 1
                    seg_end = starts[i + 1]
                if p + bs <= seg_end:  # inside segment i: a run's key (segment id, offset)
                    child = children.get((ids[i], p - starts[i]))
                    if child is None:
                        break
                    m = (seg_end - p) // bs
                    if m > max_blocks - hits:
                        m = max_blocks - hits
                    if child.n <= m:
                        m = child.n
                else:  # a block spanning segments, then the run of full blocks after it
                    end = p + bs
                    first = i
                    i += 1  # the walk goes on in the segment holding the block's last token
                    seg_end = starts[i + 1]
                    if end <= seg_end:  # two pieces, the usual case: its flat key (see _span_key)
                        child = children.get((ids[first], p - starts[first], starts[i] - p, ids[i]))
                    else:
                        child = children.get(_span_key(ids, starts, first, p, end))
                        while seg_end < end:
                            i += 1
                            seg_end = starts[i + 1]
                    if child is None:
                        break
                    m = 1
                    if child.n > 1:
                        m += (seg_end - end) // bs
                        if m > max_blocks - hits:
                            m = max_blocks - hits
                        if child.n <= m:
                            m = child.n
                hits += m
                if child.refs == 0:
                    evictable += m
                    if child.cpu:
                        cpu += m
                last, last_blocks = child, m
                if m < child.n or hits >= max_blocks:
                    break
                children = child.children
                if not children:
                    break
        return Match(hits, evictable, last, last_blocks, cpu)

    def hit_tokens(self, req: Request) -> int:
        """Prompt tokens of *req* a lookup would find cached now (for routing views)."""
        h = self.holder(req)
        return self.match(h, (req.prompt_tokens - 1) // self.block_size).blocks * self.block_size

    def pin(self, h: Holder, m: Match) -> None:
        """Reference the blocks *m* found (from :meth:`match` on the same state) for *h*.

        The blocks held by the CPU tier only (``m.cpu``) are restored: they leave the tier
        and take free GPU blocks, as an allocation does (evicting if it must)."""
        if m.last is None:
            h.deepest = self.root
            h.blocks = 0
            h.run_end = 0
            return
        node = m.last
        if m.last_blocks < node.n:
            node = self._split(node, m.last_blocks)
        h.deepest = node
        h.blocks = m.blocks
        h.run_end = 0
        restored = 0
        if m.cpu:
            tier = self.tier
            assert tier is not None  # only a CPU tier holds blocks a match counts as cpu
            cpu_lru = self._cpu_lru
            while node.cpu:  # the CPU-held tail of the chain, up to the first GPU node
                del cpu_lru[node]
                node.cpu = False
                node.refs = 1
                restored += node.n
                parent = node.parent
                assert parent is not None  # the root is never held by the CPU tier
                node = parent
            tier.held -= restored
            tier.restored_blocks += restored
        lru = self._lru
        used = self.used_blocks
        parent = node.parent
        while parent is not None:  # up to the root, the one node without a parent (and without blocks)
            if node.refs == 0:
                del lru[node]
                used += node.n
            node.refs += 1
            node = parent
            parent = node.parent
        self.used_blocks = used
        if restored:
            self.allocate(restored)

    def _split(self, node: _Node, m: int) -> _Node:
        """Split *node* after its first *m* blocks; return the new head node (the original
        object keeps the tail, its children, and its place in the free queue)."""
        bs = self.block_size
        parent = node.parent
        assert parent is not None and parent.children is not None  # a cached node hangs below the root
        head = _Node(parent, node.key, node.seg, node.off, m, node.refs)
        parent.children[node.key] = head
        node.off += m * bs
        node.n -= m
        node.key = (node.seg, node.off)
        node.parent = head
        head.children = {node.key: node}
        if head.refs == 0:  # evictable like the tail (or held by the CPU tier); the caller pins it at once
            if node.cpu:
                head.cpu = True
                self._cpu_lru[head] = None
            else:
                head.qpos = self._run_ends[-1]
                if not self._lru:
                    self._head_qpos = head.qpos
                self._lru[head] = None
        return head

    def register_shared(self, h: Holder, computed_tokens: int) -> None:
        """Register *h*'s full blocks among its first *computed_tokens* tokens that lie in its
        shared tokens (see :attr:`Holder.shared_tokens`), when the step computing them is
        scheduled (vLLM caches a full block in ``allocate_slots``, so a request scheduled
        after it in the same step finds it).

        Only those can be looked up or duplicated by another request while *h* runs; the
        blocks of its own content are registered by :meth:`unref`, which gives the same
        cache state at every lookup with one registration per request instead of one per
        prefill chunk.
        """
        shared = h.shared_tokens
        if shared >= self.block_size and h.blocks * self.block_size + self.block_size <= shared:
            self.register(h, computed_tokens if computed_tokens < shared else shared)

    def register(self, h: Holder, computed_tokens: int) -> int:
        """Cache the full blocks among *h*'s first *computed_tokens* tokens that it does not
        reference yet. Blocks whose content is already cached are adopted instead (the
        request references the cached block; its own copy, never used, goes back to the
        head of the free queue). Returns the number of blocks adopted."""
        limit = computed_tokens // self.block_size
        b = h.blocks
        if b >= limit:
            return 0
        adopted = 0
        node = h.deepest
        root = self.root
        lru = self._lru
        bs = self.block_size
        starts = h.starts
        ids = h.ids
        i = -1  # the segment holding block b's first token, found when a key is first needed
        seg_end = 0
        key: object
        seg: int | None
        while b < limit:
            if (b + 1) * bs <= h.run_end and node.refs == 1 and not node.children and node is not root:
                # Our own leaf run, and the next block is in its segment: extend it.
                run = (h.run_end - b * bs) // bs
                if run > limit - b:
                    run = limit - b
                node.n += run
                b += run
                continue
            p = b * bs
            if i < 0:
                i = bisect_right(starts, p) - 1
                seg_end = starts[i + 1]
            while seg_end <= p:
                i += 1
                seg_end = starts[i + 1]
            if p + bs <= seg_end:  # inside segment i: a run of the segment's full blocks
                seg = ids[i]
                off = p - starts[i]
                key = (seg, off)
                run = (seg_end - p) // bs
                if run > limit - b:
                    run = limit - b
                end = seg_end
            else:  # a block spanning segments, then the run of full blocks after it in its last segment
                end = p + bs
                first = i
                i += 1  # the segment holding the block's last token, where the run after it lies
                seg_end = starts[i + 1]
                if end <= seg_end:  # two pieces, the usual case: its flat key (see _span_key)
                    key = (ids[first], p - starts[first], starts[i] - p, ids[i])
                else:
                    key = _span_key(ids, starts, first, p, end)
                    while seg_end < end:
                        i += 1
                        seg_end = starts[i + 1]
                run = 1 + (seg_end - end) // bs
                if run > limit - b:
                    run = limit - b
                if run > 1:
                    seg = ids[i]
                    off = end - starts[i] - bs  # where its block 0 would start in that segment
                    end = seg_end
                else:
                    seg = None
                    off = end = 0
            child = node.children.get(key) if node.children else None
            if child is not None:
                m = child.n if child.n <= run else run
                if m < child.n:
                    child = self._split(child, m)
                if child.refs == 0:
                    if child.cpu:
                        # Held by the CPU tier only, and just computed again on the GPU: the
                        # request's own blocks become the cached ones (the CPU copies are dropped).
                        del self._cpu_lru[child]
                        child.cpu = False
                        tier = self.tier
                        assert tier is not None  # only a CPU tier holds nodes
                        tier.held -= m
                        child.refs = 1
                        node = child
                        h.run_end = 0
                        b += m
                        continue
                    del lru[child]
                    self.used_blocks += child.n
                child.refs += 1
                adopted += m
                node = child
                h.run_end = 0
                b += m
                continue
            new = _Node(node, key, seg, off, run, 1)
            if node.children is None:
                node.children = {key: new}
            else:
                node.children[key] = new
            node = new
            h.run_end = end
            b += run
        h.deepest = node
        h.blocks = b
        if adopted:
            self._fresh += adopted
            self.used_blocks -= adopted
        return adopted

    def unref(self, h: Holder, computed_tokens: int, *, findable: bool = True, findable_tokens: int | None = None) -> None:
        """Release *h*'s blocks (completion or preemption) holding *computed_tokens* tokens.

        Its remaining full blocks are registered first (its own content is registered
        here, lazily: nobody else can look it up while the request runs). Then its blocks
        join the free queue in vLLM's order, from its last block to its first: its partial
        last block (empty), the full blocks past the tree, and its references dropped from
        the deepest node up (a node joins the queue when its count reaches zero).

        With ``findable=False`` (a finished request that no later request can continue:
        no session, no recompute) the blocks of its own content (past its shared
        segments) are cached without an entry in the tree: one anonymous run in the free
        queue, evicted in the same order. Their content is unique to the request, so no
        lookup could find them anyway. *findable_tokens* limits what stays findable to
        the full blocks among the first that many tokens (``EngineConfig.reusable_prompt_tail``);
        the blocks past them that *h* does not reference in the tree yet become such a run.
        """
        lru = self._lru
        if findable:
            self.register(h, computed_tokens if findable_tokens is None else min(computed_tokens, findable_tokens))
        else:
            self.register_shared(h, computed_tokens)  # shared blocks may match others'
        partial = 1 if computed_tokens % self.block_size else 0
        own = computed_tokens // self.block_size - h.blocks
        if own < 0:
            raise KVCacheError(f"released {computed_tokens} tokens holding {h.blocks} registered blocks")
        ends = self._run_ends
        if partial or own:
            ends.append(ends[-1] + partial + own)
            cached = self._run_cached
            cached.append(cached[-1] + own)
            if len(ends) > self._compact_at:
                self._compact()
        used = self.used_blocks - partial - own
        tail = ends[-1]
        joins_empty = not lru
        node = h.deepest
        parent = node.parent
        while parent is not None:  # up to the root, the one node without a parent (and without blocks)
            node.refs -= 1
            if node.refs == 0:
                node.qpos = tail
                lru[node] = None
                used -= node.n
            node = parent
            parent = node.parent
        self.used_blocks = used
        if joins_empty and lru:
            self._head_qpos = tail  # the nodes that joined lead the queue
        h.deepest = self.root  # it references nothing now
        h.blocks = 0
