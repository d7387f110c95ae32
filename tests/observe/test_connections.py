"""The client's connections (kept alive and reused unless the server closes them), the open-files
limit, and the load generator's prompt bodies built without counting what it knows."""

from __future__ import annotations

import asyncio
import random
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm.observe.client import (
    FILES_RESERVE,
    ObservedRequest,
    OpenAIClient,
    OpenFilesLimitError,
    RequestSpec,
    raise_open_files_limit,
)
from simpy_llm.observe.loadgen import LoadGenerator, LoadRequest
from simpy_llm.observe.prompts import _WORDS, DatasetPrompts, SyntheticPrompts, approx_prompt_tokens, synthetic_prompt

_CHUNKS = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" a"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" b"},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


class _Peers:
    """An SSE server that records the client port of every request it answers."""

    def __init__(self, close: bool) -> None:
        self.close = close
        self.ports: list[int] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        self.ports.append(request.transport.get_extra_info("peername")[1])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if self.close:
            resp.force_close()  # answers with Connection: close and closes after the response
        await resp.prepare(request)
        await resp.write(_CHUNKS)
        await resp.write_eof()
        return resp


@asynccontextmanager
async def _server(close: bool = False) -> AsyncIterator[tuple[str, _Peers]]:
    peers = _Peers(close)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", peers.chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), peers
    finally:
        await server.close()


def _sequential(n: int, close: bool = False, **client_kw: Any) -> tuple[list[str], list[int]]:
    async def run() -> tuple[list[str], list[int]]:
        async with _server(close) as (url, peers), OpenAIClient(url, model="m", **client_kw) as client:
            statuses = [(await client.send(RequestSpec("x", 2, request_id=i))).status for i in range(n)]
        return statuses, peers.ports

    return asyncio.run(run())


def test_requests_one_after_another_reuse_one_connection() -> None:
    """Kept alive, streamed requests sent one after another all arrive on one connection (one
    client port)."""
    statuses, ports = _sequential(8, keep_alive=True)
    assert statuses == ["ok"] * 8
    assert len(set(ports)) == 1


@pytest.mark.parametrize("client_kw", [{}, {"keep_alive": False}])
def test_by_default_each_request_opens_a_connection(client_kw: dict[str, Any]) -> None:
    """By default (keep_alive=False) every request arrives on a connection of its own."""
    statuses, ports = _sequential(8, **client_kw)
    assert statuses == ["ok"] * 8
    assert len(set(ports)) == 8


def test_a_connection_the_server_closes_is_not_reused() -> None:
    """Kept alive, a server that answers with Connection: close gets each request on a new
    connection, all ok."""
    statuses, ports = _sequential(6, close=True, keep_alive=True)
    assert statuses == ["ok"] * 6
    assert len(set(ports)) == 6


def test_requests_in_flight_together_hold_one_connection_each_and_reuse_them() -> None:
    """Kept alive, two rounds of 5 requests sent together: the first round opens 5 connections,
    the second reuses them (5 client ports in all)."""

    async def run() -> tuple[list[str], list[int]]:
        async with _server() as (url, peers), OpenAIClient(url, model="m", keep_alive=True) as client:
            statuses = []
            for _ in range(2):
                recs = await asyncio.gather(*(client.send(RequestSpec("x", 2, request_id=i)) for i in range(5)))
                statuses += [r.status for r in recs]
        return statuses, peers.ports

    statuses, ports = asyncio.run(run())
    assert statuses == ["ok"] * 10
    assert len(set(ports)) == 5


@pytest.fixture
def lowered_soft_limit() -> Any:
    """The soft open-files limit lowered below the hard one for the test, restored after it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2 * 256:
        pytest.skip(f"the hard open-files limit ({hard}) leaves no room to lower the soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_open_files_limit_is_raised_to_the_hard_one(lowered_soft_limit: int) -> None:
    """raise_open_files_limit sets the soft limit to the hard one and returns it."""
    assert raise_open_files_limit() == lowered_soft_limit
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == lowered_soft_limit


def test_a_load_generator_raises_the_limit_when_made(lowered_soft_limit: int) -> None:
    """Making a LoadGenerator with a concurrency above the lowered soft limit raises the limit
    rather than failing."""
    client = OpenAIClient("http://127.0.0.1:9", model="m")
    LoadGenerator(client, [LoadRequest(0, 0.0, 4, 2)], concurrency=1000)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == lowered_soft_limit


def test_a_concurrency_beyond_the_hard_limit_is_refused_by_name() -> None:
    """A concurrency whose connections the hard limit cannot hold is an OpenFilesLimitError that
    names the concurrency, the files it needs and the limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no finite open-files limit")
    concurrency = hard - FILES_RESERVE + 1
    with pytest.raises(OpenFilesLimitError, match=rf"concurrency {concurrency} needs up to {hard + 1} open files.*at most {hard}"):
        LoadGenerator(OpenAIClient("http://127.0.0.1:9", model="m"), [LoadRequest(0, 0.0, 4, 2)], concurrency=concurrency)


@settings(max_examples=300, deadline=None)
@given(st.integers(-3, 3000), st.one_of(st.integers(-(2**80), 2**80), st.text(max_size=30)))
def test_synthetic_words_are_the_draws_of_random_choices(n: int, seed: int | str) -> None:
    """synthetic_prompt gives the words random.Random(seed).choices draws from the word list (its
    definition), for any length and any integer or text seed."""
    assert synthetic_prompt(n, seed) == " ".join(random.Random(seed).choices(_WORDS, k=max(n, 1)))


@pytest.mark.parametrize("source", [SyntheticPrompts(seed=3), DatasetPrompts(["one two", "a longer prompt, of words"], seed=3)])
def test_the_recorded_prompt_length_is_the_length_counted(source: Any) -> None:
    """The prompt length recorded for each request (approx_prompt_tokens, known from the lengths
    asked for) equals the sent prompt counted by the source's rule, with and without a group's
    shared prefix, for zero, one and many tokens."""
    client = OpenAIClient("http://127.0.0.1:9", model="m")
    reqs = [
        LoadRequest(i, 0.0, n, 2, fields={"prefix_group": g} if g else {})
        for i, (n, g) in enumerate([(0, ""), (1, ""), (700, ""), (1, "sys"), (2, "sys"), (300, "sys"), (40, "other")])
    ]
    gen = LoadGenerator(client, reqs, prefixes={"sys": 50, "other": 0}, prompts=source)
    for req in reqs:
        rec = ObservedRequest()
        spec = gen._spec(req, rec)
        assert rec.approx_prompt_tokens == approx_prompt_tokens(source, spec.prompt)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_workers_reuse_connections_as_the_parent_client_says(keep_alive: bool) -> None:
    """Worker processes make their clients with the parent client's keep_alive: kept alive, the
    server sees fewer client ports than requests; not, one port per request."""
    from simpy_llm.observe.workers import ProcessLoadGenerator

    async def run() -> tuple[dict[str, int], list[int]]:
        async with _server() as (url, peers), OpenAIClient(url, model="m", keep_alive=keep_alive) as client:
            reqs = [{"arrival_time_s": i * 0.01, "input_tokens": 4, "output_tokens": 2} for i in range(12)]
            summary = await ProcessLoadGenerator(client, reqs, workers=2).run()
        return summary.status_counts, peers.ports

    counts, ports = asyncio.run(run())
    assert counts == {"ok": 12}
    assert (len(set(ports)) < 12) if keep_alive else (len(set(ports)) == 12)
