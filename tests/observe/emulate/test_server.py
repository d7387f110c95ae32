"""The emulated server's HTTP surface: endpoints, bodies, usage, errors, metrics, the served trace."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd
import pytest

from simpy_llm import Scenario, scenario_from_dict
from simpy_llm.observe import ObservedRequest, OpenAIClient, RequestSpec
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.observe.sse import interpret, parse_events
from simpy_llm.workload.traces import read_trace_v2

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _serve(scenario: Scenario, fn: Callable[[EmulatedServer, aiohttp.ClientSession], Awaitable[Any]], **kw: Any) -> Any:
    """Run ``fn(server, session)`` against a fresh server on 127.0.0.1."""

    async def go() -> Any:
        async with EmulatedServer(scenario, **kw) as server, aiohttp.ClientSession() as session:
            return await fn(server, session)

    return asyncio.run(go())


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if resp.content_type == "application/json" else text)


def _chat(content: str = "one two three", **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **kw}


# --------------------------------------------------------------------------- listing and health


def test_models_lists_the_scenario_model(slow_scenario: Scenario) -> None:
    """/v1/models lists one model named after the scenario (no latency-model profile) with max_model_len."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with session.get(server.url + "/v1/models") as resp:
            return resp.status, await resp.json()

    status, body = _serve(slow_scenario, fn)
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["emulate-slow"]
    assert body["data"][0]["max_model_len"] == 768


def test_model_option_renames_the_model_and_health_answers(slow_scenario: Scenario) -> None:
    """--model's name is listed and accepted, another name gets 404 model_not_found; /health is 200."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with session.get(server.url + "/health") as resp:
            health = resp.status
        async with session.get(server.url + "/v1/models") as resp:
            names = [m["id"] for m in (await resp.json())["data"]]
        ok = await _post(session, server.url + CHAT, _chat(model="mine", max_tokens=1))
        other = await _post(session, server.url + CHAT, _chat(model="theirs", max_tokens=1))
        return health, names, ok, other

    health, names, ok, other = _serve(slow_scenario, fn, model="mine")
    assert health == 200 and names == ["mine"]
    assert ok[0] == 200 and ok[1]["model"] == "mine"
    assert other[0] == 404 and other[1]["error"]["code"] == "model_not_found"


# --------------------------------------------------------------------------- answers and usage


def test_streamed_chat_has_role_tokens_usage_and_done(slow_scenario: Scenario) -> None:
    """A streamed chat answer: a role chunk, one content chunk per token (the last with
    finish_reason length), a choices-free usage chunk, then [DONE]."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        body = _chat("a b c d e", max_tokens=4, stream=True, stream_options={"include_usage": True})
        async with session.post(server.url + CHAT, json=body) as resp:
            return resp.status, resp.content_type, await resp.read()

    status, ctype, raw = _serve(slow_scenario, fn)
    assert status == 200 and ctype == "text/event-stream"
    events = parse_events(raw)
    chunks = [interpret(e) for e in events]
    assert chunks[-1].kind == "done"
    first = json.loads(events[0].data)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks if c.has_content]
    assert len(content) == 4 and "".join(c.content for c in content).split() == ["the", "of", "and", "to"]
    assert [c.finish_reason for c in content] == [None, None, None, "length"]
    last = json.loads(events[-2].data)
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_stream_headers_come_before_the_first_token(slow_scenario: Scenario) -> None:
    """A stream's headers are sent when the request is accepted (as vLLM does), its first
    token only after the simulated prefill (about 20 ms later here)."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with OpenAIClient(server.url) as client:
            return await client.send(RequestSpec("a b c", max_tokens=2, endpoint="chat"))

    rec = _serve(slow_scenario, fn)
    assert rec.status == "ok" and rec.headers_s is not None and rec.first_content_s is not None
    assert rec.headers_s < rec.first_content_s


def test_stream_without_include_usage_has_no_usage_chunk(slow_scenario: Scenario) -> None:
    """A streamed completion without stream_options ends with its last token chunk and [DONE]."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with session.post(server.url + COMPLETIONS, json={"prompt": "x y", "max_tokens": 2, "stream": True}) as resp:
            return await resp.read()

    chunks = [interpret(e) for e in parse_events(_serve(slow_scenario, fn))]
    assert [c.kind for c in chunks] == ["data", "data", "done"]
    assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_whole_answers_carry_usage(slow_scenario: Scenario, endpoint: str) -> None:
    """Non-streamed chat and completion answers carry the text (one word per token) and usage."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with OpenAIClient(server.url) as client:
            spec = RequestSpec("w " * 12, max_tokens=3, endpoint=endpoint, stream=False)
            return await client.send(spec)

    rec = _serve(slow_scenario, fn)
    assert rec.status == "ok"
    assert (rec.prompt_tokens, rec.completion_tokens) == (12, 3)
    assert rec.prompt_tokens_source == rec.completion_tokens_source == "usage"
    assert rec.finish_reason == "length" and rec.output_chars == len("the of and")


def test_chat_counts_words_of_every_message_without_overhead(slow_scenario: Scenario) -> None:
    """Chat prompt tokens are the words of all messages (text parts included), no template tokens."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is"}, {"type": "text", "text": "a cat"}]},
            {"role": "assistant", "content": None},
        ]
        return await _post(session, server.url + CHAT, {"messages": messages, "max_completion_tokens": 2, "max_tokens": 9})

    status, body = _serve(slow_scenario, fn)
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}


