"""The client's lean transport (``OpenAIClient(transport="lean")``: an asyncio Protocol per
connection, answers parsed by httptools): the same records as aiohttp's path for the same
answers, SSE split anywhere, servers that close after each answer, HTTP errors, timeouts, and
the fallback to aiohttp without httptools."""

from __future__ import annotations

import asyncio
import itertools
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.observe import lean
from simpy_llm.observe.client import (
    LeanTransportWarning,
    ObservedRequest,
    OpenAIClient,
    RequestSpec,
    RetryPolicy,
)
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.observe.fake_server import MODES, serve
from tests.observe.test_connections import _server

pytest.importorskip("httptools")

DETERMINISTIC = (
    "status", "http_status", "attempts", "attempt_statuses", "prompt_tokens", "completion_tokens",
    "prompt_tokens_source", "completion_tokens_source", "cached_tokens", "output_chars", "reasoning_chars",
    "output_text", "finish_reason",
)
"""The fields of a record that the server's answer decides (not the client's clock)."""


def _fields(rec: ObservedRequest) -> dict[str, Any]:
    out = {name: getattr(rec, name) for name in DETERMINISTIC}
    out["chunks"], out["content_chunks"] = len(rec.chunk_times_s), len(rec.content_times_s)
    return out


async def _both(specs: list[RequestSpec], **client_kw: Any) -> dict[str, list[ObservedRequest]]:
    """*specs* sent one after another through each transport, to one fake server."""
    out = {}
    async with serve() as fake:
        for transport in ("aiohttp", "lean"):
            async with OpenAIClient(fake.url, transport=transport, **client_kw) as client:
                out[transport] = [await client.send(spec) for spec in specs]
    return out


def test_well_formed_answers_give_the_same_records_on_both_transports() -> None:
    """Streamed and plain chat and completions answers (role chunks, pings, a multi-line event,
    CRLF lines, reasoning deltas, usage, [DONE]; chunked bodies) fill the same record fields
    through the lean transport as through aiohttp, kept text included, all ok."""
    shapes = [("chat", True), ("completions", True), ("chat", False), ("completions", False)]
    specs = [RequestSpec("hello", n, ep, stream, request_id=i, keep_text=True)
             for i, (n, (ep, stream)) in enumerate((n, s) for n in (4, 5, 14) for s in shapes)]
    got = asyncio.run(_both(specs, keep_alive=True))
    assert [r.status for r in got["lean"]] == ["ok"] * len(specs)
    assert [_fields(r) for r in got["lean"]] == [_fields(r) for r in got["aiohttp"]]


def test_an_http_error_answer_is_recorded_with_its_message_and_retried() -> None:
    """A 429 answer with a JSON error body and Retry-After, and a 503 with a text body, give
    the same status and error message as through aiohttp; the retry policy retries the 429."""
    specs = [RequestSpec("x", 8), RequestSpec("x", 9)]
    got = asyncio.run(_both(specs, retry=RetryPolicy(max_retries=1, base_delay_s=0.0)))
    for rec_lean, rec_aio in zip(got["lean"], got["aiohttp"], strict=True):
        assert (rec_lean.status, rec_lean.error_message) == (rec_aio.status, rec_aio.error_message)
        assert rec_lean.attempt_statuses == rec_aio.attempt_statuses
    assert got["lean"][0].error_message == "HTTP 429 Too Many Requests: rate limited"
    assert got["lean"][0].attempt_statuses == [429, 429]
    assert got["lean"][1].error_message == "HTTP 503 Service Unavailable: overloaded"


@pytest.mark.parametrize("mode", ["truncated", "bad_json", "error_event"])
def test_misbehaving_streams_give_the_same_records_on_both_transports(mode: str) -> None:
    """A stream ending without [DONE], with invalid JSON, or with an error event gives the same
    record (status and message included) through either transport."""
    n = next(k for k, v in MODES.items() if v == mode)
    got = asyncio.run(_both([RequestSpec("x", n)]))
    assert got["lean"][0].status == "error"
    assert _fields(got["lean"][0]) == _fields(got["aiohttp"][0])
    assert got["lean"][0].error_message == got["aiohttp"][0].error_message


