"""The client's lean HTTP/1.1 transport: an asyncio Protocol per connection, answers parsed by httptools.

:class:`OpenAIClient(transport="lean") <simpy_llm.observe.client.OpenAIClient>` posts its
requests through a :class:`LeanPool` instead of aiohttp's session. A request costs one write of
bytes built once (the request line and headers are fixed per endpoint: only
``Content-Length`` and the body change) and one future, woken when the answer ends; the answer
is parsed as it arrives, in the protocol's callbacks, by ``httptools`` (the Python binding of
llhttp, the parser of Node.js; it de-chunks ``Transfer-Encoding: chunked``), and a streamed
answer is read into its record there by the same
:class:`~simpy_llm.observe.client.StreamReader` as aiohttp's path uses, with each read's receive
time. What aiohttp does per request besides (its request and response objects, a stream reader,
a task wake-up per read, its connection pool) is what it saves: see docs/observe.md, "Workers
and saturation". :meth:`LeanPool.start` saves the future and the sender's task as well: a request
so started calls its sender back when it ended (the load generator's open-loop requests go so),
and the requests so started share one timer for their timeouts. One started with no idle
connection waits in line (first come, first served) for the first connection to come free or be
opened, whichever comes first; at most :data:`MAX_OPENING` connections are being opened at once,
and no more than requests wait. A client that fell behind so catches up on the connections it
has, as fast as their answers end, rather than opening a connection per late request: at 5,000
requests/s a 100 ms pause used to open ~2,000 connections at once, and opening them kept the
event loop's turns hundreds of milliseconds long, which made more requests late (a run took a
second or more to catch up).

Connections. With ``keep_alive`` a connection whose answer ended is kept for the next request
(last in, first out), unless the answer said ``Connection: close``, the server closed it (end
of file: it leaves the pool at once), or it lay idle longer than
:data:`~simpy_llm.observe.client.KEEPALIVE_S` (closed when next looked at). A request on a
connection is written once and never again: a server that closes the connection after the
request was written, before answering, gives an ``error`` record (the server may have acted on
it), never a second send. llama.cpp's server closes after a streamed answer without saying so,
and a request sent on that connection before its end of file was read fails that way: leave
``keep_alive`` off against it. Without ``keep_alive`` every request asks ``Connection: close``
on a new connection.

What ends a request: the end of its answer (``data: [DONE]`` for a stream, which ends the
record at once; the rest of the answer is still read before the connection is reused), a
non-200 answer's body (its first 64 KiB make the error message), the server closing the
connection (an answer without ``Content-Length`` or chunked encoding ends there; one with
either is a broken stream), an answer that is not HTTP, or the caller's timeout or cancellation,
which closes the connection (its state is then unknown).

``httptools`` is an optional dependency (the ``loadgen`` extra); :func:`missing` says what is
missing, and the client falls back to aiohttp with a warning saying so.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from simpy_llm.observe.answers import StreamReader, http_error_message, json_answer, short_message

if TYPE_CHECKING:
    from simpy_llm.observe.client import ObservedRequest

__all__ = ["ERROR_BODY_BYTES", "MAX_OPENING", "LeanPool", "missing"]

ERROR_BODY_BYTES = 64 * 1024
"""A non-200 answer's body is read up to this many bytes (its error message is made from them)."""

MAX_OPENING = 64
"""Connections a :class:`LeanPool` opens at once for requests waiting in line
(:meth:`LeanPool.start` with no idle connection): each that opens takes the first request
waiting, and the next is opened while requests still wait. A burst of late requests so opens
connections in steps of this many instead of all at once, and a connection that comes free
meanwhile carries the next request at once."""


def missing() -> str | None:
    """What the lean transport lacks here (a message naming the package to install), or ``None``.

    >>> missing() is None or "httptools" in missing()
    True
    """
    try:
        import httptools  # noqa: F401 - only whether it imports
    except ImportError:
        return "the lean transport needs httptools (pip install 'simpy-llm[loadgen]' or pip install httptools)"
    return None


