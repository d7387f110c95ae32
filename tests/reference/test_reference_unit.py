"""Hand-worked timelines of the reference replica model (``tests/reference/replica.py``).

Each test follows one small scenario through the specification ("A replica,
precisely" in ``docs/model.md``) step by step; the expected times are written
as the specification's own formulas (step ``k`` of a segment ends at
``segment start + k * duration``, counted in whole nanoseconds and divided once
into seconds), so they agree with the model to the bit. The walk-through of
each step is in the test's comments.
"""

from __future__ import annotations

import math

from tests.reference.replica import (
    EngineSettings,
    LinearLatency,
    RequestInput,
    request_segments,
    simulate_replica,
)

LAT = LinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
NS = 1_000_000_000


def step(prefill: int, decode: int) -> int:
    """Duration of a step of LAT, ns (whole microseconds here)."""
    return (1000 + 10 * prefill + 100 * decode) * 1000


def t(ns: int) -> float:
    """A clock reading of *ns* nanoseconds, s."""
    return ns / NS


def req(rid: int, prompt: int, output: int, arrival: float = 0.0, **kw) -> RequestInput:
    return RequestInput(request_id=rid, arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, **kw)


def test_lone_request_prefills_then_decodes_one_token_per_step():
    """A lone request enters the queue after alpha(P), is prefilled in one step whose end
    (plus alpha2) is its first token, and decodes one token per step; the decode steps
    form one segment and its completion adds O * alpha2."""
    lat = LinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0, alpha0_us=500.0, alpha1_us=2.0, alpha2_us=50.0)
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=32, kv_block_size=4, kv_num_blocks=16)
    out = simulate_replica([req(0, 10, 3, arrival=0.3)], settings, lat)
    a2 = 50.0 * 1e-6
    enq = 0.3 + (500.0 + 2.0 * 10) * 1e-6  # entering the queue: arrival + alpha(P), in seconds
    enq_ns = 300_520_000  # the engine starts after idle: its clock, rounded to the nanosecond
    assert round(enq * NS) == enq_ns
    end1 = enq_ns + 1 * step(10, 0)  # prefill: a segment of its own
    d = step(0, 1)  # decode steps: a new segment (the prefill finished), then the same one
    end3 = end1 + 2 * d
    r = out.requests[0]
    assert r.status == "completed"
    assert r.enqueue_s == enq and r.first_scheduled_s == enq
    assert r.first_token_s == t(end1) + 1 * a2
    assert r.completion_s == t(end3) + 3 * a2
    assert (r.generated_tokens, r.num_preemptions, r.cached_tokens) == (3, 0, 0)
    assert out.steps == 3 and out.busy_s == t(step(10, 0)) + t(d) + t(d)
    assert out.preemptions == []


def test_chunked_prefill_hands_out_the_budget_step_by_step():
    """With a budget of 8 a 20-token prompt is prefilled in chunks 8, 8, 4 (each step a new
    segment); the step computing the last chunk emits the first token."""
    settings = EngineSettings(max_num_seqs=2, max_num_batched_tokens=8, kv_block_size=4, kv_num_blocks=16)
    out = simulate_replica([req(0, 20, 2)], settings, LAT)
    end1 = 0.0 + step(8, 0)
    end2 = end1 + step(8, 0)
    end3 = end2 + step(4, 0)
    end4 = end3 + step(0, 1)
    r = out.requests[0]
    assert r.first_token_s == t(end3) and r.completion_s == t(end4)
    assert out.steps == 4


def test_without_chunking_a_prompt_waits_until_it_fits_the_budget_whole():
    """Unchunked, B (11 tokens) does not fit the 8 tokens left after A's prefill, so it is
    admitted in step 2 next to A's decode (budget 12 - 1 = 11); it completes there, so
    A's later decode steps start a new segment."""
    settings = EngineSettings(
        max_num_seqs=2, max_num_batched_tokens=12, chunked_prefill=False, kv_block_size=4, kv_num_blocks=16
    )
    out = simulate_replica([req(0, 4, 5), req(1, 11, 1)], settings, LAT)
    end1 = step(4, 0)
    end2 = end1 + step(11, 1)
    d = step(0, 1)
    a, b = out.requests[0], out.requests[1]
    assert b.first_scheduled_s == t(end1) and b.first_token_s == t(end2) and b.completion_s == t(end2)
    assert a.first_token_s == t(end1) and a.completion_s == t(end2 + 3 * d)
    assert out.steps == 5


def _two_decoders(**kw) -> EngineSettings:
    # 4 blocks of 2 tokens: two 3-token prompts fit, but their 5th tokens do not
    return EngineSettings(
        max_num_seqs=2, max_num_batched_tokens=8, kv_block_size=2, kv_num_blocks=4, **kw
    )


