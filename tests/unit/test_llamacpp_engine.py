"""The llama.cpp engine preset and the engine features it maps onto: forward passes of
``ubatch_tokens``, prefill breaks, and a finished request's reusable prompt tail."""

from __future__ import annotations

import pytest
import simpy

from simpy_llm.config import ScenarioError
from simpy_llm.config.schema import (
    REUSABLE_PROMPT_TAIL,
    EngineConfig,
    LlamaCppPreset,
    SlotCacheConfig,
)
from simpy_llm.entities import Request
from simpy_llm.loading import load_scenario, scenario_from_dict
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.simulation import Simulation

LATENCY = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)


def _run(engine: EngineConfig, requests: list[tuple[float, Request]], fast: bool, latency=LATENCY) -> Replica:
    env = simpy.Environment()
    inbox = simpy.Store(env)
    recorder = Recorder()
    replica = Replica(env, 0, inbox, engine, latency, recorder, fast=fast)

    def send(at_s: float, req: Request):
        yield env.timeout(at_s)
        req.arrival_s = env.now
        recorder.on_arrival(req, env.now)
        inbox.put(req)

    for at_s, req in requests:
        env.process(send(at_s, req))
    env.run()
    return replica


def _request(rid: int, prompt: int, output: int, **fields) -> Request:
    return Request(id=rid, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=0.0, **fields)


def test_preset_maps_llamacpp_options_onto_the_engine():
    """Slots are the batch, the slot context the model length, n_batch the step budget,
    n_ubatch the forward pass; KV is one-token blocks for every slot; the prompt cache is
    the slot cache, with the host cache's tokens and the server's defaults."""
    e = LlamaCppPreset(n_parallel=3, ctx_per_slot=1000, n_batch=256, n_ubatch=64, cache_ram_tokens=500).engine()
    assert (e.max_num_seqs, e.max_model_len, e.max_num_batched_tokens, e.ubatch_tokens) == (3, 1000, 256, 64)
    assert (e.kv_block_size, e.kv_num_blocks, e.prefix_caching, e.chunked_prefill) == (1, 3000, True, True)
    assert e.prefill_breaks == (68, 4) and e.reusable_prompt_tail is None
    assert e.slot_cache == SlotCacheConfig(prompt_similarity=0.1, host_cache_tokens=500, cache_idle_slots=True, checkpoints=True, max_checkpoints=32)
    assert e.scheduler.kind == "fcfs" and e.preemption_mode == "recompute"


def test_preset_radix_cache_model_keeps_the_earlier_mapping():
    """cache_model radix: no slot cache; one-token blocks for every slot plus the host cache,
    shared by the radix prefix cache, and the reusable prompt tail of a checkpointed model."""
    e = LlamaCppPreset(n_parallel=3, ctx_per_slot=1000, n_batch=256, n_ubatch=64, cache_ram_tokens=500, cache_model="radix").engine()
    assert e.slot_cache is None and e.kv_num_blocks == 3 * 1000 + 500 and e.prefix_caching
    assert e.prefill_breaks == (68, 4) and e.reusable_prompt_tail == REUSABLE_PROMPT_TAIL


def test_preset_passes_the_slot_options_on():
    """slot_prompt_similarity, cache_idle_slots and ctx_checkpoints reach the slot cache;
    without checkpoints any common prefix is reusable; without host cache no idle slot is saved."""
    e = LlamaCppPreset(n_parallel=2, ctx_per_slot=512, slot_prompt_similarity=0.5, cache_idle_slots=False, ctx_checkpoints=3).engine()
    assert (e.slot_cache.prompt_similarity, e.slot_cache.cache_idle_slots, e.slot_cache.max_checkpoints) == (0.5, False, 3)
    plain = LlamaCppPreset(n_parallel=2, ctx_per_slot=512, prompt_checkpoints=False).engine()
    assert not plain.slot_cache.checkpoints and plain.prefill_breaks == ()
    no_host = LlamaCppPreset(n_parallel=2, ctx_per_slot=512, cache_ram_tokens=0).engine()
    assert no_host.slot_cache.host_cache_tokens == 0 and not no_host.slot_cache.cache_idle_slots


def test_preset_clamps_batch_sizes_to_the_context_as_llamacpp_does():
    """n_batch is at most the total context and n_ubatch at most n_batch; the breaks follow."""
    e = LlamaCppPreset(n_parallel=1, ctx_per_slot=300, n_batch=2048, n_ubatch=512).engine()
    assert (e.max_num_batched_tokens, e.ubatch_tokens, e.prefill_breaks) == (300, 300, (300, 4))


def test_preset_without_checkpoints_or_cache_has_no_breaks_and_keeps_no_prompts():
    """prompt_checkpoints false: no prefill breaks, whole content reusable; cache_prompt false:
    no prefix cache and no host cache blocks."""
    e = LlamaCppPreset(n_parallel=2, ctx_per_slot=512, prompt_checkpoints=False).engine()
    assert e.prefill_breaks == () and e.reusable_prompt_tail is None and e.prefix_caching
    off = LlamaCppPreset(n_parallel=2, ctx_per_slot=512, cache_prompt=False).engine()
    assert not off.prefix_caching and off.kv_num_blocks == 1024 and off.reusable_prompt_tail is None