class _Exchange:
    """One request on one connection: where its answer goes, and who is told when it ended: the
    future its sender awaits (:meth:`LeanPool.post`, resolved with the ``Retry-After`` header or
    ``None``), or a callback (:meth:`LeanPool.start`, called with the exchange)."""

    __slots__ = (
        "callback", "conn", "deadline", "ended", "future", "length_known", "on_end", "raw", "reader", "reason",
        "rec", "retry_after", "status", "stream", "t",
    )

    def __init__(
        self,
        rec: ObservedRequest,
        stream: bool,
        future: asyncio.Future[str | None] | None,
        on_end: Callable[[_Exchange], None] | None = None,
    ) -> None:
        self.rec = rec
        self.stream = stream
        self.future = future
        self.on_end = on_end
        self.callback: Callable[[], None] | None = None  # the starter's, called by the pool after on_end
        self.ended = False
        """The request ended (its record is filled; what follows on the connection is not kept)."""
        self.conn: _Connection | None = None
        self.deadline = 0.0  # perf_counter() time after which a started request times out
        self.reader: StreamReader | None = None
        self.raw: bytearray | None = None
        self.status = 0
        self.reason = ""
        self.retry_after: str | None = None
        self.length_known = False  # Content-Length or chunked: the body does not end at end of file
        self.t = 0.0  # receive time of the bytes being parsed

    def resolve(self) -> None:
        """The request ended: tell its sender (once)."""
        if self.ended:
            return
        self.ended = True
        if self.future is not None:
            if not self.future.done():
                self.future.set_result(self.retry_after)
        elif self.on_end is not None:
            self.on_end(self)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection of a :class:`LeanPool`: at most one request at a time."""

    def __init__(self, pool: LeanPool) -> None:
        import httptools

        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self._parse_error: type[Exception] = httptools.HttpParserError
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.lost: asyncio.Future[None] = pool.loop.create_future()

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: the connection cannot be trusted with a request
            self.close()
            return
        ex.t = self.pool.now()
        try:
            self.parser.feed_data(data)
        except self._parse_error as exc:
            if self.exchange is ex:
                self._fail(ex, f"invalid HTTP response: {type(exc).__name__}: {exc}")
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if not self.lost.done():
            self.lost.set_result(None)
        ex = self.exchange
        if ex is None:
            return
        self.exchange = None
        if ex.ended:
            return
        ex.t = self.pool.now()
        why = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        if ex.status == 0:
            self._fail(ex, "the server closed the connection before answering (the request was written; not sent again)" + why)
        elif not ex.length_known:  # a body that ends with the connection
            self._complete(ex)
        else:
            self._fail(ex, "stream broken: the server closed the connection before the end of the answer" + why)

    # ------------------------------------------------------------ httptools callbacks
    def on_status(self, reason: bytes) -> None:
        if self.exchange is not None:
            self.exchange.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.exchange
        if ex is None:
            return
        key = name.lower()
        if key == b"retry-after":
            ex.retry_after = value.decode("latin-1")
        elif key == b"content-length" or (key == b"transfer-encoding" and b"chunked" in value.lower()):
            ex.length_known = True

    def on_headers_complete(self) -> None:
        ex = self.exchange
        if ex is None:
            return
        ex.status = status = self.parser.get_status_code()
        rec = ex.rec
        rec.headers_s = ex.t
        rec.http_status = status
        if status == 200 and ex.stream:
            ex.reader = StreamReader(rec)
        else:
            ex.raw = bytearray()

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex is None or ex.ended:
            return  # after [DONE], or an error body read far enough: the rest is read, not kept
        reader = ex.reader
        if reader is not None:
            if reader.feed(body, ex.t):
                self._end_stream(ex, reader)
        elif ex.raw is not None:
            ex.raw += body
            if ex.status != 200 and len(ex.raw) >= ERROR_BODY_BYTES:
                self._complete(ex)
                self.close()  # the rest of a long error body is not worth reading

    def on_message_complete(self) -> None:
        ex = self.exchange
        if ex is None:
            return
        self.exchange = None
        if not ex.ended:
            self._complete(ex)
        if self.pool.keep_alive and self.parser.should_keep_alive() and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    # ------------------------------------------------------------ ends of a request
    def _end_stream(self, ex: _Exchange, reader: StreamReader) -> None:
        reader.keep_text()
        reader.end(ex.t)
        ex.resolve()

    def _complete(self, ex: _Exchange) -> None:
        """The answer ended (or was read far enough): fill the record from what was read."""
        rec = ex.rec
        if ex.reader is not None:
            self._end_stream(ex, ex.reader)
            return
        raw = bytes(ex.raw or b"")
        if ex.status != 200:
            rec.status = "error"
            rec.error_message = http_error_message(ex.status, ex.reason, raw[:ERROR_BODY_BYTES])
            rec.done_s = ex.t
        else:
            json_answer(rec, raw, ex.t)
        ex.resolve()

    def _fail(self, ex: _Exchange, message: str) -> None:
        if ex.ended:  # its record is final (the bytes after [DONE] are read, not judged)
            return
        rec = ex.rec
        if ex.reader is not None:
            ex.reader.keep_text()
        rec.status, rec.error_message = "error", short_message(message)
        rec.done_s = ex.t
        ex.resolve()

    # ------------------------------------------------------------ the sender's side
    def send(self, ex: _Exchange, data: bytes) -> None:
        """Write the whole request *data* (written once: never again on another connection)."""
        assert self.transport is not None
        self.exchange = ex
        ex.conn = self
        self.transport.write(data)

    def close(self) -> None:
        """Close the connection (its request, if any, is ended by :meth:`connection_lost`)."""
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class LeanPool:
    """The connections of one :class:`~simpy_llm.observe.client.OpenAIClient` to its server.

    Parameters
    ----------
    base_url
        ``http://host:port`` or ``https://host:port``, with or without a path prefix.
    headers
        Sent with every request (``Content-Type``, ``Authorization``, the caller's own).
    keep_alive
        Keep connections for the next request (see the module docstring).
    now
        The client's clock: seconds since its run start.
    idle_s
        Seconds an idle connection is kept (the client's :data:`~simpy_llm.observe.client.KEEPALIVE_S`).
    timeout_s
        The limit on a request started by :meth:`start` (the client's *timeout_s*; ``None``: none).
    """

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, keep_alive: bool, now: Callable[[], float], idle_s: float = 2.0,
        timeout_s: float | None = None,
    ) -> None:
        missing_ = missing()
        if missing_ is not None:
            raise ImportError(missing_)
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the lean transport needs an http:// or https:// URL with a host, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.keep_alive = keep_alive
        self.idle_s = idle_s
        self.now = now
        self.loop = asyncio.get_running_loop()
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default_port = 443 if parts.scheme == "https" else 80
        self._host_header = host if self.port == default_port else f"{host}:{self.port}"
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection"))
        self._heads: dict[str, bytes] = {}
        # Idle connections in the order released: popitem() takes the last (last in, first out),
        # and one the server closes leaves in O(1) (a run that fell behind may hold 10^4 of them).
        self._idle: dict[_Connection, None] = {}
        self._all: set[_Connection] = set()
        self.timeout_s = timeout_s
        self._started: dict[_Exchange, None] = {}  # requests started (start()) in the order of their deadlines
        self._timer: asyncio.TimerHandle | None = None
        # Requests started with no idle connection, first come first served, with their bytes (one
        # ended meanwhile stays until it comes up, then is passed over), and the connections being
        # opened for them.
        self._waiting: collections.deque[tuple[_Exchange, bytes]] = collections.deque()
        self._opening = 0
        self._openers: set[asyncio.Task[None]] = set()
        self._closing = False

    def _head(self, path: str) -> bytes:
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = (
                f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\nAccept: */*\r\n{self._fixed}"
                + ("" if self.keep_alive else "Connection: close\r\n")
                + "Content-Length: "
            ).encode("latin-1")
        return head

    async def post(self, path: str, data: bytes, rec: ObservedRequest, stream: bool) -> str | None:
        """POST *data* (a JSON body) to *path*; fill *rec* from the answer; return its ``Retry-After``.

        Failures of the connection set-up raise :class:`OSError`; everything after the request
        was written is recorded in *rec*. Cancellation (the caller's timeout) closes the connection.
        """
        conn = self._acquire()
        if conn is None:
            _, conn = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl)
            self._all.add(conn)
        future: asyncio.Future[str | None] = self.loop.create_future()
        ex = _Exchange(rec, stream, future)
        conn.send(ex, b"%s%d\r\n\r\n%s" % (self._head(path), len(data), data))
        try:
            return await future
        except BaseException:
            # Cancelled (the caller's timeout) before the answer ended: the connection is in
            # the middle of an answer, so it is closed; what was read stays in the record.
            if not ex.ended:
                ex.ended = True
                future.cancel()
                self._cut(ex)
            raise

    def _cut(self, ex: _Exchange) -> None:
        """*ex* ended before its answer did: keep the text read so far and close its connection
        (it is in the middle of an answer)."""
        if ex.reader is not None:
            ex.reader.keep_text()
        conn = ex.conn
        if conn is not None:
            if conn.exchange is ex:
                conn.exchange = None
            conn.close()

    # ------------------------------------------------------------ requests started without a task
    def start(
        self, conn: _Connection | None, path: str, data: bytes, rec: ObservedRequest, stream: bool, callback: Callable[[], None]
    ) -> _Exchange:
        """Write the request of :meth:`post` on *conn* (from :meth:`take_idle`) now, or with
        *conn* ``None`` on the first connection that comes free or is opened (see the module
        docstring), and call *callback* when it ended: its record filled as :meth:`post` fills it,
        or marked ``timeout`` *timeout_s* after this call, or ``error`` when no connection could be
        opened for it. *rec*'s ``sent_s`` and ``last_sent_s`` are set when it is written. The
        request costs no task and no timer of its own: the pool keeps the requests it started in
        the order of their deadlines, and one timer, set to the first, times them out.
        :meth:`abort` ends one sooner.
        """
        ex = _Exchange(rec, stream, None, self._ended)
        ex.callback = callback
        if self.timeout_s is not None:
            # One timeout for all: the deadlines come in the order the requests are started.
            ex.deadline = time.perf_counter() + self.timeout_s
            self._started[ex] = None
            if self._timer is None:
                self._timer = self.loop.call_later(self.timeout_s, self._expire)
        request = b"%s%d\r\n\r\n%s" % (self._head(path), len(data), data)
        if conn is not None:
            self._write(conn, ex, request)
        else:
            self._waiting.append((ex, request))
            self._open_more()
        return ex

    def _write(self, conn: _Connection, ex: _Exchange, request: bytes) -> None:
        """Write started request *ex* on *conn* now."""
        rec = ex.rec
        rec.last_sent_s = self.now()
        if rec.sent_s is None:
            rec.sent_s = rec.last_sent_s
        try:
            conn.send(ex, request)
        except Exception as exc:  # noqa: BLE001 - the transport refused the write: the record says why
            conn.exchange = None
            conn.close()
            self._refuse(ex, exc)

    def _refuse(self, ex: _Exchange, exc: BaseException) -> None:
        """Started request *ex* could not be written (*exc* says why): it ends as ``error``."""
        rec = ex.rec
        rec.status, rec.error_message = "error", short_message(f"{type(exc).__name__}: {exc}")
        rec.done_s = self.now()
        ex.ended = True
        self._ended(ex)

    def _open_more(self) -> None:
        """Open connections for the requests waiting in line: one per request, at most
        :data:`MAX_OPENING` at once."""
        while self._opening < MAX_OPENING and self._opening < len(self._waiting) and not self._closing:
            self._opening += 1
            task = self.loop.create_task(self._open())
            self._openers.add(task)
            task.add_done_callback(self._openers.discard)

    async def _open(self) -> None:
        """Open a connection and hand it to the first request waiting (else keep it idle); when it
        cannot be opened, the first request waiting ends with the error."""
        try:
            _, conn = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl)
        except Exception as exc:  # noqa: BLE001 - as a request whose connection failed: its record says why
            self._opening -= 1
            if (item := self._next_waiting()) is not None:
                self._refuse(item[0], exc)
            self._open_more()  # one attempt for each request that waits
            return
        except BaseException:  # cancelled (the pool closes): nothing more is opened
            self._opening -= 1
            raise
        self._opening -= 1
        if self._closing:
            conn.close()
            return
        self._all.add(conn)
        self.release(conn)
        self._open_more()  # requests still wait (answers are slow to come): the next connections

    def _next_waiting(self) -> tuple[_Exchange, bytes] | None:
        """The first request waiting in line that has not ended (aborted or timed out), taken out."""
        waiting = self._waiting
        while waiting:
            item = waiting.popleft()
            if not item[0].ended:
                return item
        return None

    def _ended(self, ex: _Exchange) -> None:
        self._started.pop(ex, None)
        callback, ex.callback = ex.callback, None
        if callback is not None:
            callback()

    def _expire(self) -> None:
        """Time out the started requests past their deadline; set the timer to the next one."""
        self._timer = None
        started = self._started
        now = time.perf_counter()
        while started:
            ex = next(iter(started))
            if ex.deadline > now:
                self._timer = self.loop.call_later(ex.deadline - now, self._expire)
                return
            self.abort(ex, "timeout", f"no complete response within {self.timeout_s} s")

    def abort(self, ex: _Exchange, status: str = "cancelled", message: str = "cancelled before completion") -> None:
        """End started request *ex* now, unless it ended: its record gets *status* and *message*
        (a message it has already is kept when cancelled), its connection is closed, and its
        callback is called."""
        if ex.ended:
            return
        ex.ended = True
        self._cut(ex)
        rec = ex.rec
        rec.status = status
        rec.error_message = (rec.error_message or message) if status == "cancelled" else message
        if status == "cancelled" or rec.done_s is None:
            rec.done_s = self.now()
        self._ended(ex)

    async def open_idle(self, n: int) -> int:
        """Open connections (all at once) until *n* are held, each kept idle for the next requests;
        returns how many were opened. One that cannot be opened is left out (the request that
        needs it opens its own and records why that failed)."""
        if not self.keep_alive or self._closing:
            return 0
        want = max(n - len(self._all), 0)
        made = await asyncio.gather(
            *(self.loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl) for _ in range(want)),
            return_exceptions=True,
        )
        opened = 0
        for result in made:
            if isinstance(result, BaseException):
                continue
            conn = result[1]
            if self._closing:
                conn.close()
                continue
            self._all.add(conn)
            self.release(conn)
            opened += 1
        return opened

    def take_idle(self) -> _Connection | None:
        """An idle connection for :meth:`start` (the last one released), or ``None``."""
        return self._acquire() if self._idle else None

    def _acquire(self) -> _Connection | None:
        """An idle connection to reuse (the last one released), or ``None``."""
        idle = self._idle
        limit = time.perf_counter() - self.idle_s
        while idle:
            conn = idle.popitem()[0]
            if not conn.closed and conn.idle_since >= limit:
                return conn
            conn.close()
        return None

    def release(self, conn: _Connection) -> None:
        """*conn*'s answer ended (or it was just opened) and it may carry another request: the
        first one waiting in line, at once, else the next to come."""
        if self._waiting and (item := self._next_waiting()) is not None:
            self._write(conn, *item)
            return
        conn.idle_since = time.perf_counter()
        self._idle[conn] = None

    def forget(self, conn: _Connection) -> None:
        """*conn* is closed: it leaves the pool."""
        self._all.discard(conn)
        self._idle.pop(conn, None)

    @property
    def waiting(self) -> int:
        """Requests started that wait in line for a connection (any ended meanwhile included)."""
        return len(self._waiting)

    async def close(self) -> None:
        """Close every connection and wait (briefly) until they are closed."""
        self._closing = True
        for ex in list(self._started):
            self.abort(ex)
        while (item := self._next_waiting()) is not None:  # with no timeout they are not in _started
            self.abort(item[0])
        for task in list(self._openers):
            task.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conns = list(self._all)
        self._idle.clear()
        for conn in conns:
            conn.close()
        waits: list[Any] = [conn.lost for conn in conns if not conn.lost.done()]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