def test_preemption_recomputes_the_victim_with_its_generated_tokens():
    """A and B (P=3, O=4) both decode until their 5th tokens need a block each with none
    free: the walk preempts B (largest key), A decodes; B needs 3 blocks for its recompute
    target 3 + 2 = 5 and waits until A completes, then one prefill step emits its 3rd
    token."""
    out = simulate_replica([req(0, 3, 4), req(1, 3, 4)], _two_decoders(prefix_caching=False), LAT)
    end1 = step(6, 0)  # both admitted: 2 + 2 blocks
    end2 = end1 + step(0, 2)  # both decode (token 4 of each sits in its 2nd block)
    d = step(0, 1)
    # end2 + d: B preempted at end2 (a new segment); A decodes its 5th token.
    end4 = end2 + 2 * d  # B does not fit (3 blocks > 1 free); same segment; A completes
    end5 = end4 + step(5, 0)  # B recomputes P + g = 5 tokens, emits token 3
    end6 = end5 + step(0, 1)
    a, b = out.requests[0], out.requests[1]
    assert (a.first_token_s, a.completion_s, a.num_preemptions) == (t(end1), t(end4), 0)
    assert (b.first_scheduled_s, b.first_token_s, b.completion_s) == (0.0, t(end1), t(end6))
    assert (b.num_preemptions, b.generated_tokens) == (1, 4)
    assert out.preemptions == [(1, 0, t(end2), "recompute")]
    assert out.steps == 6
    assert math.isclose(out.busy_s, t(end6))


def test_a_preempted_request_finds_its_own_surviving_blocks_in_the_prefix_cache():
    """With prefix caching B's released blocks stay cached (they join the free queue tail
    first); A's new block pops the queue's head, evicting B's 2nd block, so B's recompute
    finds only its first block (2 tokens) and prefills 3 tokens, not 5; its cached_tokens
    record stays that of its first admission (0)."""
    out = simulate_replica([req(0, 3, 4), req(1, 3, 4)], _two_decoders(prefix_caching=True), LAT)
    end1 = step(6, 0)
    end2 = end1 + step(0, 2)
    d = step(0, 1)
    end4 = end2 + 2 * d  # step 4: B needs 2 new + 1 pinned evictable block > 1 free
    end5 = end4 + step(3, 0)
    end6 = end5 + step(0, 1)
    b = out.requests[1]
    assert b.completion_s == t(end6) and b.num_preemptions == 1
    assert b.cached_tokens == 0
    assert out.requests[0].completion_s == t(end4)


def test_prefix_cache_hit_then_eviction_shortens_a_later_hit():
    """One sequence at a time (max_num_seqs 1), 6 blocks of 4 tokens. A (8 shared + 4 own
    tokens, and a decode token in a 4th block) caches 3 blocks; B finds the 2 shared blocks
    (8 tokens) and takes the 2 never-used blocks. The free queue is then A's partial 4th
    block, A's 3rd, B's partial 4th, B's 3rd, the shared 2nd and 1st: C's 20 unique tokens
    pop the first 5 (evicting A's 3rd, B's 3rd and the shared 2nd), and D finds only the
    shared 1st block (4 tokens)."""
    sys = ("sys", 0)
    a = req(0, 12, 2, segments=((sys, 8), (("u", 0), 4), (("o", 0), 2)))
    b = req(1, 13, 1, segments=((sys, 8), (("u", 1), 5), (("o", 1), 1)))
    c = req(2, 20, 1)
    d = req(3, 12, 1, segments=((sys, 8), (("u", 3), 4), (("o", 3), 1)))
    settings = EngineSettings(max_num_seqs=1, max_num_batched_tokens=24, kv_block_size=4, kv_num_blocks=6)
    out = simulate_replica([a, b, c, d], settings, LAT)
    end1 = step(12, 0)  # A: nothing cached
    end2 = end1 + step(0, 1)  # A decodes its last token (13th token: a 4th block)
    end3 = end2 + step(13 - 8, 0)  # B: 8 cached, computes 5
    end4 = end3 + step(20, 0)  # C: 5 blocks = 2 empty + 3 evicted
    end5 = end4 + step(12 - 4, 0)  # D: 4 cached, computes 8
    rec = out.requests
    assert [rec[i].cached_tokens for i in range(4)] == [0, 8, 0, 4]
    assert [rec[i].first_scheduled_s for i in range(4)] == [0.0, t(end2), t(end3), t(end4)]
    assert [rec[i].completion_s for i in range(4)] == [t(end2), t(end3), t(end4), t(end5)]


