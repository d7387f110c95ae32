"""Open-loop load generation against an OpenAI-compatible server, writing a trace v2.

:class:`LoadGenerator` sends each request of a workload (a DataFrame from
:func:`simpy_llm.workload.export.generate_requests`, or any rows with
``arrival_time_s``, ``input_tokens``, ``output_tokens``) at its target time,
measured on the :class:`~simpy_llm.observe.client.OpenAIClient`'s clock, and
writes one trace v2 row per request to a
:class:`~simpy_llm.workload.traces.TraceV2Writer` as soon as the request ends,
whatever its fate (``ok``, ``error``, ``timeout``, ``cancelled``). A run cut
short therefore leaves a readable trace.

A single dispatcher coroutine walks the requests in target order, sleeps until
each target and starts the request as a task (open loop: sends never wait for
responses). Each request's body (its prompt text, JSON-encoded) is built ahead
of its target, as benchmark tools sample and tokenize their dataset before the
clock starts: :meth:`LoadGenerator.run` builds the bodies of the first requests
before the run's clock starts, as many as *prepare_bytes* holds, and while the
run goes on it builds those next in line whenever the next target leaves time,
so the prompts cost nothing between a target and its send (the same bodies as
built at the send, hence the same bytes on the wire and the same rows).
With ``concurrency=N`` the dispatcher first waits for one of the N slots, so
requests queue in FIFO order and their schedule delay includes the queueing. The run summary reports requested vs achieved send rate and the
schedule delay; when the median client lag (dispatch time - target) exceeds
``lag_threshold_s`` (10 ms) it sets ``lagging`` and warns with
:class:`ScheduleLagWarning`; when the generator itself could not keep the schedule
(the p99 above the threshold, the achieved rate short of the requested one, or requests
that failed for want of the client's own open files or ports: :func:`saturation`) it sets
``saturated`` with the reason. To send from several
processes, see :mod:`simpy_llm.observe.workers`.

Stopping: :meth:`LoadGenerator.stop` (e.g. from a SIGINT handler installed with
``loop.add_signal_handler(signal.SIGINT, gen.stop)``) or cancelling the task
running :meth:`LoadGenerator.run` cancels the in-flight requests and writes
every unfinished request as ``cancelled``; ``stop`` makes ``run`` return its
summary, cancellation re-raises after the rows are written.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import statistics
import time
import warnings
from collections.abc import Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.observe.ahead import Lookahead
from simpy_llm.observe.client import OPEN_AHEAD, ObservedRequest, OpenAIClient, RequestSpec, raise_open_files_limit
from simpy_llm.observe.collector import young_collections_only
from simpy_llm.observe.progress import LiveStats

# prefix_text and synthetic_prompt live in prompts; they are still importable from here.
from simpy_llm.observe.prompts import (
    DatasetPrompts,
    PromptSource,
    SyntheticPrompts,
    approx_prompt_tokens,
    prefix_text,
    synthetic_prompt,
)
from simpy_llm.observe.report import latency_report

# RATE_SHORTFALL and saturation live in saturation; they are still importable from here.
from simpy_llm.observe.saturation import RATE_SHORTFALL, behind, client_limited, quantile, saturation, send_rate
from simpy_llm.workload.traces import OBSERVED_COLUMNS

if TYPE_CHECKING:
    from simpy_llm.observe.lean import _Exchange
    from simpy_llm.observe.sessions import Conversations, ToolCall

__all__ = [
    "OBSERVER_COLUMNS",
    "PREPARE_BYTES",
    "RATE_SHORTFALL",
    "LoadGenerator",
    "LoadRequest",
    "RunSummary",
    "ScheduleLagWarning",
    "load_requests",
    "prefix_text",
    "record_row",
    "run_statistics",
    "saturation",
    "summarize_run",
    "synthetic_prompt",
]

OBSERVER_COLUMNS: tuple[str, ...] = tuple(OBSERVED_COLUMNS)
"""Extra trace columns the observer fills (declare them with ``TraceV2Writer(..., extra_columns=OBSERVER_COLUMNS)``;
a writer without them gets the trace v2 columns only). ``approx_input_tokens`` is the prompt
sent, measured by the prompt source's token rule (:mod:`simpy_llm.observe.prompts`)."""

_EXACT_SOURCES = (SyntheticPrompts, DatasetPrompts)
"""Prompt sources whose ``text(n)`` and ``prefix(group, n)`` measure exactly ``max(n, 1)`` tokens
by their own rule (as their tests check): the length of what they give is known without counting."""

