"""The emulated server describes itself (``GET /simpy_llm/server``): vLLM-style engine keys, the
whole serving section, seed and mode, enough to rebuild the serving system exactly."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import aiohttp

from simpy_llm import Scenario, Simulation, load_scenario, scenario_from_dict
from simpy_llm.observe.emulate import EmulatedServer, replay_scenario
from simpy_llm.observe.emulate.server import DESCRIPTION_PATH
from simpy_llm.workload.traces import read_trace_v2, server_block_mismatches
from tests.observe.emulate.conftest import SLOW
from tests.observe.serve_process import serve_process


def _get_description(scenario: Scenario, **kw: Any) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        async with EmulatedServer(scenario, **kw) as server, aiohttp.ClientSession() as session:
            async with session.get(server.url + DESCRIPTION_PATH) as resp:
                return resp.status, await resp.json()

    return asyncio.run(go())


def test_the_endpoint_describes_the_served_system(slow_scenario: Scenario) -> None:
    """GET /simpy_llm/server answers with type emulated, the model, the engine's settings under
    vLLM's names, the replicas, the scenario's seed and the mode the server runs."""
    status, d = _get_description(slow_scenario)
    assert status == 200
    assert (d["type"], d["model"], d["scenario"], d["replicas"], d["seed"]) == ("emulated", "emulate-slow", "emulate-slow", 2, 3)
    assert (d["max_num_seqs"], d["block_size"], d["max_num_batched_tokens"], d["enable_prefix_caching"]) == (4, 16, 128, True)
    assert d["max_model_len"] is None and d["simulation_mode"] == "event_per_step"


def test_the_description_rebuilds_the_serving_system(slow_scenario: Scenario) -> None:
    """The description's serving section, seed and mode with any workload give a scenario whose
    serving equals the served one, and whose engine the description's keys match."""
    _status, d = _get_description(slow_scenario)
    rebuilt = scenario_from_dict(
        {"seed": d["seed"], "workload": copy.deepcopy(SLOW["workload"]), "serving": d["serving"], "simulation": {"mode": d["simulation_mode"]}}
    )
    assert rebuilt.serving == slow_scenario.serving and rebuilt.seed == slow_scenario.seed
    assert server_block_mismatches({"server": d}, rebuilt.serving.groups()[0].engine) == []


def test_keys_that_differ_across_replica_groups_are_left_out(slow_data: dict[str, Any]) -> None:
    """In a fleet whose groups differ in a setting, that setting is not given (no value would be
    true of every replica); the ones they share are."""
    serving = slow_data["serving"]
    engine, latency = serving.pop("engine"), serving.pop("latency_model")
    serving.pop("replicas")
    serving["replica_groups"] = [
        {"name": "small", "count": 1, "engine": engine, "latency_model": latency},
        {"name": "big", "count": 2, "engine": {**engine, "max_num_seqs": 8}, "latency_model": latency},
    ]
    d = EmulatedServer(scenario_from_dict(slow_data)).description()
    assert "max_num_seqs" not in d and d["block_size"] == 16 and d["replicas"] == 3


def test_the_served_trace_carries_the_description_and_replays_past_the_check(slow_scenario: Scenario, tmp_path: Path) -> None:
    """The server's own trace has the description as its server block; replaying it on the served
    scenario passes the server-block check, and on another engine does not."""

    async def go() -> None:
        async with EmulatedServer(slow_scenario, trace=tmp_path / "served") as server, aiohttp.ClientSession() as session:
            body = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 3}
            async with session.post(server.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()

    asyncio.run(go())
    header = read_trace_v2(tmp_path / "served").header
    assert header["server"]["type"] == "emulated" and header["server"]["max_num_seqs"] == 4
    replay = replay_scenario(slow_scenario, tmp_path / "served")
    assert Simulation(replay).run().summary()["requests"]["completed"] == 1
    other = replay.replace(**{"serving.engine.max_num_seqs": 5})
    assert [p for p, _ in server_block_mismatches(header, other.serving.engine)] == ["max_num_seqs"]


def test_serve_takes_a_scenario_whose_workload_is_a_file(tmp_path: Path) -> None:
    """``simpy-llm serve`` on the shipped scenario that references its workload file serves that
    scenario's system (its description says so) and draws output lengths from the file's clients."""
    scenario_file = Path(__file__).resolve().parents[3] / "scenarios" / "two_clients_by_reference.yaml"
    expected = load_scenario(scenario_file)

    async def ask(url: str) -> tuple[Any, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + DESCRIPTION_PATH) as resp:
                description = await resp.json()
            body = {"messages": [{"role": "user", "content": "one two"}]}  # no max_tokens: drawn from a client
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                return description, (resp.status, await resp.json())

    with serve_process(scenario_file, tmp_path) as server:
        description, (status, answer) = asyncio.run(ask(server.url))
    assert server.returncode == 0
    assert description["replicas"] == 2 and description["scenario"] == "two_clients_by_reference"
    assert scenario_from_dict({"workload": {"traces": [{"path": "x"}]}, "serving": description["serving"]}).serving == expected.serving
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1