def test_a_request_admitted_after_another_in_the_same_step_finds_its_scheduled_blocks():
    """A and B (8 shared + 4 own tokens, blocks of 4) reach an idle replica together. A is
    admitted first and its 2 shared blocks are cached as its step is scheduled, so B,
    admitted next in the same step, finds them (8 tokens) and computes its 4 own tokens:
    the step has 12 + 4 prefill tokens, and C (8 tokens) fits its budget and blocks too."""
    sys = ("sys", 0)
    a = req(0, 12, 2, segments=((sys, 8), (("u", 0), 4), (("o", 0), 2)))
    b = req(1, 12, 2, segments=((sys, 8), (("u", 1), 4), (("o", 1), 2)))
    c = req(2, 8, 1)
    settings = EngineSettings(max_num_seqs=3, max_num_batched_tokens=24, kv_block_size=4, kv_num_blocks=8)
    out = simulate_replica([a, b, c], settings, LAT)
    end1 = step(12 + 4 + 8, 0)
    end2 = end1 + step(0, 2)
    rec = out.requests
    assert [rec[i].cached_tokens for i in range(3)] == [0, 8, 0]
    assert [rec[i].first_scheduled_s for i in range(3)] == [0.0, 0.0, 0.0]
    assert rec[2].completion_s == t(end1)
    assert rec[0].completion_s == t(end2) and rec[1].completion_s == t(end2)


def test_a_block_cached_by_another_request_first_is_adopted_and_its_copy_freed():
    """Blocks of 4, 8 of them, 16 shared + 4 own tokens each, a budget of 16 and a prefill
    break 12 tokens before the end. Step 1: A's chunk stops at the break (8 tokens, shared
    blocks 1-2); B, admitted next, finds them and computes tokens 8-15 (shared blocks 3-4,
    cached by B). Step 2: A's chunk of 12 computes shared blocks 3-4 too, finds them cached
    and references B's (its 2 copies go back to the free queue), and B computes its 4 own
    tokens: 6 blocks are held, not 8, so in step 3 both decode tokens get a new block each
    and nobody is preempted."""
    sys = ("sys", 0)
    a = req(0, 20, 2, segments=((sys, 16), (("u", 0), 4), (("o", 0), 2)))
    b = req(1, 20, 2, segments=((sys, 16), (("u", 1), 4), (("o", 1), 2)))
    settings = EngineSettings(
        max_num_seqs=2, max_num_batched_tokens=16, kv_block_size=4, kv_num_blocks=8, prefill_breaks=(12,)
    )
    out = simulate_replica([a, b], settings, LAT)
    end1 = step(8 + 8, 0)
    end2 = end1 + step(12 + 4, 0)
    end3 = end2 + step(0, 2)
    rec = out.requests
    assert [rec[i].cached_tokens for i in range(2)] == [0, 8]
    assert out.preemptions == []
    assert [rec[i].first_token_s for i in range(2)] == [t(end2), t(end2)]
    assert [rec[i].completion_s for i in range(2)] == [t(end3), t(end3)]


def test_allocation_pops_the_head_of_the_free_queue_even_past_an_empty_block():
    """4 blocks of 4 tokens, one request at a time, one output token each. A (8 shared
    tokens and 1 own) takes 3 fresh blocks and releases its partial block, then its shared
    2nd and 1st; B (2 tokens) takes the last fresh block and releases it, empty, behind
    them. D (8 own tokens) pops A's partial block and the shared 2nd block (evicting it)
    although B's empty block is free, so E (A's shared 8 tokens and 1 own) finds 4 tokens."""
    sys = ("sys", 0)
    a = req(0, 9, 1, segments=((sys, 8), (("u", 0), 1), (("o", 0), 1)))
    b = req(1, 2, 1, arrival=1.0)
    d = req(2, 8, 1, arrival=2.0)
    e = req(3, 9, 1, arrival=3.0, segments=((sys, 8), (("u", 3), 1), (("o", 3), 1)))
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=16, kv_block_size=4, kv_num_blocks=4)
    out = simulate_replica([a, b, d, e], settings, LAT)
    assert [out.requests[i].cached_tokens for i in range(4)] == [0, 0, 0, 4]
    assert out.requests[3].completion_s == t(3 * NS + step(9 - 4, 0))


