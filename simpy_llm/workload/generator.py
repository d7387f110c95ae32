"""The workload generator: every source's arrivals merged into one Wire, each put at its time.

A *source* is an endless (or finite) iterator of rows ``(arrival_s, prompt_tokens,
output_tokens, extra)`` in time order, plus the request fields shared by all its
rows (``base``); ``extra`` is ``None`` or a dict of per-request fields. Synthetic
clients (:class:`ClientSource`) draw arrival times and lengths in vectors
(chunks of :data:`CHUNK`) from their own named random streams
(``workload/<client>/arrival|input|output|mix``, and ``priority`` for a priority
drawn per request), so a client's requests do not depend on the other clients. Trace replays are sources too. The generator
merges the sources by time, numbers requests in arrival order from the
simulation's id counter, and puts each into its output Wire at its arrival time.

A distribution that draws NaN or an infinity raises
:class:`~simpy_llm.workload.distributions.SamplingError`;
:func:`sampling_scenario_error` turns it into the
:class:`~simpy_llm.config.ScenarioError` naming the distribution's key path.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import numpy as np
import simpy

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.schema import WorkloadConfig
from simpy_llm.config.validators import MAX_ITEMS_PER_REQUEST, MAX_PRIORITY
from simpy_llm.entities import Request
from simpy_llm.kernel import URGENT, Later
from simpy_llm.wire import Wire
from simpy_llm.workload.distributions import Draws, SamplingError, draw_tokens, to_tokens
from simpy_llm.workload.prefix import PREFIX_BLOCK_TOKENS, prefix_blocks
from simpy_llm.workload.workflows import Workflow

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.config.schema import ClientConfig, LifecycleConfig, MultimodalConfig, Scenario, WorkloadConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.rng import RandomStreams
    from simpy_llm.workload.distributions import LengthDistribution

__all__ = [
    "CHUNK",
    "ClientSource",
    "Row",
    "WorkloadGenerator",
    "client_arrivals",
    "make_request",
    "merge_sources",
    "sampling_scenario_error",
    "to_counts",
    "to_priorities",
]

CHUNK = 4096
"""Requests drawn per vector draw and client."""
DRAW_CHUNK = 256
"""Values drawn per vector draw of :meth:`ClientSource.draw` (a workflow step's lengths, a tool's latency)."""

Row = tuple[float, int, int, "dict[str, Any] | None"]
"""(arrival_s, prompt_tokens, output_tokens, extra request fields or None)."""


def to_counts(values: np.ndarray, distribution: object = None) -> np.ndarray:
    """Round sampled item counts to whole numbers in [0, MAX_ITEMS_PER_REQUEST].

    Counts above :data:`~simpy_llm.config.validators.MAX_ITEMS_PER_REQUEST` are
    clamped to it, as :func:`~simpy_llm.workload.distributions.to_tokens` clamps
    lengths; NaN or an infinity raises
    :class:`~simpy_llm.workload.distributions.SamplingError`.

    >>> to_counts(np.array([-0.4, 0.4, 2.6, 1e9])).tolist()
    [0, 0, 3, 4096]
    """
    values = np.asarray(values, dtype=float)
    if not np.isfinite(values).all():
        to_tokens(values, distribution)  # raises the SamplingError naming the draw
    return np.clip(np.rint(values), 0, MAX_ITEMS_PER_REQUEST).astype(np.int64)


def to_priorities(values: np.ndarray, distribution: object = None) -> np.ndarray:
    """Round sampled priorities half to even to whole numbers in [-MAX_PRIORITY, MAX_PRIORITY].

    Zero and negative values are kept (a priority may be any integer in range); values
    beyond the range are clamped to it. NaN or an infinity raises
    :class:`~simpy_llm.workload.distributions.SamplingError`.

    >>> to_priorities(np.array([-1.6, -0.5, 0.5, 1.5, 2.4, 1e12])).tolist()
    [-2, 0, 0, 2, 2, 2147483647]
    """
    values = np.asarray(values, dtype=float)
    if not np.isfinite(values).all():
        to_tokens(values, distribution)  # raises the SamplingError naming the draw
    return np.clip(np.rint(values), -MAX_PRIORITY, MAX_PRIORITY).astype(np.int64)


def warp_to_windows(active_times: np.ndarray, lifecycle: LifecycleConfig) -> np.ndarray:
    """Map times on the client's *active* clock onto the simulation clock.

    Active time runs only inside the lifecycle windows; times past the last
    window map to ``inf`` (the client is done).

    >>> from simpy_llm.config.schema import ActiveWindow, LifecycleConfig
    >>> lc = LifecycleConfig(windows=(ActiveWindow(start_s=10, end_s=20), ActiveWindow(start_s=50, end_s=60)))
    >>> warp_to_windows(np.array([0.0, 5.0, 12.0, 25.0]), lc).tolist()
    [10.0, 15.0, 52.0, inf]
    """
    starts = np.array([w.start_s for w in lifecycle.windows])
    lengths = np.array([w.end_s - w.start_s for w in lifecycle.windows])
    ends = np.cumsum(lengths)
    idx = np.searchsorted(ends, active_times, side="right")
    inside = idx < len(starts)
    clipped = np.minimum(idx, len(starts) - 1)
    offset = active_times - (ends[clipped] - lengths[clipped])
    return np.where(inside, starts[clipped] + offset, np.inf)


class ClientSource:
    """Rows of one synthetic client at *rate* requests/s.

    Parameters
    ----------
    client
        The client's config.
    rate
        Its mean rate (while active), requests/s.
    streams
        Random streams (the client's are named after its id).
    seed
        Workload seed (prefix-block hashes depend on it).
    """

    def __init__(self, client: ClientConfig, rate: float, streams: RandomStreams, seed: int) -> None:
        self.client = client
        self.rate = rate
        self._streams = streams
        prefix = client.prefix_length if client.prefix_group else 0
        self.prefix_tokens = prefix
        self.base: dict[str, Any] = {
            "client_id": client.id,
            "tenant_id": client.tenant_id or client.id,
            "slo_class": client.slo_class,
            "streaming": client.streaming >= 0.5,
        }
        self.workflow = Workflow.of_client(client)
        """The workflow its sessions run (None: its requests are single)."""
        root = client.agentic.root if client.agentic is not None else None
        # The config's fields hold what the loader built: registered length distributions, given
        # (the client's own; an agentic client's root step is an llm_call, which has both).
        self.input_distribution = cast("LengthDistribution", root.input_distribution if root is not None else client.input_distribution)
        """Prompt lengths of its arrivals (an agentic client's: its root step's)."""
        self.output_distribution = cast("LengthDistribution", root.output_distribution if root is not None else client.output_distribution)
        """Output lengths of its arrivals."""
        self._draws: dict[str, Draws] = {}
        self.priority_distribution = None if isinstance(client.priority, (int, float)) else client.priority
        """The distribution each request's priority is drawn from (None: the constant in ``base``)."""
        if self.priority_distribution is None:
            self.base["priority"] = client.priority
        if prefix:
            self.base.update(
                prefix_group=client.prefix_group,
                prefix_tokens=prefix,
                prefix_blocks=prefix_blocks(seed, client.prefix_group, prefix),
                prefix_block_tokens=PREFIX_BLOCK_TOKENS,
            )

    def stream(self, what: str) -> np.random.Generator:
        """The client's random stream for *what* (arrival, input, output, mix, session, priority)."""
        return self._streams.stream(f"workload/{self.client.id}/{what}")

    def draw(self, what: str, distribution: Any, *, tokens: bool) -> float:
        """The next value of *distribution* from the client's stream *what*, drawn in vectors
        of :data:`DRAW_CHUNK` (whole tokens when *tokens*, else the float as drawn)."""
        draws = self._draws.get(what)
        if draws is None:
            draws = self._draws[what] = Draws(distribution, self.stream(what), tokens=tokens, chunk=DRAW_CHUNK)
        return draws.next()

    def prompts(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[dict[str, Any]] | None]:
        """*n* prompt lengths (with the shared prefix) and, for multimodal clients, their mix."""
        mm = self.client.multimodal
        if mm is None:
            return draw_tokens(self.input_distribution, rng, n) + self.prefix_tokens, None
        text, parts = _multimodal(mm, rng, n)
        total = np.maximum(text + parts["image_tokens"] + parts["audio_tokens"] + parts["video_tokens"], 1)
        extras = [
            {"text_tokens": t, "image_tokens": i, "audio_tokens": a, "video_tokens": v}
            for t, i, a, v in zip(
                text.tolist(),
                parts["image_tokens"].tolist(),
                parts["audio_tokens"].tolist(),
                parts["video_tokens"].tolist(),
                strict=True,
            )
        ]
        return total + self.prefix_tokens, extras

    def rows(self) -> Iterator[Row]:
        """Endless rows in arrival order (finite if the lifecycle ends).

        The rows of a chunk are read one by one at C level (a chain of the chunks' zips): the
        next chunk is drawn when the row after the last one is asked for, as a generator
        yielding them would draw it, without resuming a Python frame for every row.
        """
        return itertools.chain.from_iterable(self._chunks())

    def _chunks(self) -> Iterator[Iterator[Row]]:
        """The rows of :meth:`rows`, one iterator per chunk of :data:`CHUNK` draws."""
        client = self.client
        arrival_rng, input_rng, output_rng, mix_rng = (self.stream(w) for w in ("arrival", "input", "output", "mix"))
        p_stream = client.streaming
        arrival = client.arrival
        reason_ratio = client.reasoning.reason_ratio_distribution if client.reasoning is not None else None
        for times in arrival.times(arrival_rng, self.rate, CHUNK):
            if client.lifecycle is not None:
                times = warp_to_windows(times, client.lifecycle)
            n = len(times)
            prompts, extras = self.prompts(input_rng, n)
            outputs = draw_tokens(self.output_distribution, output_rng, n)
            per_request: Sequence[dict[str, Any] | None] | None = extras
            if 0.0 < p_stream < 1.0:
                flags = (mix_rng.random(n) < p_stream).tolist()
                per_request = [{**(e or {}), "streaming": f} for e, f in zip(per_request or [None] * n, flags, strict=True)]
            if reason_ratio is not None:
                ratios = np.clip(reason_ratio.sample(mix_rng, n), 0.0, 1.0).tolist()
                per_request = [{**(e or {}), "reason_ratio": r} for e, r in zip(per_request or [None] * n, ratios, strict=True)]
            if self.priority_distribution is not None:
                # From a stream of its own: drawing priorities leaves every other draw as it was.
                drawn = to_priorities(self.priority_distribution.sample(self.stream("priority"), n), self.priority_distribution)
                per_request = [{**(e or {}), "priority": q} for e, q in zip(per_request or [None] * n, drawn.tolist(), strict=True)]
            extra_iter = per_request if per_request is not None else itertools.repeat(None, n)
            rows = zip(times.tolist(), prompts.tolist(), outputs.tolist(), extra_iter, strict=True)
            ended = np.flatnonzero(times == np.inf)  # past the lifecycle's last window: the client is done
            if ended.size:
                yield itertools.islice(rows, int(ended[0]))
                return
            yield rows


def _multimodal(mm: MultimodalConfig, rng: np.random.Generator, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    text = draw_tokens(mm.text_distribution, rng, n)
    parts: dict[str, np.ndarray] = {}
    for kind in ("image", "audio", "video"):
        per_item = getattr(mm, f"{kind}_distribution")
        if per_item is None:
            parts[f"{kind}_tokens"] = np.zeros(n, dtype=np.int64)
            continue
        count_distribution = getattr(mm, f"{kind}_count_distribution")
        counts = to_counts(count_distribution.sample(rng, n), count_distribution)
        items = draw_tokens(per_item, rng, int(counts.sum()))
        owner = np.repeat(np.arange(n), counts)
        parts[f"{kind}_tokens"] = np.bincount(owner, weights=items, minlength=n).astype(np.int64)
    return text, parts


def client_arrivals(client: ClientConfig, rate: float, streams: RandomStreams) -> Iterator[tuple[float, int, int]]:
    """``(arrival_s, prompt_tokens, output_tokens)`` for one client at *rate* requests/s.

    Examples
    --------
    >>> from simpy_llm.config.schema import ClientConfig
    >>> from simpy_llm.workload.arrivals import PoissonArrivals
    >>> from simpy_llm.workload.distributions import Constant
    >>> from simpy_llm.rng import RandomStreams
    >>> c = ClientConfig(id="a", rate_fraction=1.0, arrival=PoissonArrivals(),
    ...                  input_distribution=Constant(value=10), output_distribution=Constant(value=5))
    >>> t, p, o = next(client_arrivals(c, 2.0, RandomStreams(0)))
    >>> (p, o), t > 0
    ((10, 5), True)
    """
    for t, p, o, _extra in ClientSource(client, rate, streams, streams.seed).rows():
        yield t, p, o


class WorkloadGenerator:
    """Puts the workload's requests into *outbox* at their arrival times.

    Parameters
    ----------
    env
        The SimPy environment.
    sources
        ``(base fields, rows)`` per source (see the module docstring).
    outbox
        Wire receiving each request as it arrives.
    recorder
        Told of each arrival.
    ids
        The simulation's request-id counter.
    num_requests
        Stop after this many arrivals (None: no limit).
    horizon_s
        Stop at the first arrival after this time (None: no limit).
    on_request
        Called as ``on_request(request, source_index)`` for each request created
        (e.g. to open a session).
    announce
        Tell the recorder of each arrival (False when the outbox's consumer does: a client
        network that delivers the request to the router later).
    """

    def __init__(
        self,
        env: simpy.Environment,
        sources: list[tuple[dict[str, Any], Iterator[Row]]],
        outbox: Wire | simpy.Store,
        recorder: Recorder,
        ids: Iterator[int],
        *,
        num_requests: int | None = None,
        horizon_s: float | None = None,
        on_request: Any = None,
        announce: bool = True,
    ) -> None:
        self.env = env
        self.sources = sources
        self.announce = announce
        self.outbox = outbox
        self.recorder = recorder
        self.ids = ids
        self.num_requests = num_requests
        self.horizon_s = horizon_s
        self.on_request = on_request
        self.generated = 0
        self.done = False
        """True once the last request has been generated."""
        outbox_put = outbox.send if isinstance(outbox, Wire) else outbox.put  # a Wire's put without its event
        self._put: Any = outbox_put
        self._bases = [base for base, _ in sources]
        self._tails = [positional_fields(base) for base in self._bases]
        """Per source, its base fields as :class:`Request`'s positional arguments after
        ``arrival_s`` (None: its requests are made by keyword, :func:`make_request`)."""
        self._rows: Iterator[tuple[float, int, int, int, dict[str, Any] | None]] | None = None
        self._due: tuple[float, int, int, int, dict[str, Any] | None] | None = None
        """The row whose arrival the pending timeout waits for."""
        self.process: Event = env.event()
        """Succeeds once the last request has been generated (as a process ending would)."""
        # The first rows are emitted at start-up, in the slot a process's start would take
        # (URGENT, now); after that each arrival is a timeout whose callback emits it (a
        # callback, not a process resumption: one fewer frame switch per request).
        Later(env, 0.0, self._start, URGENT)

    def _start(self, _event: Event) -> None:
        """Start-up: emit the rows due at once and wait for the next one's time."""
        self._rows = rows = merge_sources([rows for _, rows in self.sources], self.num_requests, self.horizon_s)
        row = next(rows, None)
        if row is None:
            self._finish()
        elif row[0] > self.env.now:
            self._due = row
            Later(self.env, row[0] - self.env.now, self._arrive)
        else:
            self._due = row
            self._arrive(_event)

    def _arrive(self, _event: Event) -> None:
        """The row waited for is due (its timeout fired): emit it and the rows due with it,
        then wait (one timeout, as a process would) for the next one's time."""
        env = self.env
        rows = self._rows
        row = self._due
        assert rows is not None and row is not None  # set before this is called
        ids = self.ids
        bases = self._bases
        tails = self._tails
        on_request = self.on_request
        on_arrival = self.recorder.on_arrival if self.announce else None
        put = self._put
        now = env.now
        while True:
            tail = tails[row[1]]
            if tail is not None and row[4] is None:
                # make_request's request by position: no keyword matching over 58 fields.
                req = Request(next(ids), tail[0], row[2], row[3], now, *tail[1])
            else:
                req = make_request(next(ids), now, bases[row[1]], row[2], row[3], row[4])
            self.generated += 1
            if on_request is not None:
                on_request(req, row[1])
            if on_arrival is not None:
                on_arrival(req, now)
            put(req)
            row = next(rows, None)
            if row is None:
                self._due = None
                self._finish()
                return
            if row[0] > now:  # (now is env.now: a callback does not move the clock)
                self._due = row
                Later(env, row[0] - now, self._arrive)
                return

    def _finish(self) -> None:
        self.done = True
        self.process.succeed()


def make_request(
    request_id: int, arrival_s: float, base: dict[str, Any], prompt: int, output: int, extra: dict[str, Any] | None
) -> Request:
    """The request of one merged row (:func:`merge_sources`) of a source with *base* fields.

    Examples
    --------
    >>> make_request(7, 1.5, {"client_id": "chat"}, 120, 30, None).client_id
    'chat'
    """
    if extra is None:
        return Request(id=request_id, prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s, **base)
    if not base:  # a trace's row: its fields are the request's own
        if len(extra) == 3 and _TRACE_HEAD == extra.keys():
            # A trace row's usual fields, by position (Request's first seven fields): no
            # keyword matching over the request's 58 fields.
            return Request(request_id, extra["client_id"], prompt, output, arrival_s, extra["tenant_id"], extra["slo_class"])
        return Request(id=request_id, prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s, **extra)
    return Request(id=request_id, prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s, **{**base, **extra})


_HEAD = ("id", "client_id", "prompt_tokens", "output_tokens", "arrival_s")
"""The first fields of :class:`Request`, in order: those :func:`make_request` gives itself
and the client's id."""
_TRACE_HEAD = {"client_id", "tenant_id", "slo_class"}
"""The fields of a trace row that sets nothing else (:func:`~simpy_llm.workload.traces.trace_rows`):
with :data:`_HEAD`, :class:`Request`'s first seven fields, in that order after ``arrival_s``."""


def positional_fields(base: dict[str, Any]) -> tuple[str, tuple[Any, ...]] | None:
    """*base* (a source's fields shared by its requests) as ``(client_id, tail)``, with
    ``Request(id, client_id, prompt, output, arrival_s, *tail)`` the request
    :func:`make_request` makes of a row without extra fields; None when *base* cannot be
    given by position (no client id, a field it lacks has a default computed per request,
    or a field that is not the request's).

    Passing the fields by position spares matching keywords against the request's 58 fields.

    Examples
    --------
    >>> base = {"client_id": "chat", "slo_class": "batch", "tenant_id": "t"}
    >>> client, tail = positional_fields(base)
    >>> client, tail
    ('chat', ('t', 'batch'))
    >>> by_position = Request(7, client, 120, 30, 1.5, *tail)
    >>> attrs.astuple(by_position) == attrs.astuple(make_request(7, 1.5, base, 120, 30, None))
    True
    >>> positional_fields({"client_id": "chat", "slo_class": "batch"}) is None  # tenant_id's default is the client id
    True
    """
    fields = attrs.fields(Request)
    names = [f.name for f in fields]
    if names[: len(_HEAD)] != list(_HEAD) or "client_id" not in base or any(k in _HEAD[2:] or k == "id" for k in base):
        return None
    try:
        last = max(names.index(k) for k in base)
    except ValueError:  # a key that is not a field of the request
        return None
    tail: list[Any] = []
    for field in fields[len(_HEAD) : last + 1]:
        if field.name in base:
            tail.append(base[field.name])
        elif isinstance(field.default, attrs.Factory) or field.default is attrs.NOTHING:  # type: ignore[arg-type]
            return None
        else:
            tail.append(field.default)
    return base["client_id"], tuple(tail)


def merge_sources(
    sources: list[Iterator[Row]], num_requests: int | None = None, horizon_s: float | None = None
) -> Iterator[tuple[float, int, int, int, dict[str, Any] | None]]:
    """Merge the sources' rows by arrival time into ``(arrival_s, source index, prompt,
    output, extra)``, stopping after *num_requests* rows or past *horizon_s*.

    Ties in time go to the lower source index.
    """
    heap: list[tuple[float, int, int, int, Any]] = []
    iterators = []
    for i, rows in enumerate(sources):
        it = iter(rows)
        iterators.append(it)
        first = next(it, None)
        if first is not None:
            heap.append((first[0], i, first[1], first[2], first[3]))
    heapq.heapify(heap)
    limit = num_requests if num_requests is not None else -1
    horizon = horizon_s if horizon_s is not None else float("inf")
    n = 0
    if len(iterators) == 1 and heap:
        # One source (a single trace or client): the same rows, read ahead one as below,
        # without the heap's compare and replace per row.
        it = iterators[0]
        item = heap[0]
        while n != limit:
            if item[0] > horizon:
                return
            nxt = next(it, None)
            n += 1
            yield item
            if nxt is None:
                return
            item = (nxt[0], 0, nxt[1], nxt[2], nxt[3])
        return
    while heap and n != limit:
        item = heap[0]
        if item[0] > horizon:
            return
        nxt = next(iterators[item[1]], None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt[0], item[1], nxt[1], nxt[2], nxt[3]))
        n += 1
        yield item


def sampling_scenario_error(
    exc: SamplingError, scenario: Scenario | WorkloadConfig, sources: Sequence[ClientSource] = ()
) -> ScenarioError:
    """The :class:`~simpy_llm.config.ScenarioError` for *exc*, raised while running *scenario*
    (or generating the requests of a bare workload spec, a :class:`WorkloadConfig`).

    Its key path is where the distribution that drew the values sits in the
    scenario (e.g. ``workload.clients[0].input_distribution``; in a bare workload spec
    ``clients[0].input_distribution``); for a client loaded from ServeGen data it is
    ``workload.servegen_data`` with the client named. The error's source is the
    scenario's name (``<workload spec>`` for a bare workload spec).
    """
    if isinstance(scenario, WorkloadConfig):
        workload, prefix, source = scenario, "", "<workload spec>"
    else:
        workload, prefix, source = scenario.workload, "workload.", f"scenario {scenario.name!r}" if scenario.name else "<scenario>"
    target = exc.distribution
    if target is not None:
        path = _key_path_of(workload, target, "")
        if path is not None:
            return ScenarioError(source, [(prefix + path, exc.message)])
        for src in sources:
            inner = _key_path_of(src.client, target, "")
            if inner is not None and workload.servegen_data is not None:
                where = f"ServeGen client {src.client.id!r} ({inner})"
                return ScenarioError(source, [(f"{prefix}servegen_data", f"{where}: {exc.message}")])
    return ScenarioError(source, [(prefix.rstrip(".") or "", exc.message)])


def _key_path_of(node: Any, target: object, path: str) -> str | None:
    """Key path of *target* (by identity) inside the config tree *node*, or None."""
    if node is target:
        return path
    if attrs.has(type(node)):
        for a in attrs.fields(type(node)):
            if not a.init:
                continue
            key = a.alias if a.alias and a.alias != a.name and not a.alias.startswith("_") else a.name
            found = _key_path_of(getattr(node, a.name), target, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    elif isinstance(node, (tuple, list)):
        for i, item in enumerate(node):
            if isinstance(item, (int, float, str)):
                return None  # a list of numbers or names: no configs inside
            found = _key_path_of(item, target, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(node, dict):
        for k, v in node.items():
            found = _key_path_of(v, target, f"{path}.{k}" if path else str(k))
            if found is not None:
                return found
    return None
