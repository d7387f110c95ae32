"""Load generation spread over worker processes: one schedule, one trace.

One event loop sends 1,000-2,000 requests per second on a core (docs/observe.md,
"Speed"). :class:`ProcessLoadGenerator` spreads the sending over *workers* processes
so that the client is not what limits a benchmark:

- the parent holds the schedule: the same requests, the same target times and request
  ids as a one-process run. :func:`partition` splits it round-robin in target order
  (a session's requests stay together in one worker);
- each worker is a fresh process (the ``spawn`` start method, the same on every
  platform) running a :class:`~simpy_llm.observe.loadgen.LoadGenerator` on its own
  event loop (uvloop when installed, as *loop* says) with its own
  :class:`~simpy_llm.observe.client.OpenAIClient`. It builds the request bodies of its
  share before it reports ready (as many as *prepare_bytes* holds, each worker its own
  window: :meth:`~simpy_llm.observe.loadgen.LoadGenerator.prepare`) and opens its first
  connections (:data:`~simpy_llm.observe.client.OPEN_AHEAD`), so that work is done before the
  run's clock starts;
- every worker counts targets from one origin: when all have connected, the parent sets
  ``run_start`` (``time.perf_counter()``, a clock every process of the machine shares)
  :data:`START_LEAD_S` ahead and sends it to them;
- each finished request's :class:`~simpy_llm.observe.client.ObservedRequest` streams
  back to the parent (in batches of at most :data:`BATCH` records, or after at most
  :data:`FLUSH_S` seconds; each record as the tuple of its fields, which pickles in a
  quarter of the object's time), which writes its trace v2 row exactly as the one-process
  generator does, so the trace has the same format, rows in the order the parent
  receives them. While the workers send, the parent counts each record in its live
  statistics and holds it: making the record again and writing its row (about 12 µs a
  request, an eighth of a core at 10,000/s, on cores the workers share) waits until every
  request has been sent, or until more than :data:`HOLD_ROWS` are held, and is then done in
  slices of :data:`SLICE_ROWS` with the event loop free between them. Every row held is
  written before :meth:`ProcessLoadGenerator.run` returns or raises, whether the run ended,
  was stopped or cancelled, or a worker failed (a parent killed outright loses the rows it
  held: at most :data:`HOLD_ROWS`). A worker's messages are written to the pipe by a thread of their own: a
  batch larger than the pipe holds waits there for the parent to read it, and that wait
  must not hold back the worker's sends (it did, for as long as the parent was busy);
- while the run sends, the parent and every worker run young garbage collections only, on
  a clock of their event loops, freezing what survives each
  (:func:`~simpy_llm.observe.collector.young_collections_only`): a full collection walks
  every record kept so far, the records grow with the run, and a young collection left to
  the collector's own count could walk seconds of them at once;
- a concurrency limit is split across the workers (:func:`split_limit`): their
  limits add up to it, so the run never has more in flight than it says. Each worker
  queues its own requests (FIFO within a worker), so a request can wait for a slot in
  its worker while another worker has one free.

Closed-loop sessions are not spread: a session's later calls get request ids and
tool slots from state the whole run shares, so ``observe`` refuses ``workers > 1``
for a workload with sessions.
"""

from __future__ import annotations

import asyncio
import collections
import math
import multiprocessing
import operator
import queue
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import attrs

from simpy_llm.observe.client import OPEN_AHEAD, ObservedRequest, OpenAIClient, raise_open_files_limit
from simpy_llm.observe.collector import young_collections_only
from simpy_llm.observe.loadgen import (
    PREPARE_BYTES,
    LoadGenerator,
    LoadRequest,
    RunSummary,
    ScheduleLagWarning,
    load_requests,
    record_row,
    run_statistics,
    summarize_run,
)
from simpy_llm.observe.progress import LiveStats
from simpy_llm.observe.prompts import PromptSource, SyntheticPrompts
from simpy_llm.observe.runner import run as run_loop

