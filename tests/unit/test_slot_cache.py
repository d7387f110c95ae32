"""llama.cpp's prompt cache, slot by slot (``simpy_llm.serving.slot_cache``): hand-counted
cases of the checkpoint rule, the slot choice, the host cache's saves and restores, and the
restore cost in the engine (``docs/model.md``, "The prompt cache, slot by slot")."""

from __future__ import annotations

import itertools

import pytest
import simpy

from simpy_llm.config.schema import LlamaCppPreset, SlotCacheConfig
from simpy_llm.entities import Request
from simpy_llm.loading import scenario_from_dict
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.serving.slot_cache import SlotCache, common_prefix_tokens
from simpy_llm.simulation import Simulation
from simpy_llm.workload.prefix import content_segments

GROUP = 7
"""The shared system prompt's segment id (a prefix group's first block hash)."""
NO_HOST = SlotCacheConfig(host_cache_tokens=0, cache_idle_slots=False)
BREAKS = (516, 4)
"""The llama.cpp preset's prefill breaks with n_ubatch 512: where checkpoints are taken."""


def first(rid: int, prompt: int, output: int = 20, shared: int = 120) -> Request:
    """A conversation's first round: *shared* tokens of the system prompt, then its own."""
    return Request(id=rid, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0,
                   prefix_group="sys", prefix_tokens=shared, prefix_blocks=(GROUP,))


def alone(rid: int, prompt: int, output: int = 20) -> Request:
    """A request sharing nothing with anyone."""
    return Request(id=rid, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0)


def after(rid: int, previous: Request, prompt: int, output: int = 20) -> Request:
    """The next round of *previous*'s conversation: its prompt carries the whole previous round."""
    return Request(id=rid, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0,
                   context=tuple(content_segments(previous)))


CLOCK = itertools.count(1.0)
"""Release times, each later than the last: one release a step."""


def run(cache: SlotCache, req: Request, *, release: bool = True):
    """Admit *req*; release it holding its prompt and output less the last token."""
    plan = cache.plan(req)
    cache.admit(req, plan)
    if release:
        cache.release(req, req.prompt_tokens + req.output_tokens - 1, next(CLOCK))
    return plan


# --- checkpoints ----------------------------------------------------------------------------


def test_a_later_round_in_its_slot_finds_its_previous_prompt_less_five():
    """A 300-token prompt leaves a checkpoint 4 tokens before its end (296); the next round,
    whose prompt carries that prompt and its answer, restores it: 295 tokens cached."""
    cache = SlotCache(1, NO_HOST, BREAKS)
    x0 = first(0, 300)
    assert run(cache, x0).checkpoints == (296,)
    plan = run(cache, after(1, x0, 400))
    assert (plan.cached, plan.restored) == (295, False)
    # the restore point (295) and the new prompt's last break (396) join the kept 296
    assert plan.checkpoints == (296, 295, 396)


def test_new_conversations_restore_a_checkpoint_inside_the_system_prompt_one_token_less_each_time():
    """A 600-token prompt leaves checkpoints at 600 - 516 = 84 and 596. A new conversation
    sharing the 120-token system prompt restores 84 (83 cached) and leaves a checkpoint at
    83 where its computation started; the next one restores that (82), and so on: the
    decreasing chain the server showed (91, 90, 89, ... on the shared-prefix trace). The
    newest checkpoint inside the common prefix is restored, not the largest: 83 after 84."""
    cache = SlotCache(1, NO_HOST, BREAKS)
    assert run(cache, first(0, 600)).checkpoints == (84, 596)
    b = run(cache, first(1, 200))
    assert b.cached == 83 and b.checkpoints == (84, 83, 196)
    c = run(cache, first(2, 250))
    assert c.cached == 82 and c.checkpoints == (83, 82, 246)
    assert run(cache, first(3, 180)).cached == 81


def test_no_checkpoint_inside_the_common_prefix_finds_nothing():
    """Prompts shorter than 517 tokens leave no checkpoint inside a 120-token system prompt:
    the next conversation shares 120 tokens but finds none cached, and its checkpoints
    replace all of the earlier ones past its start."""
    cache = SlotCache(1, NO_HOST, BREAKS)
    run(cache, first(0, 300))
    plan = run(cache, first(1, 200))
    assert (plan.cached, plan.checkpoints) == (0, (196,))


