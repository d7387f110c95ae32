"""A trace header's server block: checked against the engine for llama.cpp's keys as for vLLM's,
and the observer's server config (``--server-config``) read strictly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import EngineConfig, ScenarioError
from simpy_llm.observe.server_info import SERVER_TYPES, ServerConfig, is_loopback, load_server_config, resolve_server_type
from simpy_llm.workload.traces import Trace, server_block_mismatches, write_trace_v2
from tests.helpers import tiny_scenario

LLAMA = EngineConfig(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048, prefix_caching=True, kv_num_blocks=1024)
MATCHING = {"type": "llamacpp", "n_parallel": 4, "n_batch": 2048, "ctx_per_slot": 2048, "cache_prompt": True, "n_ctx": 8192}


def test_a_matching_llamacpp_block_has_no_mismatch() -> None:
    """A llama.cpp block whose slots, batch, slot context and prompt cache equal the engine's passes."""
    assert server_block_mismatches({"server": MATCHING}, LLAMA) == []


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("n_parallel", 8, "max_num_seqs"),
        ("n_batch", 512, "max_num_batched_tokens"),
        ("ctx_per_slot", 4096, "max_model_len"),
        ("cache_prompt", False, "prefix_caching"),
    ],
)
def test_each_llamacpp_key_is_checked_against_its_engine_setting(key: str, value: object, field: str) -> None:
    """n_parallel <-> max_num_seqs, n_batch <-> max_num_batched_tokens, ctx_per_slot <->
    max_model_len, cache_prompt <-> prefix_caching: a difference names the engine key and both values."""
    problems = server_block_mismatches({"server": {**MATCHING, key: value}}, LLAMA)
    assert [p for p, _ in problems] == [field]
    assert f"server.{key} = {value!r}" in problems[0][1] and f"the scenario has {getattr(LLAMA, field)!r}" in problems[0][1]


def test_the_kv_layout_is_checked_against_the_pass_split() -> None:
    """kv_unified false (a KV stream per slot) asks for passes by slot, true for passes in order;
    a difference names ubatch_split and both settings. With one slot, or kv_unified unknown,
    nothing is compared."""
    by_slot = EngineConfig(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048, prefix_caching=True,
                           kv_num_blocks=1024, ubatch_tokens=512, ubatch_split="by_slot")
    assert server_block_mismatches({"server": {**MATCHING, "kv_unified": False}}, by_slot) == []
    assert server_block_mismatches({"server": {**MATCHING, "kv_unified": True}}, LLAMA) == []
    assert server_block_mismatches({"server": {**MATCHING, "kv_unified": False}}, LLAMA) == [
        ("ubatch_split", "the trace was recorded with server.kv_unified = False (ubatch_split 'by_slot'), "
                         "the scenario has ubatch_split 'simple'")
    ]
    assert [k for k, _ in server_block_mismatches({"server": {**MATCHING, "kv_unified": True}}, by_slot)] == ["ubatch_split"]
    assert server_block_mismatches({"server": {**MATCHING, "kv_unified": None}}, by_slot) == []
    one_slot = {**MATCHING, "n_parallel": 1, "n_ctx": 2048, "kv_unified": False}
    engine = EngineConfig(max_num_seqs=1, max_num_batched_tokens=2048, max_model_len=2048, prefix_caching=True, kv_num_blocks=1024)
    assert server_block_mismatches({"server": one_slot}, engine) == []


def test_n_batch_is_compared_as_llamacpp_clamps_it_to_the_context() -> None:
    """A logical batch beyond the whole context counts as the context (n_ctx, or slots x slot context)."""
    engine = EngineConfig(max_num_seqs=1, max_num_batched_tokens=1024, max_model_len=1024, kv_num_blocks=64)
    block = {"type": "llamacpp", "n_parallel": 1, "ctx_per_slot": 1024, "n_batch": 2048}
    assert server_block_mismatches({"server": block}, engine) == []
    assert server_block_mismatches({"server": {**block, "n_ctx": 1024}}, engine) == []
    problems = server_block_mismatches({"server": block}, EngineConfig(max_num_seqs=1, max_num_batched_tokens=512, max_model_len=1024))
    assert problems == [
        ("max_num_batched_tokens", "the trace was recorded with server.n_batch = 2048 (clamped to the context: 1024), the scenario has 512")
    ]


def test_a_block_is_checked_by_its_own_types_keys_only() -> None:
    """A llama.cpp block's vLLM-named keys are not compared, nor a vLLM block's llama.cpp-named
    ones; null values are not compared."""
    assert server_block_mismatches({"server": {**MATCHING, "max_num_seqs": 999, "block_size": 1}}, LLAMA) == []
    assert server_block_mismatches({"server": {"type": "vllm", "n_parallel": 999, "max_num_seqs": 4}}, LLAMA) == []
    assert server_block_mismatches({"server": {"type": "llamacpp", "n_parallel": None, "ctx_per_slot": None}}, LLAMA) == []
    emulated = {"type": "emulated", "max_num_seqs": 4, "block_size": 16, "max_model_len": 2048}
    assert server_block_mismatches({"server": emulated}, LLAMA) == []
    assert [p for p, _ in server_block_mismatches({"server": {**emulated, "max_num_seqs": 5}}, LLAMA)] == ["max_num_seqs"]