def test_lookup_leaves_the_last_prompt_token_to_compute():
    """A prompt fully in the cache is looked up only over its first P - 1 tokens: with
    blocks of 4 a 12-token repeat finds 8 tokens (it recomputes its 3rd block, then
    references the cached copy), a 13-token prompt sharing those 12 tokens finds all 12."""
    shared = ((("sys", 0), 8), (("u", 0), 4))
    first = req(0, 12, 1, segments=(*shared, (("o", 0), 1)))
    repeat = req(1, 12, 1, segments=(*shared, (("o", 1), 1)))
    longer = req(2, 13, 1, segments=(*shared, (("x", 2), 1), (("o", 2), 1)))
    settings = EngineSettings(max_num_seqs=1, max_num_batched_tokens=24, kv_block_size=4, kv_num_blocks=6)
    out = simulate_replica([first, repeat, longer], settings, LAT)
    assert [out.requests[i].cached_tokens for i in range(3)] == [0, 8, 12]
    end1 = step(12, 0)
    end2 = end1 + step(4, 0)
    end3 = end2 + step(1, 0)
    assert [out.requests[i].completion_s for i in range(3)] == [t(end1), t(end2), t(end3)]


def test_a_sessions_next_round_finds_the_previous_prompt_and_answer():
    """Round 1 (P=4, O=5, blocks of 4) computes 8 tokens: its prompt block and a block its
    decode steps filled, both cached on completion; round 2 (round 1's 9 tokens plus a
    3-token question) finds both (8 tokens)."""
    first_segments = request_segments(0, 4, 5)
    r1 = req(0, 4, 5, segments=first_segments)
    r2 = req(1, 12, 1, arrival=1.0, segments=request_segments(1, 12, 1, context=first_segments))
    settings = EngineSettings(max_num_seqs=2, max_num_batched_tokens=16, kv_block_size=4, kv_num_blocks=8)
    out = simulate_replica([r1, r2], settings, LAT)
    assert out.requests[1].cached_tokens == 8
    assert out.requests[1].completion_s == t(1 * NS + step(12 - 8, 0))


def test_swap_copies_the_victim_out_and_back_and_charges_the_copies():
    """The preemption of the recompute test under swap: B's 4 computed tokens go to CPU
    swap (the preempting step pays their copy). Back at admission B resumes at 4 tokens
    but needs blocks for all 5 (3 > 1 free) so it waits for A; then it copies 4 tokens
    back and computes 1, and that step pays the copy."""
    settings = _two_decoders(
        prefix_caching=False,
        preemption_mode="swap",
        swap_space_blocks=4,
        swap_kv_bytes_per_token=1_000_000.0,
        swap_bandwidth_gb_per_s=1.0,
    )
    out = simulate_replica([req(0, 3, 4), req(1, 3, 4)], settings, LAT)
    copy4 = 4_000_000  # 4 tokens of 1 MB at 1 GB/s: 4 ms, in ns
    end1 = step(6, 0)
    end2 = end1 + step(0, 2)
    end3 = end2 + (step(0, 1) + copy4)  # B swapped out at end2
    end4 = end3 + step(0, 1)  # a different duration: a new segment; A completes
    end5 = end4 + (step(1, 0) + copy4)  # B swapped in, computes its 5th token, emits token 3
    end6 = end5 + step(0, 1)
    a, b = out.requests[0], out.requests[1]
    assert a.completion_s == t(end4)
    assert (b.first_token_s, b.completion_s, b.num_preemptions) == (t(end1), t(end6), 1)
    assert out.preemptions == [(1, 0, t(end2), "swap")]
    assert out.steps == 6


def test_swap_without_space_falls_back_to_recompute():
    """With one swap block B's 4 tokens (2 blocks) cannot be copied out: it is recomputed,
    exactly as under preemption_mode recompute."""
    swap = _two_decoders(
        prefix_caching=False, preemption_mode="swap", swap_space_blocks=1,
        swap_kv_bytes_per_token=1_000_000.0, swap_bandwidth_gb_per_s=1.0,
    )
    recompute = _two_decoders(prefix_caching=False)
    reqs = [req(0, 3, 4), req(1, 3, 4)]
    a, b = simulate_replica(reqs, swap, LAT), simulate_replica(reqs, recompute, LAT)
    assert a.requests == b.requests
    assert [p[3] for p in a.preemptions] == ["recompute"]


def test_the_victim_is_the_running_request_with_the_largest_key():
    """Under a priority key (smaller first) the later, more important request B is kept and
    the earlier admitted A is preempted, unlike FCFS."""

    class ByPriority:
        def key(self, request, now_s):
            return -request.priority

    reqs = [req(0, 3, 4, priority=0), req(1, 3, 4, priority=5)]
    out = simulate_replica(reqs, _two_decoders(prefix_caching=False), LAT, ByPriority())
    assert [p[0] for p in out.preemptions] == [0]


