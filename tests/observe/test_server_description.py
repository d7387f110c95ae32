"""The observer on a bare workload spec, and the server it describes in the trace header: the
``server`` block discovered from llama.cpp's ``/props`` and ``/slots`` or the emulated server's own
description, overridden by ``--server-config``; ``hardware``; ``network.measured_rtt_ms``;
``warm_up_requests`` and ``prefix_groups``."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.config import ScenarioError, WorkloadConfig
from simpy_llm.config.schema import TraceSource
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.observe.llamacpp import LlamaCppConfig
from simpy_llm.observe.run import observe
from simpy_llm.observe.server_info import LLAMACPP_DEFAULTS, load_server_config
from simpy_llm.workload.traces import read_trace_v2
from tests.observe.emulate.conftest import SLOW
from tests.observe.fake_server import OK_TOKENS, FakeServer, serve_instance
from tests.observe.fake_thread import in_thread

PROPS: dict[str, Any] = {
    "default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": 1024},
    "total_slots": 3,
    "model_alias": "tiny-alias",
    "model_path": "/models/tiny.gguf",
}


def _bare_workload(tmp_path: Path, n: int = 6, prefix: int = 4) -> Path:
    """A bare workload spec of *n* requests whose lengths the fake server answers well."""
    constant = {"type": "constant", "params": {"value": OK_TOKENS}}
    data = {
        "version": "1",
        "seed": 5,
        "aggregate_rate": 200.0,
        "num_requests": n,
        "clients": [
            {"id": "chat", "arrival": {"process": "poisson"}, "prefix_group": "sys", "prefix_length": prefix,
             "input_distribution": constant, "output_distribution": constant},
            {"id": "plain", "arrival": {"process": "poisson"}, "streaming": False,
             "input_distribution": constant, "output_distribution": constant},
        ],
    }
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class FakeLlamaCpp(FakeServer):
    """The fake OpenAI server plus llama.cpp's /props, /slots and /health (404 where given None)."""

    def __init__(self, props: Any = PROPS, slots: Any = None, models_extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.props, self.slots, self.models_extra = props, slots, models_extra or {}
        self.gets: list[str] = []

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/props", self.get_props)
        app.router.add_get("/slots", self.get_slots)
        app.router.add_get("/health", self.get_health)
        return app

    async def get_props(self, request: web.Request) -> web.Response:
        return self._json(request, self.props)

    async def get_slots(self, request: web.Request) -> web.Response:
        return self._json(request, self.slots)

    async def get_health(self, request: web.Request) -> web.Response:
        return self._json(request, {"status": "ok"})

    def _json(self, request: web.Request, body: Any) -> web.Response:
        self.gets.append(request.path)
        return web.json_response(body) if body is not None else web.json_response({"error": "no"}, status=404)

    async def models(self, request: web.Request) -> web.Response:
        self.gets.append(request.path)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model", **self.models_extra}]})


def _header(out: Path) -> dict[str, Any]:
    return read_trace_v2(out / "trace").header


# ------------------------------------------------------------------ llama.cpp


def test_the_llamacpp_block_is_discovered_from_props(tmp_path: Path) -> None:
    """With --server-type llamacpp the block holds the slots, the per-slot and whole context and the
    model alias from /props (listed as discovered), llama.cpp's defaults for the batch sizes, prompt
    cache and host cache (listed as defaulted), and null threads; the loopback machine is the
    hardware; the round trip is measured on /health."""
    fake = FakeLlamaCpp()
    with in_thread(lambda: serve_instance(fake)):
        summary = observe(_bare_workload(tmp_path), fake.url, tmp_path / "run", server_type="llamacpp", timeout_s=10.0)
    assert summary.status_counts == {"ok": 6}
    h = _header(tmp_path / "run")
    server = h["server"]
    assert (server["type"], server["model"], server["n_parallel"], server["ctx_per_slot"], server["n_ctx"]) == (
        "llamacpp", "tiny-alias", 3, 1024, 3072
    )
    assert {k: server[k] for k in LLAMACPP_DEFAULTS} == LLAMACPP_DEFAULTS and server["threads"] is None
    assert server["discovered"] == ["model", "n_parallel", "ctx_per_slot", "n_ctx"]
    assert server["defaulted"] == ["n_batch", "n_ubatch", "cache_prompt", "cache_ram_mib"]
    assert h["hardware"]["cores"] == os.cpu_count() and h["hardware"]["cpu"]
    assert h["network"]["rtt_probe"] == "/health" and h["network"]["measured_rtt_ms"] > 0
    assert fake.gets.count("/health") == 5
    assert h["model"] == "fake-model"  # the model requested: the first of /v1/models


def test_slots_fill_in_what_props_does_not_say(tmp_path: Path) -> None:
    """Without total_slots and the per-slot context in /props, /slots gives them (one entry per
    slot, each with its n_ctx); without a model alias the model file's stem is the model."""
    props = {"default_generation_settings": {"params": {}}, "model_path": "/models/tiny.gguf"}
    fake = FakeLlamaCpp(props=props, slots=[{"id": 0, "n_ctx": 512}, {"id": 1, "n_ctx": 512}])
    with in_thread(lambda: serve_instance(fake)):
        observe(_bare_workload(tmp_path, n=2), fake.url, tmp_path / "run", server_type="llamacpp", timeout_s=10.0)
    server = _header(tmp_path / "run")["server"]
    assert (server["model"], server["n_parallel"], server["ctx_per_slot"], server["n_ctx"]) == ("tiny", 2, 512, 1024)
    assert set(server["discovered"]) == {"model", "n_parallel", "ctx_per_slot", "n_ctx"}


def test_the_server_config_overrides_what_is_discovered(tmp_path: Path) -> None:
    """--server-config values win over discovered ones (and leave the discovered/defaulted lists),
    extra keys are written as given, and hardware and network keys join the measured ones."""
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"type": "llamacpp", "n_parallel": 8, "threads": 2, "n_batch": 1024, "flash_attn": "off"},
        "hardware": {"cpu": "the given CPU"},
        "network": {"site": "lab"},
    }))
    fake = FakeLlamaCpp()
    with in_thread(lambda: serve_instance(fake)):
        observe(_bare_workload(tmp_path, n=2), fake.url, tmp_path / "run", server_config=config, timeout_s=10.0)
    h = _header(tmp_path / "run")
    server = h["server"]
    assert (server["type"], server["n_parallel"], server["threads"], server["n_batch"], server["flash_attn"]) == ("llamacpp", 8, 2, 1024, "off")
    assert server["ctx_per_slot"] == 1024 and server["n_ctx"] == 3072  # discovered: the server's own figure
    assert "n_parallel" not in server["discovered"] and "n_batch" not in server["defaulted"]
    assert h["hardware"] == {"cpu": "the given CPU", "cores": os.cpu_count()}
    assert h["network"]["site"] == "lab" and h["network"]["measured_rtt_ms"] > 0