def test_without_max_tokens_the_length_is_drawn_from_the_first_client(slow_scenario: Scenario) -> None:
    """Without max_tokens the output length comes from the first client's output
    distribution (constant 7 here) and the finish reason is stop."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        return await _post(session, server.url + COMPLETIONS, {"prompt": "hello"})

    status, body = _serve(slow_scenario, fn)
    assert status == 200
    assert body["usage"]["completion_tokens"] == 7 and body["choices"][0]["finish_reason"] == "stop"


def test_without_max_tokens_and_without_clients_is_400(slow_data: dict, tmp_path: Path) -> None:
    """A trace-only scenario has no distribution to draw from: max_tokens is then required."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,input_tokens,output_tokens\n0,1,1\n")
    slow_data["workload"] = {"traces": [{"path": str(trace), "format": "csv"}]}

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        return await _post(session, server.url + COMPLETIONS, {"prompt": "hello"})

    status, body = _serve(scenario_from_dict(slow_data), fn)
    assert status == 400 and body["error"]["param"] == "max_tokens"


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("path", "body", "param", "needle"),
    [
        (CHAT, b"{not json", None, "not valid JSON"),
        (CHAT, b"[1, 2]", None, "JSON object"),
        (CHAT, {"max_tokens": 3}, "messages", "messages is required"),
        (CHAT, {"messages": "hi"}, "messages", "non-empty array"),
        (CHAT, {"messages": []}, "messages", "non-empty array"),
        (CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role", "role"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
        (CHAT, _chat(max_tokens=0), "max_tokens", "at least 1"),
        (CHAT, _chat(max_completion_tokens=-2), "max_completion_tokens", "at least 1"),
        (CHAT, _chat(max_tokens="10"), "max_tokens", "integer"),
        (CHAT, _chat(max_tokens=True), "max_tokens", "integer"),
        (CHAT, _chat(stream="yes"), "stream", "boolean"),
        (CHAT, _chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage", "boolean"),
        (CHAT, _chat(n=2), "n", "n must be 1"),
        (COMPLETIONS, {"max_tokens": 3}, "prompt", "prompt is required"),
        (COMPLETIONS, {"prompt": 12}, "prompt", "prompt must be"),
        (COMPLETIONS, {"prompt": ["a", "b"]}, "prompt", "batched"),
    ],
)
def test_bad_requests_get_openai_error_bodies(
    slow_scenario: Scenario, path: str, body: Any, param: str | None, needle: str
) -> None:
    """Malformed requests get HTTP 400 with an OpenAI-style error body naming the field."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        return await _post(session, server.url + path, body)

    status, reply = _serve(slow_scenario, fn)
    assert status == 400
    err = reply["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and needle in err["message"]


def test_unknown_paths_and_methods_get_json_errors(slow_scenario: Scenario) -> None:
    """An unknown path is 404 and a wrong method 405, both with an OpenAI-style body."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async with session.post(server.url + "/v1/embeddings", json={}) as a, session.get(server.url + CHAT) as b:
            return (a.status, await a.json()), (b.status, await b.json())

    (s404, b404), (s405, b405) = _serve(slow_scenario, fn)
    assert s404 == 404 and b404["error"]["message"] == "Invalid URL (POST /v1/embeddings)"
    assert s405 == 405 and b405["error"]["type"] == "invalid_request_error"


def test_request_over_max_model_len_is_dropped_with_a_context_length_error(slow_scenario: Scenario) -> None:
    """A request the simulator drops (prompt + output over max_model_len 768) gets a 400 with
    vLLM's context-length message; the server records it as dropped, and later requests still work."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        dropped = await _post(session, server.url + CHAT, _chat("w " * 700, max_tokens=100))
        fine = await _post(session, server.url + CHAT, _chat("w " * 600, max_tokens=100))
        return dropped, fine, list(server.served)

    (status, body), (ok, _), served = _serve(slow_scenario, fn)
    assert status == 400 and ok == 200
    err = body["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert err["message"].startswith("This model's maximum context length is 768 tokens. However, you requested 800 tokens")
    assert [(s.status, s.request_id) for s in served] == [("dropped", 0), ("completed", 1)]


# --------------------------------------------------------------------------- metrics and trace


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_report_queues_and_token_counters(slow_scenario: Scenario) -> None:
    """/metrics (Prometheus text, vLLM names) shows running requests while answers are in
    progress (every admitted request running, waiting or finished in the same snapshot) and,
    once they are done, counters of prompt and generated tokens."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        async def ask() -> Any:
            return await _post(session, server.url + COMPLETIONS, {"prompt": "a b c", "max_tokens": 40})

        tasks = [asyncio.create_task(ask()) for _ in range(3)]
        # Scraped once all three are admitted (not after a fixed sleep, which a busy machine can
        # outlast either way); their 40 tokens then take over half a second of 15-ms steps.
        assert server.simulation is not None
        while len(server.simulation.recorder.live) < 3:
            await asyncio.sleep(0.005)
        async with session.get(server.url + "/metrics") as resp:
            during = await resp.text()
        await asyncio.gather(*tasks)
        async with session.get(server.url + "/metrics") as resp:
            return during, await resp.text(), resp.content_type

    during, after, ctype = _serve(slow_scenario, fn)
    assert ctype == "text/plain"
    m0, m1 = _samples(during), _samples(after)
    labels = [f'{{model_name="emulate-slow",engine="{i}"}}' for i in (0, 1)]
    success = 'vllm:request_success_total{model_name="emulate-slow",finished_reason="length"}'
    in_engine = sum(m0[f"vllm:num_requests_running{lab}"] + m0[f"vllm:num_requests_waiting{lab}"] for lab in labels)
    assert in_engine + m0[success] == 3 and in_engine >= 1
    assert sum(m1[f"vllm:num_requests_running{lab}"] for lab in labels) == 0
    assert sum(m1[f"vllm:prompt_tokens_total{lab}"] for lab in labels) == 9
    assert sum(m1[f"vllm:generation_tokens_total{lab}"] for lab in labels) == 120
    assert m1[success] == 3


def test_served_trace_has_one_row_per_request(slow_scenario: Scenario, tmp_path: Path) -> None:
    """With a trace path, each completed or dropped request is a trace v2 row with its
    arrival, lengths, simulated first/last token times, endpoint and replica."""

    async def fn(server: EmulatedServer, session: aiohttp.ClientSession) -> Any:
        await _post(session, server.url + COMPLETIONS, {"prompt": "a b", "max_tokens": 3, "user": "alice"})
        await _post(session, server.url + CHAT, _chat("w " * 1300, max_tokens=1))
        return list(server.served)

    served = _serve(slow_scenario, fn, trace=tmp_path / "served")
    trace = read_trace_v2(tmp_path / "served")
    f = trace.frame
    assert trace.header["mode"] == "real" and trace.header["server"]["model"] == "emulate-slow"
    assert f.request_id.tolist() == [0, 1] and f.status.tolist() == ["ok", "error"]
    assert f.client_id.tolist() == ["alice", "chat"] and f.endpoint.tolist() == ["completions", "chat"]
    assert f.input_tokens.tolist() == [2, 1300] and f.output_tokens.tolist() == [3, 1]
    assert f.arrival_time_us.tolist() == [round(s.arrival_s * 1e6) for s in served]
    assert f.last_chunk_time_us[0] == round(served[0].completion_s * 1e6) and f.last_chunk_time_us.isna()[1]
    assert "max_model_len" in f.error_message[1]


def test_stop_records_requests_in_flight(slow_scenario: Scenario, tmp_path: Path) -> None:
    """Stopping the server with an answer in progress (its first token received, 500 asked for)
    cuts its stream, and records the request as in flight (trace status error, no token times)."""

    async def go() -> Any:
        server = EmulatedServer(slow_scenario, trace=tmp_path / "served")
        await server.start()
        async with OpenAIClient(server.url) as client:
            rec = ObservedRequest()
            task = asyncio.create_task(client.send(RequestSpec("a b", max_tokens=500, endpoint="completions"), rec))
            while not rec.content_times_s:
                await asyncio.sleep(0.01)
            await server.stop()
            return await task, server.served

    rec, served = asyncio.run(go())
    assert rec.status == "error" and 0 < len(rec.content_times_s) < 500
    assert [(s.status, s.error_message) for s in served] == [("in_flight", "server stopped before the request completed")]
    row = read_trace_v2(tmp_path / "served").frame.iloc[0]
    assert row.status == "error" and row.first_chunk_time_us is pd.NA