PREPARE_BYTES = 256 * 2**20
"""The default of :class:`LoadGenerator`'s *prepare_bytes*: request bodies built ahead of their
targets held at once by a sending process (about 5.6 kB per request of a 1,000-word synthetic
prompt: ~48,000 requests)."""

TIMER_STEP_S = 0.001
"""The shortest wait for a target: the event loops' timer step (uvloop counts whole milliseconds,
and asyncio rounds its waits up to them). A target closer than this is sent up to a step late
rather than waited for by going round the loop until it is due: that spin took CPU the workers
and a server on the same machine could have used."""

_PASSTHROUGH = ("client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group", "reason_ratio")


@attrs.frozen
class LoadRequest:
    """One request to send: target time (seconds from the run start) and lengths."""

    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    streaming: bool = True
    fields: dict[str, Any] = attrs.field(factory=dict)
    """Trace v2 identity columns carried to the row (client_id, tenant_id, slo_class, ...)."""


def load_requests(requests: Any) -> list[LoadRequest]:
    """Requests from a DataFrame or an iterable of mappings (``arrival_time_s`` or ``arrival_s``,
    ``input_tokens``, ``output_tokens``; optional ``request_id``, ``streaming`` and identity
    columns), sorted by target time (stable).

    >>> [r.request_id for r in load_requests([{"arrival_time_s": 1, "input_tokens": 2, "output_tokens": 3},
    ...                                       {"arrival_time_s": 0, "input_tokens": 2, "output_tokens": 3}])]
    [1, 0]
    """
    if hasattr(requests, "to_dict") and hasattr(requests, "columns"):
        rows: Iterable[Mapping[str, Any] | LoadRequest] = requests.to_dict("records")
    else:
        rows = requests
    out: list[LoadRequest] = []
    for i, row in enumerate(rows):
        if isinstance(row, LoadRequest):
            out.append(row)
            continue
        t = row["arrival_time_s"] if "arrival_time_s" in row else row["arrival_s"]
        fields = {k: row[k] for k in _PASSTHROUGH if k in row and row[k] is not None}
        out.append(
            LoadRequest(
                request_id=int(row.get("request_id", i)),
                arrival_s=float(t),
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                streaming=bool(row.get("streaming", True)),
                fields=fields,
            )
        )
    return sorted(out, key=lambda r: r.arrival_s)


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


def _us(t: float | None) -> int | None:
    return None if t is None else round(t * 1e6)


def record_row(req: LoadRequest, rec: ObservedRequest, columns: Iterable[str] | None = None) -> dict[str, Any]:
    """The trace v2 row of *req* measured as *rec* (restricted to *columns* when given).

    ``arrival_time_us`` is the target time; ``input_tokens`` / ``output_tokens`` are the
    server's ``usage`` counts when it gave them, else the requested lengths (see
    ``*_tokens_source``); ``first_chunk_time_us`` is the first data event (any
    kind), ``first_token_time_us`` the first with content; ``num_chunks`` counts
    data events. Errors keep the HTTP status in ``http_status``.
    """
    row: dict[str, Any] = {
        "request_id": req.request_id,
        **req.fields,
        "streaming": req.streaming,
        "input_tokens": rec.prompt_tokens if rec.prompt_tokens_source == "usage" else req.input_tokens,
        "output_tokens": rec.completion_tokens if rec.completion_tokens_source == "usage" else req.output_tokens,
        "arrival_time_us": _us(req.arrival_s),
        "send_time_us": _us(rec.sent_s),
        "first_chunk_time_us": _us(rec.first_chunk_s),
        "last_chunk_time_us": _us(rec.last_chunk_s),
        "num_chunks": len(rec.chunk_times_s) if rec.sent_s is not None else None,
        "status": rec.status,
        "error_message": rec.error_message,
        "requested_input_tokens": req.input_tokens,
        "requested_output_tokens": req.output_tokens,
        "prompt_tokens_source": rec.prompt_tokens_source,
        "completion_tokens_source": rec.completion_tokens_source,
        "http_status": rec.http_status,
        "attempts": rec.attempts,
        "first_byte_time_us": _us(rec.first_byte_s),
        "first_token_time_us": _us(rec.first_content_s),
        "done_time_us": _us(rec.done_s),
        "approx_input_tokens": rec.approx_prompt_tokens,
        "cached_tokens": rec.cached_tokens,
        # rec.itl_s's gaps, each as _us gives it (a list made at once: no generator per row).
        "itl_us": " ".join([str(round((b - a) * 1e6)) for a, b in itertools.pairwise(rec.content_times_s)]),
    }
    if columns is not None:
        # A frozenset (a generator's writer's columns, made once) is used as it is; the copy is
        # made only when some key is not kept, which for a writer of the observer's columns is never.
        keep = columns if isinstance(columns, frozenset) else frozenset(columns)
        if not keep.issuperset(row):
            row = {k: v for k, v in row.items() if k in keep}
    return row


