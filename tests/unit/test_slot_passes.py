"""Forward passes by slot (``EngineConfig.ubatch_split: by_slot``): llama.cpp's server with a
KV stream per slot runs one pass per run of consecutive slot ids, with an equal number of
tokens from each sequence in it (``docs/model.md``, "Passes by slot")."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.schema import EngineConfig, LlamaCppPreset
from simpy_llm.entities import Request
from simpy_llm.loading import scenario_from_dict
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.batch_table import BatchTableLatency
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.passes import simple_passes, slot_passes
from simpy_llm.serving.slot_cache import SlotIds

TABLE = BatchTableLatency(decode_step_us=(10_000.0, 15_000.0, 20_000.0, 25_000.0), prefill_token_us=1_000.0)
"""D(1..4) = 10, 15, 20, 25 ms; 1 ms per prompt token; no fixed prompt cost."""


def _engine(split: str) -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_num_batched_tokens=2048, kv_block_size=1, kv_num_blocks=8192,
                        ubatch_tokens=512, ubatch_split=split, prefix_caching=False)


def _run(engine: EngineConfig, requests: list[tuple[float, Request]], fast: bool) -> None:
    env = simpy.Environment()
    inbox = simpy.Store(env)
    recorder = Recorder()
    Replica(env, 0, inbox, engine, TABLE, recorder, fast=fast)

    def send(at_s: float, req: Request):
        yield env.timeout(at_s)
        req.arrival_s = env.now
        recorder.on_arrival(req, env.now)
        inbox.put(req)

    for at_s, req in requests:
        env.process(send(at_s, req))
    env.run()


def _requests() -> list[tuple[float, Request]]:
    def req(rid: int, output: int) -> Request:
        return Request(id=rid, client_id="c", prompt_tokens=10, output_tokens=output, arrival_s=0.0)

    return [(0.0, req(0, 5)), (0.0, req(1, 2)), (0.036, req(2, 3))]


def test_the_passes_of_scattered_decoders_and_a_prompt_between_them():
    """Decoders on slots 0, 2 and 3 with a prompt on slot 1: the first pass takes slot 0's
    token and the prompt's first (slots 0, 1 run on), the second slots 2 and 3, the third the
    prompt's other tokens."""
    assert slot_passes([3, 0, 2], [(1, 40, 20)], 512) == [(1, 1, 41), (0, 2, 0), (19, 0, 19 * 40 + (20 * 21 - 2) // 2)]


def test_a_pass_takes_at_most_ubatch_tokens_shared_equally():
    """Three prompts of 4, 10 and 30 tokens on slots 0-2 in passes of 12 tokens: 4 from each,
    then 6 from each of the two longer, then the longest alone, 12 and 8."""
    passes = slot_passes([], [(0, 0, 4), (1, 0, 10), (2, 0, 30)], 12)
    assert [p for p, _d, _q in passes] == [12, 12, 12, 8]


def test_scattered_decoders_cost_a_pass_each_run_in_the_engine():
    """Two requests at 0 take slots 3 and 2 (least recently used, ties to the highest); once
    the second ends, a request arriving at 36 ms takes slot 1, so slots 1 and 3 decode in two
    passes of D(1) (20 ms a step) where one engine pass of D(2) takes 15 ms. Worked by hand:
    first tokens at 20 ms (a 20-token pass), the second request ends at 35 ms (one step of
    D(2)), the first decodes alone to 45 ms, the late prompt runs beside it in passes of its
    own (10 + 10 ms, to 65 ms), then a step of slots 1 and 3 (20 ms) ends the first at 85 ms
    and one of D(1) the late one at 95 ms; in one pass per step they end at 80 and 90 ms."""
    for fast in (True, False):
        reqs = _requests()
        _run(_engine("by_slot"), reqs, fast)
        assert [r.first_token_s for _t, r in reqs] == pytest.approx([0.020, 0.020, 0.065])
        assert [r.completion_s for _t, r in reqs] == pytest.approx([0.085, 0.035, 0.095])
        simple = _requests()
        _run(_engine("simple"), simple, fast)
        assert [r.completion_s for _t, r in simple] == pytest.approx([0.080, 0.035, 0.090])


def test_slot_ids_go_to_the_least_recently_used_idle_slot():
    """A fresh server gives its highest slot first; a freed slot is taken again only after
    every slot idle longer."""
    ids = SlotIds(4)
    assert [ids.take(i) for i in range(3)] == [3, 2, 1]
    ids.free(1, 0.5)  # slot 2 idle, after slot 0 (never used)
    assert ids.take(3) == 0 and ids.take(4) == 2
    with pytest.raises(RuntimeError, match="no idle slot"):
        ids.take(5)


def test_slots_freed_in_one_step_are_taken_again_in_slot_order():
    """Requests ending in the same step free their slots as llama.cpp's server walks them, in
    slot order, whatever order the engine completes them in: the lowest is idle longest."""
    ids = SlotIds(4)
    assert [ids.take(i) for i in range(4)] == [3, 2, 1, 0]
    for request_id in (1, 3, 0):  # slots 2, 0, 3, all at 2.0
        ids.free(request_id, 2.0)
    assert [ids.take(i) for i in (4, 5, 6)] == [0, 2, 3]


def test_the_preset_runs_passes_by_slot_when_the_kv_cache_is_per_slot():
    """kv_unified off with several slots: by_slot; unified (the default), or one slot: simple."""
    assert LlamaCppPreset(n_parallel=4, ctx_per_slot=512, kv_unified=False).engine().ubatch_split == "by_slot"
    assert LlamaCppPreset(n_parallel=4, ctx_per_slot=512).engine().ubatch_split == "simple"
    assert LlamaCppPreset(n_parallel=1, ctx_per_slot=512, kv_unified=False).engine().ubatch_split == "simple"


def test_by_slot_needs_a_pass_size():
    """ubatch_split by_slot without ubatch_tokens is refused, naming both keys."""
    with pytest.raises(FieldValueError, match=r"ubatch_split.*ubatch_tokens"):
        EngineConfig(ubatch_split="by_slot")
    with pytest.raises(ScenarioError, match="ubatch_split"):
        scenario_from_dict({"serving": {"engine": {"ubatch_split": "sideways"}}, "workload": {"num_requests": 1}})


@settings(max_examples=300, deadline=None)
@given(
    decode=st.sets(st.integers(0, 7), max_size=8),
    prompts=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 700)), max_size=8),
    ubatch=st.integers(1, 600),
    data=st.data(),
)
def test_passes_compute_every_token_once(decode, prompts, ubatch, data):
    """Whatever the slots, chunks and pass size, the passes hold every decoder once and every
    prompt token once, with its causal-attention pairs: nothing lost or duplicated; a pass
    never exceeds ubatch tokens unless it holds one token per sequence; the simple split
    conserves the same totals."""
    free = [s for s in range(8, 16)]
    slots = data.draw(st.permutations(free))[: len(prompts)]
    chunks = [(s, cached, n) for s, (cached, n) in zip(slots, prompts, strict=False)]
    pairs = sum(n * cached + n * (n + 1) // 2 for _s, cached, n in chunks)
    for passes in (slot_passes(sorted(decode), chunks, ubatch),
                   simple_passes([(cached, n) for _s, cached, n in chunks], len(decode), ubatch)):
        assert sum(p for p, _d, _q in passes) == sum(n for _s, _c, n in chunks)
        assert sum(d for _p, d, _q in passes) == len(decode)
        assert sum(q for _p, _d, q in passes) == pairs
    sequences = len(decode) + len(chunks)
    for p, d, _q in slot_passes(sorted(decode), chunks, ubatch):
        assert p + d <= max(ubatch, sequences)  # over ubatch only with one token from each sequence
