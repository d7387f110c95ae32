"""The observer against a real llama.cpp server (1 thread, 4 slots) on this machine.

Timing assertions here are sanity bands around the server's measured speed (docs/real-server.md),
wide enough for a slower or busier machine: they check that the observer measures something
plausible on a real server, not how fast our code is.
"""

from __future__ import annotations

import asyncio
import statistics
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

pytestmark = pytest.mark.real_server

NO_CACHE = {"cache_prompt": False}
"""Request body extra: prefill every prompt in full (prompts differ anyway; this makes it certain)."""

LAG_THRESHOLD_S = 0.5
"""Client lag that would make the run warn (and the test fail): far above a healthy run's."""


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
        for i, (t, a, b) in enumerate(zip(arrivals, inputs, outputs))
    ]


def _run(
    server: LlamaCppServer, requests: list[dict[str, Any]], path: Path, endpoint: str
) -> tuple[RunSummary, LoadGenerator]:
    async def go() -> tuple[RunSummary, LoadGenerator]:
        async with OpenAIClient(server.url, timeout_s=60.0) as client:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(
                    client, requests, writer, endpoint=endpoint, extra_body=NO_CACHE, lag_threshold_s=LAG_THRESHOLD_S
                )
                return await gen.run(), gen

    return asyncio.run(go())


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
    8-16 output tokens with ignore_eos): at least 95% end ok; every ok row has the server's usage
    counts, exactly max_tokens generated and a prompt count close to the requested length; TTFT
    per prompt token (median 1-30 ms) and the median inter-token latency (2-400 ms) are plausible
    for this server; the trace reads back with one row per request."""
    requests = _open_loop(30, rate_per_s=1.0, seed=20261123)
    summary, gen = _run(llamacpp_server, requests, tmp_path / "trace", "completions")

    assert summary.n_requests == summary.n_sent == 30 and not summary.lagging
    recs = [gen.records[r["request_id"]] for r in requests]
    ok = [r for r in recs if r.status == "ok"]
    assert len(ok) >= 0.95 * len(recs), [(r.request_id, r.status, r.error_message) for r in recs if r.status != "ok"]
    for req, rec in zip(requests, recs):
        if rec.status != "ok":
            continue
        assert rec.prompt_tokens_source == "usage" and rec.completion_tokens_source == "usage"
        assert rec.completion_tokens == req["output_tokens"]
        assert rec.prompt_tokens is not None
        # one synthetic word is about one token; the server adds BOS
        assert req["input_tokens"] <= rec.prompt_tokens <= 1.05 * req["input_tokens"] + 2
        assert len(rec.content_times_s) >= 2 and rec.ttft_s is not None and rec.ttft_s > 0

    ttft_per_token_ms = statistics.median(r.ttft_s / r.prompt_tokens * 1e3 for r in ok)  # type: ignore[operator]
    itl_ms = statistics.median(gap * 1e3 for r in ok for gap in r.itl_s)
    assert 1.0 <= ttft_per_token_ms <= 30.0, ttft_per_token_ms
    assert 2.0 <= itl_ms <= 400.0, itl_ms

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
    summary, gen = _run(llamacpp_server, requests, tmp_path / "chat", "chat")

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
    grow by exactly one request's prompt and generated tokens after that request."""
    assert llamacpp_server.url is not None and llamacpp_server.url.startswith("http://127.0.0.1:")

    async def scrape(session: aiohttp.ClientSession) -> tuple[str, dict[str, float]]:
        async with session.get(llamacpp_server.url + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        return text, _metrics(text)

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(llamacpp_server.url + "/health") as resp:
                assert resp.status == 200
            text, before = await scrape(session)
        assert "# TYPE llamacpp:prompt_tokens_total counter" in text
        for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing"):
            assert name in before

        async with OpenAIClient(llamacpp_server.url, timeout_s=60.0) as client:
            assert await client.list_models() == [MODEL_ALIAS]
            assert await client.default_model() == MODEL_ALIAS == llamacpp_server.model
            body = {"ignore_eos": True, **NO_CACHE}
            spec = RequestSpec("one two three four five six seven", 5, "completions", extra_body=body)
            rec = await client.send(spec)
        assert rec.status == "ok" and rec.prompt_tokens is not None and rec.completion_tokens == 5

        # The counters are updated when the slot is released, which can trail the response's end.
        predicted = "llamacpp:tokens_predicted_total"
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 5.0
            while True:
                _, after = await scrape(session)
                if after[predicted] > before[predicted] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
        assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == rec.prompt_tokens
        assert after[predicted] - before[predicted] == 5

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