def test_without_checkpoints_the_whole_common_prefix_is_found():
    """A model without checkpoints reuses any common prefix: the system prompt (120), or the
    previous round's prompt and answer less its last token (300 + 20 - 1)."""
    cache = SlotCache(1, SlotCacheConfig(host_cache_tokens=0, cache_idle_slots=False, checkpoints=False), BREAKS)
    x0 = first(0, 300)
    run(cache, x0)
    assert cache.plan(first(1, 200)).cached == 120
    assert run(cache, after(2, x0, 400)).cached == 319


def test_a_slot_keeps_its_newest_checkpoints_only():
    """With max_checkpoints 2, a prompt computed from 295 cached tokens (restore point 295,
    break 396) leaves only those two: the earlier 296 is dropped."""
    cache = SlotCache(1, SlotCacheConfig(host_cache_tokens=0, cache_idle_slots=False, max_checkpoints=2), BREAKS)
    x0 = first(0, 300)
    run(cache, x0)
    assert run(cache, after(1, x0, 400)).checkpoints == (295, 396)


def test_an_identical_prompt_still_computes_one_token():
    """Without checkpoints a prompt equal to the slot's whole context finds P - 1 cached."""
    cache = SlotCache(1, SlotCacheConfig(host_cache_tokens=0, cache_idle_slots=False, checkpoints=False))
    x0 = first(0, 300)
    run(cache, x0)
    again = after(1, x0, 319)  # the previous prompt and answer less its last token, exactly
    assert common_prefix_tokens(cache.slots[0].context.segments, content_segments(again)) == 319
    assert cache.plan(again).cached == 318


def test_a_prompt_ending_at_a_checkpoint_computes_its_last_token_and_keeps_that_checkpoint():
    """A prompt equal to the first 295 tokens of a context with a checkpoint at 296 restores
    it (295 tokens), all of the prompt: one token is computed again (294 cached); the
    checkpoint at 296 is not past the restored position and stays, beside the new one at 294."""
    cache = SlotCache(1, NO_HOST, BREAKS)
    x0 = first(0, 300)
    run(cache, x0)
    plan = cache.plan(after(1, x0, 295))
    assert (plan.cached, plan.checkpoints) == (294, (296, 294))


# --- choosing the slot ----------------------------------------------------------------------


def test_an_unused_server_fills_its_slots_from_the_highest():
    """Never-used slots tie as least recently used and llama.cpp takes the last of a tie:
    slot 3 first, then 2 while 3 runs."""
    cache = SlotCache(4, NO_HOST, BREAKS)
    assert run(cache, first(0, 300), release=False).slot.index == 3
    assert run(cache, first(1, 300), release=False).slot.index == 2


def test_the_slot_sharing_most_of_the_prompt_is_chosen_ties_to_the_lower():
    """Slots 2 and 3 hold conversations sharing the 120-token system prompt with a new
    prompt: the tie goes to slot 2; the next round of slot 3's conversation shares more with
    slot 3 and goes there, by similarity."""
    cache = SlotCache(4, NO_HOST, BREAKS)
    a, b = first(0, 300), first(1, 300)
    pa, pb = run(cache, a, release=False), run(cache, b, release=False)
    cache.release(a, 319, next(CLOCK))
    cache.release(b, 319, next(CLOCK))
    assert (pa.slot.index, pb.slot.index) == (3, 2)
    assert cache.plan(first(2, 200)).slot.index == 2
    plan = cache.plan(after(3, a, 400))
    assert (plan.slot.index, plan.by_similarity, plan.cached) == (3, True, 295)


def test_a_prompt_sharing_too_little_goes_to_the_least_recently_used_slot():
    """120 shared tokens of a 1300-token prompt (9 %) are not above the 10 % similarity: the
    least recently used slot is taken (a never-used one, the highest), not the one sharing."""
    cache = SlotCache(4, NO_HOST, BREAKS)
    run(cache, first(0, 300))  # slot 3
    plan = cache.plan(first(1, 1300))
    assert (plan.slot.index, plan.by_similarity) == (2, False)