__all__ = ["BATCH", "FLUSH_S", "HOLD_ROWS", "SLICE_ROWS", "START_LEAD_S", "ProcessLoadGenerator", "partition", "split_limit"]

START_LEAD_S = 0.1
"""The shared run start is this long after the last worker reported ready, so that every
worker has received it before the first target."""
BATCH = 256
"""A worker sends finished records to the parent in batches of at most this many ..."""
FLUSH_S = 0.02
"""... and at most this long after the first of a batch ended."""

HOLD_ROWS = 200_000
"""While the workers send, the parent holds at most about this many records unwritten (see the
module docstring): beyond it, it writes the oldest until half as many are held. 20 s at
10,000 requests/s, so a 10 s run at that rate writes no row while it sends; a held record takes
about 1.2 kB (a streamed answer of 5 chunks), about what its record takes once made again, which
the parent keeps for the run's summary in any case."""
SLICE_ROWS = 1_000
"""Rows the parent writes at a time while the run goes on (tens of milliseconds), the event
loop free between slices for the workers' messages."""

_FIELDS = tuple(a.name for a in attrs.fields(ObservedRequest))
_pack = operator.attrgetter(*_FIELDS)
"""A record as the tuple of its fields in declaration order (``ObservedRequest(*values)`` makes it again)."""
_live_fields = operator.itemgetter(*(_FIELDS.index(n) for n in ("status", "streaming", "sent_s", "first_content_s", "done_s")))
"""The fields of a packed record that :meth:`~simpy_llm.observe.progress.LiveStats.end_values` takes."""


def partition(requests: Sequence[LoadRequest], workers: int) -> list[list[LoadRequest]]:
    """*requests* split over *workers* lists: round-robin in the given order, except that
    every request of a session (``fields["session_id"]``) goes where its first went.

    Every request is in exactly one list, and each list keeps the given order.

    >>> reqs = [LoadRequest(i, i * 0.1, 8, 2) for i in range(5)]
    >>> [[r.request_id for r in part] for part in partition(reqs, 2)]
    [[0, 2, 4], [1, 3]]
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    parts: list[list[LoadRequest]] = [[] for _ in range(workers)]
    by_session: dict[Any, int] = {}
    turn = 0
    for req in requests:
        sid = req.fields.get("session_id")
        where = by_session.get(sid) if sid is not None else None
        if where is None:
            where = turn % workers
            turn += 1
            if sid is not None:
                by_session[sid] = where
        parts[where].append(req)
    return parts


def split_limit(limit: int | None, workers: int) -> list[int | None]:
    """A concurrency *limit* split across *workers*: whole shares as equal as can be, adding up to it.

    ``None`` (open loop) stays ``None`` for every worker. A limit below *workers* would
    leave a worker with no slot: :class:`ValueError`.

    >>> split_limit(10, 3)
    [4, 3, 3]
    >>> split_limit(None, 2)
    [None, None]
    """
    if limit is None:
        return [None] * workers
    if limit < workers:
        raise ValueError(f"concurrency {limit} is below workers {workers}: each worker needs at least one slot")
    return [limit // workers + (1 if i < limit % workers else 0) for i in range(workers)]


class _Sender:
    """A worker's messages to its parent, written to the pipe *conn* by a thread of their own, in
    the order given.

    Writing a message larger than the pipe holds waits until the parent reads it; in this thread
    the event loop's sends go on meanwhile. When the pipe is closed (the parent is gone) it sets
    :attr:`broken`, calls *on_broken* once (from its thread) and drops what is left.
    """

    def __init__(self, conn: Connection, on_broken: Callable[[], None] | None = None) -> None:
        self.conn = conn
        self.on_broken = on_broken
        self.broken = False
        """The pipe was found closed: nothing more is written."""
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="simpy-llm-load-sender", daemon=True)
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue *message* for the parent."""
        self._outbox.put(message)

    def close(self) -> None:
        """Write every message queued, then end the thread (the pipe stays open)."""
        self._outbox.put(None)
        self._thread.join()

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            if self.broken:
                continue
            try:
                self.conn.send(message)
            except OSError:  # the parent is gone (its pipe is closed): nobody will read these
                self.broken = True
                if self.on_broken is not None:
                    self.on_broken()