def test_the_launchers_server_block_is_a_server_config() -> None:
    """LlamaCppConfig.server_block() gives the launcher's slots, contexts, threads, prompt cache and
    KV layout (the very value its server parameters set), with xllamacpp's defaults for the batch
    sizes and host cache, under the block's names, and passes as a server config."""
    xllamacpp = pytest.importorskip("xllamacpp", reason="needs the real-server extra (xllamacpp): pip install -e '.[real-server]'")

    from simpy_llm.observe.server_info import load_server_config

    block = LlamaCppConfig(parallel=2, ctx=4096, threads=1, cache_prompt=False).server_block()
    defaults = xllamacpp.CommonParams()
    assert block == {
        "type": "llamacpp", "model": "gemma-3-270m-q4_k_m", "n_parallel": 2, "ctx_per_slot": 2048, "n_ctx": 4096,
        "threads": 1, "cache_prompt": False, "kv_unified": False, "n_batch": defaults.n_batch, "n_ubatch": defaults.n_ubatch,
        "cache_ram_mib": defaults.cache_ram_mib,
    }
    assert load_server_config({"server": block}).server == block
    assert LlamaCppConfig(parallel=2).params("model.gguf").kv_unified is block["kv_unified"]


# ------------------------------------------------------------------ other types


def test_other_servers_get_the_model_and_the_config_only(tmp_path: Path) -> None:
    """By default (type other) the block is the model (read from /v1/models, so discovered) and the
    config's keys: llama.cpp's endpoints are not asked, no hardware is assumed; a server without
    /health is timed on /v1/models."""
    llama = FakeLlamaCpp()
    with in_thread(lambda: serve_instance(llama)):
        observe(_bare_workload(tmp_path, n=2), llama.url, tmp_path / "a", timeout_s=10.0, server_config={"server": {"gpu": "none"}})
    h = _header(tmp_path / "a")
    assert h["server"] == {"type": "other", "model": "fake-model", "gpu": "none", "discovered": ["model"], "defaulted": []}
    assert h["hardware"] == {} and h["network"]["rtt_probe"] == "/health"
    assert "/props" not in llama.gets and "/slots" not in llama.gets
    plain = FakeServer()
    with in_thread(lambda: serve_instance(plain)):
        observe(_bare_workload(tmp_path, n=2), plain.url, tmp_path / "b", timeout_s=10.0)
    network = _header(tmp_path / "b")["network"]
    assert network["rtt_probe"] == "/v1/models" and network["measured_rtt_ms"] > 0