def test_least_recently_used_is_the_first_released():
    """All four slots used and released in the order 1, 3, 0, 2: an unrelated prompt goes
    to slot 1."""
    cache = SlotCache(4, NO_HOST, BREAKS)
    reqs = [alone(i, 50) for i in range(4)]
    slots = [run(cache, r, release=False).slot.index for r in reqs]
    assert slots == [3, 2, 1, 0]
    for i in (2, 0, 3, 1):  # slots 1, 3, 0, 2
        cache.release(reqs[i], 69, next(CLOCK))
    assert cache.plan(alone(9, 50)).slot.index == 1


def test_similarity_zero_always_takes_the_least_recently_used_slot():
    """prompt_similarity 0: the next round goes to the least recently used slot even though
    another holds its conversation."""
    cache = SlotCache(2, SlotCacheConfig(prompt_similarity=0.0, host_cache_tokens=0, cache_idle_slots=False), BREAKS)
    x0 = first(0, 300)
    run(cache, x0)  # slot 1 (the highest never-used)
    plan = cache.plan(after(1, x0, 400))
    assert (plan.slot.index, plan.by_similarity, plan.cached) == (0, False, 0)


# --- the host cache -----------------------------------------------------------------------------


def test_a_mostly_lost_context_is_saved_and_restored_for_its_conversation():
    """One slot: Y (264-token context) takes X's slot (120 of X's 319 tokens shared, more than
    half lost): X is saved. X's next round is given the slot holding Y (120 of 264 shared:
    more than half lost), saves Y and restores X from the host cache: 295 cached, one restore."""
    cache = SlotCache(1, SlotCacheConfig(cache_idle_slots=False), BREAKS)
    x0 = first(0, 300)
    run(cache, x0)
    y = run(cache, first(1, 260, output=5))
    assert (y.update, y.restored, y.cached) == (True, False, 0)
    assert [e.tokens for e in cache.host] == [319]
    plan = run(cache, after(2, x0, 400))
    assert (plan.update, plan.restored, plan.cached) == (True, True, 295)
    assert [e.tokens for e in cache.host] == [264] and cache.restores == 1


def test_a_slot_holding_a_short_context_is_taken_without_looking_in_the_host_cache():
    """X's slot went to Y, whose context (204 tokens) shares 120 with X's next round, at
    least half of itself: llama.cpp keeps it and never looks in the host cache, so X's next
    round finds nothing although X's context is saved there (the measured "found nothing")."""
    cache = SlotCache(1, SlotCacheConfig(cache_idle_slots=False), BREAKS)
    x0 = first(0, 300)
    run(cache, x0)
    run(cache, first(1, 200, output=5))
    plan = cache.plan(after(2, x0, 400))
    assert (plan.update, plan.restored, plan.cached) == (False, False, 0)
    assert [e.tokens for e in cache.host] == [319]


def test_a_saved_context_keeping_less_than_a_quarter_of_itself_is_not_restored():
    """X's 619-token context shares 120 tokens with a new conversation (19 %): on an empty
    slot that would still beat nothing, but it would keep under a quarter of itself, so it
    stays in the host cache; a 400-token context sharing 120 (30 %) is restored."""
    cfg = SlotCacheConfig(cache_idle_slots=False)
    cache = SlotCache(2, cfg, BREAKS)
    big = first(0, 600)
    run(cache, big, release=False)
    cache.release(big, 619, next(CLOCK))
    run(cache, alone(1, 700, output=1))  # LRU: slot 0 (never used); big's slot 1 stays
    run(cache, alone(2, 650, output=1))  # LRU: slot 1, saving big (619)
    assert [e.tokens for e in cache.host] == [619]
    assert cache.plan(first(3, 200)).restored is False
    cache = SlotCache(2, cfg, BREAKS)
    small = first(0, 381)
    run(cache, small)
    run(cache, alone(1, 700, output=1))
    run(cache, alone(2, 650, output=1))
    plan = cache.plan(first(3, 200))
    assert [e.tokens for e in cache.host] == [400] and plan.restored and plan.cached == 0