class _ForwardingGenerator(LoadGenerator):
    """A worker's generator: finished records go to the parent (through *sender*) instead of a trace writer."""

    def __init__(self, sender: _Sender, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sender = sender
        self._out: list[tuple[Any, ...]] = []
        self._timer: asyncio.TimerHandle | None = None

    def _finish(self, req: LoadRequest, rec: ObservedRequest) -> None:
        if req.request_id in self._written:
            return
        super()._finish(req, rec)  # no writer: marks the request written and counts it
        self._out.append(_pack(rec))
        if len(self._out) >= BATCH:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send the records finished since the last flush, with the count of requests sent so far."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sender.broken:
            # The parent is gone: stop rather than keep sending into a closed pipe (which once
            # kept orphaned workers busy for minutes, each batch growing by what the last failed
            # to send). Nobody will write these rows.
            self._out = []
            self.stop()
        elif self._out:
            out, self._out = self._out, []
            self._sender.send(("ended", self.live.sent, out))


def _listen(conn: Connection, loop: asyncio.AbstractEventLoop, start: asyncio.Future[float | None], gen: LoadGenerator) -> None:
    """The worker's reader of its parent's messages: the run start, then perhaps a stop."""
    try:
        while True:
            kind, *rest = conn.recv()
            if kind == "start":
                loop.call_soon_threadsafe(_resolve, start, rest[0])
            elif kind == "stop":
                loop.call_soon_threadsafe(_resolve, start, None)
                loop.call_soon_threadsafe(gen.stop)
    except (EOFError, OSError, RuntimeError):  # the parent closed the pipe, or the loop is closed
        return


def _resolve(future: asyncio.Future[float | None], value: float | None) -> None:
    if not future.done():
        future.set_result(value)


async def _work(
    conn: Connection, sender: _Sender, client_options: dict[str, Any], options: dict[str, Any], requests: list[LoadRequest]
) -> None:
    loop = asyncio.get_running_loop()
    async with OpenAIClient(**client_options) as client:
        # An infinite lag threshold: the parent judges the whole run and warns, not each worker.
        gen = _ForwardingGenerator(sender, client, requests, None, lag_threshold_s=math.inf, **options)
        sender.on_broken = lambda: _call_soon(loop, gen.stop)
        start: asyncio.Future[float | None] = loop.create_future()
        threading.Thread(target=_listen, args=(conn, loop, start, gen), daemon=True).start()
        gen.prepare()  # the bodies of its share, before the run's clock starts
        await client.open_connections(min(OPEN_AHEAD, len(requests), options.get("concurrency") or OPEN_AHEAD))
        sender.send(("ready",))
        run_start = await start
        try:
            if run_start is not None:
                gen.run_start = run_start
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ScheduleLagWarning)
                    await gen.run()
            else:  # stopped before the start: every request is written as never sent
                gen.stop()
                await gen.run()
        finally:  # a failure too sends what ended before it: those rows are written
            gen.flush()
    sender.send(("done",))


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Call *callback* on *loop* from another thread (not at all once the loop is closed)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed: the run is over anyway
        pass


def _worker_main(
    conn: Connection, client_options: dict[str, Any], options: dict[str, Any], requests: list[LoadRequest], loop: str
) -> None:
    """A worker process: run its share of the schedule, then exit."""
    # Ctrl-C reaches the whole process group: the parent alone decides, and sends "stop".
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sender = _Sender(conn)
    try:
        run_loop(_work(conn, sender, client_options, options, requests), loop=loop)
    except BaseException:
        sender.send(("failed", traceback.format_exc()))
    finally:
        sender.close()
        conn.close()