def test_a_replayed_trace_with_a_contradicting_llamacpp_block_is_rejected(tmp_path: Path) -> None:
    """Replaying an observed llama.cpp trace on an engine with other slots stops with an error
    naming the trace, the engine key and the block's key; ``server_block: ignore`` replays it."""
    trace = Trace({"server": {"type": "llamacpp", "n_parallel": 2}}, {"arrival_time_us": [0, 10], "input_tokens": [5, 6], "output_tokens": [2, 2]})
    csv_path = write_trace_v2(trace, tmp_path / "llama")[1]
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": str(csv_path)}]}
    with pytest.raises(ScenarioError) as err:
        Simulation(scenario_from_dict(data))
    assert err.value.source == str(csv_path) and err.value.paths == ["serving.engine.max_num_seqs"]
    assert "server.n_parallel = 2" in str(err.value)
    data["workload"]["traces"][0]["server_block"] = "ignore"
    assert Simulation(scenario_from_dict(data)).run().summary()["requests"]["completed"] == 2
    data["workload"]["traces"][0]["server_block"] = "check"
    data["serving"]["engine"]["max_num_seqs"] = 2
    assert Simulation(scenario_from_dict(data)).run().summary()["requests"]["completed"] == 2


# ------------------------------------------------------------------ the server config


def test_a_server_config_file_is_read(tmp_path: Path) -> None:
    """server, hardware and network mappings are read as given; an empty file is an empty config."""
    path = tmp_path / "server.yaml"
    path.write_text("server: {type: vllm, max_num_seqs: 64, enforce_eager: false, quantization: null}\nhardware: {gpu: H100, gpu_count: 2}\n")
    config = load_server_config(path)
    assert config.server == {"type": "vllm", "max_num_seqs": 64, "enforce_eager": False, "quantization": None}
    assert (config.hardware, config.network, config.source) == ({"gpu": "H100", "gpu_count": 2}, {}, str(path))
    path.write_text("# nothing\n")
    assert load_server_config(path) == ServerConfig(source=str(path))


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("servers: {}\n", "servers", "unknown key; allowed: server, hardware, network"),
        ("server: [1]\n", "server", "must be a mapping"),
        ("server: {n_parallel: 0}\n", "server.n_parallel", "must be a whole number >= 1"),
        ("server: {n_parallel: 2.5}\n", "server.n_parallel", "must be a whole number >= 1"),
        ("server: {cache_prompt: yes please}\n", "server.cache_prompt", "must be true or false"),
        ("server: {cache_ram_mib: -1}\n", "server.cache_ram_mib", "must be a whole number >= 0"),
        ("server: {gpu_memory_utilization: 1.5}\n", "server.gpu_memory_utilization", "must be a number in (0, 1]"),
        ("server: {type: triton}\n", "server.type", "must be one of vllm, sglang, llamacpp, emulated, tgi, other"),
        ("server: {model: 3}\n", "server.model", "must be a string"),
        ("server: {discovered: [x]}\n", "server.discovered", "is written by the observer"),
        ("network: {measured_rtt_ms: .nan}\n", "network.measured_rtt_ms", "must be a finite number"),
        ("- server\n", "", "must be a mapping with keys server, hardware, network"),
        ("server: {a: [\n", "", "not valid YAML"),
    ],
)
def test_a_bad_server_config_names_the_file_and_key_path(tmp_path: Path, text: str, path: str, message: str) -> None:
    """Each bad server config is one ScenarioError naming the file, the key path and what is allowed."""
    f = tmp_path / "server.yaml"
    f.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_server_config(f)
    assert err.value.source == str(f) and err.value.paths == [path] and message in str(err.value)
    assert "problem(s) in server config" in str(err.value)


def test_a_server_config_mapping_must_hold_plain_data() -> None:
    """Given in Python, values must be plain data a YAML header can hold, keys strings."""
    with pytest.raises(ScenarioError) as err:
        load_server_config({"hardware": {"gpu": object(), 1: "x", "ok": [1, math.inf]}})
    assert sorted(err.value.paths) == ["hardware.gpu", "hardware.ok[1]", "hardware[1]"]


def test_a_missing_server_config_file_is_reported(tmp_path: Path) -> None:
    """A server config that cannot be read names the file."""
    with pytest.raises(ScenarioError, match="cannot read file"):
        load_server_config(tmp_path / "none.yaml")


def test_the_server_type_comes_from_the_option_or_the_config() -> None:
    """The option wins when the config says nothing; the config's server.type is used without the
    option; both must agree; an unknown type is refused."""
    assert resolve_server_type("llamacpp", ServerConfig()) == "llamacpp"
    assert resolve_server_type(None, ServerConfig(server={"type": "sglang"})) == "sglang"
    assert resolve_server_type("vllm", ServerConfig(server={"type": "vllm"})) == "vllm"
    assert resolve_server_type(None, ServerConfig()) == "other" and "other" in SERVER_TYPES
    with pytest.raises(ScenarioError) as err:
        resolve_server_type("vllm", ServerConfig(server={"type": "llamacpp"}, source="s.yaml"))
    assert err.value.paths == ["server.type"] and err.value.source == "s.yaml"
    with pytest.raises(ValueError, match="server_type must be one of"):
        resolve_server_type("triton", ServerConfig())


@pytest.mark.parametrize(
    ("url", "loopback"),
    [("http://127.0.0.1:8080", True), ("http://127.1.2.3", True), ("http://localhost:1", True), ("http://[::1]:9", True),
     ("http://192.168.1.5:8000", False), ("https://api.example.com/v1", False)],
)
def test_loopback_urls_are_recognised(url: str, loopback: bool) -> None:
    """Loopback addresses and localhost are this machine; anything else is not."""
    assert is_loopback(url) is loopback
