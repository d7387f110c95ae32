"""The request-level batch server: multi-bin queues, fixed and dynamic batches.

A continuous-batching engine (:mod:`simpy_llm.serving.engine`) schedules work
step by step. A *request-level* batch server is a different machine (seed 001,
``docs/batching.md``): it serves whole batches, and a batch holds the server
from its start until its slowest request ends, so the batch's service time is
the **maximum** over its requests.

Two pieces, wired by :class:`BatchServer`:

* :class:`BinQueue`, a SimPy resource: per-bin FIFO queues of requests, binned
  by predicted *size* (what the service time grows with). With a fixed batch
  size ``B`` a bin that holds ``B`` requests forms a batch at once and pushes it
  to the central FIFO batch queue (formation order); a ``get`` takes the oldest
  formed batch. With dynamic batching a ``get`` forms the batch when the server
  asks: a :class:`~simpy_llm.policies.batching.BinSelector` picks the bin, a
  :class:`~simpy_llm.policies.batching.DynamicBatchSizer` the size, and the
  candidates not taken simply stay at the head of their bin.
* the server process: take a batch, hold for its service time, complete every
  request at the batch's end (the responses are returned whole: a request's
  first token and last token reach the client together), tell the sizer.

One SimPy event per batch for the service and at most one for the get: a
million requests in batches of 32 cost ~60k events beside the arrivals.

A *batch service model* (registry :data:`batch_service_models`) gives each
request its size and a batch its service time:

* ``sampled``: each request's service time is drawn from a distribution
  (uniform, gamma, any registered one), its size; a batch takes the longest;
* ``linear`` (seed 001 §5.1): ``base_s + seq_len_coeff_s * max_seq_len *
  (1 + batch_penalty * (n - 1) / n)`` with a request's size its prompt plus
  output tokens;
* ``latency_model``: the replica's latency model run as a static batch: one
  prefill step over every prompt, then ``max_output - 1`` decode steps of the
  whole batch (a static batch keeps its finished sequences as padding); size:
  output tokens.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Generator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.structure import Problems, build_policy, tagged
from simpy_llm.config.validators import MAX_TIME_S, at_least, at_most
from simpy_llm.entities import Batch
from simpy_llm.kernel import BoundClass, Channel, ChannelGet, WirePut
from simpy_llm.policies.batching import (
    SLA_CONTROLLERS,
    DynamicBatchSizer,
    RoundRobinBins,
    bin_selectors,
)
from simpy_llm.registry import Registry
from simpy_llm.serving.kv_cache import TokenMemory
from simpy_llm.workload.distributions import Draws, length_distributions

if TYPE_CHECKING:
    import simpy
    from simpy.events import Event

    from simpy_llm.config.schema import BatchServerConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.policies.batching import BinSelector
    from simpy_llm.policies.predictors import OutputPredictor
    from simpy_llm.wire import Wire

__all__ = [
    "BatchServer",
    "BatchServiceModel",
    "BinQueue",
    "BinQueueStats",
    "LatencyModelBatches",
    "LinearBatchModel",
    "SampledServiceTimes",
    "batch_service_models",
    "equal_mass_boundaries",
]


# --- service models ------------------------------------------------------------
class BatchServiceModel(Protocol):
    """Sizes of requests and service times of batches, s.

    ``needs_latency_model`` (class attribute) says whether the replica's latency model
    is passed in (as ``latency``).
    """

    needs_latency_model: bool

    def size(self, request: Request) -> float:
        """The request's true size (what its service time grows with)."""
        ...

    def predicted_size(self, request: Request, size: float, predictor: OutputPredictor) -> float:
        """What the server believes the size is, through *predictor*."""
        ...

    def batch_time_s(self, requests: Sequence[Request], sizes: Sequence[float]) -> float:
        """Service time of a batch of *requests* with these *sizes*: its slowest request's."""
        ...

    # Optional, as a latency model's (absent: 0): ``queueing_time_s(prompt_tokens)``, the
    # delay before a request enters its bin, and ``output_token_overhead_s``, the
    # post-processing per output token after the batch ends.


batch_service_models: Registry[type] = Registry("batch service model")


