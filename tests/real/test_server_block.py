"""The observer describes the real llama.cpp server by itself: ``--server-type llamacpp`` reads
the slots and the per-slot context from ``/props`` (and ``/slots``), and they are the launcher's.
A bare workload spec is sent as it is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm.config import EngineConfig
from simpy_llm.observe.llamacpp import LlamaCppServer
from simpy_llm.observe.run import observe
from simpy_llm.workload.traces import read_trace_v2, server_block_mismatches
from tests.real.conftest import CTX_PER_SLOT, PARALLEL

pytestmark = pytest.mark.real_server


def _bare_workload(tmp_path: Path) -> Path:
    """Two short requests, as a bare workload spec (no serving section)."""
    constant_in = {"type": "constant", "params": {"value": 16}}
    constant_out = {"type": "constant", "params": {"value": 4}}
    data: dict[str, Any] = {
        "version": "1",
        "seed": 3,
        "aggregate_rate": 2.0,
        "num_requests": 2,
        "clients": [{"id": "probe", "arrival": {"process": "poisson"}, "input_distribution": constant_in, "output_distribution": constant_out}],
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def described(tmp_path_factory: pytest.TempPathFactory, llamacpp_server: LlamaCppServer) -> dict[str, Any]:
    """The header of a short run against the shared server with ``server_type="llamacpp"``."""
    assert llamacpp_server.returncode is None and llamacpp_server.url is not None
    out = tmp_path_factory.mktemp("described") / "run"
    observe(_bare_workload(out.parent), llamacpp_server.url, out, server_type="llamacpp", warm_up_requests=1, timeout_s=120.0)
    return read_trace_v2(out / "trace").header


def test_slots_and_context_are_discovered_as_the_launcher_set_them(described: dict[str, Any], llamacpp_server: LlamaCppServer) -> None:
    """n_parallel and ctx_per_slot come from the server itself and equal the launcher's config;
    the model is its alias; n_ctx is their product."""
    server = described["server"]
    assert server["type"] == "llamacpp"
    assert server["n_parallel"] == llamacpp_server.config.parallel == PARALLEL
    assert server["ctx_per_slot"] == llamacpp_server.config.ctx_per_slot == CTX_PER_SLOT
    assert server["n_ctx"] == PARALLEL * CTX_PER_SLOT
    assert {"n_parallel", "ctx_per_slot"} <= set(server["discovered"])
    assert server["model"] == llamacpp_server.model


def test_the_launchers_block_agrees_with_the_discovered_one(described: dict[str, Any], llamacpp_server: LlamaCppServer) -> None:
    """Every setting both the launcher's server_block() and the server report agrees; the
    engine those settings describe passes the replay check."""
    server, launcher = described["server"], llamacpp_server.config.server_block()
    for key in server["discovered"]:
        if key in launcher:
            assert server[key] == launcher[key], key
    engine = EngineConfig(
        max_num_seqs=launcher["n_parallel"],
        max_num_batched_tokens=min(launcher["n_batch"], launcher["n_ctx"]),
        max_model_len=launcher["ctx_per_slot"],
        prefix_caching=launcher["cache_prompt"],
        kv_num_blocks=launcher["n_ctx"],
        ubatch_tokens=launcher["n_ubatch"],
        ubatch_split="simple" if launcher["kv_unified"] else "by_slot",  # the launcher's KV layout
    )
    assert server_block_mismatches({"server": {**launcher}}, engine) == []


def test_the_local_machine_network_and_warm_up_are_written(described: dict[str, Any]) -> None:
    """On loopback the hardware is this machine; the round trip was measured on /health; the
    warm-up count is in the header."""
    assert described["hardware"]["cores"] == os.cpu_count() and described["hardware"]["cpu"]
    assert described["network"]["rtt_probe"] == "/health" and described["network"]["measured_rtt_ms"] > 0
    assert described["warm_up_requests"] == 1
