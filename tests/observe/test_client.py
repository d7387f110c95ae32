"""The OpenAI-compatible client against fake servers, well-behaved and not."""

from __future__ import annotations

import asyncio

from simpy_llm.observe.client import ObservedRequest, OpenAIClient, RequestSpec, RetryPolicy
from tests.observe.fake_server import PROMPT_TOKENS, serve

TIMEOUT_S = 2.0
"""Client timeout where one is tested: the fake server's slow mode only ends when the client gives
up, and a well-behaved fake request (milliseconds) stays far inside it on a busy machine."""


def _ordered(rec: ObservedRequest) -> None:
    times = [rec.sent_s, rec.headers_s, rec.first_byte_s, rec.first_chunk_s, rec.first_content_s, rec.last_chunk_s, rec.done_s]
    assert None not in times
    assert times == sorted(times)  # type: ignore[type-var]
    assert rec.chunk_times_s == sorted(rec.chunk_times_s)
    assert set(rec.content_times_s) <= set(rec.chunk_times_s)


async def _send(specs: list[RequestSpec], **client_kw: object) -> tuple[list[ObservedRequest], object]:
    async with serve() as fake:
        async with OpenAIClient(fake.url, **client_kw) as client:  # type: ignore[arg-type]
            records = await asyncio.gather(*(client.send(s) for s in specs))
    return list(records), fake


def test_streaming_and_plain_requests_on_both_endpoints() -> None:
    """Streamed and non-streamed chat and completions requests end ok with the server's usage
    counts (source "usage"), ordered timestamps, one content time per token chunk, the model
    found through /v1/models, the API key sent, usage asked for in streams, and derived metrics."""
    specs = [RequestSpec("hello", 5, ep, stream, request_id=i) for i, (ep, stream) in enumerate(
        [("chat", True), ("completions", True), ("chat", False), ("completions", False)])]
    records, fake = asyncio.run(_send(specs, api_key="sk-test"))
    for rec in records:
        assert rec.status == "ok", rec.error_message
        assert rec.http_status == 200 and rec.attempts == 1
        assert (rec.prompt_tokens, rec.completion_tokens) == (PROMPT_TOKENS, 5)
        assert rec.prompt_tokens_source == rec.completion_tokens_source == "usage"
        _ordered(rec)
        assert rec.ttft_s is not None and rec.e2e_s is not None and 0 <= rec.ttft_s <= rec.e2e_s
    for rec in records[:2]:
        assert len(rec.content_times_s) == 5
        assert len(rec.itl_s) == 4 and all(g >= 0 for g in rec.itl_s)
        assert rec.tpot_s is not None and rec.tpot_s >= 0
    assert records[0].output_chars == len("".join(f" t{i}" for i in range(5)))
    assert all(b["model"] == "fake-model" for b in fake.bodies)  # type: ignore[attr-defined]
    assert all(h["Authorization"] == "Bearer sk-test" for h in fake.headers)  # type: ignore[attr-defined]
    streamed = [b for b in fake.bodies if b["stream"]]  # type: ignore[attr-defined]
    assert len(streamed) == 2 and all(b["stream_options"] == {"include_usage": True} for b in streamed)


def test_reasoning_content_counts_as_tokens() -> None:
    """reasoning_content deltas are token chunks: they set the first-token time and count in ITL."""
    (rec,), _ = asyncio.run(_send([RequestSpec("think", 14)]))
    assert rec.status == "ok"
    assert len(rec.content_times_s) == 14 and rec.reasoning_chars == 6
    _ordered(rec)


def test_misbehaving_servers_are_recorded_not_raised() -> None:
    """Each failure is a record, never an exception: a killed stream, a truncated stream
    (no [DONE]), 429 and 503 (HTTP status kept), a first byte later than the timeout
    (status timeout), invalid JSON in a chunk, a connection reset, and an error event; and
    without usage a stream's completion count comes from its chunks."""
    modes = {6: "error", 7: "error", 8: "error", 9: "error", 10: "timeout", 11: "error", 12: "error", 13: "error"}
    specs = [RequestSpec("x", n, request_id=n) for n in modes]
    records, _ = asyncio.run(_send(specs, timeout_s=TIMEOUT_S))
    by_id = {r.request_id: r for r in records}
    for n, status in modes.items():
        rec = by_id[n]
        assert rec.status == status, (n, rec.status, rec.error_message)
        assert rec.error_message
        assert rec.attempts == 1 and rec.done_s is not None and rec.sent_s is not None and rec.sent_s <= rec.done_s
    assert (by_id[8].http_status, by_id[9].http_status) == (429, 503)
    assert "rate limited" in by_id[8].error_message
    assert "[DONE]" in by_id[7].error_message
    assert "invalid JSON" in by_id[11].error_message
    assert "engine died" in by_id[13].error_message
    assert by_id[6].completion_tokens_source == "chunks" and by_id[6].completion_tokens == 2
    assert by_id[12].http_status is None


def test_retry_policy_counts_every_attempt() -> None:
    """With a bounded retry policy a 429 storm ends in status error after max_retries + 1
    attempts (each HTTP status kept), and a server that recovers gives ok on a later attempt."""

    async def run() -> tuple[ObservedRequest, ObservedRequest]:
        policy = RetryPolicy(max_retries=2, base_delay_s=0.01)
        async with serve() as fake, OpenAIClient(fake.url, retry=policy) as client:
            storm = await client.send(RequestSpec("x", 8))
        async with serve(fail_first=1) as fake, OpenAIClient(fake.url, retry=policy) as client:
            recovered = await client.send(RequestSpec("x", 5))
        return storm, recovered

    storm, recovered = asyncio.run(run())
    assert (storm.status, storm.http_status, storm.attempts) == ("error", 429, 3)
    assert storm.attempt_statuses == [429, 429, 429]
    assert (recovered.status, recovered.attempts, recovered.attempt_statuses) == ("ok", 2, [429, 200])
    assert recovered.sent_s is not None and recovered.last_sent_s is not None and recovered.sent_s < recovered.last_sent_s


def test_cancellation_marks_the_record() -> None:
    """Cancelling a request in flight re-raises CancelledError and leaves the caller's record
    marked cancelled with its send time."""

    async def run() -> ObservedRequest:
        async with serve(token_delay_s=0.05) as fake, OpenAIClient(fake.url, model="m") as client:
            rec = ObservedRequest()
            task = asyncio.create_task(client.send(RequestSpec("x", 50), rec))
            while rec.first_content_s is None:
                await asyncio.sleep(0.01)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            return rec

    rec = asyncio.run(run())
    assert rec.status == "cancelled" and rec.sent_s is not None and rec.done_s is not None
