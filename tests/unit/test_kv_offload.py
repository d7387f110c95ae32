"""The prefix cache's CPU tier (``EngineConfig.kv_offload_blocks``): offload, restore, capacity."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Recorder, Request, Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.config.schema import EngineConfig
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.serving.prefix_cache import Holder, PrefixCache, _Node
from tests.helpers import tiny_scenario

LATENCY = BlisLinearLatency(beta0_us=1000.0, beta1_us=10.0, beta2_us=100.0)
BS = 4
BYTES_PER_TOKEN = 1e6
BANDWIDTH_GB_PER_S = 16.0


def _request(i: int, prompt: int, output: int, arrival_s: float, prefix: bool) -> Request:
    """A request; with *prefix*, its first 16 tokens are the shared blocks 1..4."""
    extra = {"prefix_tokens": 16, "prefix_blocks": (1, 2, 3, 4), "prefix_block_tokens": BS} if prefix else {}
    return Request(id=i, client_id="c", prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s, **extra)


def _isolated_restore(kv_num_blocks: int) -> tuple[Request, Replica]:
    """A (shared prefix) completes; B, alone, needs every block of a 16-block GPU (so it
    evicts A's four prefix blocks); C, with A's prefix, arrives when the replica is idle."""
    engine = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=64, kv_block_size=BS, kv_num_blocks=kv_num_blocks,
        kv_offload_blocks=8, kv_offload_bytes_per_token=BYTES_PER_TOKEN, kv_offload_bandwidth_gb_per_s=BANDWIDTH_GB_PER_S,
    )
    env = simpy.Environment()
    inbox: simpy.Store = simpy.Store(env)
    rec = Recorder()
    rep = Replica(env, 0, inbox, engine, LATENCY, rec)
    reqs = [
        _request(0, 17, 2, 0.0, prefix=True),
        _request(1, 60, 2, 1.0, prefix=False),  # 60 prompt tokens + 1 decoded: 16 blocks
        _request(2, 17, 2, 2.0, prefix=True),
    ]

    def send():
        for req in reqs:
            yield env.timeout(req.arrival_s - env.now)
            rec.on_arrival(req, env.now)
            inbox.put(req)

    env.process(send())
    env.run()
    return reqs[2], rep


def test_an_isolated_restore_adds_exactly_the_copy_time_to_ttft():
    """A prefix evicted to the CPU tier and found again costs the request's first step
    blocks x block_size x bytes_per_token / bandwidth more than finding it on the GPU."""
    on_cpu, rep_cpu = _isolated_restore(kv_num_blocks=16)
    on_gpu, rep_gpu = _isolated_restore(kv_num_blocks=64)
    tier_cpu, tier_gpu = rep_cpu.prefix_cache.tier, rep_gpu.prefix_cache.tier
    assert tier_cpu is not None and tier_gpu is not None
    blocks = 4
    assert (tier_cpu.restored_blocks, tier_cpu.cpu_hit_tokens) == (blocks, blocks * BS)
    assert (tier_gpu.restored_blocks, tier_gpu.offloaded_blocks) == (0, 0)
    assert on_cpu.cached_tokens == on_gpu.cached_tokens == 16
    copy_s = blocks * BS * BYTES_PER_TOKEN / (BANDWIDTH_GB_PER_S * 1e9)
    assert tier_cpu.restore_s == pytest.approx(copy_s, rel=1e-12)
    ttft_cpu = on_cpu.first_token_s - on_cpu.arrival_s
    ttft_gpu = on_gpu.first_token_s - on_gpu.arrival_s
    assert ttft_cpu - ttft_gpu == pytest.approx(copy_s, abs=1e-9)  # step ends are whole nanoseconds


# --- conservation under random operations ------------------------------------------------
def _walk(cache: PrefixCache) -> tuple[list[_Node], list[_Node]]:
    """The tree's GPU and CPU nodes (root excluded), checking the tiers' nesting."""
    gpu: list[_Node] = []
    cpu: list[_Node] = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        for child in (node.children or {}).values():
            assert child.parent is node and child.n > 0
            assert not (node.cpu and not child.cpu)  # the GPU tier holds a prefix of every chain
            (cpu if child.cpu else gpu).append(child)
            stack.append(child)
    return gpu, cpu


def _check(cache: PrefixCache, private: int) -> None:
    """The invariants, with *private* GPU blocks held outside the tree."""
    tier = cache.tier
    assert tier is not None
    gpu, cpu = _walk(cache)
    assert cache.empty + cache.used_blocks + cache.evictable == cache.num_blocks
    assert cache.empty >= 0 and cache.evictable >= 0
    # Every GPU block is counted once: referenced, evictable (in the free queue) or empty.
    assert cache.used_blocks == sum(n.n for n in gpu if n.refs) + private
    assert {id(n) for n in gpu if not n.refs} == {id(n) for n in cache._lru}  # noqa: SLF001
    # The CPU tier holds exactly its nodes' blocks, within capacity, each node once.
    assert all(n.refs == 0 for n in cpu)
    assert [id(n) for n in cache._cpu_lru] == [id(n) for n in cache._cpu_lru if n.cpu]  # noqa: SLF001
    assert {id(n) for n in cpu} == {id(n) for n in cache._cpu_lru}  # noqa: SLF001
    assert tier.held == sum(n.n for n in cpu) <= tier.capacity
    assert tier.offloaded_blocks - tier.restored_blocks >= tier.held


@settings(max_examples=150, deadline=None)
@given(
    num_blocks=st.integers(8, 24),
    cpu_blocks=st.integers(1, 16),
    ops=st.lists(st.tuples(st.sampled_from(["admit", "release", "private", "free"]), st.integers(0, 5), st.integers(1, 30)), max_size=40),
)
def test_blocks_are_conserved_across_the_two_tiers(num_blocks, cpu_blocks, ops):
    """Under random admissions (lookup, restore, allocate), releases and private blocks, the
    GPU's empty + used + evictable blocks stay its total, the CPU tier holds at most its
    capacity, and every cached block is on exactly one tier."""
    cache = PrefixCache(num_blocks, BS, cpu_blocks=cpu_blocks)
    running: list[tuple[Holder, int]] = []  # (holder, tokens computed)
    private: list[int] = []
    rid = 0
    for op, group, tokens in ops:
        if op == "admit":
            # Prefix groups 0..5 of 3 blocks each, then the request's own tokens.
            req = Request(id=rid, client_id="c", prompt_tokens=12 + tokens, output_tokens=1, arrival_s=0.0,
                          prefix_tokens=12, prefix_blocks=(3 * group, 3 * group + 1, 3 * group + 2), prefix_block_tokens=BS)
            rid += 1
            h = cache.holder(req)
            m = cache.match(h, (req.prompt_tokens - 1) // BS)
            total = -(-req.prompt_tokens // BS)
            if total - m.blocks + m.evictable > cache.free_blocks:
                continue
            cache.pin(h, m)
            cache.allocate(total - m.blocks)
            cache.register_shared(h, req.prompt_tokens)
            running.append((h, req.prompt_tokens))
        elif op == "release" and running:
            h, computed = running.pop(group % len(running))
            cache.unref(h, computed)
        elif op == "private" and tokens <= cache.free_blocks:
            cache.allocate(tokens)
            private.append(tokens)
        elif op == "free" and private:
            cache.release(private.pop(group % len(private)))
        # h.blocks counts the blocks it references in the tree; the rest of its allocation is its own.
        own = sum(-(-computed // BS) - h.blocks for h, computed in running)
        _check(cache, sum(private) + own)


def _shared_prefix(kv_num_blocks: int) -> dict:
    """Two prefix groups of 200 tokens each, alternating, with long own prompts: a small GPU
    cannot keep both prefixes between their requests."""
    data = tiny_scenario()
    client = {
        "rate_fraction": 0.5,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 260}},
        "output_distribution": {"type": "constant", "params": {"value": 4}},
        "prefix_length": 200,
    }
    data["workload"]["clients"] = [
        {"id": "a", "prefix_group": "a", **client},
        {"id": "b", "prefix_group": "b", **client},
    ]
    data["workload"]["aggregate_rate"] = 5.0
    data["workload"]["num_requests"] = 60
    data["serving"]["engine"].update({
        "kv_num_blocks": kv_num_blocks, "kv_block_size": 16, "max_num_batched_tokens": 512, "kv_offload_blocks": 50,
        "kv_offload_bytes_per_token": 1e5, "kv_offload_bandwidth_gb_per_s": 25.0,
    })
    return data


def test_a_small_gpu_cache_finds_prefixes_on_the_cpu_tier():
    """With shared prefixes a small GPU cache cannot keep, the summary's tiers show hits on
    the CPU tier; with a GPU cache large enough for everything, none."""
    small = Simulation(scenario_from_dict(_shared_prefix(40))).run().summary()["prefix_cache"]
    large = Simulation(scenario_from_dict(_shared_prefix(1024))).run().summary()["prefix_cache"]
    assert small["tiers"]["cpu_hit_tokens"] > 0 and small["tiers"]["restored_blocks"] > 0
    assert small["tiers"]["cpu_hit_rate"] > 0 and small["tiers"]["restore_s"] > 0
    assert large["tiers"]["cpu_hit_tokens"] == 0 == large["tiers"]["offloaded_blocks"]
    assert large["tiers"]["gpu_hit_tokens"] > 0


def test_the_summary_has_no_tiers_without_a_cpu_tier():
    """Without a CPU tier (the default) the summary's prefix_cache section has no tiers."""
    data = _shared_prefix(1024)
    for key in ("kv_offload_blocks", "kv_offload_bytes_per_token", "kv_offload_bandwidth_gb_per_s"):
        del data["serving"]["engine"][key]
    assert "tiers" not in Simulation(scenario_from_dict(data)).run().summary()["prefix_cache"]


@pytest.mark.parametrize(
    ("engine", "key"),
    [
        ({"kv_offload_blocks": -1}, "kv_offload_blocks"),
        ({"kv_offload_blocks": 8, "prefix_caching": False}, "kv_offload_blocks"),
        ({"kv_offload_bytes_per_token": 1e5}, "kv_offload_bytes_per_token"),
        ({"kv_offload_bandwidth_gb_per_s": 10.0}, "kv_offload_bandwidth_gb_per_s"),
        ({"kv_offload_blocks": 8, "kv_offload_bandwidth_gb_per_s": 0.0, "kv_offload_bytes_per_token": 1e5}, "kv_offload_bandwidth_gb_per_s"),
        ({"kv_offload_blocks": 8}, "kv_offload_bytes_per_token"),  # no hardware in the latency model
    ],
)
def test_bad_offload_keys_are_refused_by_key_path(engine, key):
    """A bad CPU-tier setting, or one given without a CPU tier, is a scenario error naming
    serving.engine.<key>."""
    data = tiny_scenario()
    data["serving"]["engine"].update(engine)
    with pytest.raises(ScenarioError, match=rf"serving\.engine\.{key}"):
        scenario_from_dict(data)