@batch_service_models.register("sampled")
class SampledServiceTimes:
    """Each request's service time (s) drawn from *distribution*; a batch takes the longest.

    Draws come in vectors from the replica's own stream (``service/<replica>``), in
    arrival order; a draw below 0 counts as 0, a NaN or infinite one is an error. A noisy
    predictor scales the time by its error factor.

    Parameters
    ----------
    distribution
        A registered distribution (``{type: uniform, params: {low: 1, high: 3}}``), of seconds.
    rng
        The replica's stream (injected).

    Examples
    --------
    >>> from simpy_llm.workload.distributions import Uniform
    >>> m = SampledServiceTimes(distribution=Uniform(low=1.0, high=3.0), rng=np.random.default_rng(0))
    >>> m.batch_time_s([], [1.5, 2.5, 2.0])
    2.5
    """

    needs_latency_model = False
    _CHUNK = 4096

    def __init__(self, distribution: Any, rng: np.random.Generator | None = None) -> None:
        if isinstance(distribution, dict):
            try:
                distribution = tagged(distribution, length_distributions, "type", flat=False)
            except Problems as exc:
                where, msg = exc.problems[0]
                raise FieldValueError(f"distribution.{where}".rstrip("."), msg) from None
        elif not (callable(getattr(distribution, "sample", None)) and hasattr(distribution, "mean")):
            # Any other shape (a number, a list, a string) would fail at the first draw, mid-run.
            raise FieldValueError(
                "distribution", f"must be a length distribution {{type: NAME, params: {{...}}}} (of seconds), got {distribution!r}"
            )
        self.distribution = distribution
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._draws = Draws(self.distribution, self.rng, tokens=False, chunk=self._CHUNK)

    @property
    def mean_s(self) -> float:
        """Mean service time of one request, s."""
        return float(self.distribution.mean)

    def size(self, request: Request) -> float:
        # A time cannot be negative: a draw below 0 (a normal's left tail) is 0.
        return max(self._draws.next(), 0.0)

    def predicted_size(self, request: Request, size: float, predictor: OutputPredictor) -> float:
        return size * predictor.factor(request)

    def batch_time_s(self, requests: Sequence[Request], sizes: Sequence[float]) -> float:
        return max(sizes)


@batch_service_models.register("linear")
@attrs.frozen(kw_only=True)
class LinearBatchModel:
    """Seed 001 §5.1: ``base_s + seq_len_coeff_s * max_seq_len * (1 + batch_penalty * (n - 1) / n)``.

    ``max_seq_len`` is the longest prompt plus output in the batch of ``n``; a request's
    size is its prompt plus output tokens (predicted: prompt plus predicted output).

    >>> m = LinearBatchModel(base_s=0.05, seq_len_coeff_s=0.001, batch_penalty=0.5)
    >>> round(m.batch_time_s([], [100.0, 300.0]), 6)  # 0.05 + 0.001 * 300 * 1.25
    0.425
    """

    needs_latency_model = False
    base_s: float = attrs.field(default=0.0, validator=[at_least(0), at_most(MAX_TIME_S)])
    """Fixed time per batch, s."""
    seq_len_coeff_s: float = attrs.field(validator=[at_least(0), at_most(MAX_TIME_S)])
    """Time per token of the longest sequence, s."""
    batch_penalty: float = attrs.field(default=0.0, validator=[at_least(0), at_most(1e6)])
    """How much a full batch slows each token (beta)."""

    def __attrs_post_init__(self) -> None:
        if self.base_s == 0 and self.seq_len_coeff_s == 0:
            raise FieldValueError("seq_len_coeff_s", "base_s and seq_len_coeff_s cannot both be 0 (batches would take no time)")

    def size(self, request: Request) -> float:
        return float(request.prompt_tokens + request.output_tokens)

    def predicted_size(self, request: Request, size: float, predictor: OutputPredictor) -> float:
        return request.prompt_tokens + predictor.predict(request)

    def batch_time_s(self, requests: Sequence[Request], sizes: Sequence[float]) -> float:
        n = len(sizes)
        return self.base_s + self.seq_len_coeff_s * max(sizes) * (1.0 + self.batch_penalty * (n - 1) / n)