class ProcessLoadGenerator:
    """Sends *requests* from *workers* processes at their target times; writes one trace.

    It stands where a :class:`~simpy_llm.observe.loadgen.LoadGenerator` stands
    (:meth:`run`, :meth:`stop`, :meth:`statistics`, :attr:`live`, :attr:`requests`,
    :attr:`records`, :attr:`summary`), with the same parameters but for those it
    cannot take (closed-loop sessions) and two of its own.

    Parameters
    ----------
    client
        An open :class:`~simpy_llm.observe.client.OpenAIClient` of the parent: each
        worker makes its own with the same URL, key, timeout, retries, headers,
        connection reuse (``keep_alive``), transport and cap on connections
        (``max_connections``, for each worker); the parent's ``run_start`` is set to the
        shared run start, so that its clock (the metrics scraper's) is the trace's.
    requests, writer, endpoint, stream, model, ignore_eos, extra_body, lag_threshold_s, prefixes, prompts
        As for :class:`~simpy_llm.observe.loadgen.LoadGenerator`.
    prepare_bytes
        As for :class:`~simpy_llm.observe.loadgen.LoadGenerator`, for each worker: every worker
        builds its share's bodies before it reports ready, up to this many bytes.
    concurrency
        At most this many requests in flight over the whole run, split across the
        workers (:func:`split_limit`); ``None``: open loop.
    workers
        How many processes send (>= 1; 1 runs one worker process all the same).
    loop
        The workers' event loop: ``auto`` (uvloop when installed), ``uvloop`` or ``asyncio``.

    Examples
    --------
    >>> import asyncio
    >>> from simpy_llm import load_scenario
    >>> from simpy_llm.observe.emulate.server import EmulatedServer
    >>> from simpy_llm.workload.traces import TraceV2Writer
    >>> async def main(out):
    ...     server = EmulatedServer(load_scenario("scenarios/quickstart.yaml"))
    ...     async with server, OpenAIClient(server.url) as client:
    ...         reqs = [{"arrival_time_s": i * 0.01, "input_tokens": 16, "output_tokens": 4} for i in range(6)]
    ...         with TraceV2Writer(out) as writer:
    ...             gen = ProcessLoadGenerator(client, reqs, writer, workers=2)
    ...             summary = await gen.run()
    ...     return summary.status_counts, gen.statistics()["workers"]
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     asyncio.run(main(pathlib.Path(tmp) / "trace"))
    ({'ok': 6}, 2)
    """

    def __init__(
        self,
        client: OpenAIClient,
        requests: Any,
        writer: Any = None,
        *,
        workers: int,
        endpoint: str = "chat",
        stream: bool | None = None,
        model: str | None = None,
        concurrency: int | None = None,
        ignore_eos: bool = True,
        extra_body: dict[str, Any] | None = None,
        lag_threshold_s: float = 0.010,
        prefixes: Mapping[str, int] | None = None,
        prompts: PromptSource | None = None,
        loop: str = "auto",
        prepare_bytes: int = PREPARE_BYTES,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 or None, got {concurrency}")
        if prepare_bytes < 0:
            raise ValueError(f"prepare_bytes must be >= 0, got {prepare_bytes}")
        self.limits = split_limit(concurrency, workers)  # checks workers and concurrency against it
        # Workers inherit this process's limit: raised (and checked against a worker's share) here,
        # before any is started, so that a share no worker could hold is refused up front.
        raise_open_files_limit(self.limits[0])
        self.client = client
        self.requests = load_requests(requests)
        self.writer = writer
        self.workers = workers
        self.model = model
        self.concurrency = concurrency
        self.lag_threshold_s = lag_threshold_s
        self.loop = loop
        self.options: dict[str, Any] = {
            "endpoint": endpoint,
            "stream": stream,
            "ignore_eos": ignore_eos,
            "extra_body": dict(extra_body or {}),
            "prefixes": dict(prefixes or {}),
            "prompts": prompts if prompts is not None else SyntheticPrompts(),
            "prepare_bytes": prepare_bytes,
        }
        self.live = LiveStats()
        self.records: dict[int, ObservedRequest] = {}
        self.summary: RunSummary | None = None
        self.failures: list[str] = []
        """The tracebacks of workers that failed (the run then raises :class:`RuntimeError`)."""
        self._by_id = {r.request_id: r for r in self.requests}
        self._columns = frozenset(writer.columns) if writer is not None and hasattr(writer, "columns") else None
        self._sent = [0] * workers
        self._held: collections.deque[tuple[Any, ...]] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None
        self._conns: list[Connection] = []
        self._started = asyncio.Event()
        self._stopped = False

    def statistics(self) -> dict[str, Any]:
        """The trace header's ``load_generator`` block, as
        :meth:`~simpy_llm.observe.loadgen.LoadGenerator.statistics` gives it, ``workers`` included.

        Raises
        ------
        RuntimeError
            :meth:`run` has not finished.
        """
        if self.summary is None:
            raise RuntimeError("the load generator has not run: no statistics yet")
        return run_statistics(self.summary, concurrency=self.concurrency, workers=self.workers)

    async def wait_started(self, run: asyncio.Future[Any] | None = None) -> None:
        """Wait until the run's clock is set (every worker ready, the start sent), or until *run*
        (the task running :meth:`run`) ends, whichever comes first."""
        started = asyncio.ensure_future(self._started.wait())
        try:
            await asyncio.wait({started} if run is None else {started, run}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()

    def stop(self) -> None:
        """Ask every worker to stop now: unfinished requests are cancelled and written as ``cancelled``."""
        self._stopped = True
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):  # that worker has already ended
                pass

    def _ended(self, worker: int, sent: int, recs: Sequence[tuple[Any, ...]]) -> None:
        """A worker's batch of packed records: counted now, held to be written (module docstring)."""
        self._sent[worker] = sent
        self.live.sent = sum(self._sent)
        end = self.live.end_values
        for item in recs:
            end(*_live_fields(item))
        self._held.extend(recs)
        if self._drainer is None and (len(self._held) > HOLD_ROWS or self.live.sent >= len(self.requests)):
            self._drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Write held rows a slice at a time: all of them once every request has been sent, else
        until half of :data:`HOLD_ROWS` are held."""
        try:
            while self._held and (self.live.sent >= len(self.requests) or len(self._held) > HOLD_ROWS // 2):
                self._write_held(SLICE_ROWS)
                await asyncio.sleep(0)
        finally:
            self._drainer = None

    def _write_held(self, limit: int | None = None) -> None:
        """Write the oldest *limit* held rows (``None``: all), in the order they were received."""
        held = self._held
        for _ in range(len(held) if limit is None else min(limit, len(held))):
            self._write(ObservedRequest(*held.popleft()))

    def _write(self, rec: ObservedRequest) -> None:
        self.records[rec.request_id] = rec
        if self.writer is not None:
            self.writer.write_row(record_row(self._by_id[rec.request_id], rec, self._columns))

    async def run(self) -> RunSummary:
        """Run the whole workload over the workers; returns (and stores in :attr:`summary`) the summary.

        Raises
        ------
        RuntimeError
            A worker failed (its traceback is in the message and in :attr:`failures`); the
            trace still holds a row for every request, those the worker left as ``cancelled``.
        """
        if self.model is None:
            self.model = await self.client.default_model()
        loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        c = self.client
        client_options = {
            "base_url": c.base_url,
            "api_key": c.api_key,
            "model": self.model,
            "timeout_s": c.timeout_s,
            "retry": c.retry,
            "read_bufsize": c.read_bufsize,
            "keep_alive": c.keep_alive,
            "transport": c.transport,
            "max_connections": c.max_connections,
            "headers": {k: v for k, v in c.headers.items() if k not in ("Content-Type", "Authorization")},
        }
        procs = []
        done: list[asyncio.Future[None]] = []
        ready: list[asyncio.Future[None]] = []
        try:
            for i, part in enumerate(partition(self.requests, self.workers)):
                parent, child = ctx.Pipe()
                options = {**self.options, "model": self.model, "concurrency": self.limits[i]}
                proc = ctx.Process(
                    target=_worker_main,
                    args=(child, client_options, options, part, self.loop),
                    name=f"simpy-llm-load-{i}",
                    daemon=True,
                )
                proc.start()
                child.close()
                procs.append(proc)
                self._conns.append(parent)
                ready.append(loop.create_future())
                done.append(loop.create_future())
                threading.Thread(target=self._read, args=(i, parent, loop, ready[i], done[i]), daemon=True).start()
            await asyncio.gather(*ready)
            if self._stopped or self.failures:
                self.stop()  # a worker that reported ready after an earlier stop() still waits for word
            else:
                run_start = time.perf_counter() + START_LEAD_S
                self.client.run_start = run_start
                for conn in self._conns:
                    conn.send(("start", run_start))
            self._started.set()
            with young_collections_only():  # see the module docstring
                await asyncio.gather(*done)
        except asyncio.CancelledError:
            self.stop()
            await asyncio.gather(*done, return_exceptions=True)
            self._close(procs)
            self.summary = self._summarize()
            raise
        self._close(procs)
        self.summary = self._summarize()
        if self.failures:
            raise RuntimeError("a load worker failed:\n" + "\n".join(self.failures))
        if self.summary.lagging and self.summary.lag_p50_s is not None:
            warnings.warn(
                f"median schedule lag {self.summary.lag_p50_s * 1e3:.1f} ms exceeds "
                f"{self.lag_threshold_s * 1e3:.1f} ms: the client could not keep the requested rate",
                ScheduleLagWarning,
                stacklevel=2,
            )
        return self.summary

    def _read(
        self, worker: int, conn: Connection, loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None], done: asyncio.Future[None]
    ) -> None:
        """Reader thread of one worker's pipe: each message is handled on the event loop."""
        try:
            while True:
                kind, *rest = conn.recv()
                if kind == "ready":
                    loop.call_soon_threadsafe(_settle, ready)
                elif kind == "ended":
                    loop.call_soon_threadsafe(self._ended, worker, rest[0], rest[1])
                elif kind == "failed":
                    loop.call_soon_threadsafe(self.failures.append, f"worker {worker}: {rest[0]}")
                    break
                elif kind == "done":
                    break
        except (EOFError, OSError):
            loop.call_soon_threadsafe(self.failures.append, f"worker {worker} exited without finishing its requests")
        loop.call_soon_threadsafe(_settle, ready)
        loop.call_soon_threadsafe(_settle, done)

    def _close(self, procs: list[Any]) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():  # it did not exit after its last message: end it by its pid
                proc.kill()
                proc.join()

    def _summarize(self) -> RunSummary:
        """Write the rows still held, then every request no worker reported as ``cancelled``;
        summarize the run."""
        if self._drainer is not None:  # its slices are written below, without yielding
            self._drainer.cancel()
            self._drainer = None
        self._write_held()
        for req in self.requests:
            if req.request_id not in self.records:
                rec = ObservedRequest(request_id=req.request_id, scheduled_s=req.arrival_s)
                rec.status, rec.error_message = "cancelled", "run stopped before the request was sent"
                self.live.end(rec)
                self._write(rec)
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()
        return summarize_run(
            self.requests,
            self.records,
            lag_threshold_s=self.lag_threshold_s,
            stopped=self._stopped,
            limited=self.concurrency is not None,
        )


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