def test_preset_in_a_scenario_and_its_errors():
    """``engine: {preset: llamacpp, ...}`` loads; unknown presets and keys, and impossible
    settings, are errors naming the key path."""
    base = {
        "workload": {"aggregate_rate": 1.0, "num_requests": 5, "clients": [{"id": "a", "arrival": {"process": "poisson"},
                     "input_distribution": {"type": "constant", "params": {"value": 20}},
                     "output_distribution": {"type": "constant", "params": {"value": 5}}}]},
        "serving": {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0}}},
    }
    ok = scenario_from_dict({**base, "serving": {**base["serving"], "engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 256}}})
    assert ok.serving.engine.max_num_seqs == 2
    cases = [
        ({"preset": "tgi"}, "serving.engine.preset", "unknown engine preset 'tgi'; one of: vllm, llamacpp"),
        ({"preset": "llamacpp", "max_num_seqs": 4}, "serving.engine.max_num_seqs", "unknown key"),
        ({"preset": "llamacpp", "n_parallel": 8, "n_batch": 4}, "serving.engine.n_batch", "must be >= n_parallel"),
        ({"preset": "vllm", "n_parallel": 2}, "serving.engine.n_parallel", "unknown key"),
        ({"chunked_prefill": False, "prefill_breaks": [4]}, "serving.engine.prefill_breaks", "needs chunked_prefill"),
        ({"prefill_breaks": [4, 0]}, "serving.engine.prefill_breaks[1]", "must be >= 1"),
        ({"preset": "llamacpp", "cache_model": "lru"}, "serving.engine.cache_model", "must be one of slots, radix"),
        ({"preset": "llamacpp", "cache_model": "radix", "slot_prompt_similarity": 0.2}, "serving.engine.slot_prompt_similarity",
         "applies to the slots cache model only; here cache_model is radix"),
        ({"preset": "llamacpp", "cache_prompt": False, "ctx_checkpoints": 4}, "serving.engine.ctx_checkpoints",
         "applies to the slots cache model only; here cache_prompt is false"),
        ({"preset": "llamacpp", "prompt_checkpoints": False, "ctx_checkpoints": 4}, "serving.engine.ctx_checkpoints",
         "applies to a checkpointed model only"),
        ({"preset": "llamacpp", "cache_ram_tokens": 0, "cache_idle_slots": True}, "serving.engine.cache_idle_slots", "needs cache_ram_tokens > 0"),
        ({"preset": "llamacpp", "slot_prompt_similarity": 1.5}, "serving.engine.slot_prompt_similarity", "must be in [0.0, 1.0]"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 12, "slot_cache": {}},
         "serving.engine.kv_num_blocks",
         "must hold every slot's whole context: max_num_seqs (2) x max_model_len (100) tokens = 14 blocks of 16; got 12"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "kv_num_blocks": 20, "slot_cache": {}},
         "serving.engine.slot_cache", "needs max_model_len"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20, "prefix_caching": False, "slot_cache": {}},
         "serving.engine.slot_cache", "needs prefix_caching: true"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20, "reusable_prompt_tail": 5, "slot_cache": {}},
         "serving.engine.reusable_prompt_tail", "applies to the block cache"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20, "preemption_mode": "swap",
          "swap_space_blocks": 4, "slot_cache": {}}, "serving.engine.preemption_mode", "a slot cache never preempts"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": "auto", "slot_cache": {}},
         "serving.engine.kv_num_blocks", "must be a number with slot_cache"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20,
          "slot_cache": {"host_cache_tokens": 0, "cache_idle_slots": True}},
         "serving.engine.slot_cache.cache_idle_slots", "needs host_cache_tokens > 0"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20,
          "slot_cache": {"max_checkpoints": 0}}, "serving.engine.slot_cache.max_checkpoints", "must be >= 1"),
        ({"max_num_seqs": 2, "max_num_batched_tokens": 64, "max_model_len": 100, "kv_num_blocks": 20,
          "slot_cache": {"ram": 1}}, "serving.engine.slot_cache.ram", "unknown key"),
    ]
    for engine, where, message in cases:
        with pytest.raises(ScenarioError) as info:
            scenario_from_dict({**base, "serving": {**base["serving"], "engine": engine}})
        assert info.value.paths == [where], (engine, str(info.value))
        assert message in str(info.value)