@pytest.mark.parametrize(("mode", "words"), [("killed", "stream broken"), ("reset", "before answering")])
def test_a_connection_dropped_by_the_server_is_an_error_never_sent_again(mode: str, words: str) -> None:
    """A server that drops the connection mid-stream, or before answering, gives an error record
    saying so; the request, written once, reached the server once."""
    n = next(k for k, v in MODES.items() if v == mode)

    async def run() -> tuple[ObservedRequest, int]:
        async with serve() as fake, OpenAIClient(fake.url, transport="lean", keep_alive=True) as client:
            rec = await client.send(RequestSpec("x", n))
        return rec, fake.hits[mode]

    rec, hits = asyncio.run(run())
    assert rec.status == "error" and words in rec.error_message
    assert hits == 1 and rec.attempts == 1


def test_a_slow_answer_times_out_and_its_connection_is_not_reused() -> None:
    """An answer slower than the client's timeout ends as timeout; the next request gets a new
    connection and ends ok."""

    async def run() -> list[ObservedRequest]:
        async with serve(slow_s=5.0) as fake, OpenAIClient(fake.url, transport="lean", keep_alive=True, timeout_s=0.3) as client:
            return [await client.send(RequestSpec("x", n)) for n in (10, 5)]

    slow, ok = asyncio.run(run())
    assert (slow.status, ok.status) == ("timeout", "ok")


def test_a_server_closing_after_each_answer_gets_each_request_on_a_new_connection() -> None:
    """Kept alive, a server that answers with Connection: close and closes (as llama.cpp does
    after a streamed answer) gets each request once, on a new connection, all ok."""

    async def run() -> tuple[list[ObservedRequest], list[int]]:
        async with _server(close=True) as (url, peers), OpenAIClient(url, model="m", keep_alive=True, transport="lean") as client:
            recs = [await client.send(RequestSpec("x", 2, request_id=i)) for i in range(6)]
        return recs, peers.ports

    recs, ports = asyncio.run(run())
    assert [(r.status, r.attempts) for r in recs] == [("ok", 1)] * 6
    assert len(ports) == len(set(ports)) == 6


def test_kept_alive_requests_one_after_another_share_one_connection() -> None:
    """Kept alive, requests sent one after another against a server that keeps connections all
    arrive on one connection; without keep_alive each has its own."""

    async def run(keep_alive: bool) -> list[int]:
        async with _server() as (url, peers), OpenAIClient(url, model="m", keep_alive=keep_alive, transport="lean") as client:
            assert {(await client.send(RequestSpec("x", 2))).status for _ in range(5)} == {"ok"}
        return peers.ports

    assert len(set(asyncio.run(run(True)))) == 1
    assert len(set(asyncio.run(run(False)))) == 5


# --------------------------------------------------------------- an answer split anywhere
_SSE = (
    b": ping\r\n\r\n"
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,\r\ndata: "delta":{"content":" h\xc3\xa9"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" b"},"finish_reason":"length"}]}\r\r'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(_SSE, 37)
)


class _Transport:
    """Stands for a connection's transport: keeps what is written, and whether it was closed."""

    def __init__(self) -> None:
        self.written = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closing = True


def _feed(pieces: list[bytes]) -> tuple[ObservedRequest, list[Any]]:
    """*pieces* of an answer fed to a lean connection in turn; the record and the pool's idle list."""

    async def run() -> tuple[ObservedRequest, list[Any]]:
        pool = lean.LeanPool("http://127.0.0.1:1", {"Content-Type": "application/json"}, keep_alive=True, now=lambda: 0.0)
        conn = lean._Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        rec = ObservedRequest(output_text="")
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        conn.send(lean._Exchange(rec, True, future), b"request")
        for piece in pieces:
            conn.data_received(piece)
        assert future.done()
        return rec, list(pool._idle)

    return asyncio.run(run())


def _stream_fields(rec: ObservedRequest) -> tuple[Any, ...]:
    return (rec.status, rec.error_message, len(rec.chunk_times_s), len(rec.content_times_s), rec.output_text,
            rec.completion_tokens, rec.finish_reason, rec.http_status)


