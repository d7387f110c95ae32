"""The prefix cache as vLLM's V1 engine keeps it, hand-counted: full blocks are findable
from the moment the step computing them is scheduled, and allocation pops the head of
one LRU free queue in which every released block (cached or not) takes its place."""

from __future__ import annotations

import pytest
import simpy

from simpy_llm.config.schema import EngineConfig
from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.serving.prefix_cache import Holder, PrefixCache

NS = 1_000_000_000
LATENCY = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)


def _run(engine: EngineConfig, requests: list[tuple[Request, float]], fast: bool) -> Recorder:
    """Send each request to one replica at its time and run to the end."""
    env = simpy.Environment()
    inbox = simpy.Store(env)
    recorder = Recorder()
    Replica(env, 0, inbox, engine, LATENCY, recorder, fast=fast)

    def send(req: Request, at_s: float):
        yield env.timeout(at_s)
        req.arrival_s = env.now
        recorder.on_arrival(req, env.now)
        inbox.put(req)

    for req, at_s in requests:
        env.process(send(req, at_s))
    env.run()
    return recorder


def _group_request(rid: int, prompt: int = 1600, output: int = 2) -> Request:
    """A request of prefix group ``g`` whose first 1,500 prompt tokens are the group's."""
    return Request(
        id=rid, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0,
        prefix_group="g", prefix_tokens=1500, prefix_blocks=(7,),
    )


@pytest.mark.parametrize("fast", [True, False])
def test_a_burst_sharing_a_prefix_finds_it_in_the_step_that_schedules_it(fast):
    """Eight requests sharing a 1,500-token prefix reach an idle replica at once: the first
    one admitted schedules the whole prefix, whose 93 full blocks (1,488 tokens) are
    findable at once, so the seven admitted after it in the same step find them and compute
    only their own 112 tokens: one step of 1,600 + 7 x 112 prefill tokens."""
    engine = EngineConfig(max_num_seqs=8, max_num_batched_tokens=16384, kv_block_size=16, kv_num_blocks=4096)
    reqs = [_group_request(i) for i in range(8)]
    rec = _run(engine, [(r, 0.0) for r in reqs], fast)
    assert [r.cached_tokens for r in reqs] == [0] + [1488] * 7
    prefill_tokens = 1600 + 7 * (1600 - 1488)
    assert rec.prefill_tokens[0] == prefill_tokens + 8 * 0  # decode steps add no prefill
    first_token_s = (1000 + 10 * prefill_tokens) * 1000 / NS
    assert [r.first_token_s for r in reqs] == [first_token_s] * 8


@pytest.mark.parametrize("fast", [True, False])
def test_a_request_arriving_during_a_chunked_prefill_finds_the_chunk_being_computed(fast):
    """With a budget of 1,000 tokens the first request's 1,600-token prompt is prefilled in
    chunks of 1,000 and 600. A second request of the same prefix group arrives during the
    first chunk and is admitted in the step of the second chunk (400 tokens of budget left),
    after that chunk was scheduled: it finds all 93 prefix blocks (1,488 tokens), not only
    the 62 blocks (992 tokens) the first chunk filled."""
    engine = EngineConfig(max_num_seqs=8, max_num_batched_tokens=1000, kv_block_size=16, kv_num_blocks=4096)
    a, b = _group_request(0), _group_request(1)
    _run(engine, [(a, 0.0), (b, 0.005)], fast)
    assert a.cached_tokens == 0
    assert b.first_scheduled_s == (1000 + 10 * 1000) * 1000 / NS  # the end of a's first chunk
    assert b.cached_tokens == 1488


