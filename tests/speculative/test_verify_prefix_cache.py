"""Prefix caching on verify servers (``speculation.verify.prefix_caching``) against
independent counts: multi-turn sessions whose cached prompt tokens follow from the
previous round's prompt and output by a few lines of arithmetic, prefill passes timed by
the latency model's formula on the uncached tokens, block conservation at every pass
boundary, and the default path's KV being the whole-request token reservation it was."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, load_scenario, scenario_from_dict
from simpy_llm.entities import Request
from simpy_llm.serving.kv_cache import TokenMemory
from simpy_llm.serving.prefix_cache import PrefixCache
from simpy_llm.speculative.verify import VerifyServer
from tests.spec_helpers import flat_curve, spec_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
BETA0_US, BETA1_US, BETA2_US = 5000.0, 50.0, 200.0
BS = 16


def sessions_scenario(
    tmp_path: Path, *, sessions: int, rounds: int, prompt: int, output: int, kv_blocks: int = 4096,
    prefix_caching: bool = True, seed: int = 1, think_s: float = 0.5, rate: float = 2.0, shared_prefix: int = 0,
) -> dict[str, Any]:
    """*sessions* multi-turn sessions of *rounds* rounds (``accumulate``: each round's prompt is
    the previous round's prompt and output plus *prompt* new tokens), one per draft device,
    on one verify server with blocks of :data:`BS` tokens; every first round starts with the
    same *shared_prefix* tokens (a system prompt)."""
    curve = flat_curve(tmp_path, [0.8, 0.7, 0.6, 0.5])
    data = spec_scenario(
        curve, requests=sessions, rate=rate, prompt=prompt, output=output, devices=sessions, seed=seed,
        speculation={"verify": {"prefix_caching": prefix_caching}},
        latency={"kind": "blis_linear", "params": {"beta0_us": BETA0_US, "beta1_us": BETA1_US, "beta2_us": BETA2_US}},
        engine={"max_num_seqs": 64, "max_num_batched_tokens": 512, "kv_block_size": BS, "kv_num_blocks": kv_blocks},
    )
    client = data["workload"]["clients"][0]
    client["multi_turn"] = {"max_rounds": rounds, "think_time": {"type": "constant", "params": {"value": think_s}}}
    if shared_prefix:
        client.update(prefix_group="system", prefix_length=shared_prefix)
    return data


def test_cached_tokens_of_each_round_are_the_previous_rounds_full_blocks(tmp_path):
    """With a KV cache too large to evict, round r of a session finds cached exactly the full
    blocks of the previous round's KV (its prompt and every output token but the last), and
    no more than the full blocks of its own first P - 1 tokens; a first round finds none."""
    prompt, output, rounds = 100, 20, 4
    frame = Simulation(scenario_from_dict(sessions_scenario(tmp_path, sessions=6, rounds=rounds, prompt=prompt, output=output))).run().to_dataframe()
    assert frame["status"].eq("completed").all() and len(frame) == 6 * rounds
    for row in frame.itertuples():
        p_r = prompt + row.round_index * (prompt + output)  # accumulate: earlier prompts and outputs, then its own
        assert row.prompt_tokens == p_r
        if row.round_index == 0:
            expected = 0
        else:
            previous_kv = (p_r - prompt - output) + output - 1  # the previous round's prompt and output but its last token
            expected = min(previous_kv // BS, (p_r - 1) // BS) * BS
        assert row.cached_tokens == expected, row


def test_a_shared_system_prompt_is_found_by_every_request_after_the_first(tmp_path):
    """Single requests sharing a 64-token system prompt (4 blocks): the first computes it, and
    every later one, in the same prefill pass or after, finds those 4 blocks cached (the
    blocks are registered as the pass computing them is scheduled)."""
    data = sessions_scenario(tmp_path, sessions=8, rounds=1, prompt=100, output=10, shared_prefix=64, rate=50.0)
    frame = Simulation(scenario_from_dict(data)).run().to_dataframe().sort_values("first_scheduled_s", kind="stable")
    assert frame["status"].eq("completed").all()
    assert frame["cached_tokens"].tolist() == [0] + [64] * 7


def test_prefill_passes_take_the_step_time_of_their_uncached_tokens(tmp_path):
    """Each prefill pass (the requests whose prefill started at one instant) lasts the latency
    model's step of its uncached prompt tokens, ``beta0 + beta1 x sum(P - cached)`` µs, and
    every request's first token comes at its pass's end."""
    frame = Simulation(scenario_from_dict(sessions_scenario(tmp_path, sessions=6, rounds=4, prompt=100, output=20))).run().to_dataframe()
    passes: dict[float, list[Any]] = defaultdict(list)
    for row in frame.itertuples():
        passes[row.first_scheduled_s].append(row)
    assert any(r.cached_tokens for rows in passes.values() for r in rows)
    for start, rows in passes.items():
        uncached = sum(r.prompt_tokens - r.cached_tokens for r in rows)
        step_s = (BETA0_US + BETA1_US * uncached) * 1e-6
        for r in rows:
            assert r.first_token_s == pytest.approx(start + step_s, rel=1e-12, abs=1e-12), (start, [x.request_id for x in rows])


def test_prefix_caching_off_computes_every_prompt_whole(tmp_path):
    """Without prefix caching (the default) the same sessions find nothing cached and each
    prefill pass is the step time of its whole prompts."""
    frame = Simulation(scenario_from_dict(
        sessions_scenario(tmp_path, sessions=4, rounds=3, prompt=100, output=20, prefix_caching=False),
    )).run().to_dataframe()
    assert frame["cached_tokens"].eq(0).all()
    for start, rows in frame.groupby("first_scheduled_s"):
        step_s = (BETA0_US + BETA1_US * rows["prompt_tokens"].sum()) * 1e-6
        assert (rows["first_token_s"] - start - step_s).abs().max() < 1e-12


def test_a_cached_session_round_reaches_its_first_token_sooner(tmp_path):
    """Caching shortens the server TTFT of later rounds (their uncached prompt is smaller)
    and leaves first rounds as they were."""
    on = Simulation(scenario_from_dict(sessions_scenario(tmp_path, sessions=1, rounds=3, prompt=400, output=20))).run().to_dataframe()
    off = Simulation(scenario_from_dict(
        sessions_scenario(tmp_path, sessions=1, rounds=3, prompt=400, output=20, prefix_caching=False),
    )).run().to_dataframe()
    ttft_on = (on["first_token_s"] - on["first_scheduled_s"]).to_numpy()
    ttft_off = (off["first_token_s"] - off["first_scheduled_s"]).to_numpy()
    assert ttft_on[0] == ttft_off[0]
    assert (ttft_on[1:] < ttft_off[1:]).all()


def _held_blocks(server: VerifyServer, cache: PrefixCache) -> int:
    """Blocks the running requests hold, counted from their lengths and the tree: each holds
    the blocks of its prompt and output, and a cached block referenced by k of them is one
    block, not k (so k - 1 of its copies are not held)."""
    total = 0
    for req in server.running.values():
        total += -(-(req.prompt_tokens + req.output_tokens) // cache.block_size)
    stack = [cache.root]
    while stack:
        node = stack.pop()
        if node is not cache.root and node.refs > 1:
            total -= node.n * (node.refs - 1)
        if node.children:
            stack.extend(node.children.values())
    return total


def _unreferenced_tree_blocks(cache: PrefixCache) -> int:
    total = 0
    stack = [cache.root]
    while stack:
        node = stack.pop()
        if node is not cache.root and node.refs == 0:
            total += node.n
        if node.children:
            stack.extend(node.children.values())
    return total


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    sessions=st.integers(1, 5), rounds=st.integers(1, 4), prompt=st.integers(20, 200), output=st.integers(2, 40),
    kv_blocks=st.integers(40, 200), seed=st.integers(0, 1000), think_s=st.sampled_from([0.001, 0.05, 0.5]),
    rate=st.sampled_from([2.0, 50.0]), shared=st.sampled_from([0, 16, 40]), guard=st.sampled_from([0.6, 1.0]),
)
def test_blocks_are_conserved_at_every_pass_boundary(tmp_path, sessions, rounds, prompt, output, kv_blocks, seed, think_s, rate, shared, guard):
    """At the end of every pass, the blocks the running requests hold (counted from their
    lengths less the shared copies, not from the cache's counters) are the cache's used
    blocks, within the KV guard's share; used + empty + evictable is the capacity; the
    unreferenced cached blocks are among the evictable ones; and when everyone has left,
    nothing is held."""
    data = sessions_scenario(
        tmp_path, sessions=sessions, rounds=rounds, prompt=prompt, output=output, kv_blocks=kv_blocks,
        seed=seed, think_s=think_s, rate=rate, shared_prefix=min(shared, prompt),
    )
    data["speculation"]["verify"]["max_kv_utilization"] = guard
    sim = Simulation(scenario_from_dict(data))
    (server,) = [s for s in sim.replicas if isinstance(s, VerifyServer)]
    cache = server.prefix_cache
    assert cache is not None
    checks = []

    def check() -> None:
        assert _held_blocks(server, cache) == cache.used_blocks
        assert cache.used_blocks + cache.empty + cache.evictable == cache.num_blocks
        assert 0 <= cache.used_blocks <= guard * cache.num_blocks
        assert _unreferenced_tree_blocks(cache) <= cache.evictable
        checks.append(1)

    pass_over = server._pass_over  # noqa: SLF001 - every pass ends here

    def checked_pass_over() -> None:
        check()
        pass_over()

    server._pass_over = checked_pass_over  # type: ignore[method-assign]  # noqa: SLF001 - a probe at each pass boundary
    frame = sim.run().to_dataframe()
    assert checks
    check()
    if not server.running:  # (a request whose blocks exceed the guard's share waits for ever)
        assert cache.used_blocks == 0 and cache.empty + cache.evictable == cache.num_blocks
    assert frame["status"].isin(["completed", "dropped", "in_flight"]).all()


@pytest.mark.parametrize("name", sorted(p.name for p in SCENARIOS.glob("speculative_*.yaml")))
def test_with_prefix_caching_off_the_shipped_scenarios_reserve_whole_requests(name):
    """With ``verify.prefix_caching`` at its default (off), each shipped speculative scenario's
    verify servers count KV in tokens, reserving each request whole, with no prefix cache
    (the code path the simulator had before prefix caching on verify servers), so their
    results are those it gave."""
    scenario = load_scenario(SCENARIOS / name)
    assert scenario.speculation is not None and scenario.speculation.verify.prefix_caching is False
    sim = Simulation(scenario)
    servers = [s for s in sim.replicas if isinstance(s, VerifyServer)]
    assert servers
    for server in servers:
        assert server.prefix_cache is None and type(server.kv) is TokenMemory
        assert server.prefix_hit_tokens(Request(id=0, client_id="c", prompt_tokens=64, output_tokens=8, arrival_s=0.0)) == 0