@batch_service_models.register("latency_model")
class LatencyModelBatches:
    """The replica's latency model run as a static batch: ``step(sum of prompts, 0) +
    (max_output - 1) * step(0, n)`` (a request's size: its output tokens).

    The model's per-request overheads apply as on a continuous-batching replica: a
    request enters its bin ``queueing_time_s(prompt)`` after it reaches the server, and its
    response reaches the client ``output_tokens * output_token_overhead_s`` after its
    batch ends (post-processing, which does not hold the server).

    Parameters
    ----------
    latency
        The replica's latency model (injected from the group's ``latency_model``).
    """

    needs_latency_model = True

    def __init__(self, latency: Any = None) -> None:
        self.latency = latency
        """The latency model (the scenario's check makes sure a group using this model has one)."""

    def queueing_time_s(self, prompt_tokens: int) -> float:
        """Time from reaching the server to entering a bin, s."""
        return self.latency.queueing_time_s(prompt_tokens)

    @property
    def output_token_overhead_s(self) -> float:
        """Post-processing per output token, s, after the batch ends."""
        return self.latency.output_token_overhead_s

    def size(self, request: Request) -> float:
        return float(request.output_tokens)

    def predicted_size(self, request: Request, size: float, predictor: OutputPredictor) -> float:
        return predictor.predict(request)

    def batch_time_s(self, requests: Sequence[Request], sizes: Sequence[float]) -> float:
        step = self.latency.step_time_s
        prompts = sum(r.prompt_tokens for r in requests)
        return step(prompts, 0) + (max(sizes) - 1) * step(0, len(requests))


# --- the bin queue -------------------------------------------------------------
def equal_mass_boundaries(predicted: Sequence[float], bins: int) -> tuple[float, ...]:
    """The ``bins - 1`` inner equal-mass boundaries: empirical ``i / bins`` quantiles (seed 001 §7).

    >>> equal_mass_boundaries([1.0, 2.0, 3.0, 4.0, 5.0], 2)
    (3.0,)
    """
    q = np.quantile(np.asarray(predicted, dtype=np.float64), [i / bins for i in range(1, bins)])
    return tuple(float(v) for v in q)


@attrs.frozen
class BinQueueStats:
    """Counters of a :class:`BinQueue`."""

    puts: int
    """Requests put."""
    batched: int
    """Requests that left in a batch."""
    batches: int
    """Batches taken by the server."""
    queued: int
    """Requests waiting: in bins, or in formed batches not yet taken."""


class BatchGet(ChannelGet):
    """Request for the next batch of a :class:`BinQueue`; its value is a :class:`Batch`."""


Entry = tuple["Request", float, float, float]
"""(request, true size, predicted KV tokens, predicted size) as a bin holds it."""