class ScheduleLagWarning(UserWarning):
    """The load generator could not send at the target times (median lag above the threshold)."""


@attrs.frozen
class RunSummary:
    """Outcome of a run. Rates are sends per second between the first and last send
    (requested: between the first and last target); ``None`` with fewer than two.
    ``schedule_delay_*`` are over ``sent - target``; ``lag_p50_s`` over
    ``dispatch - target`` (client lag, without concurrency-limit waits), the
    quantity compared with ``lag_threshold_s`` to set ``lagging``. ``latency_s`` and
    ``latency_s_by_client`` are the client-side latencies of the answered requests
    (see docs/observe.md)."""

    n_requests: int
    n_sent: int
    status_counts: dict[str, int]
    requested_rate: float | None
    achieved_rate: float | None
    schedule_delay_p50_s: float | None
    schedule_delay_p99_s: float | None
    schedule_delay_max_s: float | None
    lag_p50_s: float | None
    lag_threshold_s: float
    lagging: bool
    stopped: bool
    duration_s: float
    latency_s: dict[str, Any] = attrs.field(factory=dict)
    """TTFT, TPOT, ITL and E2E statistics over the whole run (:func:`~simpy_llm.observe.report.latency_report`)."""
    latency_s_by_client: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """The same per ``client_id``."""
    lag_p99_s: float | None = None
    """The 99th percentile of the client lag (``dispatch - target``)."""
    saturated: bool = False
    """The load generator itself could not keep the schedule (:func:`saturation`)."""
    saturation_reason: str | None = None
    """Why :attr:`saturated` is set (``None`` when it is not)."""
    connection_waits: int = 0
    """Requests that waited for one of the client's connections (its *max_connections* all busy);
    those that waited longer than ``lag_threshold_s`` set :attr:`saturated`."""
    connection_wait_max_s: float | None = None
    """The longest such wait (``None``: no request waited)."""
    late: int = 0
    """Requests sent more than ``lag_threshold_s`` after their targets (under a concurrency limit:
    dispatched, the client lag; :func:`~simpy_llm.observe.saturation.behind`)."""
    late_spans_s: tuple[tuple[float, float], ...] = ()
    """When: the spans of their targets (first, last; seconds from the run start), late requests
    less than :data:`~simpy_llm.observe.saturation.SPAN_GAP_S` apart in one span."""


