"""The client's cap on connections (``max_connections``): the server never sees more connections
open at once than the cap, requests beyond it wait and are all sent, the wait is in their
schedule delay and counted as the generator's saturation, and worker processes each hold the cap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from simpy_llm.observe.client import MAX_CONNECTIONS, OpenAIClient, RequestSpec
from simpy_llm.observe.lean import missing
from simpy_llm.observe.loadgen import LoadGenerator, RunSummary
from simpy_llm.observe.workers import ProcessLoadGenerator

HOLD_S = 0.05
"""How long the server holds each answer: long enough for the requests sent at once to pile up."""

_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"content":" a"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)

TRANSPORTS = ["aiohttp", pytest.param("lean", marks=pytest.mark.skipif(missing() is not None, reason="httptools missing"))]


class _Counted(asyncio.Protocol):
    """One server-side connection: answers each request HOLD_S after it arrived; counts itself open."""

    def __init__(self, server: _CountingServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.open -= 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, rest = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").lower().split("\r\n")
            length = next((int(v) for k, _, v in (h.partition(": ") for h in lines) if k == "content-length"), 0)
            if len(rest) < length:
                return
            self.buf = rest[length:]
            close = "connection: close" in lines
            asyncio.get_running_loop().call_later(HOLD_S, self.answer, close)

    def answer(self, close: bool) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            f"Content-Length: {len(_SSE)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        self.transport.write(head.encode("latin-1") + _SSE)
        if close:
            self.transport.close()


class _CountingServer:
    """Counts the connections open at once (``open``) and the most ever open (``most``)."""

    def __init__(self) -> None:
        self.open = 0
        self.most = 0

    def opened(self) -> None:
        self.open += 1
        self.most = max(self.most, self.open)


@asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, _CountingServer]]:
    counts = _CountingServer()
    server = await asyncio.get_running_loop().create_server(lambda: _Counted(counts), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", counts
    finally:
        server.close()
        await server.wait_closed()


def _burst(n: int) -> list[dict[str, Any]]:
    """*n* requests all due at the run start."""
    return [{"arrival_time_s": 0.0, "input_tokens": 4, "output_tokens": 1} for _ in range(n)]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_server_never_sees_more_connections_than_the_cap(transport: str, keep_alive: bool) -> None:
    """Twenty requests sent at once through a client capped at 3 connections: the server never
    has more than 3 open, and every request is answered."""

    async def run() -> tuple[list[str], int]:
        async with _server() as (url, counts), OpenAIClient(
            url, model="m", max_connections=3, keep_alive=keep_alive, transport=transport
        ) as client:
            recs = await asyncio.gather(*(client.send(RequestSpec("x", 1, request_id=i)) for i in range(20)))
        return [r.status for r in recs], counts.most

    statuses, most = asyncio.run(run())
    assert statuses == ["ok"] * 20
    assert 1 <= most <= 3


def test_requests_beyond_the_cap_wait_and_the_wait_is_schedule_delay() -> None:
    """A load generator whose client is capped at 2 connections sends all 10 requests due at
    once; the 8 beyond the cap wait (``connection_wait_s``), their send comes after the wait, and
    the run reports them as connection waits that saturated the generator."""

    async def run() -> tuple[RunSummary, LoadGenerator]:
        async with _server() as (url, _), OpenAIClient(url, model="m", max_connections=2) as client:
            gen = LoadGenerator(client, _burst(10))
            return await gen.run(), gen

    summary, gen = asyncio.run(run())
    recs = sorted(gen.records.values(), key=lambda r: r.connection_wait_s)
    assert summary.status_counts == {"ok": 10} and summary.n_sent == 10
    assert [r.connection_wait_s > 0 for r in recs] == [False] * 2 + [True] * 8
    for r in recs:
        assert r.sent_s is not None and r.dispatched_s is not None
        assert r.sent_s - r.dispatched_s >= r.connection_wait_s
    assert summary.connection_waits == 8 and gen.statistics()["connection_waits"] == 8
    assert summary.connection_wait_max_s == max(r.connection_wait_s for r in recs)
    assert summary.saturated and summary.saturation_reason is not None
    assert "8 requests waited" in summary.saturation_reason and "max_connections" in summary.saturation_reason


def test_waits_within_the_lag_threshold_are_counted_but_do_not_saturate() -> None:
    """With a lag threshold longer than any wait, the 8 requests that waited for one of the 2
    connections are still counted, and the run is not saturated by them."""

    async def run() -> RunSummary:
        async with _server() as (url, _), OpenAIClient(url, model="m", max_connections=2) as client:
            return await LoadGenerator(client, _burst(10), lag_threshold_s=1e9).run()

    summary = asyncio.run(run())
    assert summary.status_counts == {"ok": 10}
    assert summary.connection_waits == 8 and not summary.saturated


def test_without_a_cap_no_request_waits_for_a_connection() -> None:
    """``max_connections=None``: the ten requests due at once are all written at once (ten
    connections), none waits."""

    async def run() -> tuple[RunSummary, int]:
        async with _server() as (url, counts), OpenAIClient(url, model="m", max_connections=None) as client:
            summary = await LoadGenerator(client, _burst(10)).run()
        return summary, counts.most

    summary, most = asyncio.run(run())
    assert summary.status_counts == {"ok": 10} and summary.connection_waits == 0
    assert summary.connection_wait_max_s is None
    assert most == 10


def test_each_worker_holds_the_parent_clients_cap() -> None:
    """Two worker processes, the parent's client capped at 2: each worker's client has the same
    cap, so the server never has more than 4 open, and all 16 requests are answered."""

    async def run() -> tuple[dict[str, int], int]:
        async with _server() as (url, counts), OpenAIClient(url, model="m", max_connections=2) as client:
            summary = await ProcessLoadGenerator(client, _burst(16), workers=2).run()
        return summary.status_counts, counts.most

    status_counts, most = asyncio.run(run())
    assert status_counts == {"ok": 16}
    assert 1 <= most <= 4


@pytest.mark.parametrize("bad", [0, -1, True])
def test_a_cap_below_one_is_refused_by_name(bad: Any) -> None:
    """``max_connections`` must be a whole number >= 1 (or None): others are refused naming it."""
    with pytest.raises(ValueError, match="max_connections"):
        OpenAIClient("http://127.0.0.1:1", max_connections=bad)



@pytest.mark.parametrize(("given", "cap"), [(None, MAX_CONNECTIONS), ("64", 64), ("none", None), ("None", None)])
def test_the_observe_command_takes_a_connection_cap(given: str | None, cap: int | None) -> None:
    """``simpy-llm observe --max-connections N|none``: a whole number or no cap; by default the client's own."""
    from simpy_llm.cli import _parser

    argv = ["observe", "spec.yaml", "--url", "http://127.0.0.1:1"] + ([] if given is None else ["--max-connections", given])
    assert _parser("observe").parse_args(argv).max_connections == cap


@pytest.mark.parametrize("given", ["0", "-3", "many"])
def test_the_observe_command_refuses_a_bad_connection_cap(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A cap below 1 or not a number is a usage error naming the option and what it takes."""
    from simpy_llm.cli import _parser

    with pytest.raises(SystemExit) as exit_info:
        _parser("observe").parse_args(["observe", "spec.yaml", "--url", "http://127.0.0.1:1", "--max-connections", given])
    assert exit_info.value.code == 2
    assert "--max-connections: must be a whole number >= 1 or none" in capsys.readouterr().err
