"""A fake OpenAI-compatible server for the observer tests (aiohttp.web on 127.0.0.1).

The behaviour of a request is chosen by its ``max_tokens`` (see :data:`MODES`),
so a load-generator run can mix well-behaved and misbehaving requests and the
test knows which request met which behaviour.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

OK_TOKENS = 5
MODES = {
    4: "ok_short",  # ok, 4 tokens
    5: "ok",  # ok stream: role chunk, pings, 5 content chunks, usage chunk, [DONE] (CRLF line ends)
    6: "killed",  # 2 content chunks, then the connection is aborted
    7: "truncated",  # 2 content chunks, then a clean end of body without [DONE]
    8: "429",
    9: "503",
    10: "slow",  # first byte after slow_s (60 s) unless the client hangs up first: only its timeout ends it
    11: "bad_json",  # a chunk with invalid JSON, then the rest and [DONE]
    12: "reset",  # connection aborted before any response
    13: "error_event",  # an {"error": ...} data event, then [DONE]
    14: "reasoning",  # 2 reasoning_content deltas, then 3 content deltas
}
PROMPT_TOKENS = 17


def _chunk(obj: dict[str, Any], crlf: bool = False) -> bytes:
    end = "\r\n" if crlf else "\n"
    return f"data: {json.dumps(obj)}{end}{end}".encode()


def _delta(endpoint: str, text: str = "", reasoning: str | None = None, role: bool = False) -> dict[str, Any]:
    if endpoint == "completions":
        return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if text or not role:
        delta["content"] = text
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
        delta.pop("content", None)
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _usage(n: int) -> dict[str, Any]:
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}


class FakeServer:
    """State of a running fake server: ``hits`` per mode, the ``bodies`` seen (parsed; their bytes
    in ``raw_bodies``), and knobs."""

    def __init__(self, *, fail_first: int = 0, token_delay_s: float = 0.0, slow_s: float = 60.0) -> None:
        self.hits: dict[str, int] = {}
        self.bodies: list[dict[str, Any]] = []
        self.raw_bodies: list[bytes] = []  # the bytes received, as sent
        self.headers: list[dict[str, str]] = []
        self.fail_first = fail_first  # answer this many requests with 429 first
        self.token_delay_s = token_delay_s
        self.slow_s = slow_s
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.complete(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.complete(request, "completions")

    async def complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.raw_bodies.append(raw)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        n = int(body.get("max_tokens", OK_TOKENS))
        mode = MODES.get(n, "ok")
        if self.fail_first > 0:
            self.fail_first -= 1
            mode = "429"
        self.hits[mode] = self.hits.get(mode, 0) + 1
        if mode == "429":
            return web.json_response({"error": {"message": "rate limited", "code": 429}}, status=429, headers={"Retry-After": "0"})
        if mode == "503":
            return web.Response(status=503, text="overloaded")
        if mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=200)
        if mode == "slow":
            for _ in range(int(self.slow_s / 0.05)):
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(0.05)
        if not body.get("stream"):
            text = " ".join(["tok"] * n)
            if endpoint == "chat":
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length"}
            return web.json_response({"object": "completion", "choices": [choice], "usage": _usage(n)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        crlf = mode == "ok"
        await resp.write(b": ping\n\n")
        if endpoint == "chat":
            await resp.write(_chunk(_delta(endpoint, role=True), crlf))
        sent = 0
        if mode == "reasoning":
            for _ in range(2):
                await resp.write(_chunk(_delta(endpoint, reasoning="hmm"), crlf))
                sent += 1
        for i in range(n - sent):
            if mode in ("killed", "truncated") and i == 2:
                break
            if mode == "bad_json" and i == 1:
                await resp.write(b'data: {"choices": [{"delta": {"content": \n\n')
            if mode == "error_event" and i == 1:
                await resp.write(_chunk({"error": {"message": "engine died", "code": 500}}))
                break
            # a multi-line data event splits the JSON across two data: lines
            payload = json.dumps(_delta(endpoint, text=f" t{i}"))
            half = payload.index(", ") + 1  # between JSON tokens, so the joining newline is whitespace
            await resp.write(f"data: {payload[:half]}\ndata: {payload[half:]}\n\n".encode() if i == 0 else _chunk(json.loads(payload), crlf))
            if i == 0:
                await resp.write(b": keep-alive\n\n")
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
        if mode == "killed":
            assert request.transport is not None
            request.transport.abort()
            return resp
        if mode == "truncated":
            await resp.write_eof()
            return resp
        await resp.write(_chunk({"choices": [], "usage": _usage(n)}, crlf))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def serve(**kwargs: Any) -> AbstractAsyncContextManager[FakeServer]:
    """Run a :class:`FakeServer` on 127.0.0.1 (a free port) for the duration of the block."""
    return serve_instance(FakeServer(**kwargs))


@asynccontextmanager
async def serve_instance(fake: FakeServer) -> AsyncIterator[FakeServer]:
    """Run *fake* (a :class:`FakeServer`, or one that extends its app) on 127.0.0.1 (a free
    port) for the duration of the block."""
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    try:
        yield fake
    finally:
        await server.close()
