"""Prefix caching against independent offline counts: the Mooncake trace's block hashes, a replayed session.

The Mooncake conversation trace gives every request the hash ids of its prompt's
512-token blocks (prefix-chained: equal ids mean equal prompts up to the end of that
block). With 512-token KV blocks and one request running at a time (``max_num_seqs: 1``,
FCFS, so every request before it has finished), the cache's behaviour is fixed by the
documented rules alone, and a few lines of plain Python replay it: a request looks up
the blocks wholly inside its first ``P - 1`` tokens, stops at the first miss, and after
it completes every full block of its KV (prompt and output) is cached, released tail
first. Nothing here shares code with the engine.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np

from simpy_llm import Simulation, scenario_from_dict

TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake" / "conversation_trace.jsonl"
BS = 512


def _rows(n: int) -> list[dict]:
    with TRACE.open() as fh:
        return [json.loads(next(fh)) for _ in range(n)]


def _scenario(n: int, kv_blocks: int) -> dict:
    return {
        "seed": 3,
        "workload": {"traces": [{"path": str(TRACE), "format": "mooncake", "max_requests": n}]},
        "serving": {
            "engine": {
                "max_num_seqs": 1,
                "max_num_batched_tokens": 8192,
                "kv_block_size": BS,
                "kv_num_blocks": kv_blocks,
                "prefix_caching": True,
            },
            "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 500.0, "beta1_us": 1.0, "beta2_us": 10.0}},
        },
    }


def _run(n: int, kv_blocks: int):
    results = Simulation(scenario_from_dict(_scenario(n, kv_blocks))).run()
    return results, results.to_dataframe()


def _identities(row: dict) -> list[tuple[int, ...]]:
    """Identity of each prompt block: the chain of hash ids up to it."""
    ids = row["hash_ids"]
    return [tuple(ids[: b + 1]) for b in range(len(ids))]


def test_hit_rate_with_a_cache_that_never_evicts_equals_the_offline_count():
    """With a KV cache too large to evict, each request's cached prompt tokens are exactly
    the blocks of its first P-1 tokens seen in an earlier request's full prompt blocks (an
    offline count over hash_ids), and the hit rate is their sum over all prompt tokens."""
    n = 1500
    rows = _rows(n)
    _results, frame = _run(n, kv_blocks=1 << 16)
    seen: set[tuple[int, ...]] = set()
    expected = []
    for row in rows:
        p = row["input_length"]
        blocks = _identities(row)
        hits = 0
        for ident in blocks[: (p - 1) // BS]:
            if ident not in seen:
                break
            hits += 1
        expected.append(hits * BS)
        seen.update(blocks[: p // BS])  # only full blocks are cached
    assert frame["status"].eq("completed").all()
    assert frame["cached_tokens"].tolist() == expected
    hit_rate = sum(expected) / sum(r["input_length"] for r in rows)
    assert 0.1 < hit_rate < 0.95  # the trace really shares prefixes
    assert frame["cached_tokens"].sum() / frame["prompt_tokens"].sum() == hit_rate


def test_hits_with_a_small_cache_equal_an_lru_replay_of_the_block_accesses():
    """With a KV cache of 80 blocks, cached prompt tokens per request equal an independent
    replay of vLLM's free queue: one queue of every block nobody holds, the never-used
    blocks first, then each released block in release order (a finished request releases
    its partial last block, then its full blocks from its last to its first); allocation
    pops the head, evicting a cached block it pops, even when an empty block waits behind.
    The blocks still cached at the end agree too."""
    n, capacity = 300, 80
    rows = _rows(n)
    sim = Simulation(scenario_from_dict(_scenario(n, capacity)))
    frame = sim.run().to_dataframe()
    queue: OrderedDict[object, None] = OrderedDict((("fresh", b), None) for b in range(capacity))
    cached: set[object] = set()
    expected = []
    evictions = 0
    evictions_past_an_empty_block = 0
    for i, (row, status) in enumerate(zip(rows, frame["status"], strict=True)):
        p, o = row["input_length"], row["output_length"]
        if status == "dropped":  # longer than the cache holds: never touches it
            assert p + o > capacity * BS
            expected.append(0)
            continue
        prompt_blocks = _identities(row)
        hits = []
        for ident in prompt_blocks[: (p - 1) // BS]:
            if ident not in cached:
                break
            hits.append(ident)
        for ident in hits:
            del queue[ident]  # pinned
        expected.append(len(hits) * BS)
        kv_tokens = p + o - 1
        need = -(-kv_tokens // BS) - len(hits)
        for _ in range(need):
            key, _ = queue.popitem(last=False)
            if key in cached:
                cached.discard(key)  # evicted
                evictions += 1
                if any(k[0] == "partial" for k in queue):
                    evictions_past_an_empty_block += 1
        full = kv_tokens // BS
        own = prompt_blocks[: min(full, p // BS)] + [("out", i, b) for b in range(p // BS, full)]
        if kv_tokens % BS:
            queue[("partial", i)] = None
        for ident in reversed(own):
            queue[ident] = None
            cached.add(ident)
    assert evictions > 100  # the cache is small enough to matter
    assert evictions_past_an_empty_block > 10  # and the queue's order matters
    assert frame["cached_tokens"].tolist() == expected
    assert sim.replicas[0].statistics().kv_cached_blocks == len(cached)  # the blocks still cached
    assert np.array_equal(frame["num_preemptions"].to_numpy(), np.zeros(n))


def test_a_replayed_sessions_later_rounds_find_the_previous_round_cached(tmp_path):
    """A replayed trace's session round k (its prompt repeats round k-1's prompt and answer)
    finds round k-1's KV cached after it completed: the full 16-token blocks of its
    ``prompt + output - 1`` computed tokens (the last token's KV is never computed), at most
    the blocks inside round k's first ``prompt - 1`` tokens. A single request that is not
    part of a session, run in between, finds nothing."""
    from simpy_llm.workload.traces import Trace, write_trace_v2

    prompts, outputs = [100, 200, 300, 60], [20, 10, 5, 4]
    frame = {
        "arrival_time_us": [0, 2_000_000, 4_000_000, 3_000_000],  # rounds 2 s apart: each finds the last one done
        "input_tokens": prompts,
        "output_tokens": outputs,
        "session_id": ["s", "s", "s", ""],
        "round_index": [0, 1, 2, 0],
    }
    _yaml, csv = write_trace_v2(Trace({"created_at": "2026-01-01T00:00:00Z"}, frame), tmp_path / "run")
    scenario = {
        "workload": {"traces": [{"path": str(csv)}]},
        "serving": {
            "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 512, "kv_block_size": 16, "kv_num_blocks": 256},
            "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 2000.0, "beta1_us": 20.0, "beta2_us": 100.0}},
        },
    }
    f = Simulation(scenario_from_dict(scenario)).run().to_dataframe().sort_values("arrival_s")
    session = f[f.session_id == "s"].sort_values("round_index")
    expected = [0] + [
        min((p + o - 1) // 16, (nxt - 1) // 16) * 16 for p, o, nxt in zip(prompts[:2], outputs[:2], prompts[1:3], strict=True)
    ]
    assert session.cached_tokens.tolist() == expected == [0, 112, 208]
    assert f[f.session_id == ""].cached_tokens.tolist() == [0]