def summarize_run(
    requests: Iterable[LoadRequest],
    records: Mapping[int, ObservedRequest],
    *,
    lag_threshold_s: float,
    stopped: bool,
    limited: bool = False,
) -> RunSummary:
    """The :class:`RunSummary` of *requests* measured as *records* (by request id).

    *limited*: the run had a concurrency limit (see :func:`saturation`).

    >>> s = summarize_run([LoadRequest(0, 0.0, 8, 2)], {}, lag_threshold_s=0.01, stopped=False)
    >>> (s.n_requests, s.n_sent, s.saturated)
    (1, 0, False)
    """
    requests = list(requests)
    recs = [records[r.request_id] for r in requests if r.request_id in records]
    sent = [r for r in recs if r.sent_s is not None]
    delays = [r.schedule_delay_s for r in sent if r.schedule_delay_s is not None]
    lags = [r.dispatched_s - r.scheduled_s for r in recs if r.dispatched_s is not None and r.scheduled_s is not None]
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    lag50 = statistics.median(lags) if lags else None
    done = [r.done_s for r in recs if r.done_s is not None]
    clients = {r.request_id: str(r.fields["client_id"]) for r in requests if "client_id" in r.fields}
    latency = latency_report(recs, clients)
    requested_rate = send_rate([r.arrival_s for r in requests])
    achieved_rate = send_rate([r.sent_s for r in sent if r.sent_s is not None])
    delay_p99 = quantile(delays, 0.99)
    lag_p99 = quantile(lags, 0.99)
    late, spans = behind(recs, lag_threshold_s, limited=limited)
    out_of_resources = [r.error_message for r in recs if r.status == "error" and client_limited(r.error_message)]
    waits = [r.connection_wait_s for r in recs if r.connection_wait_s > 0]
    reason = saturation(
        delay_p99_s=delay_p99,
        lag_p99_s=lag_p99,
        requested_rate=requested_rate,
        achieved_rate=achieved_rate,
        threshold_s=lag_threshold_s,
        limited=limited,
        client_limit_errors=len(out_of_resources),
        client_limit_message=out_of_resources[0] if out_of_resources else None,
        connection_waits=sum(1 for w in waits if w > lag_threshold_s),
        late=late,
        late_spans_s=spans,
    )
    return RunSummary(
        n_requests=len(requests),
        n_sent=len(sent),
        status_counts=counts,
        requested_rate=requested_rate,
        achieved_rate=achieved_rate,
        schedule_delay_p50_s=statistics.median(delays) if delays else None,
        schedule_delay_p99_s=delay_p99,
        schedule_delay_max_s=max(delays) if delays else None,
        lag_p50_s=lag50,
        lag_threshold_s=lag_threshold_s,
        lagging=lag50 is not None and lag50 > lag_threshold_s,
        stopped=stopped,
        duration_s=max(done) if done else 0.0,
        latency_s=latency["latency_s"],
        latency_s_by_client=latency["latency_s_by_client"],
        lag_p99_s=lag_p99,
        saturated=reason is not None,
        saturation_reason=reason,
        connection_waits=len(waits),
        connection_wait_max_s=max(waits) if waits else None,
        late=late,
        late_spans_s=spans,
    )


def run_statistics(summary: RunSummary, *, concurrency: int | None, workers: int = 1) -> dict[str, Any]:
    """The trace header's ``load_generator`` block of a run summarized as *summary*
    (see :meth:`LoadGenerator.statistics`)."""
    s = summary
    return {
        "requests": s.n_requests,
        "sent": s.n_sent,
        "requested_rate": s.requested_rate,
        "achieved_rate": s.achieved_rate,
        "schedule_delay_p50_s": s.schedule_delay_p50_s,
        "schedule_delay_p99_s": s.schedule_delay_p99_s,
        "schedule_delay_max_s": s.schedule_delay_max_s,
        "lag_p50_s": s.lag_p50_s,
        "lag_p99_s": s.lag_p99_s,
        "lag_threshold_s": s.lag_threshold_s,
        "lagging": s.lagging,
        "saturated": s.saturated,
        "saturation_reason": s.saturation_reason,
        "connection_waits": s.connection_waits,
        "connection_wait_max_s": s.connection_wait_max_s,
        "late": s.late,
        "late_spans_s": [list(span) for span in s.late_spans_s],
        "concurrency": concurrency,
        "workers": workers,
        "stopped": s.stopped,
    }