def test_idle_slots_are_saved_whenever_a_request_starts():
    """With cache_idle_slots, X's idle slot is saved when an unrelated request starts on the
    other slot; saving it again later changes nothing (contained already)."""
    cache = SlotCache(2, SlotCacheConfig(), BREAKS)
    run(cache, first(0, 300))  # slot 1
    run(cache, alone(1, 50), release=False)  # slot 0: X's slot 1 is idle and saved
    assert [e.tokens for e in cache.host] == [319] and cache.saves == 1
    run(cache, alone(2, 40), release=False)  # slot 1 (LRU, f_keep 0): saving X again is a no-op
    assert cache.saves == 1


def test_the_host_cache_drops_contained_contexts_then_the_oldest():
    """One slot, a host cache of 700 tokens, unrelated prompts taking the slot by least
    recent use. X's next round restores X's saved context (it leaves the host cache); X's
    longer context is saved beside a 61-token one, then another 61-token one; saving a
    319-token context then drops the two oldest (61 + 369 + 61 + 319 > 700, 61 + 319 fits);
    an 819-token context is larger than the cache and is not saved."""
    cache = SlotCache(1, SlotCacheConfig(host_cache_tokens=700, cache_idle_slots=False), BREAKS)

    def host():
        return [e.tokens for e in cache.host]

    x0 = first(0, 300)
    run(cache, x0)
    run(cache, alone(1, 60, output=2))  # saves X0 (319)
    assert host() == [319]
    plan = run(cache, after(2, x0, 350))  # saves the 61-token context, restores X0
    assert plan.restored and plan.cached == 295 and host() == [61]
    run(cache, alone(3, 60, output=2))  # saves X1 (369)
    assert host() == [61, 369]
    run(cache, alone(4, 300))  # saves alone(3)'s 61 tokens
    assert host() == [61, 369, 61]
    run(cache, alone(5, 800))  # saves alone(4)'s 319: the two oldest go
    assert host() == [61, 319]
    run(cache, alone(6, 10, output=2))  # alone(5)'s 819 tokens exceed the cache
    assert host() == [61, 319]


def test_saving_a_context_drops_the_saved_contexts_it_contains():
    """Two slots, idle slots saved: X's context (319) is saved while another request starts;
    X's next round runs in X's slot and leaves a 419-token context that begins with X's; when
    it is saved in turn, X's entry goes (it contains it): the 69-token one and X1's remain."""
    cache = SlotCache(2, SlotCacheConfig(), BREAKS)

    def host():
        return [e.tokens for e in cache.host]

    x0 = first(0, 300)
    run(cache, x0)  # slot 1
    run(cache, alone(1, 50))  # slot 0: X's idle slot is saved
    assert host() == [319]
    plan = run(cache, after(2, x0, 400))  # X's slot, by similarity: alone(1)'s idle slot is saved
    assert (plan.slot.index, plan.cached, plan.restored) == (1, 295, False)
    assert host() == [319, 69]
    run(cache, alone(3, 50), release=False)  # slot 0 (LRU); X1's idle slot is saved, X0's entry dropped
    assert host() == [69, 419]


def test_an_unrelated_prompt_clears_the_least_recently_used_slot():
    """A prompt sharing nothing with the slot's context (below the similarity) drops it when
    nothing better is saved: the slot's checkpoints go too."""
    cache = SlotCache(1, SlotCacheConfig(cache_idle_slots=False), BREAKS)
    run(cache, first(0, 600))
    plan = cache.plan(alone(1, 100))
    assert plan.clear and plan.checkpoints == (96,)


# --- in the engine ----------------------------------------------------------------------------


def _replica(restore_us: float, requests: list[tuple[float, Request]], slots: int = 1) -> Replica:
    engine = LlamaCppPreset(n_parallel=slots, ctx_per_slot=1024, cache_idle_slots=False).engine()
    latency = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0, cache_restore_us=restore_us)
    env = simpy.Environment()
    inbox = simpy.Store(env)
    recorder = Recorder()
    replica = Replica(env, 0, inbox, engine, latency, recorder, fast=True)

    def send(at_s: float, req: Request):
        yield env.timeout(at_s)
        req.arrival_s = env.now
        recorder.on_arrival(req, env.now)
        inbox.put(req)

    for at_s, req in requests:
        env.process(send(at_s, req))
    env.run()
    return replica


