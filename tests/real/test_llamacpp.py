"""The observer against a real llama.cpp server (1 thread, 4 slots) on this machine.

No assertion here depends on how fast the machine is or how busy it is. What the observer
measures is checked against what the server reports itself: its ``usage`` token counts, its
``/metrics`` token counters, and the time it spent on a request (``llamacpp:prompt_seconds_total``
and ``llamacpp:tokens_predicted_seconds_total``: prompt processing starts after the request
arrived and the last token is produced before the answer ends, so the client's TTFT and E2E can
only be longer). When requests are sent is checked against the event loop's lag measured during
the run (tests/observe/lag.py). The server's speed (TTFT per prompt token, inter-token latency)
is a figure, printed by ``benchmarks/bench_observe_timing.py``, not asserted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from simpy_llm.observe.client import OpenAIClient, RequestSpec
from simpy_llm.observe.llamacpp import MODEL_ALIAS, LlamaCppConfig, LlamaCppServer, LlamaCppServerError
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, RunSummary
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.lag import LagProbe

pytestmark = pytest.mark.real_server

NO_CACHE = {"cache_prompt": False}
"""Request body extra: prefill every prompt in full (prompts differ anyway; this makes it certain)."""

QUIET = 1e9
"""Lag threshold that never warns: the send times are checked against the measured lag instead."""

DISPATCH_TURNS = 2
"""Loop turns from a send's target time to its dispatch (the timer fires, the dispatcher resumes)."""

COUNTERS_WAIT_S = 60.0
"""How long to wait for llama.cpp's counters to include a finished request (updated when its slot
is released, which can trail the response); only a server that never updates them waits this long."""