class BinQueue(Channel):
    """Per-bin FIFO queues of requests and the batches formed from them.

    Parameters
    ----------
    env
        The SimPy environment.
    bins
        Number of bins k.
    boundaries
        The ``k - 1`` inner boundaries of predicted size (None: equal-mass from the first
        *warmup* predicted sizes).
    warmup
        Predicted sizes sampled for equal-mass boundaries (without *boundaries*); until
        the sample is complete every request queues in bin 0.
    batch_size
        Fixed batch size B (None: dynamic, with *selector* and *sizer*).
    max_wait_s
        Fixed B only: when no full batch is formed and the server asks for one, a bin whose
        oldest request has waited this long gives it a partial batch of all it holds (the
        oldest such head first). Partial batches form only for an idle server, never ahead
        of full ones.
    selector, sizer
        Dynamic batching policies.
    max_candidates
        Dynamic: most requests pulled from the selected bin.
    memory_limit_tokens
        Dynamic: a batch stops before the request whose predicted KV tokens would take it
        over this (None: no limit).

    Examples
    --------
    >>> import simpy
    >>> from simpy_llm.entities import Request
    >>> env = simpy.Environment()
    >>> q = BinQueue(env, bins=2, boundaries=(10.0,), batch_size=2)
    >>> for i, size in enumerate([5.0, 20.0, 7.0]):
    ...     req = Request(id=i, client_id="c", prompt_tokens=1, output_tokens=1, arrival_s=0.0)
    ...     _ = q.put((req, size, 2.0, size))  # (request, size, predicted KV tokens, predicted size)
    >>> batch = q.get().value  # bin 0 filled first
    >>> batch.bin, [r.id for r in batch.requests], q.queue_lengths
    (0, [0, 2], [0, 1])
    """

    def __init__(
        self,
        env: simpy.Environment,
        bins: int,
        boundaries: Sequence[float] | None = None,
        *,
        warmup: int = 0,
        batch_size: int | None = None,
        max_wait_s: float | None = None,
        selector: BinSelector | None = None,
        sizer: DynamicBatchSizer | None = None,
        max_candidates: int = 1 << 30,
        memory_limit_tokens: float | None = None,
    ) -> None:
        super().__init__(env)
        if (batch_size is None) == (sizer is None):
            raise ValueError("give a fixed batch_size or a sizer (dynamic), not both or neither")
        if sizer is not None and selector is None:
            selector = RoundRobinBins()
        if boundaries is not None and len(boundaries) != bins - 1:
            raise ValueError(f"{bins} bins need {bins - 1} inner boundaries; got {len(boundaries)}")
        self.bins: list[deque[Entry]] = [deque() for _ in range(bins)]
        """Per-bin FIFO queues."""
        self.boundaries: tuple[float, ...] | None = (
            tuple(boundaries) if boundaries is not None else (() if bins == 1 and warmup == 0 else None)
        )
        """Inner boundaries of predicted size (None until the warm-up sample is complete)."""
        self.formed: deque[Batch] = deque()
        """Central FIFO batch queue (fixed B): formed batches not yet taken."""
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.selector = selector
        self.sizer = sizer
        self.max_candidates = max_candidates
        self.memory_limit_tokens = memory_limit_tokens
        self._warmup = warmup
        self._sample: list[float] = []
        """Predicted sizes seen while the boundaries are not yet known."""
        self._in_bins = 0
        self._in_formed = 0
        self._overdue: set[int] = set()
        """Ids of bin heads whose wait limit has run out (max_wait_s)."""
        self.puts = 0
        self.batched = 0
        self.batches_taken = 0
        self._next_id = 0

    if TYPE_CHECKING:

        def get(self) -> BatchGet:
            """Request the next batch (waits until one can be had)."""
            ...

    else:
        get = BoundClass(BatchGet)

    def __len__(self) -> int:
        """Requests waiting (in bins, or in formed batches not yet taken)."""
        return self._in_bins + self._in_formed

    @property
    def queue_lengths(self) -> list[int]:
        """Requests in each bin."""
        return [len(q) for q in self.bins]

    def statistics(self) -> BinQueueStats:
        """Current counters."""
        return BinQueueStats(puts=self.puts, batched=self.batched, batches=self.batches_taken, queued=len(self))

    def put(self, entry: Entry) -> WirePut:  # type: ignore[override]
        """Queue *entry* in the bin of its predicted size; the event is already processed (a
        put never waits).

        While the equal-mass boundaries are not yet known, requests queue in bin 0 (one
        FIFO queue, served as such); when the warm-up sample is complete the boundaries
        are set and the requests still waiting are re-binned in their order.
        """
        self.puts += 1
        if self.boundaries is None:
            self._sample.append(entry[3])
            if len(self._sample) < self._warmup:
                self._place(entry, 0)
            else:
                self.boundaries = equal_mass_boundaries(self._sample, len(self.bins))
                self._sample = []
                waiting = list(self.bins[0])
                self.bins[0].clear()
                self._in_bins -= len(waiting)
                for e in [*waiting, entry]:
                    self._place(e, bisect_right(self.boundaries, e[3]))
        else:
            self._place(entry, bisect_right(self.boundaries, entry[3]))
        if self.get_queue:
            self.serve_getters()
        return WirePut(self.env, entry)

    def _place(self, entry: Entry, i: int) -> None:
        entry[0].bin = i
        q = self.bins[i]
        q.append(entry)
        self._in_bins += 1
        b = self.batch_size
        if b is None:
            return
        if len(q) >= b:
            self._push(i, b)
        elif len(q) == 1 and self.max_wait_s is not None:
            self._arm(i)

    def _arm(self, i: int) -> None:
        """Schedule bin *i*'s wait limit for its current head."""
        head = self.bins[i][0]
        assert self.max_wait_s is not None  # armed only with a wait limit
        due = head[0].enqueue_s + self.max_wait_s
        env = self.env
        timer = env.timeout(max(due - env.now, 0.0))
        timer.callbacks.append(lambda _event: self._expire(i, head))

    def _expire(self, i: int, head: Entry) -> None:
        q = self.bins[i]
        if q and q[0] is head:
            # Marked rather than recomputed from the clock: now - enqueue_s may round to a
            # hair below max_wait_s at the very timeout that measures it.
            self._overdue.add(id(head))
            if self.get_queue:  # the server waits: let it take the partial batch
                self.serve_getters()

    def _overdue_bin(self) -> int | None:
        """The bin whose head has waited longest, if at least ``max_wait_s``; else None."""
        now = self.env.now
        best = None
        oldest = math.inf
        for i, q in enumerate(self.bins):
            if q and q[0][0].enqueue_s < oldest:
                best, oldest = i, q[0][0].enqueue_s
        if best is None or self.max_wait_s is None or (now - oldest < self.max_wait_s and id(self.bins[best][0]) not in self._overdue):
            return None
        return best

    def _push(self, i: int, n: int) -> None:
        """Form a batch of bin *i*'s *n* oldest requests into the central batch queue."""
        self.formed.append(self._take(i, n))
        self._in_formed += n
        if self.bins[i] and self.max_wait_s is not None:
            self._arm(i)  # a new head

    def _take(self, i: int, n: int) -> Batch:
        q = self.bins[i]
        popleft = q.popleft
        entries = [popleft() for _ in range(n)]
        self._in_bins -= n
        if self._overdue:
            for e in entries:
                self._overdue.discard(id(e))
        batch = Batch(
            id=self._next_id, bin=i, requests=[e[0] for e in entries], formed_s=self.env.now,
            sizes=[e[1] for e in entries],
            memory_tokens=sum(e[0].prompt_tokens + e[0].output_tokens for e in entries),
        )
        self._next_id += 1
        return batch

    def serve(self, event: BatchGet) -> bool | None:  # type: ignore[override]
        """Give *event* the next batch, if one can be had now (a formed batch, a partial
        batch of an overdue bin, or a dynamic batch)."""
        if self.batch_size is not None:
            if self.formed:
                batch = self.formed.popleft()
                self._in_formed -= batch.size
            else:
                overdue = self._overdue_bin() if self.max_wait_s is not None else None
                if overdue is None:
                    return False
                batch = self._take(overdue, len(self.bins[overdue]))
                if self.bins[overdue]:
                    self._arm(overdue)
        else:
            if not self._in_bins:
                return False
            batch = self._form_dynamic()
        self.batched += batch.size
        self.batches_taken += 1
        event.succeed(batch)
        return True

    def _form_dynamic(self) -> Batch:
        """A batch formed now: the selected bin, ``min(b_target, candidates)`` requests,
        cut before the first whose predicted KV tokens exceed the memory limit."""
        lengths = self.queue_lengths
        assert self.selector is not None and self.sizer is not None  # both are set with dynamic batching
        i = self.selector.select(lengths)
        if not 0 <= i < len(lengths) or not lengths[i]:
            raise ValueError(f"bin selector chose bin {i}; non-empty bins: {[j for j, n in enumerate(lengths) if n]}")
        target, memory, sla = self.sizer.target()
        n = min(lengths[i], self.max_candidates, target)
        limit = self.memory_limit_tokens
        if limit is not None:
            used = 0.0
            for k, (_req, _size, tokens, _pred) in enumerate(islice(self.bins[i], n)):
                used += tokens
                if used > limit:
                    n = max(k, 1)  # a request alone within the limit was admitted at arrival
                    break
        batch = self._take(i, n)
        batch.b_target, batch.b_mem, batch.b_sla = target, memory, sla
        return batch