class LoadGenerator:
    """Sends *requests* through *client* at their target times and writes rows to *writer*.

    Parameters
    ----------
    client
        An open :class:`OpenAIClient`; its ``run_start`` is reset when :meth:`run` starts,
        so targets and every recorded time are seconds from then.
    requests
        Anything :func:`load_requests` takes.
    writer
        A ``TraceV2Writer`` (or ``None``); columns it lacks are left out of the rows.
    endpoint, stream
        ``"chat"`` or ``"completions"``; ``stream=None`` follows each request's ``streaming``.
    concurrency
        At most this many requests in flight (FIFO queue); ``None`` = open loop.
    ignore_eos
        Send ``ignore_eos: true`` so the server generates exactly ``max_tokens`` = ``output_tokens``.
    extra_body
        Added to every request body.
    lag_threshold_s
        Median client lag above which the run is flagged ``lagging`` and warned about.
    prefixes
        Shared-prefix length (tokens) per ``prefix_group``: a request of a listed group is sent
        as a ``system`` message with the group's prefix from *prompts* (:func:`prefix_text`
        for synthetic prompts: the same for the whole group) and a
        ``user`` message with the rest of its prompt (one prompt, in that order, for the
        completions API). ``observe`` fills it from the workload's clients.
    conversations
        Closed-loop sessions (:class:`~simpy_llm.observe.sessions.Conversations`): a session's
        requests send the conversation so far, and each finished request may release any
        number of later calls: requests (sent at the end of what released them plus their
        delay), which join :attr:`requests`, and tool calls, slept through as tasks of the run.
    prompts
        Where prompt text comes from (:mod:`simpy_llm.observe.prompts`; default
        :class:`~simpy_llm.observe.prompts.SyntheticPrompts`). Each record's
        ``approx_prompt_tokens`` is what was sent, measured by its token rule.
    run_start
        The ``time.perf_counter()`` value that targets count from (default: when :meth:`run`
        starts sending). Worker processes of one run share it
        (:mod:`simpy_llm.observe.workers`); a value in the future delays the first sends.
    prepare_bytes
        Bytes of request bodies built ahead of their targets that the generator holds at once,
        the prompt texts they were made from counted too (:meth:`prepare`; default
        :data:`PREPARE_BYTES`). The run builds as many as fit before its clock starts, then
        keeps the window full while it sends, in the time before each target; a run whose
        bodies all fit builds every one before its clock starts. ``0``: each body is built
        just before its target, one at a time. Closed-loop sessions (*conversations*) are
        built that way always: a round's body holds the answers before it.

    :attr:`live` counts requests as they start and end (for a progress display).
    """

    def __init__(
        self,
        client: OpenAIClient,
        requests: Any,
        writer: Any = None,
        *,
        endpoint: str = "chat",
        stream: bool | None = None,
        model: str | None = None,
        concurrency: int | None = None,
        ignore_eos: bool = True,
        extra_body: dict[str, Any] | None = None,
        lag_threshold_s: float = 0.010,
        prefixes: Mapping[str, int] | None = None,
        conversations: Conversations | None = None,
        prompts: PromptSource | None = None,
        run_start: float | None = None,
        prepare_bytes: int = PREPARE_BYTES,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 or None, got {concurrency}")
        if prepare_bytes < 0:
            raise ValueError(f"prepare_bytes must be >= 0, got {prepare_bytes}")
        raise_open_files_limit(concurrency)
        self.client = client
        self.requests = load_requests(requests)
        self.writer = writer
        self.endpoint = endpoint
        self.stream = stream
        self.model = model
        self.concurrency = concurrency
        self.extra_body = {**({"ignore_eos": True} if ignore_eos else {}), **(extra_body or {})}
        self.lag_threshold_s = lag_threshold_s
        self.conversations = conversations
        self.prefixes = dict(prefixes or {})
        self.prompts: PromptSource = prompts if prompts is not None else SyntheticPrompts()
        # The exact class: a subclass may give text of another length than it was asked for.
        self._lengths_known = type(self.prompts) in _EXACT_SOURCES
        self._prefix_texts: dict[tuple[str, int], str] = {}  # a group's text, the same for each of its requests
        self.run_start = run_start
        self.live = LiveStats()
        self.records: dict[int, ObservedRequest] = {}
        self.summary: RunSummary | None = None
        self._written: set[int] = set()
        self._stop = asyncio.Event()
        self._waker: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started: dict[int, _Exchange] = {}  # requests started without a task, until they end
        self._drained: asyncio.Future[None] | None = None  # woken when the last of them ended
        self._slots: asyncio.Semaphore | None = None
        self._columns = frozenset(writer.columns) if writer is not None and hasattr(writer, "columns") else None
        self.prepare_bytes = prepare_bytes
        self._ahead: Lookahead[LoadRequest] | None = None  # made by the first prepare()

    def statistics(self) -> dict[str, Any]:
        """How the run kept its schedule, as plain data: the trace header's ``load_generator``
        block (``observe`` writes it at the end of the run, adding ``measured_rtt_ms``).

        Keys: ``requests`` and ``sent`` (counts), ``requested_rate`` and ``achieved_rate``
        (sends per second between the first and last target / send; ``None`` with fewer
        than two), ``schedule_delay_p50_s``, ``schedule_delay_p99_s`` and
        ``schedule_delay_max_s`` (send - target, concurrency-limit waits included),
        ``lag_p50_s`` and ``lag_p99_s`` (dispatch - target), ``lag_threshold_s`` and
        ``lagging`` (the median lag exceeded it), ``saturated`` and ``saturation_reason``
        (the generator itself could not keep the schedule: :func:`saturation`),
        ``connection_waits`` and ``connection_wait_max_s`` (requests that waited for one of the
        client's connections, its ``max_connections`` all busy, and the longest wait), ``late``
        and ``late_spans_s`` (requests sent over ``lag_threshold_s`` late, and when: their targets' spans),
        ``concurrency`` (the limit; ``None``: open loop), ``workers`` (1 here; see
        :mod:`simpy_llm.observe.workers`) and ``stopped``.

        Raises
        ------
        RuntimeError
            :meth:`run` has not finished.
        """
        if self.summary is None:
            raise RuntimeError("the load generator has not run: no statistics yet")
        return run_statistics(self.summary, concurrency=self.concurrency)

    def stop(self) -> None:
        """Ask the run to stop now: unfinished requests are cancelled and written as ``cancelled``."""
        self._stop.set()
        if self._waker is not None and not self._waker.done():
            self._waker.set_result(None)  # wake the dispatcher from its sleep

    def spec(self, req: LoadRequest) -> RequestSpec:
        """The request body spec of *req*: its own text from :attr:`prompts` (after its group's
        shared prefix, see *prefixes*), or, for a session round, the conversation so far
        (:attr:`conversations`)."""
        return self._build(req)[0]

    def _build(self, req: LoadRequest) -> tuple[RequestSpec, int | None]:
        """:meth:`spec`, and the prompt's length by the source's rule when known without counting."""
        messages = self.conversations.messages(req) if self.conversations is not None else None
        prompt: str | list[dict[str, str]]
        length = None
        if messages is not None:
            prompt = messages
        else:
            group = str(req.fields.get("prefix_group", ""))
            shared = min(self.prefixes.get(group, 0), req.input_tokens - 1) if group else 0
            n_own = req.input_tokens - max(shared, 0)
            own = self.prompts.text(n_own, req.request_id)
            if shared > 0:
                key = (group, shared)
                prefix = self._prefix_texts.get(key)
                if prefix is None:
                    prefix = self._prefix_texts[key] = self.prompts.prefix(group, shared)
                prompt = [{"role": "system", "content": prefix}, {"role": "user", "content": own}]
            else:
                prompt = own
            if self._lengths_known:
                length = max(int(n_own), 1) + max(shared, 0)
        spec = RequestSpec(
            prompt=prompt,
            max_tokens=max(req.output_tokens, 1),
            endpoint=self.endpoint,
            stream=req.streaming if self.stream is None else self.stream,
            model=self.model,
            request_id=req.request_id,
            extra_body=dict(self.extra_body),
            keep_text=messages is not None,
        )
        return spec, length

    def _spec(self, req: LoadRequest, rec: ObservedRequest) -> RequestSpec:
        spec, rec.approx_prompt_tokens = self._made(req)
        return spec

    def _made(self, req: LoadRequest) -> tuple[RequestSpec, int]:
        """*req*'s spec and the length of its prompt by the source's rule (``approx_prompt_tokens``)."""
        if type(self).spec is LoadGenerator.spec:
            spec, length = self._build(req)
        else:  # a subclass shapes the body (spec() is its seam): its prompt is counted as sent
            spec, length = self.spec(req), None
        return spec, length if length is not None else approx_prompt_tokens(self.prompts, spec.prompt)

    def prepare(self) -> int:
        """Build the bodies of the requests next in line, in target order, until the window holds
        *prepare_bytes* (or every request is built); returns how many requests it holds.

        :meth:`run` calls it before its clock starts; call it earlier to build them sooner
        (a worker process does, before it reports ready). It builds nothing while the model is
        unknown (``model=None`` and :meth:`run` not started: the body names the model), with
        ``prepare_bytes=0``, or for closed-loop sessions. The requests are taken as they stand
        at the first call: one added to :attr:`requests` after it is built when it is due.
        """
        if not self._can_prepare():
            return 0
        if self._ahead is None:
            self._ahead = Lookahead(tuple(self.requests), self.prepare_bytes, self._made, self.client.encode)
        return self._ahead.fill()

    def _can_prepare(self) -> bool:
        return self.prepare_bytes > 0 and self.conversations is None and self.model is not None

    def _finish(self, req: LoadRequest, rec: ObservedRequest) -> None:
        if req.request_id in self._written:
            return
        self._written.add(req.request_id)
        if rec.status not in ("ok", "error", "timeout", "cancelled"):
            rec.status, rec.error_message = "cancelled", rec.error_message or "not completed"
        self.live.end(rec)
        if self.writer is not None:
            self.writer.write_row(record_row(req, rec, self._columns))

    async def _one(
        self,
        req: LoadRequest,
        rec: ObservedRequest,
        slots: asyncio.Semaphore | None,
        spec: RequestSpec,
        body: bytes | None = None,
    ) -> None:
        self.live.sent += 1
        try:
            await self.client.send(spec, rec, body=body)
        finally:
            if slots is not None:
                slots.release()
            self._finish(req, rec)
        if self.conversations is not None and not self._stop.is_set():
            self._follow_ups(self.conversations.after(req, rec, rec.output_text or ""))

    def _follow_ups(self, made: Iterable[LoadRequest | ToolCall]) -> None:
        """Start what a session made: requests (each sent at its target: the end of what released
        it plus its delay) and tool calls (slept through, then what they release is started)."""
        for item in made:
            if isinstance(item, LoadRequest):
                self._start_follow_up(item)
            else:
                self._track(self._tool(item))

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run *coro* as a task of the run (stop() cancels it; the run waits for it)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_follow_up(self, req: LoadRequest) -> None:
        """Send session call *req* at its target (the end of what released it plus its delay)."""
        self.requests.append(req)
        rec = self.records[req.request_id] = ObservedRequest(request_id=req.request_id, scheduled_s=req.arrival_s)
        self._track(self._follow_up(req, rec))

    async def _tool(self, tool: ToolCall) -> None:
        """A session's tool call: no request, a sleep of its latency; then what it releases."""
        conversations = self.conversations
        assert conversations is not None
        start_s, running_s = await conversations.wait_tool(tool, self.client.now)
        if not self._stop.is_set():
            self._follow_ups(conversations.tool_returned(tool, start_s, running_s, self.client.now()))

    async def _follow_up(self, req: LoadRequest, rec: ObservedRequest) -> None:
        spec = self._spec(req, rec)
        try:
            # Plain sleeps: many rounds may wait at once; stop() cancels them via the task set.
            await asyncio.sleep(max(req.arrival_s - self.client.now(), 0.0))
            rec.dispatched_s = self.client.now()
            if self._slots is not None:
                await self._slots.acquire()
        except asyncio.CancelledError:
            rec.status, rec.error_message = "cancelled", "run stopped before the request was sent"
            self._finish(req, rec)
            raise
        await self._one(req, rec, self._slots, spec)

    async def run(self) -> RunSummary:
        """Run the whole workload; returns (and stores in :attr:`summary`) the :class:`RunSummary`.

        Before its clock starts it builds the bodies ahead (:meth:`prepare`) and has the client
        open connections (:data:`~simpy_llm.observe.client.OPEN_AHEAD`). While it runs, the collector
        runs young collections on a clock only (:func:`~simpy_llm.observe.collector.young_collections_only`),
        unless the program froze objects itself or disabled the collector.
        """
        if self.model is None:
            self.model = await self.client.default_model()
        self.prepare()  # before the clock starts (and before the freeze below, which then keeps them)
        await self.client.open_connections(min(OPEN_AHEAD, len(self.requests), self.concurrency or OPEN_AHEAD))
        # A full collection walks every object of the oldest generation while the event loop
        # waits: the imports' ~10^5 objects (40-60 ms on a small machine), then the records the
        # run keeps, more with every second (a sustained run at 5,000/s: 24 to 208 ms each).
        # The sends due meanwhile were held back: they were the schedule delay's p99 and max.
        with young_collections_only():
            self.summary = await self._dispatch()
        lag = self.summary.lag_p50_s
        if self.summary.lagging and lag is not None:  # lagging implies a measured lag
            warnings.warn(
                f"median schedule lag {lag * 1e3:.1f} ms exceeds "
                f"{self.lag_threshold_s * 1e3:.1f} ms: the client could not keep the requested rate",
                ScheduleLagWarning,
                stacklevel=2,
            )
        return self.summary

    async def _sleep(self, delay: float) -> None:
        """Sleep *delay* seconds or until :meth:`stop` is called, whichever comes first."""
        # A bare future woken by a timer (or by stop()) costs about half of
        # asyncio.wait({stopper}, timeout=...), which the dispatcher would pay per request.
        waker = self._waker = asyncio.get_running_loop().create_future()
        timer = waker.get_loop().call_later(delay, _wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
            self._waker = None

    async def _dispatch(self) -> RunSummary:
        client = self.client
        client.run_start = time.perf_counter() if self.run_start is None else self.run_start
        slots = self._slots = asyncio.Semaphore(self.concurrency) if self.concurrency else None
        tasks = self._tasks
        stopper = asyncio.ensure_future(self._stop.wait())
        acquire: asyncio.Future[Any] | None = None
        order = tuple(self.requests)  # session follow-ups join self.requests as they come
        ahead = self._ahead if self._can_prepare() else None
        # Requests started without a task (client.start), by id, until they end: open loop only
        # (a concurrency slot or a session's next round waits in a task).
        fast = slots is None and self.conversations is None
        started = self._started
        if ahead is not None and not ahead.same_order(order):  # the requests changed since prepare()
            ahead = self._ahead = Lookahead(order, self.prepare_bytes, self._made, self.client.encode)
        try:
            for position, req in enumerate(order):
                if self._stop.is_set():
                    break
                rec = self.records[req.request_id] = ObservedRequest(request_id=req.request_id, scheduled_s=req.arrival_s)
                built = ahead.take(position) if ahead is not None else None
                if built is None:
                    if req.arrival_s > client.now():
                        # Time to spare: first let the request just started reach its send,
                        # so that building this one's prompt does not delay it.
                        await asyncio.sleep(0)
                    # Built before the sleep, not in the request's task: nothing between target and send.
                    spec, body = self._spec(req, rec), None
                    if ahead is not None:  # the window ran dry: refill it if the target leaves time
                        ahead.top_up(client.now, req.arrival_s)
                else:
                    spec, body, rec.approx_prompt_tokens = built
                    if ahead is not None and ahead.room() and req.arrival_s > client.now():
                        await asyncio.sleep(0)  # as above (the wait below would yield anyway)
                        ahead.top_up(client.now, req.arrival_s)
                if self.conversations is not None:  # a session's root with fan_out: its other instances
                    self._follow_ups(self.conversations.siblings(req))
                while (delay := req.arrival_s - client.now()) > 0 and not self._stop.is_set():
                    # Not less than a timer step: uvloop fired a shorter timer at once, and the wait
                    # spun round the loop (~20 times per request at 2,000/s; see TIMER_STEP_S).
                    await self._sleep(max(delay, TIMER_STEP_S))
                if self._stop.is_set():
                    break
                rec.dispatched_s = client.now()
                if slots is not None:
                    acquire = asyncio.ensure_future(slots.acquire())
                    await asyncio.wait({acquire, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if not acquire.done():
                        acquire.cancel()
                        break
                if fast and body is not None:
                    # No task: the client writes it now (or on the first connection free) and calls
                    # back when it ended; else (a retry policy, aiohttp, the cap's slots all taken) a task.
                    handle = client.start(spec, rec, body, functools.partial(self._ended, req, rec))
                    if handle is not None:
                        self.live.sent += 1
                        if not handle.ended:
                            started[req.request_id] = handle
                        continue
                task = asyncio.create_task(self._one(req, rec, slots, spec, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while (tasks or started) and not stopper.done():
                waits: set[asyncio.Future[Any]] = {*tasks, stopper}
                if started:
                    self._drained = asyncio.get_running_loop().create_future()
                    waits.add(self._drained)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._shutdown(tasks)
            self.summary = self._summarize()
            raise
        finally:
            stopper.cancel()
            if acquire is not None and not acquire.done():
                acquire.cancel()
        await self._shutdown(tasks)
        return self._summarize()

    def _ended(self, req: LoadRequest, rec: ObservedRequest) -> None:
        """A request started without a task ended: its row, and the dispatcher woken when it was the last."""
        self._started.pop(req.request_id, None)
        self._finish(req, rec)
        if not self._started and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _shutdown(self, tasks: set[asyncio.Task[None]]) -> None:
        """Cancel in-flight requests, wait for their rows, then write never-sent requests as cancelled."""
        for handle in list(self._started.values()):
            self.client.abort(handle)  # its row is written by _ended
        pending = list(tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for req in self.requests:
            rec = self.records.get(req.request_id)
            if rec is None:
                rec = self.records[req.request_id] = ObservedRequest(request_id=req.request_id, scheduled_s=req.arrival_s)
            if req.request_id not in self._written:
                rec.status, rec.error_message = "cancelled", "run stopped before the request was sent"
                self._finish(req, rec)
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()

    def _summarize(self) -> RunSummary:
        return summarize_run(
            self.requests,
            self.records,
            lag_threshold_s=self.lag_threshold_s,
            stopped=self._stop.is_set(),
            limited=self.concurrency is not None,
        )