def test_until_s_keeps_planned_admissions_but_not_the_step_in_progress():
    """A step ending exactly at until_s has not happened (its token is not emitted, it is
    not counted), while the admission it planned has; a request entering the queue at or
    after until_s never enters it."""
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=32, kv_block_size=4, kv_num_blocks=16)
    end1 = t(step(10, 0))
    until = t(step(10, 0) + step(5, 1))  # the end of step 2 (A decodes, B is admitted)
    out = simulate_replica([req(0, 10, 3), req(1, 5, 1, arrival=end1), req(2, 5, 1, arrival=until)], settings, LAT, until_s=until)
    a, b, c = out.requests[0], out.requests[1], out.requests[2]
    assert (a.status, a.generated_tokens, a.first_token_s) == ("in_flight", 1, end1)
    assert math.isnan(a.completion_s)
    assert (b.status, b.first_scheduled_s, b.generated_tokens) == ("in_flight", end1, 0)
    assert c.status == "in_flight" and math.isnan(c.enqueue_s)
    assert out.steps == 1 and out.busy_s == end1


def _post_processed(until_s: float):
    """One request (P = 10, O = 3) at 0 s, 0.1 s of post-processing per token: its steps end
    at 1.1, 2.2 and 3.3 ms, its first token reaches the client at 101.1 ms, its answer at
    3.3 ms + 0.3 s."""
    lat = LinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0, alpha2_us=100_000.0)
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=32, kv_block_size=4, kv_num_blocks=16)
    return simulate_replica([req(0, 10, 3)], settings, lat, until_s=until_s).requests[0]


def test_an_answer_post_processed_after_until_s_is_in_flight():
    """All three steps end before until_s = 0.2 s, but the answer reaches the client at
    0.3033 s: the request is in flight with its 3 tokens and its first token (0.1011 s)."""
    a2 = 100_000.0 * 1e-6  # alpha2 in seconds, as the latency model states it
    r = _post_processed(0.2)
    assert (r.status, r.generated_tokens, r.first_token_s) == ("in_flight", 3, t(step(10, 0)) + a2)
    assert math.isnan(r.completion_s)
    done = _post_processed(0.4)
    assert (done.status, done.completion_s) == ("completed", t(step(10, 0) + 2 * step(0, 1)) + 3 * a2)


def test_a_first_token_post_processed_after_until_s_is_not_recorded():
    """With until_s = 0.05 s the first token (seen at 0.1011 s) has not reached the client."""
    r = _post_processed(0.05)
    assert (r.status, r.generated_tokens) == ("in_flight", 3)
    assert math.isnan(r.first_token_s) and math.isnan(r.completion_s)


def test_an_entry_at_a_step_end_written_in_decimal_is_seen_by_that_step():
    """5 ms steps (4,900 µs + 1 µs per prompt token of 100, or + 100 µs per decode token):
    A enters at 35.448384 s, its prefill ends at 35.453384 s and its 7th decode step at
    35.488384 s, when B enters; the clock counts nanoseconds, so that step end is B's entry
    time to the bit and B is admitted into the step planned there."""
    lat = LinearLatency(beta0_us=4900.0, beta1_us=1.0, beta2_us=100.0)
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=128, kv_block_size=4, kv_num_blocks=256)
    out = simulate_replica([req(0, 100, 20, arrival=35.448384), req(1, 10, 1, arrival=35.488384)], settings, lat)
    b = out.requests[1]
    assert b.first_scheduled_s == 35.488384
    assert b.completion_s == t(35_488_384_000 + (4900 + 10 + 100) * 1000)


def test_a_request_longer_than_max_model_len_is_dropped_on_arrival():
    """P + O > max_model_len: dropped at once, never enqueued."""
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=32, kv_block_size=4, kv_num_blocks=16, max_model_len=12)
    out = simulate_replica([req(0, 10, 3), req(1, 10, 2)], settings, LAT)
    assert out.requests[0].status == "dropped" and math.isnan(out.requests[0].enqueue_s)
    assert out.requests[1].status == "completed"


def test_segments_of_a_prefix_request_and_of_a_later_round():
    """A prefix request: one segment per prefix hash, the last cut to the prefix length; a
    later round: the previous round's whole sequence, then its own question and output."""
    first = request_segments(7, 30, 5, prefix_hashes=(11, 22), prefix_block_tokens=16, prefix_tokens=20)
    assert first == ((("prefix", 11), 16), (("prefix", 22), 4), (("prompt", 7), 10), (("output", 7), 5))
    later = request_segments(9, 45, 2, context=first)
    assert later == (*first, (("prompt", 9), 10), (("output", 9), 2))
