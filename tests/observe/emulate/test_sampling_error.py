"""The emulated server when the scenario's output distribution draws a value that is not a
finite number: a clear error naming the distribution's key path, and the server goes on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import attrs

from simpy_llm import Scenario
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.workload.distributions import LogNormal

CHAT = "/v1/chat/completions"


def _overflowing(scenario: Scenario) -> Scenario:
    """*scenario* whose first client's output lengths are lognormal with mu = 800: exp(800)
    overflows float64, so every draw is infinite (no scenario file can give this mu)."""
    dist = LogNormal(mu=1.0, sigma=1.0)
    object.__setattr__(dist, "mu", 800.0)
    client = attrs.evolve(scenario.workload.clients[0], output_distribution=dist)
    return attrs.evolve(scenario, workload=attrs.evolve(scenario.workload, clients=(client,)))


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, json.loads(await resp.text())


def test_a_bad_draw_answers_the_scenario_error_and_the_server_goes_on(slow_scenario: Scenario) -> None:
    """A request without max_tokens, whose length the broken distribution draws, gets a 500 whose
    OpenAI-shaped body carries the command line's message (the scenario, the key path
    workload.clients[0].output_distribution, what went wrong); the next request, with max_tokens,
    is served, and /health stays 200."""
    scenario = _overflowing(slow_scenario)

    async def go() -> Any:
        async with EmulatedServer(scenario) as server, aiohttp.ClientSession() as session:
            bad = await _post(session, server.url + CHAT, {"messages": [{"role": "user", "content": "a b"}]})
            good = await _post(session, server.url + CHAT, {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 3})
            async with session.get(server.url + "/health") as resp:
                health = resp.status
            return bad, good, health, list(server.served)

    (status, body), (ok_status, ok_body), health, served = asyncio.run(go())
    assert status == 500
    error = body["error"]
    assert error["type"] == "server_error" and error["code"] == "scenario_error"
    lines = error["message"].splitlines()
    assert lines[0] == "scenario 'emulate-slow': 1 problem(s) in scenario"
    assert lines[1].startswith("  workload.clients[0].output_distribution: ")
    assert "not finite" in lines[1]
    assert ok_status == 200 and ok_body["usage"]["completion_tokens"] == 3
    assert health == 200
    assert [r.status for r in served] == ["completed"]  # the refused request never entered the simulation


def test_a_simulation_stopped_by_a_bad_draw_reports_it_at_its_key_path(slow_scenario: Scenario) -> None:
    """When a draw inside the running simulation fails (its driver holds the SamplingError),
    every later request is answered 500 with the scenario error naming the distribution's key path."""
    from simpy_llm.workload.distributions import SamplingError

    async def go() -> Any:
        async with EmulatedServer(slow_scenario) as server, aiohttp.ClientSession() as session:
            dist = server.scenario.workload.clients[0].output_distribution
            server.driver.error = SamplingError("drew NaN", dist)
            return await _post(session, server.url + CHAT, {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2})

    status, body = asyncio.run(go())
    assert status == 500
    message = body["error"]["message"]
    assert "the simulation failed: scenario 'emulate-slow': 1 problem(s) in scenario" in message
    assert "workload.clients[0].output_distribution: drew NaN" in message
