"""A no-op OpenAI-compatible server for measuring the load generator itself.

It answers at once, with precomputed bytes, so that whatever limits a
benchmark run is the client and not the server:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a streamed
  answer (``text/event-stream``): a role chunk (chat), ``--chunks`` content
  chunks, a usage-only chunk and ``data: [DONE]``; ``"stream": false`` gets
  one JSON completion;
- ``GET /v1/models``: one model, ``noop``;
- ``GET /health``: ``{"status": "ok"}``.

Anything else is a 404. Connections are kept alive (HTTP/1.1), as real servers
keep them, for as many requests as the client sends on them; a request with
``Connection: close`` (a client that opens a connection per request) is
answered with ``Connection: close`` and the server closes the connection after
writing it, so the closing side's TIME_WAIT sockets pile up here and not among
the client's ephemeral ports.

It is a bare ``asyncio.Protocol`` rather than an aiohttp app: a few lines of
HTTP/1.1 parsing cost far less per request than a web framework, which
matters when the server shares a 2-core machine with the client it serves.
It uses uvloop when installed. Run it in its own process::

    python benchmarks/noop_sse_server.py --port 0        # prints "LISTENING <port>", then serves

and stop it with SIGTERM or SIGINT. It imports nothing from this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

MODEL = "noop"
PROMPT_TOKENS = 17  # reported in usage; the server never reads the prompt


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _response(status: str, content_type: str, body: bytes, close: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-cache\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def build_responses(chunks: int) -> dict[str, bytes]:
    """Every answer the server gives, as complete HTTP responses (built once at start-up), each
    also with ``Connection: close`` (its name and ``_close``).

    >>> r = build_responses(2)
    >>> r["chat_stream"].count(b"data: "), r["chat_stream"].endswith(b"data: [DONE]\\n\\n")
    (5, True)
    >>> b"Connection: close" in r["chat_stream_close"], b"Connection: close" in r["chat_stream"]
    (True, False)
    """
    usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": chunks, "total_tokens": PROMPT_TOKENS + chunks}
    chat = [{"id": "noop", "object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    text = []
    for i in range(chunks):
        last = "length" if i == chunks - 1 else None
        chat.append({"id": "noop", "object": "chat.completion.chunk", "model": MODEL,
                     "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": last}]})
        text.append({"id": "noop", "object": "text_completion", "model": MODEL,
                     "choices": [{"index": 0, "text": " tok", "finish_reason": last}]})
    tail = {"id": "noop", "object": "chat.completion.chunk", "model": MODEL, "choices": [], "usage": usage}
    done = b"data: [DONE]\n\n"
    sse = "text/event-stream"
    js = "application/json"
    content = " tok" * chunks
    out = {
        "chat_stream": _response("200 OK", sse, b"".join(map(_event, [*chat, tail])) + done),
        "completions_stream": _response("200 OK", sse, b"".join(map(_event, [*text, {**tail, "object": "text_completion"}])) + done),
        "chat_json": _response("200 OK", js, json.dumps({
            "id": "noop", "object": "chat.completion", "model": MODEL, "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
        }).encode()),
        "completions_json": _response("200 OK", js, json.dumps({
            "id": "noop", "object": "text_completion", "model": MODEL, "usage": usage,
            "choices": [{"index": 0, "text": content, "finish_reason": "length"}],
        }).encode()),
        "models": _response("200 OK", js, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()),
        "health": _response("200 OK", js, b'{"status":"ok"}'),
        "not_found": _response("404 Not Found", js, b'{"error":{"message":"not found"}}'),
        "bad_request": _response("400 Bad Request", js, b'{"error":{"message":"bad request"}}'),
    }
    for name, response in list(out.items()):
        out[name + "_close"] = response.replace(b"Connection: keep-alive\r\n", b"Connection: close\r\n", 1)
    return out


class _Connection(asyncio.Protocol):
    """One connection: buffer until a request (headers and Content-Length body) is complete, answer
    it; keep the connection for the next request unless the request asked for ``Connection: close``."""

    def __init__(self, responses: dict[str, bytes]) -> None:
        self.responses = responses
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buf += data
        while not self.closing:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            close = False
            for line in head[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip() or 0)
                elif name == "connection":
                    close = value.strip().lower() == "close"
            body_start = end + 4
            if len(self.buf) < body_start + length:
                return  # wait for the rest of the body
            body = bytes(self.buf[body_start : body_start + length])
            del self.buf[: body_start + length]
            parts = head[0].split(" ")
            method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) >= 2 else ("", "")
            self._answer(method, path, body, close)

    def _answer(self, method: str, path: str, body: bytes, close: bool) -> None:
        r = self.responses
        if method == "GET" and path == "/health":
            name = "health"
        elif method == "GET" and path == "/v1/models":
            name = "models"
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            kind = "chat" if path.endswith("chat/completions") else "completions"
            # Only the stream flag matters; a substring test spares a JSON parse of the whole prompt.
            stream = b'"stream": false' not in body and b'"stream":false' not in body
            name = f"{kind}_{'stream' if stream else 'json'}"
        else:
            name = "not_found"
        assert self.transport is not None
        if close:
            self.closing = True
            self.transport.write(r[name + "_close"])
            self.transport.close()  # after the buffered write: the server sends FIN first
        else:
            self.transport.write(r[name])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, chunks: int, backlog: int) -> None:
    """Serve until SIGTERM or SIGINT; print ``LISTENING <port>`` once bound."""
    responses = build_responses(chunks)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(responses), host, port, backlog=backlog, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1]
    print(f"LISTENING {bound}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="No-op OpenAI-compatible SSE server (answers at once).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port (printed as LISTENING <port>)")
    p.add_argument("--chunks", type=int, default=4, help="content chunks per streamed answer (default 4)")
    p.add_argument("--backlog", type=int, default=4096, help="listen backlog (default 4096)")
    p.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="event loop: uvloop when installed (auto, the default), or the default asyncio loop")
    args = p.parse_args(argv)
    factory = None
    if args.loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if args.loop == "uvloop":
                raise
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.host, args.port, args.chunks, args.backlog))
    return 0


if __name__ == "__main__":
    sys.exit(main())