@pytest.mark.parametrize("fast", [True, False])
def test_requests_sharing_a_context_find_it_as_the_first_one_computes_it(fast):
    """Two parallel calls carrying the same 48-token context (an earlier request's prompt
    and answer, no longer cached) and 10 tokens of their own reach an idle replica at once:
    the first computes the context and its 3 blocks of 16 are findable as that step is
    scheduled, so the second, admitted next in the same step, finds all 48 tokens."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, kv_block_size=16, kv_num_blocks=64)
    context = ((-100, 40), (-99, 8))  # request 49's prompt tail and answer
    a, b = (
        Request(id=i, client_id="c", prompt_tokens=58, output_tokens=2, arrival_s=0.0, context=context)
        for i in (0, 1)
    )
    rec = _run(engine, [(a, 0.0), (b, 0.0)], fast)
    assert (a.cached_tokens, b.cached_tokens) == (0, 48)
    assert rec.prefill_tokens[0] == 58 + 10


def _shared(rid: int, prompt: int) -> Request:
    """A request whose first 8 tokens are the trace blocks 5 and 6 (4 tokens each)."""
    return Request(
        id=rid, client_id="c", prompt_tokens=prompt, output_tokens=1, arrival_s=0.0,
        prefix_tokens=8, prefix_blocks=(5, 6), prefix_block_tokens=4,
    )


def _own(rid: int, prompt: int) -> Request:
    return Request(id=rid, client_id="c", prompt_tokens=prompt, output_tokens=1, arrival_s=0.0)


@pytest.mark.parametrize("fast", [True, False])
def test_eviction_pops_the_head_of_one_lru_queue_of_released_blocks(fast):
    """Four blocks of 4 tokens, one request at a time (each has one output token, so it
    completes in its prefill step). The free queue, head first:

    * A (9 tokens: shared blocks 5, 6 and a partial block) takes 3 of the 4 fresh blocks and
      releases them partial first, then its blocks from last to first: [fresh, A's partial,
      6, 5];
    * B (2 tokens) takes the fresh block and releases its partial one: [A's partial, 6, 5,
      B's partial];
    * D (8 tokens of its own) needs 2 blocks: A's partial and block 6, which is evicted,
      although B's partial block is empty (an allocation that took empty blocks first would
      evict nothing);
    * E (A's 8 shared tokens and one more) then finds block 5 only: 4 cached tokens.
    """
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, kv_block_size=4, kv_num_blocks=4)
    a, b, d, e = _shared(0, 9), _own(1, 2), _own(2, 8), _shared(3, 9)
    _run(engine, [(a, 0.0), (b, 1.0), (d, 2.0), (e, 3.0)], fast)
    assert [r.cached_tokens for r in (a, b, d, e)] == [0, 0, 0, 4]
    assert all(r.completion_s == r.completion_s for r in (a, b, d, e))


def test_allocation_takes_the_queue_head_even_when_a_later_released_block_is_empty():
    """At the cache level: a request holding 2 shared blocks and a partial block releases
    them (partial first, then tail to head); a private block released after them is at the
    queue's tail, so taking 2 blocks pops the first request's partial block and evicts its
    tail block (the cache still holds the head block), leaving the later empty block free."""
    cache = PrefixCache(num_blocks=4, block_size=4)
    a = _shared(0, 9)
    ha = cache.holder(a)
    cache.pin(ha, cache.match(ha, 2))
    cache.allocate(3)
    cache.register(ha, 9)
    cache.allocate(1)  # the fresh block, held privately by a request without a holder
    cache.unref(ha, 9)
    cache.release_own(2)  # that request (2 tokens) ends: its partial block joins the tail
    assert (cache.empty, cache.evictable, cache.cached_blocks) == (2, 2, 2)
    cache.allocate(2)
    assert (cache.empty, cache.evictable, cache.cached_blocks) == (1, 1, 1)
    e = cache.holder(_shared(3, 9))
    assert cache.match(e, 2).blocks == 1


def test_releases_of_content_nobody_can_find_keep_the_free_queue_as_long_as_its_runs():
    """10,000 requests of their own content (released without a holder) churn a 64-block
    cache: the free queue keeps no tree node, and the runs it remembers (two integers per
    release) are dropped once taken, so they stay within twice the runs a full queue can
    hold, while the counts stay exact (every full block released is cached until taken)."""
    cache = PrefixCache(num_blocks=64, block_size=4)
    longest = 0
    for k in range(10_000):
        tokens = 1 + k % 23  # 1 to 6 blocks, the last one partial unless a multiple of 4
        cache.allocate(-(-tokens // 4))
        cache.release_own(tokens)
        longest = max(longest, len(cache._run_ends))  # noqa: SLF001 - the queue's own bookkeeping
    assert not cache._lru  # noqa: SLF001 - no tree node ever queued
    assert longest <= 2 * 64 + 65
    assert (cache.used_blocks, cache.free_blocks) == (0, 64)
    assert cache.empty + cache.evictable == 64 and cache.cached_blocks == cache.evictable


def test_allocation_takes_queued_blocks_in_release_order_around_a_prefix_taken_back_by_a_hit():
    """The free queue holds, after its fresh blocks, a request's own blocks (unfindable) and
    then a cached prefix; a hit takes the prefix back out of the queue, so allocations take
    the fresh and unfindable blocks and never the prefix while it is held. Released again
    behind another unfindable block, the prefix is evicted only once that block is taken,
    its tail block first."""
    cache = PrefixCache(num_blocks=8, block_size=4)
    cache.allocate(2)
    cache.release_own(8)  # two blocks of content nobody can look up
    first = Holder([(1, 8)])
    first.deepest = cache.root
    cache.pin(first, cache.match(first, 2))
    cache.allocate(2)
    cache.register(first, 8)
    cache.unref(first, 8)  # the prefix (1, 8): two cached blocks, queued after the two unfindable ones
    assert (cache.free_blocks, cache.evictable, cache.cached_blocks) == (8, 4, 4)

    hit = Holder([(1, 8), (-5, 4)])
    found = cache.match(hit, 2)
    assert (found.blocks, found.evictable) == (2, 2)
    cache.pin(hit, found)  # the prefix leaves the queue
    cache.allocate(1)
    cache.register(hit, 12)
    cache.allocate(5)  # the three fresh blocks left, then the two unfindable ones
    assert (cache.free_blocks, cache.evictable, cache.used_blocks) == (0, 0, 8)
    assert cache.match(Holder([(1, 8)]), 2).blocks == 2

    cache.unref(hit, 12, findable=False)  # its own block (unfindable) queues first, then the prefix
    assert (cache.free_blocks, cache.evictable) == (3, 3)
    cache.allocate(1)  # the unfindable block
    assert cache.match(Holder([(1, 8)]), 2).blocks == 2
    cache.allocate(1)  # the prefix's tail block
    assert cache.match(Holder([(1, 8)]), 2).blocks == 1
    cache.allocate(1)
    assert cache.match(Holder([(1, 8)]), 2).blocks == 0
    assert (cache.free_blocks, cache.cached_blocks) == (0, 0)


def _tree_nodes(cache: PrefixCache) -> list[tuple[object, int]]:
    """Every node below the root as (key, blocks), depth first."""
    out = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        if node is not cache.root:
            out.append((node.key, node.n))
        if node.children:
            stack.extend(node.children.values())
    return out


def _admit(cache: PrefixCache, segs: list[tuple[int, int]]) -> tuple[Holder, int]:
    """Look *segs* up, pin what is found, allocate and register the rest; the blocks found."""
    h = Holder(segs)
    total = h.total
    m = cache.match(h, total // cache.block_size)
    cache.pin(h, m)
    cache.allocate(-(-total // cache.block_size) - m.blocks)
    cache.register(h, total)
    return h, m.blocks


def test_a_block_spanning_two_segments_and_the_run_after_it_are_one_node():
    """Content of 6 tokens of segment 1 then 14 of segment 2 (blocks of 4) is two nodes:
    segment 1's one full block, and the block spanning the two segments together with the
    three full blocks after it in segment 2; the same content is then found whole."""
    cache = PrefixCache(num_blocks=32, block_size=4)
    _admit(cache, [(1, 6), (2, 14)])
    assert set(_tree_nodes(cache)) == {((1, 0), 1), ((1, 4, 2, 2), 4)}
    second = Holder([(1, 6), (2, 14), (-9, 3)])
    assert cache.match(second, 5).blocks == 5


def test_a_lookup_ending_inside_a_spanning_node_splits_it_and_both_contents_stay_findable():
    """A second content sharing the spanning block but not the blocks after it (its segment
    2 is 3 tokens, then segment 3) finds 2 blocks, splits the node after its spanning block
    and adds its own; after both release, each content is still found whole and the cache
    holds each distinct block once."""
    cache = PrefixCache(num_blocks=32, block_size=4)
    a_segs = [(1, 6), (2, 14)]
    b_segs = [(1, 6), (2, 3), (3, 10)]
    a, _ = _admit(cache, a_segs)
    b, found = _admit(cache, b_segs)
    assert found == 2
    assert cache.used_blocks == 5 + 3  # b's blocks past the shared two: [8, 12), [12, 16), [16, 19)
    cache.unref(a, 20)
    cache.unref(b, 19)
    assert cache.used_blocks == 0
    assert cache.cached_blocks == 5 + 2  # b's partial last block is not cached
    assert cache.match(Holder([*a_segs, (-1, 1)]), 5).blocks == 5
    assert cache.match(Holder([*b_segs, (-2, 1)]), 4).blocks == 4
    assert cache.match(Holder([(1, 6), (2, 10), (-3, 5)]), 5).blocks == 4  # segment 2 shorter: its blocks up to its end