def _open_loop(n: int, rate_per_s: float, seed: int, first_id: int = 0) -> list[dict[str, Any]]:
    """*n* Poisson arrivals at *rate_per_s* (first at 0), prompts of 50-100 and outputs of 8-16 tokens."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, n)
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps)
    inputs = rng.integers(50, 101, n)
    outputs = rng.integers(8, 17, n)
    return [
        {"request_id": first_id + i, "arrival_time_s": float(t), "input_tokens": int(a), "output_tokens": int(b)}
        for i, (t, a, b) in enumerate(zip(arrivals, inputs, outputs, strict=True))
    ]


def _run(
    server: LlamaCppServer, requests: list[dict[str, Any]], path: Path, endpoint: str
) -> tuple[RunSummary, LoadGenerator, LagProbe]:
    async def go() -> tuple[RunSummary, LoadGenerator, LagProbe]:
        async with OpenAIClient(server.url, timeout_s=60.0) as client, LagProbe() as probe:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, endpoint=endpoint, extra_body=NO_CACHE, lag_threshold_s=QUIET)
                return await gen.run(), gen, probe

    return asyncio.run(go())


async def _counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return _metrics(await resp.text())


async def _counters_after(session: aiohttp.ClientSession, url: str, before: dict[str, float], tokens: int) -> dict[str, float]:
    """The counters once they include *tokens* more generated tokens than *before* (or after
    :data:`COUNTERS_WAIT_S`)."""
    predicted = "llamacpp:tokens_predicted_total"
    deadline = time.monotonic() + COUNTERS_WAIT_S
    while True:
        after = await _counters(session, url)
        if after[predicted] - before[predicted] >= tokens or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.05)


def _metrics(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition (unlabelled names only, as llama.cpp writes them)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_open_loop_completions(llamacpp_server: LlamaCppServer, tmp_path: Path) -> None:
    """30 streamed completions sent open loop (Poisson, 1 request/s, prompts of 50-100 tokens,
    8-16 output tokens with ignore_eos): each is sent no earlier than its target and dispatched
    within the allowance derived from the event loop's lag measured in its own window; at least
    95% end ok; every ok row has the server's usage counts, exactly max_tokens generated, a prompt
    count close to the requested length and ordered times (sent, first token, last token, end);
    the server's token counter grew by at least the tokens received; the trace reads back with
    one row per request."""
    requests = _open_loop(30, rate_per_s=1.0, seed=20261123)

    async def counters() -> dict[str, float]:
        async with aiohttp.ClientSession() as session:
            return await _counters(session, llamacpp_server.url)

    before = asyncio.run(counters())
    summary, gen, probe = _run(llamacpp_server, requests, tmp_path / "trace", "completions")

    assert summary.n_requests == summary.n_sent == 30
    base = gen.client.run_start
    for rec in gen.records.values():
        assert rec.scheduled_s is not None and rec.dispatched_s is not None and rec.sent_s is not None
        assert rec.scheduled_s <= rec.dispatched_s <= rec.sent_s
        target, dispatched = base + rec.scheduled_s, base + rec.dispatched_s
        assert dispatched - target <= probe.allowance_s(target, dispatched, DISPATCH_TURNS), rec.request_id
    recs = [gen.records[r["request_id"]] for r in requests]
    ok = [r for r in recs if r.status == "ok"]
    assert len(ok) >= 0.95 * len(recs), [(r.request_id, r.status, r.error_message) for r in recs if r.status != "ok"]
    for req, rec in zip(requests, recs, strict=True):
        if rec.status != "ok":
            continue
        assert rec.prompt_tokens_source == "usage" and rec.completion_tokens_source == "usage"
        assert rec.completion_tokens == req["output_tokens"]
        assert rec.prompt_tokens is not None
        # one synthetic word is about one token; the server adds BOS
        assert req["input_tokens"] <= rec.prompt_tokens <= 1.05 * req["input_tokens"] + 2
        assert len(rec.content_times_s) >= 2 and rec.ttft_s is not None and rec.ttft_s > 0
        assert rec.sent_s < rec.content_times_s[0] <= rec.content_times_s[-1] <= rec.done_s  # type: ignore[operator]

    async def counters_after() -> dict[str, float]:
        async with aiohttp.ClientSession() as session:
            return await _counters_after(session, llamacpp_server.url, before, sum(r.completion_tokens for r in ok))  # type: ignore[misc]

    after = asyncio.run(counters_after())
    generated = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert generated >= sum(r.completion_tokens for r in ok)  # type: ignore[misc]

    frame = read_trace_v2(tmp_path / "trace").frame.set_index("request_id")
    assert sorted(frame.index) == [r["request_id"] for r in requests]
    assert (frame.status == "ok").sum() == len(ok)
    good = frame[frame.status == "ok"]
    assert (good.output_tokens == good.requested_output_tokens).all()
    assert (good.completion_tokens_source == "usage").all() and (good.prompt_tokens_source == "usage").all()
    assert (good.first_token_time_us >= good.send_time_us).all()


def test_open_loop_chat(llamacpp_server: LlamaCppServer, tmp_path: Path) -> None:
    """A few streamed chat requests end ok with usage counts: exactly max_tokens generated, and
    a prompt count a little above the requested length (Gemma's turn markers and BOS)."""
    requests = _open_loop(6, rate_per_s=2.0, seed=7, first_id=1000)
    summary, gen, _ = _run(llamacpp_server, requests, tmp_path / "chat", "chat")

    assert summary.status_counts == {"ok": 6}
    for req in requests:
        rec = gen.records[req["request_id"]]
        assert rec.prompt_tokens_source == "usage" and rec.completion_tokens == req["output_tokens"]
        assert rec.prompt_tokens is not None
        # BOS and the turn markers add 9 tokens to the words
        assert req["input_tokens"] + 5 <= rec.prompt_tokens <= 1.05 * req["input_tokens"] + 15
        assert rec.ttft_s is not None and rec.first_content_s is not None and rec.output_chars > 0
    assert len(read_trace_v2(tmp_path / "chat").frame) == 6


def test_chat_template_gives_gemma_turns(llamacpp_server: LlamaCppServer) -> None:
    """The server formats chat messages as Gemma turns (system folded into the first user turn,
    assistant as "model", generation prompt last), not the ChatML fallback of a base model."""

    async def go() -> str:
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ]
        async with aiohttp.ClientSession() as session:
            async with session.post(llamacpp_server.url + "/apply-template", json={"messages": messages}) as resp:
                assert resp.status == 200
                return str((await resp.json())["prompt"])

    prompt = asyncio.run(go())
    assert prompt == (
        "<start_of_turn>user\nBe brief.\n\nName a colour.<end_of_turn>\n"
        "<start_of_turn>model\nBlue.<end_of_turn>\n"
        "<start_of_turn>user\nAnother one?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_models_health_and_metrics(llamacpp_server: LlamaCppServer) -> None:
    """The server listens on 127.0.0.1 only, answers /health, lists its one model under its alias
    at /v1/models (the client picks it), and /metrics is Prometheus text whose llama.cpp counters
    grow by exactly one request's prompt and generated tokens after that request, and by less
    processing time than the client measured: prompt seconds <= TTFT, prompt plus generation
    seconds <= E2E (the server's own clock; the client's spans enclose them)."""
    assert llamacpp_server.url is not None and llamacpp_server.url.startswith("http://127.0.0.1:")

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(llamacpp_server.url + "/health") as resp:
                assert resp.status == 200
            async with session.get(llamacpp_server.url + "/metrics") as resp:
                text = await resp.text()
            before = _metrics(text)
        assert "# TYPE llamacpp:prompt_tokens_total counter" in text
        for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                     "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"):
            assert name in before

        async with OpenAIClient(llamacpp_server.url, timeout_s=60.0) as client:
            assert await client.list_models() == [MODEL_ALIAS]
            assert await client.default_model() == MODEL_ALIAS == llamacpp_server.model
            body = {"ignore_eos": True, **NO_CACHE}
            spec = RequestSpec("one two three four five six seven", 5, "completions", extra_body=body)
            rec = await client.send(spec)
        assert rec.status == "ok" and rec.prompt_tokens is not None and rec.completion_tokens == 5

        async with aiohttp.ClientSession() as session:
            after = await _counters_after(session, llamacpp_server.url, before, 5)
        assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == rec.prompt_tokens
        assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 5
        prompt_s = after["llamacpp:prompt_seconds_total"] - before["llamacpp:prompt_seconds_total"]
        generate_s = after["llamacpp:tokens_predicted_seconds_total"] - before["llamacpp:tokens_predicted_seconds_total"]
        assert rec.ttft_s is not None and rec.e2e_s is not None
        assert 0 < prompt_s <= rec.ttft_s and 0 < generate_s and prompt_s + generate_s <= rec.e2e_s

    asyncio.run(go())


def test_server_that_cannot_start_raises_with_its_log(tmp_path: Path) -> None:
    """A server that exits during start-up (a model file that does not exist) raises
    LlamaCppServerError carrying the end of its log; the process has been reaped and the log kept."""
    server = LlamaCppServer(LlamaCppConfig(port=0, model=str(tmp_path / "missing.gguf")), startup_timeout_s=60.0)
    with pytest.raises(LlamaCppServerError, match="exited with status 1") as info:
        server.start()
    assert "missing.gguf" in str(info.value)
    assert server.returncode == 1 and server.log_path is not None and server.log_path.exists()
    server.log_path.unlink()


def test_server_not_ready_in_time_is_stopped(tmp_path: Path) -> None:
    """A server not ready within the start-up timeout is stopped by its PID (SIGTERM) and the
    error says so; stopping again is harmless."""
    server = LlamaCppServer(LlamaCppConfig(port=0), startup_timeout_s=0.0, log_path=tmp_path / "server.log")
    with pytest.raises(LlamaCppServerError, match="not ready within 0 s"):
        server.start()
    assert server.pid is not None and server.returncode is not None
    assert server.stop() == server.returncode
