"""An async OpenAI-compatible client that measures each request (aiohttp).

:class:`OpenAIClient` posts to ``/v1/chat/completions`` or ``/v1/completions``,
streamed (SSE, parsed by :mod:`simpy_llm.observe.sse`) or not, and returns a
:class:`ObservedRequest` per request: raw timestamps in seconds since the
client's run start (``time.perf_counter()`` based), the token counts with
their source, and the outcome. Each request opens a **new connection** by default
(``keep_alive=False``). llama.cpp's server closes its connection after a streamed answer, and
a kept-alive connection reused just then failed: at write, which the client now recovers by
sending again on another connection (:data:`UNSENT_RETRIES`), but also as "Server
disconnected" after the write, which it cannot tell from a server that took the request and
dropped it (an agentic run against llama.cpp lost a call that way in 2 of 5 runs on a busy
machine). With ``keep_alive=True`` requests reuse connections (HTTP/1.1 keep-alive,
aiohttp's pool): a connection is opened only when none is idle, one the server closes is
not reused, and an idle one is closed after :data:`KEEPALIVE_S`, before the servers' own
idle timeouts (5 s for uvicorn, i.e. vLLM and SGLang). That saves the connection set-up
where a server keeps connections (docs/observe.md, "Connections").

The client never raises for a failed request: HTTP errors (429 and 503
included), broken or truncated streams, invalid JSON, server ``error`` events
and timeouts are all recorded in the record (``status`` ``error`` or
``timeout``). Only cancellation propagates, after the record passed in has
been marked ``cancelled``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import attrs
import orjson

from simpy_llm.observe.answers import (  # answers read into records: both transports use them
    StreamReader,
    _fill_usage,  # noqa: F401 - importable from here as before
    http_error_message,
    json_answer,
    short_message,
)

if TYPE_CHECKING:
    from simpy_llm.observe.lean import LeanPool, _Exchange

__all__ = [
    "FILES_RESERVE",
    "KEEPALIVE_S",
    "MAX_CONNECTIONS",
    "TRANSPORTS",
    "UNSENT_RETRIES",
    "LeanTransportWarning",
    "ObservedRequest",
    "OpenAIClient",
    "OpenFilesLimitError",
    "RequestSpec",
    "RetryPolicy",
    "StreamReader",
    "http_error_message",
    "json_answer",
    "raise_open_files_limit",
    "short_message",
]

MAX_CONNECTIONS = 4096
"""The default of :class:`OpenAIClient`'s *max_connections*: connections one client (one sending
process) holds at most. A run that falls behind at 10,000 requests/s with keep-alive on once
held ~48,000 and ran the machine out of local ports (28,000 by Linux's default range); two
sending processes at this cap hold at most 8,192."""

OPEN_AHEAD = 32
"""Connections a load generator has its client open before its clock starts
(:meth:`OpenAIClient.open_connections`; fewer for fewer requests or a lower concurrency): a
sending process at 5,000 requests/s against a server that answers at once keeps 20-30 busy, and
without them its first requests waited for connections being opened."""

STATUSES = ("ok", "error", "timeout", "cancelled")
TRANSPORTS = ("aiohttp", "lean")
"""The client's ways of sending requests (:class:`OpenAIClient`, *transport*)."""
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
KEEPALIVE_S = 2.0
"""Seconds an idle connection is kept for reuse: below the 5 s idle timeout of uvicorn (vLLM,
SGLang) and of llama.cpp's server, so that the client does not reuse a connection the server
is closing at that moment (aiohttp's default, 15 s, is above them)."""
UNSENT_RETRIES = 4
"""A request that could not be written in full on a kept-alive connection (the server closed it
just then: llama.cpp's server closes its connection after each streamed answer, and a client
reusing it failed about one time in three) is sent again on another connection, at most this
many times; it is not an attempt of the record (the server never had it) and not a retry of
:class:`RetryPolicy`."""


FILES_RESERVE = 64
"""Open files a sending process keeps besides its connections (the trace, pipes, the event
loop's own, imports), counted when :func:`raise_open_files_limit` checks a concurrency."""


class LeanTransportWarning(UserWarning):
    """``transport="lean"`` was asked for where it cannot run (httptools missing): aiohttp sends instead."""


class OpenFilesLimitError(RuntimeError):
    """The process may not open as many files as the connections asked for need (the message
    says how many, the limit, and what to change)."""


def raise_open_files_limit(connections: int | None = None) -> int | None:
    """Raise this process's soft limit on open files (``RLIMIT_NOFILE``) to its hard limit, and
    return the limit now in force (``None`` where there is none to read: no :mod:`resource`).

    Every connection is an open file, and an open-loop run at a high rate holds as many as it
    has requests in flight (rate x latency); the usual soft limit (1,024) is far below the
    usual hard one. *connections*: the most the caller will hold at once (a concurrency
    limit), checked against the limit with :data:`FILES_RESERVE` more.

    Raises
    ------
    OpenFilesLimitError
        *connections* plus :data:`FILES_RESERVE` exceed the limit, even raised.

    Examples
    --------
    >>> limit = raise_open_files_limit(8)
    >>> limit is None or limit >= 8 + FILES_RESERVE
    True
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. an infinite hard limit that the kernel caps lower
            pass
    if soft == resource.RLIM_INFINITY:
        return None
    if connections is not None and connections + FILES_RESERVE > soft:
        raise OpenFilesLimitError(
            f"concurrency {connections} needs up to {connections + FILES_RESERVE} open files (a connection per "
            f"request in flight, {FILES_RESERVE} more for the rest of the process), but this process may open "
            f"at most {soft} (RLIMIT_NOFILE, its hard limit {'' if soft == hard else 'not '}reached): lower "
            "the concurrency, or raise the hard limit (`ulimit -Hn`, /etc/security/limits.conf)"
        )
    return soft


class _Slots:
    """The client's cap on requests written at once: a counting semaphore, first come first served.

    :class:`asyncio.Semaphore` before Python 3.12 looks through its waiters from the first on
    every release, past those woken but not yet run: a run that fell behind, with thousands
    waiting, spent seconds there. Here a release hands its slot to the first waiter still waiting
    (the others are dropped as they are passed, once), and :meth:`try_acquire` takes one without
    waiting, for a request started without a task.
    """

    __slots__ = ("free", "waiters")

    def __init__(self, value: int) -> None:
        self.free = value
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def locked(self) -> bool:
        """Whether a request would wait (no slot free, or others waiting before it)."""
        return self.free <= 0 or bool(self.waiters)

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits for one; whether it did."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting (in order of arrival) for one."""
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: the next one gets it
            raise

    def release(self) -> None:
        """Give a slot back: to the first still waiting, else to the free ones."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


@attrs.frozen
class RetryPolicy:
    """Bounded retries of requests answered with a retryable HTTP status (429, 503 by default).

    Attempt ``k`` (0-based) of a retry waits ``min(base_delay_s * 2**k, max_delay_s)``, or the
    server's ``Retry-After`` seconds if larger (still capped at ``max_delay_s``). Only HTTP answers
    are retried, never a broken stream or a timeout (the server may have done the work).
    """

    max_retries: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    base_delay_s: float = attrs.field(default=0.5, validator=attrs.validators.ge(0))
    max_delay_s: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    retry_on: frozenset[int] = attrs.field(default=frozenset((429, 503)), converter=frozenset)

    def delay(self, retry_index: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry number *retry_index* (0-based).

        >>> RetryPolicy(3, 0.1, 1.0).delay(2), RetryPolicy(3, 0.1, 1.0).delay(0, "0.5")
        (0.4, 0.5)
        """
        d = self.base_delay_s * 2**retry_index
        try:
            d = max(d, float(retry_after)) if retry_after is not None else d
        except ValueError:
            pass
        return min(d, self.max_delay_s)


@attrs.frozen
class RequestSpec:
    """What to send: the prompt (text, or chat messages), ``max_tokens`` and the request shape.

    ``extra_body`` is merged into the JSON body last (e.g. ``{"ignore_eos": True}``).
    """

    prompt: str | list[dict[str, Any]]
    max_tokens: int
    endpoint: str = attrs.field(default="chat", validator=attrs.validators.in_(tuple(ENDPOINTS)))
    stream: bool = True
    model: str | None = None
    request_id: int = 0
    extra_body: dict[str, Any] = attrs.field(factory=dict)
    keep_text: bool = False
    """Keep the generated text in the record's ``output_text`` (closed-loop sessions send it back)."""

    def body(self, default_model: str) -> dict[str, Any]:
        """The JSON body.

        >>> RequestSpec("hi", 3, "completions", stream=False).body("m")
        {'model': 'm', 'max_tokens': 3, 'stream': False, 'prompt': 'hi'}
        """
        out: dict[str, Any] = {"model": self.model or default_model, "max_tokens": self.max_tokens, "stream": self.stream}
        if self.endpoint == "chat":
            msgs = self.prompt if isinstance(self.prompt, list) else [{"role": "user", "content": self.prompt}]
            out["messages"] = msgs
        else:
            out["prompt"] = self.prompt if isinstance(self.prompt, str) else "\n".join(str(m.get("content", "")) for m in self.prompt)
        if self.stream:
            out["stream_options"] = {"include_usage": True}
        out.update(self.extra_body)
        return out


@attrs.define
class ObservedRequest:
    """One request as measured. Times are seconds since the run start; ``None`` when not reached.

    ``scheduled_s`` target send time (load generator), ``dispatched_s`` when the
    generator released it (after any concurrency wait it is ``sent_s``'s lower
    bound), ``sent_s`` just before the first attempt's POST, ``last_sent_s``
    before the last attempt's, ``headers_s`` response headers (last attempt),
    ``first_byte_s`` first body bytes, ``first_chunk_s`` first data event of any
    kind, ``first_content_s`` first event with content (the first token),
    ``chunk_times_s`` receive time of every data event (``[DONE]`` excluded),
    ``content_times_s`` those with content, ``last_chunk_s`` last data event,
    ``done_s`` when the request ended (``[DONE]``, end of body, error or
    timeout). A non-streamed response is one chunk received when its body was
    read. Token counts: ``prompt_tokens`` / ``completion_tokens`` with their
    source ``"usage"`` (server ``usage``), ``"chunks"`` (content chunks counted,
    completion only) or ``"none"``.
    """

    request_id: int = 0
    endpoint: str = "chat"
    streaming: bool = True
    scheduled_s: float | None = None
    dispatched_s: float | None = None
    sent_s: float | None = None
    last_sent_s: float | None = None
    headers_s: float | None = None
    first_byte_s: float | None = None
    first_chunk_s: float | None = None
    first_content_s: float | None = None
    last_chunk_s: float | None = None
    done_s: float | None = None
    chunk_times_s: list[float] = attrs.field(factory=list)
    content_times_s: list[float] = attrs.field(factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_tokens_source: str = "none"
    completion_tokens_source: str = "none"
    approx_prompt_tokens: int | None = None
    """The prompt's length by the sender's token rule (set by the load generator; see
    :mod:`simpy_llm.observe.prompts`), to set beside the server's ``prompt_tokens``."""
    output_chars: int = 0
    reasoning_chars: int = 0
    output_text: str | None = None
    """The generated content (not the reasoning), kept only when the spec asks (``keep_text``)."""
    finish_reason: str | None = None
    status: str = "pending"
    http_status: int | None = None
    error_message: str = ""
    attempts: int = 0
    attempt_statuses: list[int | None] = attrs.field(factory=list)
    connection_wait_s: float = 0.0
    """Seconds the request waited for one of the client's connections (*max_connections* all
    busy) before its attempts were written; ``sent_s`` comes after the first attempt's wait,
    so the schedule delay includes it, as a real client's would."""

    # ------------------------------------------------------------ derived metrics
    @property
    def ttft_s(self) -> float | None:
        """Time to first token: ``first_content_s - sent_s``."""
        return None if self.first_content_s is None or self.sent_s is None else self.first_content_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency: ``done_s - sent_s``."""
        return None if self.done_s is None or self.sent_s is None else self.done_s - self.sent_s

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive content chunks."""
        t = self.content_times_s
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: ``(last content - first content) / (completion_tokens - 1)``."""
        n = self.completion_tokens
        if n is None or n < 2 or not self.content_times_s:
            return None
        return (self.content_times_s[-1] - self.content_times_s[0]) / (n - 1)

    @property
    def schedule_delay_s(self) -> float | None:
        """``sent_s - scheduled_s`` (client lag plus any concurrency-limit wait)."""
        return None if self.sent_s is None or self.scheduled_s is None else self.sent_s - self.scheduled_s


def _unsent(exc: aiohttp.ClientOSError) -> bool:
    """Whether *exc* says the request could not be written in full (aiohttp's words for it)."""
    return not isinstance(exc, aiohttp.ClientConnectorError) and "Can not write request body" in str(exc)


def _encode(body: dict[str, Any]) -> bytes:
    """*body* as compact UTF-8 JSON (orjson: a tenth of json.dumps's time for a long prompt);
    what orjson cannot encode (integers beyond 64 bits, keys that are not strings, other types)
    is encoded by json.dumps. Non-finite floats are sent as ``null`` (JSON has no NaN).

    >>> _encode({"model": "m", "n": 2**70})
    b'{"model": "m", "n": 1180591620717411303424}'
    >>> _encode({"model": "m", "prompt": "é"}).decode()
    '{"model":"m","prompt":"é"}'
    """
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body).encode()


class OpenAIClient:
    """Async client of an OpenAI-compatible server at *base_url* (``http://host:port``, no ``/v1``).

    Use as ``async with OpenAIClient(url) as client: rec = await client.send(spec)``.

    Parameters
    ----------
    api_key
        Sent as ``Authorization: Bearer <key>`` when given.
    model
        Default model name (``None``: the first of ``/v1/models``, looked up on enter).
    timeout_s
        Per-attempt limit on the whole request (connect to end of body); exceeding it
        gives status ``timeout``. ``None``: no limit.
    retry
        :class:`RetryPolicy` for 429/503 answers (default: no retries).
    read_bufsize
        aiohttp read buffer (bytes); large so that long responses are not read 64 KiB at a time.
    run_start
        ``time.perf_counter()`` value that times are relative to (default: when created).
    keep_alive
        Reuse connections: requests in flight at once each hold one, and an idle one is kept
        :data:`KEEPALIVE_S` for the next request. ``False`` (the default): a new connection per
        request, which every server answers reliably (each request pays the connection
        set-up, and the client's sockets linger in ``TIME_WAIT``; module docstring).
    max_connections
        At most this many requests are written at once, each on a connection of its own
        (HTTP/1.1), so the client holds at most this many connections (default
        :data:`MAX_CONNECTIONS`; ``None``: no cap). A request beyond it waits, in FIFO order,
        until one ends: the wait is in its schedule delay and in ``connection_wait_s``.
    transport
        How requests are sent: ``"aiohttp"`` (the default) or ``"lean"``, an asyncio Protocol
        per connection with answers parsed by httptools (:mod:`simpy_llm.observe.lean`): the
        same records for the same answers at a fraction of the CPU per request, for load
        generation at high rates. Without httptools installed (the ``loadgen`` extra),
        ``"lean"`` warns and sends through aiohttp. Either way ``/v1/models`` is asked
        through aiohttp.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout_s: float | None = 600.0,
        retry: RetryPolicy | None = None,
        read_bufsize: int = 4 * 2**20,
        headers: dict[str, str] | None = None,
        run_start: float | None = None,
        keep_alive: bool = False,
        transport: str = "aiohttp",
        max_connections: int | None = MAX_CONNECTIONS,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(map(repr, TRANSPORTS))}, got {transport!r}")
        if max_connections is not None and (isinstance(max_connections, bool) or max_connections < 1):
            raise ValueError(f"max_connections must be a whole number >= 1 or None, got {max_connections!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.read_bufsize = read_bufsize
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.run_start = time.perf_counter() if run_start is None else run_start
        self.keep_alive = keep_alive
        self.transport = transport
        self.max_connections = max_connections
        self._connections: _Slots | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lean: LeanPool | None = None

    def now(self) -> float:
        """Seconds since :attr:`run_start`."""
        return time.perf_counter() - self.run_start

    async def __aenter__(self) -> OpenAIClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the HTTP session and its connection pool (see *keep_alive*)."""
        if self._connections is None and self.max_connections is not None:
            # One slot per request being written or answered: a connection each, whatever the
            # transport (aiohttp's pool and the lean one open a connection only when none is idle).
            self._connections = _Slots(self.max_connections)
        if self._session is None:
            # No limit in aiohttp's pool: the client's own (max_connections) holds requests back
            # before their send time is taken, so that a wait for a connection is measured; the
            # pool then holds at most as many connections as requests were in flight at once.
            if self.keep_alive:
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            else:
                connector = aiohttp.TCPConnector(limit=0, force_close=True)
            # No aiohttp timeouts: each attempt runs under asyncio.timeout(timeout_s) already.
            # aiohttp's defaults (total 300 s, connect 30 s) would add two timers per request
            # and cut a stream at 300 s even when timeout_s is longer or None.
            self._session = aiohttp.ClientSession(
                connector=connector,
                read_bufsize=self.read_bufsize,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        if self.transport == "lean" and self._lean is None:
            from simpy_llm.observe import lean

            problem = lean.missing()
            if problem is None:
                self._lean = lean.LeanPool(
                    self.base_url, self.headers, keep_alive=self.keep_alive, now=self.now, idle_s=KEEPALIVE_S,
                    timeout_s=self.timeout_s,
                )
            else:
                warnings.warn(f"{problem}; sending through aiohttp instead", LeanTransportWarning, stacklevel=2)

    async def close(self) -> None:
        """Close the HTTP session (and the lean transport's connections)."""
        self._connections = None
        if self._lean is not None:
            await self._lean.close()
            self._lean = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the client is not open: use `async with OpenAIClient(...)`")
        return self._session

    async def list_models(self) -> list[str]:
        """Model ids from ``GET /v1/models`` (raises ``aiohttp.ClientError`` on failure)."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with self.session.get(self.base_url + "/v1/models", timeout=timeout) as resp:
            resp.raise_for_status()
            obj = await resp.json(content_type=None)
        return [str(m["id"]) for m in obj.get("data", []) if isinstance(m, dict) and "id" in m]

    async def open_connections(self, n: int) -> int:
        """Open connections ahead of the requests until *n* are held (at most *max_connections*),
        kept idle for them; returns how many were opened. It opens none but with the lean
        transport and ``keep_alive`` (aiohttp opens its own as requests need them; without
        ``keep_alive`` each request has a connection of its own). A load generator opens
        :data:`OPEN_AHEAD` before its clock starts."""
        if self._lean is None:
            return 0
        cap = n if self.max_connections is None else min(n, self.max_connections)
        return await self._lean.open_idle(cap)

    async def default_model(self) -> str:
        """:attr:`model`, looked up (first of ``/v1/models``) and remembered if unset."""
        if self.model is None:
            models = await self.list_models()
            self.model = models[0] if models else "default"
        return self.model

    # ------------------------------------------------------------------ requests
    def encode(self, spec: RequestSpec) -> bytes:
        """The JSON body of *spec* as :meth:`send` writes it (its model, else :attr:`model`), to
        build ahead of the send and pass to it as *body*.

        Raises
        ------
        ValueError
            Neither *spec* nor the client names a model yet (:meth:`default_model` looks it up).
        TypeError
            The body holds what JSON cannot encode (from the spec's ``extra_body``).

        Examples
        --------
        >>> OpenAIClient("http://127.0.0.1:1", model="m").encode(RequestSpec("hi", 3, "completions", stream=False))
        b'{"model":"m","max_tokens":3,"stream":false,"prompt":"hi"}'
        """
        model = spec.model if spec.model is not None else self.model
        if model is None:
            raise ValueError("no model to encode the body with: name one, or look it up first (default_model())")
        return _encode(spec.body(model))

    async def send(self, spec: RequestSpec, record: ObservedRequest | None = None, *, body: bytes | None = None) -> ObservedRequest:
        """Send *spec* (retrying per :attr:`retry`) and return its measured record.

        *record* (optional) is filled in place, so a caller keeps the partial
        record if the task is cancelled; ``CancelledError`` is re-raised after
        the record is marked ``cancelled``. *body*: *spec*'s body as :meth:`encode`
        gave it, built ahead of time (``None``: built here); it is sent as it is.
        """
        rec = record if record is not None else ObservedRequest()
        rec.request_id, rec.endpoint, rec.streaming = spec.request_id, spec.endpoint, spec.stream
        try:
            if body is not None:
                data = body
            else:
                model = await self.default_model() if spec.model is None else spec.model
                data = _encode(spec.body(model))  # once for every attempt, sent under the session's Content-Type
            for attempt in range(self.retry.max_retries + 1):
                retry_after = await self._attempt(spec, data, rec)
                if rec.status == "ok" or rec.http_status not in self.retry.retry_on or attempt == self.retry.max_retries:
                    break
                await asyncio.sleep(self.retry.delay(attempt, retry_after))
        except asyncio.CancelledError:
            rec.status = "cancelled"
            rec.error_message = rec.error_message or "cancelled before completion"
            rec.done_s = self.now()
            raise
        except Exception as exc:  # noqa: BLE001 - never let one request break a run
            rec.status = "error"
            rec.error_message = short_message(f"{type(exc).__name__}: {exc}")
            rec.done_s = self.now()
        return rec

    def start(self, spec: RequestSpec, rec: ObservedRequest, body: bytes, on_end: Callable[[], None]) -> _Exchange | None:
        """Send *spec* (its *body* built by :meth:`encode`) now, without a task, and call *on_end*
        when it ended, its record *rec* filled as :meth:`send` fills it; returns a handle for
        :meth:`abort`, or ``None`` when the request cannot be sent so (nothing was done: send it
        with :meth:`send`).

        It can be with the lean transport, no retries and, under *max_connections*, a slot free
        with nobody waiting for one: what a load generator's request meets at a steady rate, and
        when it fell behind. It then costs one write and the callbacks that read the answer; with
        no connection idle it waits in line for the first to come free or be opened, and its
        ``sent_s`` is when it was written. Its timeout is the pool's
        (:meth:`~simpy_llm.observe.lean.LeanPool.start`).
        """
        lean = self._lean
        if lean is None or self.retry.max_retries:
            return None
        slots = self._connections
        if slots is not None and not slots.try_acquire():
            return None
        rec.request_id, rec.endpoint, rec.streaming = spec.request_id, spec.endpoint, spec.stream
        self._reset(spec, rec)
        return lean.start(
            lean.take_idle(), ENDPOINTS[spec.endpoint], body, rec, spec.stream, lambda: self._started_ended(rec, on_end)
        )

    def _started_ended(self, rec: ObservedRequest, on_end: Callable[[], None]) -> None:
        """A request of :meth:`start` ended: what :meth:`_attempt` does after its POST."""
        if self._connections is not None:
            self._connections.release()
        if rec.status != "cancelled":  # a cancelled attempt ends as send()'s does: no more
            rec.attempt_statuses.append(rec.http_status)
            if rec.done_s is None:
                rec.done_s = self.now()
            if rec.completion_tokens_source != "usage" and rec.streaming and rec.content_times_s:
                rec.completion_tokens, rec.completion_tokens_source = len(rec.content_times_s), "chunks"
        on_end()

    def abort(self, handle: _Exchange) -> None:
        """Cancel a request of :meth:`start` that has not ended: its record is marked
        ``cancelled`` (as :meth:`send` marks one cancelled) and its callback is called."""
        if self._lean is not None:
            self._lean.abort(handle)

    @staticmethod
    def _reset(spec: RequestSpec, rec: ObservedRequest) -> None:
        """*rec* as an attempt starts: one more attempt, nothing of an answer yet."""
        rec.attempts += 1
        rec.status, rec.error_message, rec.http_status = "pending", "", None
        rec.headers_s = rec.first_byte_s = rec.first_chunk_s = rec.first_content_s = rec.last_chunk_s = rec.done_s = None
        rec.chunk_times_s, rec.content_times_s = [], []
        rec.output_chars = rec.reasoning_chars = 0
        rec.output_text = "" if spec.keep_text else None

    async def _attempt(self, spec: RequestSpec, data: bytes, rec: ObservedRequest) -> str | None:
        """One POST; fills *rec*; returns the ``Retry-After`` header if any."""
        self._reset(spec, rec)
        slots = self._connections
        if slots is not None:
            if slots.locked():  # every connection busy: wait (FIFO) for one, before the send time
                waited_from = self.now()
                await slots.acquire()
                rec.connection_wait_s += self.now() - waited_from
            else:
                await slots.acquire()
        rec.last_sent_s = self.now()
        if rec.sent_s is None:
            rec.sent_s = rec.last_sent_s
        retry_after = None
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._lean is not None:
                    retry_after = await self._lean.post(ENDPOINTS[spec.endpoint], data, rec, spec.stream)
                else:
                    retry_after = await self._post(spec, data, rec)
        except TimeoutError:
            rec.status = "timeout"
            rec.error_message = f"no complete response within {self.timeout_s} s"
        except aiohttp.ClientPayloadError as exc:
            rec.status = "error"
            rec.error_message = short_message(f"stream broken: {type(exc).__name__}: {exc}")
        except (aiohttp.ClientError, OSError) as exc:
            rec.status = "error"
            rec.error_message = short_message(f"{type(exc).__name__}: {exc}")
        finally:
            if slots is not None:
                slots.release()
        rec.attempt_statuses.append(rec.http_status)
        if rec.done_s is None:
            rec.done_s = self.now()
        if rec.completion_tokens_source != "usage" and spec.stream and rec.content_times_s:
            rec.completion_tokens, rec.completion_tokens_source = len(rec.content_times_s), "chunks"
        return retry_after

    async def _post(self, spec: RequestSpec, data: bytes, rec: ObservedRequest) -> str | None:
        """The POST of an attempt through aiohttp; fills *rec*; returns the ``Retry-After`` header if any."""
        retry_after = None
        for resend in range(UNSENT_RETRIES + 1):
            try:
                async with self.session.post(self.base_url + ENDPOINTS[spec.endpoint], data=data) as resp:
                    rec.headers_s = self.now()
                    rec.http_status = resp.status
                    if resp.status != 200:
                        retry_after = resp.headers.get("Retry-After")
                        raw = await resp.content.read(64 * 1024)
                        rec.status = "error"
                        rec.error_message = http_error_message(resp.status, resp.reason, raw)
                    elif spec.stream:
                        await self._read_stream(resp, rec)
                    else:
                        await self._read_json(resp, rec)
                break
            except aiohttp.ClientOSError as exc:
                # A kept-alive connection the server closed as the request went out: the
                # request was not written in full, so the server did not act on it; it
                # goes again, on another connection (RFC 9112, 9.3.1).
                if resend == UNSENT_RETRIES or rec.headers_s is not None or not _unsent(exc):
                    raise
        return retry_after

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: ObservedRequest) -> None:
        reader = StreamReader(rec)
        try:
            while True:
                data = await resp.content.readany()
                if not data or reader.feed(data, self.now()):
                    break
        finally:
            reader.keep_text()
        reader.end(self.now())

    async def _read_json(self, resp: aiohttp.ClientResponse, rec: ObservedRequest) -> None:
        raw = await resp.read()
        json_answer(rec, raw, self.now())