def test_vllm_max_model_len_is_read_from_the_model_card(tmp_path: Path) -> None:
    """For vllm the model's card in /v1/models gives max_model_len; --model given by the user is
    not discovered; the other vLLM keys are null unless the config gives them."""
    fake = FakeLlamaCpp(props=None, models_extra={"max_model_len": 8192})
    with in_thread(lambda: serve_instance(fake)):
        observe(_bare_workload(tmp_path, n=2), fake.url, tmp_path / "run", model="fake-model", server_type="vllm",
                server_config={"server": {"max_num_seqs": 64}}, timeout_s=10.0)
    server = _header(tmp_path / "run")["server"]
    assert (server["max_model_len"], server["max_num_seqs"], server["block_size"]) == (8192, 64, None)
    assert server["discovered"] == ["max_model_len"]


def test_the_emulated_server_is_described_by_itself(tmp_path: Path) -> None:
    """Against ``EmulatedServer`` with --server-type emulated the block is the server's own
    description: its engine keys, serving section and seed rebuild the served scenario, and the
    observed trace replays on it past the server-block check."""
    scenario = scenario_from_dict(copy.deepcopy(SLOW))
    spec = tmp_path / "workload.yaml"
    spec.write_text(yaml.safe_dump({**copy.deepcopy(SLOW["workload"]), "num_requests": 4, "seed": 3}))
    with in_thread(lambda: EmulatedServer(scenario)) as server:
        summary = observe(spec, server.url, tmp_path / "run", server_type="emulated", timeout_s=30.0)
    assert summary.status_counts == {"ok": 4}
    h = _header(tmp_path / "run")
    block = h["server"]
    assert (block["type"], block["model"], block["max_num_seqs"], block["block_size"], block["replicas"]) == ("emulated", "emulate-slow", 4, 16, 2)
    assert {"serving", "seed", "simulation_mode", "max_num_seqs"} <= set(block["discovered"])
    rebuilt = scenario_from_dict({"seed": block["seed"], "workload": copy.deepcopy(SLOW["workload"]), "serving": block["serving"]})
    assert rebuilt.serving == scenario.serving
    assert h["hardware"]["cores"] == os.cpu_count()
    replay = scenario.replace(workload={"traces": [{"path": str(tmp_path / "run" / "trace.csv"), "arrival_column": "send_time_us"}]})
    assert isinstance(replay.workload.traces[0], TraceSource)
    assert Simulation(replay).run().summary()["requests"]["completed"] == 4


# ------------------------------------------------------------------ warm-up, prefix groups, the command


def test_warm_up_requests_and_prefix_groups_are_written(tmp_path: Path) -> None:
    """The header holds warm_up_requests as given and each prefix group's shared length; every
    request, warm-up ones included, is sent and recorded; the workload spec and its seed are named."""
    fake = FakeServer()
    spec = _bare_workload(tmp_path, n=5, prefix=7)
    with in_thread(lambda: serve_instance(fake)):
        summary = observe(spec, fake.url, tmp_path / "run", warm_up_requests=3, timeout_s=10.0)
    h = _header(tmp_path / "run")
    assert (h["warm_up_requests"], h["prefix_groups"], h["workload_spec"], h["seed"]) == (3, {"sys": 7}, str(spec), 5)
    assert summary.status_counts == {"ok": 5} and len(read_trace_v2(tmp_path / "run" / "trace")) == 5


def test_observe_takes_a_loaded_workload_with_overrides(tmp_path: Path) -> None:
    """A loaded bare spec is observed as its file would be, with overrides relative to it."""
    from simpy_llm.loading import load_workload

    fake = FakeServer()
    wl = load_workload(_bare_workload(tmp_path, n=6))
    assert isinstance(wl, WorkloadConfig)
    with in_thread(lambda: serve_instance(fake)):
        summary = observe(wl, fake.url, tmp_path / "run", overrides=["num_requests=3"], timeout_s=10.0)
    assert summary.n_requests == 3 and _header(tmp_path / "run")["seed"] == 5