@pytest.mark.parametrize("fast", [True, False])
def test_a_step_over_ubatch_tokens_costs_one_fixed_term_per_forward_pass(fast):
    """1000 prompt tokens in passes of 512 take two passes: 2 x beta0 + 1000 x beta1, not one."""
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=2048, kv_block_size=16, kv_num_blocks=512, ubatch_tokens=512)
    req = _request(0, 1000, 2)
    _run(engine, [(0.0, req)], fast)
    assert req.first_token_s == pytest.approx((2 * 1000 + 10 * 1000) * 1e-6)
    single = _request(1, 1000, 2)
    _run(EngineConfig(max_num_seqs=2, max_num_batched_tokens=2048, kv_block_size=16, kv_num_blocks=512), [(0.0, single)], fast)
    assert single.first_token_s == pytest.approx((1000 + 10 * 1000) * 1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_decoders_fill_the_first_forward_pass_before_prompt_tokens(fast):
    """Two decoders and a 6-token prompt in passes of 4: pass 1 has both decoders and 2 prompt
    tokens, pass 2 the other 4 prompt tokens; with D(n) tabulated the step is D(2) + 2 prefill
    passes + a prompt-only pass."""
    model = BatchTableLatency(decode_step_us=(100.0, 300.0), prefill_step_us=10.0, prefill_only_step_us=1000.0, prefill_token_us=1.0)
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=1, kv_num_blocks=2048, ubatch_tokens=4, prefix_caching=False)
    a, b, late = _request(0, 2, 400), _request(1, 2, 400), _request(2, 6, 2)
    _run(engine, [(0.0, a), (0.0, b), (0.05, late)], fast, latency=model)
    # a and b prefill together (one pass, 4 tokens): 10 + 1000 + 4 = 1014 us; then 2-decoder steps of 300 us.
    first_ab = 1014e-6
    assert a.first_token_s == pytest.approx(first_ab)
    steps_before = -(-(0.05 - first_ab) // 300e-6)  # the late request joins at the next step boundary
    joined_at = first_ab + steps_before * 300e-6
    mixed = (300 + 10 + 2) + (10 + 1000 + 4)  # pass 1: D(2) + prompt 2; pass 2: prompt-only 4
    assert late.first_token_s == pytest.approx(joined_at + mixed * 1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_prefill_breaks_put_the_prompt_end_in_a_step_of_its_own(fast):
    """With breaks (516, 4) a 300-token prompt takes two steps (296, then 4 tokens), so its
    first token comes one step after the bulk; 1500 tokens take three (984, 512, 4)."""
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=2048, kv_block_size=16, kv_num_blocks=512, prefill_breaks=(516, 4))
    short, long_ = _request(0, 300, 2), _request(1, 1500, 2)
    rep = _run(engine, [(0.0, short), (10.0, long_)], fast)
    assert short.first_token_s == pytest.approx((1000 + 10 * 296 + 1000 + 10 * 4) * 1e-6)
    assert long_.first_token_s == pytest.approx(10.0 + (3 * 1000 + 10 * 1500) * 1e-6)
    assert rep.step == 2 + 1 + 3 + 1


def test_a_finished_round_leaves_its_prompt_less_the_tail_to_the_next():
    """With reusable_prompt_tail 5, round 2 of a session finds round 1's prompt less 5 tokens
    cached (not round 1's output); without it, round 1's prompt and output but its last
    token (whose KV was never computed)."""
    def scenario(tail):
        engine = {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 2048}
        if tail is None:
            engine["prompt_checkpoints"] = False
        return scenario_from_dict({
            "seed": 1,
            "workload": {"aggregate_rate": 0.01, "num_requests": 1, "clients": [{
                "id": "chat", "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 100}},
                "output_distribution": {"type": "constant", "params": {"value": 20}},
                "multi_turn": {"max_rounds": 2, "think_time": {"type": "constant", "params": {"value": 1.0}}}}]},
            "serving": {"engine": engine,
                        "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0, "beta1_us": 10.0, "beta2_us": 10.0}}},
        })
    with_tail = Simulation(scenario(5)).run(progress=False).to_dataframe().sort_values("round_index")
    assert with_tail.prompt_tokens.tolist() == [100, 220] and with_tail.cached_tokens.tolist() == [0, 95]
    whole = Simulation(scenario(None)).run(progress=False).to_dataframe().sort_values("round_index")
    assert whole.cached_tokens.tolist() == [0, 119]


def test_llamacpp_preset_never_preempts_under_overload():
    """Every slot owns its context, so even a flood of the longest requests never preempts;
    requests longer than a slot are dropped on arrival, as llama.cpp refuses them."""
    s = load_scenario("scenarios/quickstart.yaml", {
        "serving.engine": {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 1024, "cache_ram_tokens": 0},
        "workload.num_requests": 400, "workload.aggregate_rate": 50.0,
    })
    results = Simulation(s).run(progress=False)
    frame = results.to_dataframe()
    assert results.summary()["preemptions"]["total"] == 0
    too_long = frame.prompt_tokens + frame.output_tokens > 1024
    assert too_long.any() and (frame.loc[too_long, "dropped_reason"] == "max_model_len").all()
    assert (frame.loc[~too_long, "status"] == "completed").all()