def test_an_answer_fed_whole_is_read_and_its_connection_kept() -> None:
    """The whole answer at once: ok, two content chunks (" hé", " b"), the usage counts, and the
    connection back in the pool for the next request."""
    rec, idle = _feed([_ANSWER])
    assert _stream_fields(rec) == ("ok", "", 4, 2, " hé b", 2, "length", 200)
    assert len(idle) == 1


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, len(_ANSWER) - 1), unique=True, max_size=12))
def test_an_answer_split_at_any_bytes_reads_the_same(cuts: list[int]) -> None:
    """The answer split at any byte boundaries (inside the status line, headers, chunk sizes,
    SSE lines, a CRLF, a UTF-8 character) gives the same record as the answer fed whole."""
    bounds = [0, *sorted(cuts), len(_ANSWER)]
    pieces = [_ANSWER[a:b] for a, b in itertools.pairwise(bounds)]
    whole, _ = _feed([_ANSWER])
    rec, idle = _feed(pieces)
    assert _stream_fields(rec) == _stream_fields(whole)
    assert len(idle) == 1


def test_an_answer_fed_one_byte_at_a_time_reads_the_same() -> None:
    """Every byte of the answer fed alone gives the same record as the answer fed whole."""
    whole, _ = _feed([_ANSWER])
    rec, _ = _feed([_ANSWER[i : i + 1] for i in range(len(_ANSWER))])
    assert _stream_fields(rec) == _stream_fields(whole)


def test_an_answer_saying_connection_close_is_not_kept() -> None:
    """An answer with Connection: close is read in full, and its connection leaves the pool."""
    answer = _ANSWER.replace(b"Transfer-Encoding", b"Connection: close\r\nTransfer-Encoding", 1)
    rec, idle = _feed([answer])
    assert rec.status == "ok" and not idle


def test_the_request_is_written_once_with_its_length() -> None:
    """A request goes out as one write: the request line, the fixed headers, Content-Length and the body."""

    async def run() -> bytes:
        pool = lean.LeanPool("http://example.test:8000/base", {"Content-Type": "application/json", "X-A": "1"},
                             keep_alive=True, now=lambda: 0.0)
        conn = lean._Connection(pool)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        conn.send(lean._Exchange(ObservedRequest(), True, future), pool._head("/v1/completions") + b"5\r\n\r\nhello")
        return transport.written

    assert asyncio.run(run()) == (
        b"POST /base/v1/completions HTTP/1.1\r\nHost: example.test:8000\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello"
    )


# --------------------------------------------------------------- the load generator's trace
def test_a_load_generator_run_writes_the_same_trace_through_either_transport(tmp_path: Path) -> None:
    """The same workload sent by a load generator through each transport to the fake server
    writes the same trace but for the columns of the client's clock."""
    requests = [{"arrival_time_s": i * 0.002, "input_tokens": 10 + i, "output_tokens": (4, 5, 14, 7, 8, 13)[i % 6],
                 "streaming": i % 4 != 3} for i in range(24)]

    async def run(transport: str) -> Path:
        out = tmp_path / transport
        async with serve() as fake, OpenAIClient(fake.url, transport=transport, keep_alive=True) as client:
            with TraceV2Writer(out, extra_columns=OBSERVER_COLUMNS) as writer:
                await LoadGenerator(client, requests, writer).run()
        return out

    timing = ["send_time_us", "first_chunk_time_us", "last_chunk_time_us", "first_byte_time_us",
              "first_token_time_us", "done_time_us", "itl_us"]
    frames = {t: read_trace_v2(asyncio.run(run(t))).frame.sort_values("request_id").reset_index(drop=True)
              for t in ("aiohttp", "lean")}
    assert set(frames["lean"]["status"]) == {"ok", "error"}
    assert frames["lean"].drop(columns=timing).equals(frames["aiohttp"].drop(columns=timing))


def test_without_httptools_the_client_warns_and_sends_through_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    """transport="lean" where httptools cannot be imported warns, naming the package, and the
    requests still end ok (through aiohttp)."""
    monkeypatch.setattr(lean, "missing", lambda: "the lean transport needs httptools (test)")

    async def run() -> ObservedRequest:
        async with serve() as fake, OpenAIClient(fake.url, transport="lean") as client:
            return await client.send(RequestSpec("x", 5))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = asyncio.run(run())
    assert rec.status == "ok"
    assert any(issubclass(w.category, LeanTransportWarning) and "httptools" in str(w.message) for w in caught)


def test_an_unknown_transport_is_refused() -> None:
    """A transport other than aiohttp and lean is a ValueError naming both."""
    with pytest.raises(ValueError, match="'aiohttp', 'lean'"):
        OpenAIClient("http://127.0.0.1:1", transport="curl")