def _conversations() -> list[tuple[float, Request]]:
    """X, then Y taking X's slot (X saved), then X's next round restoring X."""
    x0 = first(0, 300, output=5)
    y0 = first(1, 260, output=5)
    x1 = after(2, x0, 400, output=5)
    return [(0.0, x0), (10.0, y0), (20.0, x1)]


def test_a_restore_from_host_memory_costs_cache_restore_us_once():
    """X's next round is restored from host memory: its first token comes exactly 3 ms later
    with cache_restore_us 3000 than with 0 (one restore, in the step admitting it); the two
    rounds found with nothing or in their slot are not delayed at all."""
    slow = _conversations()
    fast = _conversations()
    r_slow = _replica(3000.0, slow)
    _replica(0.0, fast)
    assert r_slow.slot_cache.restores == 1
    assert [r.cached_tokens for _, r in slow] == [0, 0, 295]
    delays_ns = [round(s.first_token_s * 1e9) - round(f.first_token_s * 1e9) for (_, s), (_, f) in zip(slow, fast, strict=True)]
    assert delays_ns == [0, 0, 3_000_000]
    # hand count: 400 - 295 = 105 prompt tokens in two steps (101, then the last 4)
    x1 = slow[2][1]
    step_us = (1000 + 10 * 101 + 3000) + (1000 + 10 * 4)
    assert round(x1.first_token_s * 1e9) == round((20.0 + step_us * 1e-6) * 1e9)


def test_two_restores_in_one_step_cost_twice():
    """Two slots, two conversations displaced by two others, both next rounds arriving at once:
    two restores in the step admitting them, 6 ms with cache_restore_us 3000."""
    def requests():
        x0, z0 = first(0, 300, output=5), first(1, 310, output=5)
        y0, w0 = first(2, 260, output=5), first(3, 270, output=5)
        return [(0.0, x0), (0.0, z0), (10.0, y0), (10.0, w0), (20.0, after(4, x0, 400, output=5)), (20.0, after(5, z0, 420, output=5))]
    slow, fast = requests(), requests()
    r = _replica(3000.0, slow, slots=2)
    _replica(0.0, fast, slots=2)
    assert r.slot_cache.restores == 2
    assert [q.cached_tokens for _, q in slow[4:]] == [295, 305]
    delays_ns = [round(s.first_token_s * 1e9) - round(f.first_token_s * 1e9) for (_, s), (_, f) in zip(slow, fast, strict=True)]
    assert delays_ns == [0, 0, 0, 0, 6_000_000, 6_000_000]


@pytest.mark.parametrize("mode", ["event_per_change", "event_per_step"])
def test_a_scenario_with_the_preset_replays_the_measured_pattern(mode):
    """A llamacpp scenario (4 slots, 120-token system prompt, two-round sessions, one at a
    time): every first round after the first finds nothing (only checkpoints past the system
    prompt), every second round its first round's prompt less 5 tokens."""
    data = {
        "seed": 3,
        "workload": {"aggregate_rate": 0.05, "num_requests": 4, "clients": [{
            "id": "chat", "arrival": {"process": "constant"}, "prefix_group": "sys", "prefix_length": 120,
            "input_distribution": {"type": "constant", "params": {"value": 200}},
            "output_distribution": {"type": "constant", "params": {"value": 10}},
            "multi_turn": {"max_rounds": 2, "think_time": {"type": "constant", "params": {"value": 1.0}}}}]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 2048},
                    "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0, "beta1_us": 10.0, "beta2_us": 100.0}}},
        "simulation": {"mode": mode},
    }
    frame = Simulation(scenario_from_dict(data)).run().to_dataframe().sort_values("request_id")
    firsts = frame[frame["round_index"] == 0]
    seconds = frame[frame["round_index"] == 1].set_index("session_id")
    assert (firsts["cached_tokens"] == 0).all()
    for _, r in firsts.iterrows():
        assert seconds.loc[r["session_id"], "cached_tokens"] == r["prompt_tokens"] - 5