# --- the server -----------------------------------------------------------------
class BatchServer:
    """A request-level batch server replica: a :class:`BinQueue` and a server process.

    It offers what the router's views and the simulation read from a replica
    (``waiting``, ``running``, ``kv``, ``departed``...), so a fleet may mix batch servers
    and continuous-batching replicas.

    Parameters
    ----------
    env
        The SimPy environment.
    index
        The replica's number.
    inbox
        Wire the router puts requests into (connected to :meth:`arrive`).
    config
        The group's ``batch_server`` settings.
    service
        The batch service model (built per replica).
    recorder
        Where lifecycle, batch and busy-time records go.
    completions
        Optional Wire receiving each request that leaves (completed or dropped).
    group
        Its replica group's name.
    selector
        Bin selector (dynamic batching; default from the config).
    sizer
        Dynamic batch sizer (dynamic batching; default from the config).
    """

    prefix_cache = None
    """No prefix cache: a request-level batch server recomputes every prompt."""

    def prefix_hit_tokens(self, request: Request) -> int:
        """Prompt tokens a prefix cache would find: none (there is none)."""
        return 0

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        inbox: Wire,
        config: BatchServerConfig,
        service: BatchServiceModel,
        recorder: Recorder,
        *,
        completions: Wire | None = None,
        group: str = "default",
        selector: BinSelector | None = None,
        sizer: DynamicBatchSizer | None = None,
    ) -> None:
        self.env = env
        self.index = index
        self.group = group
        self.config = config
        self.service = service
        self.recorder = recorder
        self.completions = completions
        dyn = config.dynamic
        limit = None
        if dyn is not None:
            if selector is None:
                selector = build_policy(dyn.bin_selection, bin_selectors)
            if sizer is None:
                controller = SLA_CONTROLLERS[dyn.sla_controller](
                    d_sla_s=dyn.d_sla_s, eps_d_s=dyn.tolerance_s, b_min=dyn.b_min, b_max=dyn.b_max, alpha=dyn.alpha,
                    window_batches=dyn.window_batches,
                )
                memory = dyn.memory
                sizer = DynamicBatchSizer(
                    controller,
                    memory.eta_tokens if memory is not None else None,
                    memory.safety_fraction if memory is not None else 0.1,
                    memory.window_batches if memory is not None else None,
                )
            if dyn.memory is not None:
                limit = dyn.memory.eta_tokens
        self.sizer = sizer
        bins = config.bins
        self.predictor = bins.predictor
        self.queue = BinQueue(
            env, bins.count, bins.boundaries, warmup=bins.warmup_size, batch_size=config.batch_size,
            max_wait_s=config.max_wait_s, selector=selector, sizer=sizer,
            max_candidates=dyn.max_candidates if dyn is not None else 1 << 30, memory_limit_tokens=limit,
        )
        self.kv = TokenMemory(limit or 0)
        self.memory_limit_tokens = limit
        """KV capacity eta, tokens (None: no limit)."""
        self.running: list[Request] = []
        """Requests of the batch in service."""
        self.current: Batch | None = None
        """The batch in service."""
        self.step = 0
        """Batches served."""
        self.departed = 0
        self.departed_tokens = 0
        self.queued_prompt_tokens = 0
        """Prompt tokens of requests waiting (in bins or formed batches not yet served)."""
        self.prefill_s_per_token = 0.0
        """What routers assume a prompt token costs: unknown for a batch server, 0."""
        self._queueing_time_s = getattr(service, "queueing_time_s", None)
        self._output_overhead_s = float(getattr(service, "output_token_overhead_s", 0.0))
        inbox.connect(self.arrive)
        self.process = env.process(self._serve())

    @property
    def waiting(self) -> BinQueue:
        """The bin queue (``len()``: requests waiting)."""
        return self.queue

    def in_flight(self) -> list[Request]:
        """Requests routed here that have not finished."""
        out = list(self.running)
        q = self.queue
        for b in q.bins:
            out.extend(e[0] for e in b)
        for batch in q.formed:
            out.extend(batch.requests)
        return out

    def arrive(self, req: Request) -> None:
        """A routed request: sized, predicted and queued in its bin; dropped when alone it
        would exceed the memory limit (reason ``memory``)."""
        now = self.env.now
        size = self.service.size(req)
        predictor = self.predictor
        tokens = req.prompt_tokens + predictor.predict(req)
        limit = self.memory_limit_tokens
        if limit is not None and tokens > limit:
            req.dropped_reason = "memory"
            self._leave(req)
            self.recorder.on_drop(req)
            self.recorder.on_departure(now)
            if self.completions is not None:
                self.completions.put(req)
            return
        self.queued_prompt_tokens += req.prompt_tokens
        entry = (req, size, tokens, self.service.predicted_size(req, size, predictor))
        delay = self._queueing_time_s(req.prompt_tokens) if self._queueing_time_s is not None else 0.0
        if delay > 0.0:
            self.env.timeout(delay, entry).callbacks.append(self._enqueue_event)
        else:
            req.enqueue_s = now
            self.queue.put(entry)

    def _enqueue_event(self, event: Event) -> None:
        """The queueing time of a request (``event.value``, its bin entry) is over."""
        entry: tuple[Request, float, float, float] = event.value  # type: ignore[assignment] # the entry the timeout was given
        entry[0].enqueue_s = self.env.now
        self.queue.put(entry)

    def _leave(self, req: Request) -> None:
        self.departed += 1
        self.departed_tokens += req.prompt_tokens

    def _serve(self) -> Generator[Event, Batch, None]:
        """The server: take a batch, serve it for its slowest request's time, complete it.

        Yields
        ------
        BatchGet
            The next batch.
        Timeout
            Its service time.
        """
        env = self.env
        get = self.queue.get
        recorder = self.recorder
        on_complete = recorder.on_complete
        completions = self.completions
        service_time = self.service.batch_time_s
        kv = self.kv
        while True:
            batch = yield get()
            start = env.now
            reqs = batch.requests
            batch.start_s = start
            prompt = 0
            output = 0
            for r in reqs:
                r.first_scheduled_s = start
                prompt += r.prompt_tokens
                output += r.output_tokens
            self.queued_prompt_tokens -= prompt
            self.running = reqs
            self.current = batch
            kv.used_blocks = batch.memory_tokens
            if batch.memory_tokens > kv.peak_used_blocks:
                kv.peak_used_blocks = batch.memory_tokens
            service_s = service_time(reqs, batch.sizes)
            yield env.timeout(service_s)
            end = env.now
            batch.end_s = end
            self.step += 1
            self.running = []
            self.current = None
            kv.used_blocks = 0
            recorder.on_steps(self.index, service_s, 1, len(reqs), prompt, output, batch.memory_tokens * service_s)
            recorder.on_batch(self.index, batch)
            self.departed += len(reqs)
            self.departed_tokens += prompt
            overhead = self._output_overhead_s
            for r in reqs:
                r.generated_tokens = r.output_tokens
                r.first_token_s = r.completion_s = end + r.output_tokens * overhead if overhead else end
                on_complete(r)
            recorder.on_departures(end, len(reqs))
            if completions is not None:
                for r in reqs:
                    completions.put(r)
            if self.sizer is not None:
                self.sizer.observe(latency_s=service_s, size=len(reqs), prompt_tokens=prompt, output_tokens=output)

    def settle(self, until_s: float) -> None:
        """The run stopped at *until_s*: count the busy time of the batch in service."""
        if self.current is not None:
            self.recorder.on_busy(self.index, until_s - self.current.start_s)

    def statistics(self) -> BinQueueStats:
        """The bin queue's counters."""
        return self.queue.statistics()


def build_service_model(config: BatchServerConfig, latency: Any, rng: np.random.Generator) -> BatchServiceModel:
    """The service model *config* names, with the replica's *latency* model and stream injected."""
    cls = batch_service_models.get(config.service.kind)
    inject: dict[str, Any] = {"rng": rng}
    if getattr(cls, "needs_latency_model", False):
        inject["latency"] = latency
    return build_policy(config.service, batch_service_models, **inject)