def test_bad_inputs_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """A negative warm-up, an unknown server type or a bad server config raise before the first
    request (the server sees none and no output is written)."""
    fake = FakeServer()
    spec = _bare_workload(tmp_path, n=2)
    bad_config = tmp_path / "server.yaml"
    bad_config.write_text("server: {n_parallel: -4}\n")
    with in_thread(lambda: serve_instance(fake)):
        with pytest.raises(ValueError, match="warm_up_requests must be a whole number"):
            observe(spec, fake.url, tmp_path / "a", warm_up_requests=-1)
        with pytest.raises(ValueError, match="server_type must be one of"):
            observe(spec, fake.url, tmp_path / "b", server_type="triton")
        with pytest.raises(ScenarioError) as err:
            observe(spec, fake.url, tmp_path / "c", server_config=bad_config)
    assert err.value.source == str(bad_config) and err.value.paths == ["server.n_parallel"]
    assert fake.bodies == [] and not any((tmp_path / d).exists() for d in "abc")


def test_the_command_writes_the_blocks_and_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``simpy-llm observe SPEC --server-type llamacpp --server-config FILE --warm-up-requests N`` on a
    bare spec writes them to the header; a bad config or a negative warm-up exits 2 naming it."""
    fake = FakeLlamaCpp()
    spec = _bare_workload(tmp_path, n=4)
    config = tmp_path / "server.yaml"
    config.write_text("server: {threads: 1}\nhardware: {note: ci}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {cache_prompt: 3}\nextra: 1\n")
    common = ["observe", str(spec), "--url", "", "--timeout", "10", "--set", "workload.num_requests=3"]
    with in_thread(lambda: serve_instance(fake)):
        common[3] = fake.url
        ok = main([*common, "--out", str(tmp_path / "run"), "--server-type", "llamacpp", "--server-config", str(config), "--warm-up-requests", "2"])
        sent = len(fake.bodies)
        bad_code = main([*common, "--out", str(tmp_path / "bad"), "--server-config", str(bad)])
        negative = main([*common, "--out", str(tmp_path / "neg"), "--warm-up-requests", "-1"])
    assert ok == 0 and sent == 3 and len(fake.bodies) == 3
    h = _header(tmp_path / "run")
    assert (h["warm_up_requests"], h["server"]["type"], h["server"]["threads"], h["hardware"]["note"]) == (2, "llamacpp", 1, "ci")
    assert (bad_code, negative) == (2, 2)
    err = capsys.readouterr().err
    assert f"{bad}: 2 problem(s) in server config" in err and "server.cache_prompt" in err and "extra: unknown key" in err
    assert "--warm-up-requests must be at least 0" in err


def test_observe_runs_from_inside_a_running_event_loop(tmp_path: Path) -> None:
    """Called from a thread that runs an event loop (a Jupyter kernel's), observe() runs the
    workload on a loop of its own and returns its summary, with no signal handler to add."""
    import asyncio

    fake = FakeServer()

    async def in_a_kernel() -> Any:
        return observe(_bare_workload(tmp_path, n=3), fake.url, tmp_path / "run", timeout_s=10.0)

    with in_thread(lambda: serve_instance(fake)):
        summary = asyncio.run(in_a_kernel())
    assert summary.status_counts == {"ok": 3}
    assert (tmp_path / "run" / "trace.csv").exists()


def test_the_network_keys_a_calibration_reads_are_checked() -> None:
    """The server config's network bandwidth, bytes per token and round trip must be numbers in
    range (or null): anything else is an error naming each key path; good values are kept."""
    with pytest.raises(ScenarioError) as err:
        load_server_config({"network": {"bandwidth_mbps": 0, "bytes_per_token": "four", "measured_rtt_ms": -1.0}})
    assert err.value.paths == ["network.bandwidth_mbps", "network.bytes_per_token", "network.measured_rtt_ms"]
    assert "network.bandwidth_mbps: must be a number > 0 (megabits per second, each way) or null, got 0" in str(err.value)
    config = load_server_config({"network": {"bandwidth_mbps": 100, "bytes_per_token": 4, "link": "wifi"}})
    assert config.network == {"bandwidth_mbps": 100, "bytes_per_token": 4, "link": "wifi"}
