"""A replica: continuous batching over a paged KV cache, in two engine modes.

Kept whole (over 800 lines): the step loop of both engine modes, admission, preemption and
the KV bookkeeping touch the same per-request state in the hot path; splitting them would
add calls per step.

The model this implements is specified in ``docs/model.md`` ("A replica,
precisely"): the scheduler policy's keys order admission, prefill chunks and
preemption victims; decodes go first in every step's token budget; KV blocks
are allocated per step, with prefix caching (a radix tree of block runs,
:mod:`simpy_llm.serving.prefix_cache`) or without; a step that cannot get its
blocks preempts the largest key (recompute or swap).

One event per batch-composition change
--------------------------------------
In ``event_per_change`` mode a stretch of pure-decode steps in which no
request joins or leaves is a single timeout: its length is the smaller of
the steps until the first request finishes and the steps until the KV cache
cannot grow. A request that becomes the head of the waiting queue
mid-stretch, while a sequence slot is free, wakes the engine, which waits for
the step in progress to end, settles the steps done and plans the next step
at that boundary. Per-request token counts and KV blocks during decoding are
derived from the step counter at which decoding started (``decode_anchor_step``),
never incremented per step; KV growth over a stretch is counted through a
histogram of each decoder's position within its last block.

That is exact because nothing in a stretch can change a plan: the scheduler
policy's keys are fixed while a request waits or runs, free blocks only shrink
while decoders grow, and the budget and sequence slots change only when the
batch does. ``event_per_step`` mode takes one event per step and runs the full
plan every step; it is the reference the fast mode is tested against
(identical records), and the mode in which an optional :data:`TokenListener`
hears of every output token as its step ends (the emulated server streams with
it).

Step ends are counted in whole nanoseconds (``segment_start_ns + k *
step_ns``, see "Clock" in ``docs/model.md``; the engine keeps the last step end in
nanoseconds and moves it by whole step durations, the same integers), so a step end that decimal
arithmetic puts at an arrival's time is that time to the bit; they are scheduled
at those exact absolute times and at a SimPy priority after every ordinary
event (:func:`simpy_llm.kernel.timer_at`), and an idle engine wakes at that same
priority, so every request
entering the waiting queue at a step's start time is visible to that step's
plan.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import simpy
from mypy_extensions import mypyc_attr
from simpy.events import Event

from simpy_llm.entities import Request
from simpy_llm.kernel import LATE, Later, TimerAt, Wire, move_wait, succeed_at
from simpy_llm.policies.scheduling import FirstComeFirstServed
from simpy_llm.serving.kv_cache import PagedKVCache, blocks_for
from simpy_llm.serving.passes import simple_passes, slot_passes
from simpy_llm.serving.prefix_cache import PrefixCache
from simpy_llm.serving.slot_cache import SlotCache, SlotIds

if TYPE_CHECKING:
    from collections.abc import Generator

    from simpy_llm.config.schema import EngineConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.policies.scheduling import SchedulerPolicy
    from simpy_llm.serving.latency_base import LatencyModel
    from simpy_llm.serving.prefix_cache import CpuTier, Holder

__all__ = ["LATE", "Replica", "ReplicaStats", "TokenListener"]

NS_PER_S = 1_000_000_000
"""The engine's clock unit: step boundaries are whole nanoseconds."""
_NEVER = 1 << 62
"""Steps until a time that steps taking no time never reach."""


def to_ns(t_s: float) -> int:
    """*t_s* seconds as the nearest whole number of nanoseconds.

    >>> to_ns(0.0011), to_ns(35.488384), to_ns(2.5e-10)
    (1100000, 35488384000, 0)
    """
    return round(t_s * NS_PER_S)

def kv_growth(residue: list[int], s0: int, k: int) -> tuple[int, int]:
    """KV blocks the decoders allocate during a stretch of *k* pure-decode steps starting at
    step *s0*, and their time integral in block-steps: ``(grown, weighted)``.

    ``residue[c]`` counts the decoders that need a new block at step ``s`` iff
    ``(c + s) % len(residue) == 0``; the stretch's first step allocates nothing here (its
    blocks were planned with it), so a block allocated at step ``s0 + j`` (``0 < j < k``) is
    held ``k - j`` steps of the stretch. Summed by residue class in closed form: the class
    reached first at ``s0 + r`` allocates at ``r, r + bs, ...`` (``count`` times).

    Examples
    --------
    Two decoders needing a block at steps 3, 7, 11, ... (block size 4), a stretch of 9
    steps from step 0: blocks at steps 3 and 7, held 6 and 2 steps.

    >>> kv_growth([0, 2, 0, 0], 0, 9)
    (4, 16)
    """
    bs = len(residue)
    if k <= 1:
        return 0, 0
    i0 = -(s0 + 1) % bs
    seq = residue[i0::-1] + residue[:i0:-1]  # seq[r - 1]: the class allocating at step s0 + r
    q, rem = divmod(k - 1, bs)
    # Steps r = 1..rem allocate q + 1 times; r = rem + 1..bs allocate q times.
    head = seq[:rem]
    a1 = sum(head)
    r1 = sum(map(operator.mul, head, range(1, rem + 1)))
    c = q + 1
    grown = c * a1
    weighted = c * (k * a1 - r1) - (bs * c * (c - 1) // 2) * a1
    if q:
        a2 = sum(seq) - a1
        r2 = sum(map(operator.mul, seq, range(1, bs + 1))) - r1
        grown += q * a2
        weighted += q * (k * a2 - r2) - (bs * q * (q - 1) // 2) * a2
    return grown, weighted


def on_grid(step_s: float) -> tuple[int, float]:
    """A step of *step_s* seconds on the engine's clock grid: ``(whole nanoseconds, seconds)``,
    the nearest whole nanoseconds and at least 1 for a step that takes any time, so that step
    ends are exact multiples (see "Clock" in docs/model.md).

    Examples
    --------
    >>> on_grid(0.0123456789), on_grid(1e-12), on_grid(0.0)
    ((12345679, 0.012345679), (1, 1e-09), (0, 0.0))
    """
    d_ns = round(step_s * NS_PER_S)
    if not d_ns and step_s > 0.0:
        d_ns = 1
    return d_ns, d_ns / NS_PER_S


TokenListener = Callable[[Request, int, float], None]
"""Called as ``listener(request, tokens, visible_s)`` each time *request* produces an output
token: *tokens* is its output tokens so far, *visible_s* when the client sees that token
(the step's end plus ``tokens x output_token_overhead_s``, so the first call's time is
``first_token_s`` and the last call's ``completion_s``). Called from the step-end event,
before the request completes; it must not touch the environment or the replica."""


@attrs.frozen(kw_only=True)
class ReplicaStats:
    """A snapshot of a replica's counters."""

    steps: int
    """Engine steps run."""
    waiting: int
    """Requests in the waiting queue."""
    running: int
    """Requests in the running batch."""
    departed: int
    """Requests that left the replica (completed or dropped)."""
    kv_used_blocks: int
    """KV blocks held by running requests (shared blocks once)."""
    kv_peak_used_blocks: int
    """Most KV blocks held at once."""
    kv_cached_blocks: int
    """Blocks in the prefix cache (referenced or evictable; 0 without prefix caching)."""
    preemptions: int
    """Preemptions so far."""
    swapped_requests: int
    """Requests whose KV is swapped out to CPU memory now."""


# Compiled (hatch_build.py), the class stays open to subclasses written in Python (a user's
# replica, a test's checked one).
@mypyc_attr(allow_interpreted_subclasses=True)
class Replica:
    """One model replica: an ingress process and a continuous-batching engine process.

    Parameters
    ----------
    env
        The SimPy environment.
    index
        The replica's number (in records and routing views).
    inbox
        Wire the router puts requests into.
    config
        Engine settings.
    latency
        Step-time model.
    recorder
        Where lifecycle and step statistics go.
    fast
        ``True`` for one event per batch-composition change, ``False`` for one
        event per step.
    completions
        Optional Wire that receives each request leaving the replica (completed or dropped).
    token_listener
        Optional :data:`TokenListener`, told of every output token as its step ends. It
        needs one event per step (``fast=False``): a fast-mode stretch settles many
        steps at once, after the fact. ``None`` (default) costs nothing.
    scheduler
        The :class:`~simpy_llm.policies.scheduling.SchedulerPolicy` (default: FCFS).
    group
        Name of the replica group it belongs to (for views and records).
    role
        ``both`` (default): prefill and decode; ``prefill``: a disaggregated prefill replica,
        which computes a request's prompt and first token, then puts it into *handoffs*
        (with its KV counted as leaving); ``decode``: a decode replica, whose requests
        arrive with ``kv_received_tokens`` of KV and their first token
        (``docs/network.md``, "Prefill/decode disaggregation").
    handoffs
        Wire receiving the requests a prefill replica hands off (required for ``prefill``).
    load_s
        Cold start: the replica starts without its model loaded and spends this long
        loading it when its first request arrives (requests queue meanwhile; counted busy).
    warm_retention_s
        After this long idle the replica unloads its model, and loads it again (``load_s``)
        at its next request (None: it stays loaded).
    throttle
        ``(after_s, factor)``: thermal throttling; once the replica has been busy without a
        break for ``after_s``, its steps take ``1 / factor`` times as long, until it idles.
        The speed is decided when a step or stretch of steps is planned.
    until_s
        The time the run stops (``simulation.until_s``; None: it runs to the end). A request
        whose last token is computed before it but whose answer reaches the client at or
        after it (per-token post-processing) is not recorded completed: it stays in flight
        (``docs/model.md``, "Stopping early").
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        inbox: Wire | simpy.Store,
        config: EngineConfig,
        latency: LatencyModel,
        recorder: Recorder,
        *,
        fast: bool = True,
        completions: Wire | simpy.Store | None = None,
        token_listener: TokenListener | None = None,
        scheduler: SchedulerPolicy | None = None,
        group: str = "default",
        role: str = "both",
        handoffs: Wire | None = None,
        load_s: float = 0.0,
        warm_retention_s: float | None = None,
        throttle: tuple[float, float] | None = None,
        until_s: float | None = None,
    ) -> None:
        if role not in ("both", "prefill", "decode"):
            raise ValueError(f"role must be both, prefill or decode, not {role!r}")
        if (role == "prefill") != (handoffs is not None):
            raise ValueError("a prefill replica needs a handoffs Wire, and only a prefill replica takes one")
        if token_listener is not None and fast:
            raise ValueError("a token_listener needs one event per step: fast=False (simulation.mode event_per_step)")
        if scheduler is None:

            scheduler = FirstComeFirstServed()
        self.env = env
        self.index = index
        self.group = group
        self.role = role
        self.handoffs = handoffs
        self._prefill_only = role == "prefill"
        self._send_handoff: Callable[[Request], None] | None = None if handoffs is None else handoffs.send
        """*handoffs*' send (a prefill replica's; None on the others)."""
        self.load_s = load_s
        self.warm_retention_s = warm_retention_s
        self.throttle = throttle
        self.cold_starts = 0
        """Times it loaded its model."""
        self._loaded = False
        self._idle_since = 0.0
        self._busy_since = 0.0
        self.inbox = inbox
        self.config = config
        self.latency = latency
        self.recorder = recorder
        self.fast = fast
        self.completions = completions
        self._send_done: Callable[[Request], object] | None = (
            None if completions is None else completions.send if isinstance(completions, Wire) else completions.put
        )
        """Puts a departing request into *completions* (a Wire's put without the put's event)."""
        self.token_listener = token_listener
        self._max_num_seqs = config.max_num_seqs
        """``config.max_num_seqs`` (read once per stretch)."""
        self.scheduler = scheduler
        self._key = scheduler.key
        self._fcfs = type(scheduler) is FirstComeFirstServed
        """Whether every key is FCFS's 0 (then a request's key is not asked for)."""

        bs = config.kv_block_size
        num_blocks = config.kv_num_blocks
        if not isinstance(num_blocks, int):
            # ``auto`` is resolved from the latency model's hardware first (serving.fleet.resolve_engine).
            raise ValueError(f"kv_num_blocks must be a number of blocks, not {num_blocks!r} (resolve auto with plan_fleet)")
        self.slot_cache: SlotCache | None = None
        """llama.cpp's prompt cache, slot by slot (``EngineConfig.slot_cache``): then the KV
        blocks are the slots' own, and the cached prefix comes from the slot a request is given."""
        self.prefix_cache: PrefixCache | None = None
        """The KV blocks when they are a prefix cache (``EngineConfig.prefix_caching`` without a
        slot cache), else None."""
        self._tier: CpuTier | None = None
        """The prefix cache's CPU tier (``EngineConfig.kv_offload_blocks``), else None."""
        if config.slot_cache is not None:
            self.slot_cache = SlotCache(config.max_num_seqs, config.slot_cache, config.prefill_breaks)
            self.kv: PagedKVCache | PrefixCache = PagedKVCache(num_blocks, bs)
        elif config.prefix_caching:
            self.kv = self.prefix_cache = PrefixCache(num_blocks, bs, cpu_blocks=config.kv_offload_blocks)
            self._tier = self.prefix_cache.tier
            if self._tier is not None:
                recorder.kv_tiers[index] = self._tier
        else:
            self.kv = PagedKVCache(num_blocks, bs)
        self._slot_ids: SlotIds | None = None
        """Slots held by the running requests when ``ubatch_split: by_slot`` has no slot cache to ask."""
        self._slot_of: Callable[[int], int] | None = None
        """The slot a running request holds (``ubatch_split: by_slot``), else None."""
        if config.ubatch_split == "by_slot":
            if self.slot_cache is not None:
                self._slot_of = self.slot_cache.slot_of
            else:
                self._slot_ids = SlotIds(config.max_num_seqs)
                self._slot_of = self._slot_ids.slot_of
        self._slotted = self.slot_cache is not None or self._slot_ids is not None
        """Whether requests hold slots (a slot cache, or slot ids for ``ubatch_split: by_slot``)."""
        capacity = num_blocks * bs
        limit = config.max_model_len if config.max_model_len is not None else capacity
        if not config.chunked_prefill:
            limit = min(limit, config.max_num_batched_tokens)
        self.max_model_len = min(limit, capacity)
        """Longest prompt + output accepted; longer requests are dropped."""

        self._breaks = tuple(sorted(config.prefill_breaks, reverse=True))
        self._chunked = config.chunked_prefill
        self._plain_admit = self.slot_cache is None and self._tier is None and self._slot_ids is None and not self._breaks
        """Whether admission needs no slots, no CPU tier and no prefill breaks (``_admit``'s
        short loop)."""
        self._reusable_tail = config.reusable_prompt_tail
        self.swap = config.preemption_mode == "swap"
        self.swap_free_blocks = config.swap_space_blocks if self.swap else 0
        """CPU swap-space blocks not holding a swapped-out request."""
        self._swap_bytes_per_token = config.swap_kv_bytes_per_token or 0.0
        self._swap_bandwidth_gb_per_s = config.swap_bandwidth_gb_per_s or 0.0
        self._swap_tokens = 0
        """Tokens copied to or from CPU memory in the step being planned."""
        self._restores = 0
        """Requests admitted in the step being planned with a cached prefix found (with a slot
        cache: with a context restored from host memory)."""
        self._restore_s = latency.cache_restore_s
        self._restore_tokens = 0
        """Tokens restored from the prefix cache's CPU tier in the step being planned (reset
        when the step's time is taken)."""
        self._offload_bytes_per_token = config.kv_offload_bytes_per_token or 0.0
        self._offload_bandwidth_gb_per_s = config.kv_offload_bandwidth_gb_per_s or 0.0

        self.waiting: list[tuple[Any, int, Request]] = []
        """Heap of ``(policy key, entry order, request)``: the waiting queue."""
        self.running: dict[int, Request] = {}
        """Running batch by request id."""
        self._prefilling: list[tuple[Any, int, Request]] = []
        """The running requests still in prefill, sorted by key."""
        self._seq = 0
        self._finish_heap: list[tuple[int, Any, int, int, Request]] = []
        """(step producing the last token, policy key, entry order, anchor step, request) per
        decoder; an entry whose anchor differs from the request's current one is stale
        (preempted since)."""
        self._residue = [0] * bs
        """Decoders by ``(kv_tokens_at_anchor - anchor_step) % block_size``: a decoder
        needs a new block at step ``s`` iff ``(residue + s) % block_size == 0``."""
        self._ctx_base = 0
        """Sum over decoders of ``kv_tokens - decode_anchor_step``: their KV tokens at step
        ``s`` sum to ``_ctx_base + decoders * s``."""
        self._measured_streamers = 0
        """Decoders that stream and are not warm-up: the only ones whose token gaps are
        tallied as ITL (a non-streaming client sees no gaps; warm-up is not measured)."""
        self._uses_context = latency.uses_context
        self._energy = latency.step_energy_j
        """The latency model's step energy (None: no table; energy then comes from the device's power)."""
        self._step_j = 0.0
        """The energy of each step of the current plan, J (with :attr:`_energy`)."""
        if self._energy is not None:
            recorder.energy_j[index] = 0.0
        self._decode_context = 0
        """Decode context as of the last composition change (context-dependent latency models)."""
        self.num_preemptions = 0
        self.departed = 0
        """Requests that left the replica (completed or dropped), counted by the replica."""
        self.departed_tokens = 0
        """Prompt tokens of the requests that left the replica."""
        self.queued_prompt_tokens = 0
        """Prompt tokens of waiting or prefilling requests not yet computed (or found cached)."""

        self.step = 0
        """Engine step counter: steps completed so far."""
        self._clock = 0.0
        """The engine's time, s: the start of the step being planned."""
        self._clock_ns = 0
        """The grid point the next step's end is counted from, ns: ``_clock`` in whole
        nanoseconds (rounded once, when the engine starts after idle, then moved by whole
        step durations, so ``_clock_ns + j * _step_ns`` is exact)."""
        self._step_ns = 0
        """The planned step's duration, ns (0: steps that take no time, which end where they
        start, at ``_clock``)."""
        self._until_s = math.inf if until_s is None else until_s
        self._seen_after_cut: list[Request] = []
        """Requests whose answer reaches the client at or after ``until_s`` although their
        last token was computed before it: left in flight (see :meth:`settle`)."""
        self._changed = True
        self._preempted_now = False
        self._idle_signal: Event | None = None
        """Succeeds (at LATE priority) when a request enters the waiting queue of an idle engine."""
        self._cuttable = False
        """True while the engine sits in a decode stretch that a new waiting head could join."""
        self._stretch: tuple[int, int, float] | None = None
        """(steps, decoders, step_s) of the decode stretch in progress, from ``_clock`` (None
        during a single step)."""
        self._alpha2 = latency.output_token_overhead_s

        if hasattr(inbox, "connect"):
            inbox.connect(self.arrive)
        else:  # a plain simpy.Store: take requests with a process
            env.process(self._ingress())
        # A decode replica's requests were tokenised and queued by their prefill replica.
        self._queueing_time_s: Callable[[int], float] | None = None if role == "decode" else latency.queueing_time_s
        """The latency model's queueing time (None on a decode replica: no queueing delay)."""
        self.process = env.process(self._engine())

    # --- own state, read by views ---------------------------------------------
    @property
    def prefill_s_per_token(self) -> float:
        """Marginal step time of one prompt token, s (from the latency model, over 1024 tokens;
        its mean when it draws step times)."""
        step = self.latency.mean_step_time_s
        return (step(1024, 0) - step(0, 0)) / 1024

    @property
    def waiting_requests(self) -> int:
        return len(self.waiting)

    @property
    def running_requests(self) -> int:
        return len(self.running)

    @property
    def kv_free_blocks(self) -> int:
        return self.kv.free_blocks

    def prefix_hit_tokens(self, req: Request) -> int:
        """Prompt tokens of *req* the replica's prefix cache would find now (0 without one)."""
        if self.slot_cache is not None:
            return self.slot_cache.hit_tokens(req)
        return 0 if self.prefix_cache is None else self.prefix_cache.hit_tokens(req)

    def statistics(self) -> ReplicaStats:
        """Current counters."""
        return ReplicaStats(
            steps=self.step,
            waiting=len(self.waiting),
            running=len(self.running),
            departed=self.departed,
            kv_used_blocks=self.kv.used_blocks,
            kv_peak_used_blocks=self.kv.peak_used_blocks,
            kv_cached_blocks=self.prefix_cache.cached_blocks if self.prefix_cache is not None else 0,
            preemptions=self.num_preemptions,
            swapped_requests=sum(1 for _, _, r in self.waiting if r.swapped_tokens),
        )

    def in_flight(self) -> list[Request]:
        """Requests routed here that have not finished (running or waiting)."""
        seen = {**self.running, **{r.id: r for _, _, r in self.waiting}}
        return list(seen.values())

    # --- ingress -----------------------------------------------------------
    def arrive(self, req: Request) -> None:
        """A routed request reaches the replica: it enters the waiting queue after the latency
        model's queueing time (none on a decode replica), or is dropped if longer than
        ``max_model_len``."""
        if req.prompt_tokens + req.output_tokens > self.max_model_len:
            now = self.env.now
            req.dropped_reason = "max_model_len"
            self.departed += 1
            self.departed_tokens += req.prompt_tokens
            self.recorder.on_drop(req)
            self.recorder.on_departure(now)
            if self.completions is not None:
                self.completions.put(req)
            return
        queueing_time_s = self._queueing_time_s
        if queueing_time_s is not None:
            delay = queueing_time_s(req.prompt_tokens)
            if delay > 0.0:
                Later(self.env, delay, functools.partial(self._enqueue, req))  # env.timeout(delay), leaner
                return
        # _enqueue(req), inline: a decode replica's every hand-off comes this way.
        now = self.env.now
        if req.enqueue_s != req.enqueue_s:  # nan: the first replica it reaches (a decode replica keeps the prefill's)
            req.enqueue_s = now
        req.prefill_target = target = req.prompt_tokens + req.generated_tokens
        self.queued_prompt_tokens += target
        seq = self._seq
        self._seq = seq + 1
        entry = (0 if self._fcfs else self._key(req, now), seq, req)
        req.sched_key = entry[:2]
        waiting = self.waiting
        heapq.heappush(waiting, entry)
        # (*) By its entry order, unique, not by identity: compiled (hatch_build.py), a tuple
        # put in a list is a new object.
        if self._cuttable:
            if waiting[0][1] == seq:  # the new entry leads: it might be admissible, replan at the next boundary (*)
                self._cuttable = False
                self._cut_stretch(now)
        elif self._idle_signal is not None and not self._idle_signal.triggered:
            succeed_at(self.env, self._idle_signal, now)  # succeed() at LATE priority

    def _ingress(self) -> Generator[Event, Request, None]:
        """Process taking requests from an inbox Store that cannot call :meth:`arrive` itself.

        Yields
        ------
        StoreGet
            The next request from the inbox.
        """
        get = self.inbox.get
        while True:
            self.arrive((yield get()))

    def _enqueue(self, req: Request, _event: Event | None = None) -> None:
        """*req* enters the waiting queue (at once, or as the timeout of its queueing time fires)."""
        now = self.env.now
        if req.enqueue_s != req.enqueue_s:  # nan: the first replica it reaches (a decode replica keeps the prefill's)
            req.enqueue_s = now
        # A handed-off request has its first token: its prefill ends with computing that token's KV.
        req.prefill_target = target = req.prompt_tokens + req.generated_tokens
        self.queued_prompt_tokens += target
        seq = self._seq
        self._seq = seq + 1
        entry = (0 if self._fcfs else self._key(req, now), seq, req)
        req.sched_key = entry[:2]
        heapq.heappush(self.waiting, entry)
        if self._cuttable:
            if self.waiting[0][1] == seq:  # the new entry leads: it might be admissible, replan at the next boundary (*)
                self._cuttable = False
                self._cut_stretch(now)
        elif self._idle_signal is not None and not self._idle_signal.triggered:
            succeed_at(self.env, self._idle_signal, now)  # succeed() at LATE priority

    def set_max_num_seqs(self, n: int) -> None:
        """Change the batch limit (the planner's knob, ``docs/planner.md``): requests already
        running keep running; admissions from the next step boundary on respect *n*. A raised
        limit with requests waiting cuts a decode stretch at the step in progress, as an
        arrival at the head of the queue does."""
        if n == self.config.max_num_seqs:
            return
        self.config = attrs.evolve(self.config, max_num_seqs=n)
        self._max_num_seqs = n
        if getattr(self, "_stretch", None) is None:
            return
        room = len(self.running) < n
        if room and self.waiting and not self._cuttable:
            self._cut_stretch(self.env.now)  # the stretch ends at the next boundary: no more cuts
        else:
            self._cuttable = room

    # --- engine ----------------------------------------------------------
    def _engine(self) -> Generator[Event, object, None]:
        """The engine loop: plan a step (or a stretch of identical decode steps), wait for
        it to end, settle it.

        Yields
        ------
        Event
            The idle signal (a request entered the waiting queue) and step-end events
            (both LATE priority); a decode stretch's end moves earlier when a request
            becomes the head of the waiting queue (:meth:`_cut_stretch`).
        """
        # Everything read every step and fixed for the replica's life is bound once: the step
        # loop runs a few times per request, and each attribute read is a dictionary lookup.
        env = self.env
        step_time_s = self.latency.step_time_s
        running = self.running
        waiting = self.waiting
        ubatch = self.config.ubatch_tokens
        fast = self.fast
        uses_context = self._uses_context
        energy = self._energy
        throttle = self.throttle
        plan = self._plan
        admit = self._admit
        max_batched = self.config.max_num_batched_tokens
        tier = self._tier
        settle_step = self._settle_step
        settle_stretch = self._settle_decode_stretch
        stretch_length = self._stretch_length
        finish_heap = self._finish_heap
        heappop = heapq.heappop
        kv = self.kv
        bs = kv.block_size
        prefilling = self._prefilling
        residue = self._residue
        # The step time from the token counts alone (no context, one pass): the usual model.
        plain = not uses_context and ubatch is None
        # A pure-decode step's duration on the grid, (ns, s), by batch size: timed once per size
        # when the model's step times are repeatable and nothing else changes a step's duration
        # (no energy table, no throttling); None: every step is timed anew.
        decode_times: dict[int, tuple[int, float]] | None = None
        if plain and energy is None and throttle is None and getattr(self.latency, "repeatable_step_times", False):
            decode_times = {}
        while True:
            if not running and not waiting:
                self._idle_since = env.now
                self._idle_signal = Event(env)
                yield self._idle_signal
                self._idle_signal = None
                self._clock = self._busy_since = env.now
                self._clock_ns = to_ns(self._clock)
                self._changed = True
                if self.load_s and self._must_load():
                    yield from self._load()

            if prefilling or (waiting and tier is not None):
                chunks, n_decode, prefill_tokens, kv_used = plan()
                if not chunks and not n_decode:
                    raise RuntimeError(f"replica {self.index}: waiting requests but nothing schedulable")
            elif waiting:
                # _plan's case with nobody prefilling (a decode replica's hand-offs; arrivals
                # between prompts), inline: the decoders' blocks, then admission.
                n_decode = len(running)
                need = residue[-self.step % bs] if n_decode else 0
                if need <= kv.num_blocks - kv.used_blocks:
                    self._preempted_now = False
                    chunks = []
                    budget = max_batched - n_decode
                    if budget > 0 and n_decode < self._max_num_seqs:
                        # The chunks admitted take the budget they leave: their tokens are its difference.
                        prefill_tokens = budget - admit(chunks, budget, need)
                    else:
                        prefill_tokens = 0
                        if need:
                            kv.allocate(need)
                    kv_used = kv.used_blocks
                else:  # preemptions
                    chunks, n_decode, prefill_tokens, kv_used = plan()
                if not chunks and not n_decode:
                    raise RuntimeError(f"replica {self.index}: waiting requests but nothing schedulable")
            else:
                # _plan's usual case inline: decode steps only, nobody to admit; each decoder
                # whose last block is full takes a block.
                n_decode = len(running)
                need = residue[-self.step % bs]
                if need <= kv.num_blocks - kv.used_blocks:
                    if need:
                        kv.allocate(need)
                    self._preempted_now = False
                    chunks = []
                    prefill_tokens = 0
                    kv_used = kv.used_blocks
                else:  # preemptions
                    chunks, n_decode, prefill_tokens, kv_used = plan()
            if decode_times is not None and not chunks and not self._preempted_now:
                # A pure-decode step (a preemption's step may carry its swap-outs' copies).
                timed = decode_times.get(n_decode)
                if timed is None:
                    timed = decode_times[n_decode] = on_grid(step_time_s(0, n_decode))
                d_ns, step_s = timed
                self._step_ns = d_ns
                self._changed = False
            else:
                changed = self._changed
                if plain:
                    step_s = step_time_s(prefill_tokens, n_decode)
                else:
                    if uses_context and (chunks or changed):
                        self._decode_context = self._ctx_base + n_decode * self.step
                    if ubatch is not None and (prefill_tokens + n_decode > ubatch or self._slot_of is not None):
                        step_s = self._passes_time_s(chunks, n_decode, ubatch)
                    elif uses_context:
                        step_s = step_time_s(
                            prefill_tokens,
                            n_decode,
                            decode_context_tokens=self._decode_context,
                            prefill_attention_pairs=sum(c * r.kv_tokens + c * (c + 1) // 2 for r, c in chunks),
                        )
                    else:
                        step_s = step_time_s(prefill_tokens, n_decode)
                if energy is not None:
                    self._step_j = self._step_energy_j(chunks, n_decode, prefill_tokens, ubatch)
                # The plan's swaps and cache restores add their copies to the step (counted anew by
                # each plan: reset here once taken, so a plan with none writes nothing).
                if self._swap_tokens:
                    step_s += self._swap_tokens * self._swap_bytes_per_token / (self._swap_bandwidth_gb_per_s * 1e9)
                    self._swap_tokens = 0
                if self._restores:
                    step_s += self._restores * self._restore_s
                    self._restores = 0
                    if self._restore_tokens:  # blocks restored from the CPU tier (only with a hit)
                        step_s += self._restore_tokens * self._offload_bytes_per_token / (self._offload_bandwidth_gb_per_s * 1e9)
                        self._restore_tokens = 0
                if throttle is not None and self._clock >= self._busy_since + throttle[0]:
                    step_s /= throttle[1]
                d_ns, step_s = on_grid(step_s)
                self._step_ns = d_ns
                if changed:
                    self._changed = False

            if chunks or not fast or self._preempted_now:
                # A mixed step, the reference mode, or a step after a preemption
                # (whose victims may be readmitted next step): one event. It is no stretch
                # (``_stretch`` stays None): nothing can cut it, and a run stopped during
                # it settles no step of it.
                yield TimerAt(env, (self._clock_ns + d_ns) / NS_PER_S if d_ns else self._clock)
                settle_step(chunks, n_decode, prefill_tokens, kv_used, step_s)
                continue

            # A stretch of identical pure-decode steps, one event. A request that becomes
            # the waiting head cuts it short at the end of the step in progress (_enqueue).
            # _stretch_length's usual case inline: the first finish comes before the KV cache
            # could run out (each decoder takes a block at most every block_size steps).
            top = finish_heap[0]
            while top[4].decode_anchor_step != top[3]:  # stale: preempted since it was pushed
                heappop(finish_heap)
                top = finish_heap[0]
            k = top[0] - self.step + 1
            free = kv.num_blocks - kv.used_blocks
            if k > 1 + free // len(running) * bs:
                k = stretch_length()
            if throttle is not None and self._clock < self._busy_since + throttle[0]:
                # End the stretch where throttling begins: the steps after it are planned
                # slower, at the boundary where the one-event-per-step mode slows down too.
                m = self._steps_to(self._busy_since + throttle[0])
                if m < k:
                    k = m
            self._cuttable = len(running) < self._max_num_seqs
            self._stretch = (k, n_decode, step_s)
            yield TimerAt(env, (self._clock_ns + k * d_ns) / NS_PER_S if d_ns else self._clock)
            k = self._stretch[0]
            self._cuttable = False
            self._stretch = None
            settle_stretch(k, n_decode, kv_used, step_s)

    def _must_load(self) -> bool:
        """Whether the model must be loaded before serving: never loaded, or unloaded after
        ``warm_retention_s`` idle."""
        if not self._loaded:
            return True
        retention = self.warm_retention_s
        return retention is not None and self._clock - self._idle_since > retention

    def _load(self) -> Generator[Event, object, None]:
        """Load the model (``load_s``, busy); requests arriving meanwhile wait in the queue."""
        start = self.env.now
        yield self.env.timeout(self.load_s)
        self._loaded = True
        self.cold_starts += 1
        self._clock = self.env.now
        self._clock_ns = to_ns(self._clock)
        self.recorder.on_cold_start(self.index, start, self.env.now)

    def _step_energy_j(self, chunks: list[tuple[Request, int]], n_decode: int, prefill_tokens: int, ubatch: int | None) -> float:
        """The planned step's energy by the latency model's ``step_energy_j``, J, passed what
        ``step_time_s`` is (pass by pass when the step takes several)."""
        energy = self._energy
        assert energy is not None  # called only with a table of step energies
        if ubatch is not None and (prefill_tokens + n_decode > ubatch or self._slot_of is not None):
            return self._passes_time_s(chunks, n_decode, ubatch, energy)
        if self._uses_context:
            pairs = sum(c * r.kv_tokens + c * (c + 1) // 2 for r, c in chunks)
            return energy(prefill_tokens, n_decode, self._decode_context, pairs)
        return energy(prefill_tokens, n_decode)

    def _passes_time_s(
        self, chunks: list[tuple[Request, int]], n_decode: int, ubatch: int, measure: Callable[..., float] | None = None
    ) -> float:
        """Time of a step computed as forward passes of at most *ubatch* tokens
        (``EngineConfig.ubatch_tokens``), cut as ``ubatch_split`` says
        (:mod:`simpy_llm.serving.passes`); each pass is timed by the latency model alone.

        A context-dependent model sees each pass's share: the decoders' context in
        proportion to the decoders in the pass, and the causal-attention pairs of the
        prefill tokens in it. *measure* (default the model's ``step_time_s``) is what is
        summed over the passes; the step's energy sums ``step_energy_j`` the same way.
        """
        step_time_s = self.latency.step_time_s if measure is None else measure
        slot_of = self._slot_of
        if slot_of is None:
            passes = simple_passes([(req.kv_tokens, chunk) for req, chunk in chunks], n_decode, ubatch)
        else:
            prefilling = {req.id for _k, _q, req in self._prefilling}
            decoders = [slot_of(i) for i in self.running if i not in prefilling]
            passes = slot_passes(decoders, [(slot_of(req.id), req.kv_tokens, chunk) for req, chunk in chunks], ubatch)
        total = 0.0
        if self._uses_context:
            context_per_decoder = self._decode_context / n_decode if n_decode else 0.0
            for p, d, q in passes:
                total += step_time_s(p, d, context_per_decoder * d, q)
        else:
            for p, d, _q in passes:
                total += step_time_s(p, d)
        return total

    def _cut_stretch(self, now: float) -> None:
        """End the decode stretch in progress at the end of the step in progress at *now*:
        the engine process waits for a step end at that boundary instead of the stretch's.

        This moves the process's wait from one event to another
        (:func:`~simpy_llm.kernel.move_wait`, as SimPy's own ``Process.interrupt`` does
        before it throws); the stretch's original event then fires with nobody waiting. It
        spares an interrupt event and an exception per cut.
        """
        stretch = self._stretch
        if stretch is None:  # no stretch in progress: nothing to cut
            return
        k, n_decode, step_s = stretch
        d_ns = self._step_ns
        if not d_ns:  # steps that take no time
            m = self._steps_to(now)
            if m >= k:
                return
            at = self._clock
        else:
            # _steps_to inline (once per arrival that cuts): the smallest m >= 1 whose step
            # end (the same arithmetic) is at or after now.
            start_ns = self._clock_ns
            m = int((now * NS_PER_S - start_ns) / d_ns)
            if m < 1:
                m = 1
            at = (start_ns + m * d_ns) / NS_PER_S
            if at < now:
                m += 1
                at = (start_ns + m * d_ns) / NS_PER_S
                while at < now:
                    m += 1
                    at = (start_ns + m * d_ns) / NS_PER_S
            else:
                while m > 1:
                    before = (start_ns + (m - 1) * d_ns) / NS_PER_S
                    if before < now:
                        break
                    m -= 1
                    at = before
            if m >= k:
                return  # the stretch ends with the step in progress anyway
        self._stretch = (m, n_decode, step_s)
        move_wait(self.process, TimerAt(self.env, at))

    def _steps_to(self, t: float) -> int:
        """The smallest ``m >= 1`` such that the *m*-th step from ``_clock`` on (each of
        ``_step_ns``) ends at or after *t*, by the same arithmetic as the step ends themselves:
        ``(_clock_ns + m * _step_ns) / NS_PER_S``; steps that take no time all end at ``_clock``."""
        d_ns = self._step_ns
        if d_ns == 0:  # steps that take no time: all end where they start
            return 1 if self._clock >= t else _NEVER
        start_ns = self._clock_ns
        m = max(int((t * NS_PER_S - start_ns) / d_ns), 1)
        while (start_ns + m * d_ns) / NS_PER_S < t:
            m += 1
        while m > 1 and (start_ns + (m - 1) * d_ns) / NS_PER_S >= t:
            m -= 1
        return m

    # --- planning ------------------------------------------------------------
    def _key_order(self) -> list[tuple[Any, int, Request]]:
        """The running batch as ``(policy key, entry order, request)`` entries sorted by key
        (the last one is the next preemption victim).

        Made when asked (preemption, the token listener, a stop), not kept sorted as requests
        join and leave: the entry orders are unique, so the order is the same."""
        return sorted([(*req.sched_key, req) for req in self.running.values()])

    def _decoder_kv_tokens(self, req: Request) -> int:
        return req.kv_tokens + (self.step - req.decode_anchor_step)

    def _plan(self) -> tuple[list[tuple[Request, int]], int, int, int]:
        """Plan step ``self.step``: allocate its KV blocks, preempting if needed, and admit
        waiting requests.

        Returns (prefill chunks, decoding requests, prefill tokens, KV blocks used).
        """
        cfg = self.config
        kv = self.kv
        bs = kv.block_size
        prefilling = self._prefilling
        running = self.running
        n_decode = len(running) - len(prefilling)
        budget = cfg.max_num_batched_tokens - n_decode

        chunks: list[tuple[Request, int]] = []
        need = self._residue[-self.step % bs] if n_decode else 0
        prefill_tokens = 0
        if prefilling:
            # _chunk_size inline when there are no prefill breaks (the usual case): one call
            # fewer per prefilling request and step.
            chunked = cfg.chunked_prefill
            chunk_size = self._chunk_size if self._breaks else None
            for _k, _q, req in prefilling:
                have = req.kv_tokens
                remaining = req.prefill_target - have
                if chunk_size is not None:
                    chunk = chunk_size(remaining, budget)
                else:
                    chunk = remaining if remaining <= budget else (budget if chunked else 0)
                if not chunk:
                    break
                chunks.append((req, chunk))
                budget -= chunk
                prefill_tokens += chunk
                need += (-have) // bs - (-have - chunk) // bs  # blocks_for(have + chunk) - blocks_for(have)
        if need <= kv.num_blocks - kv.used_blocks:
            cache = self.prefix_cache
            if cache is not None and (chunks or self._tier is not None):
                if need:  # taken before blocks are shared (and before the CPU tier sees any take)
                    kv.allocate(need)
                    need = 0
                # Full blocks are findable once the step computing them is scheduled.
                for req, chunk in chunks:
                    holder: Holder | None = req.kv_holder  # type: ignore[assignment]  # set only by this engine, to a Holder
                    if holder is not None:  # without one, nothing is shared
                        cache.register_shared(holder, req.kv_tokens + chunk)
            self._preempted_now = False
            if self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                # The chunks admitted take the budget they leave: their tokens are its difference.
                prefill_tokens += budget - self._admit(chunks, budget, need)
            elif need:
                kv.allocate(need)
        else:
            chunks, n_decode = self._allocate_in_order()
            self._preempted_now = True
            prefill_tokens = 0
            for _req, chunk in chunks:
                prefill_tokens += chunk
        return chunks, n_decode, prefill_tokens, kv.used_blocks

    def _admit(self, chunks: list[tuple[Request, int]], budget: int, pending: int = 0) -> int:
        """Admit waiting requests in key order while a slot, budget and blocks remain.

        *pending* blocks of the step are planned and not yet taken: they are taken with the
        blocks of the requests admitted, in one allocation (blocks are taken from the head of
        the free queue, so taking a then b is taking a + b), and at once before the prefix
        cache is looked up or pinned (a take may evict what a lookup would find)."""
        waiting = self.waiting
        running = self.running
        kv = self.kv
        cache = self.prefix_cache
        bs = kv.block_size
        max_seqs = self._max_num_seqs
        heappop = heapq.heappop
        prefilling = self._prefilling
        if self._plain_admit:
            # The loop below for a request without a cache lookup (no prefix cache, or content
            # all its own), no slots, no CPU tier and no prefill breaks: what it does for such
            # a request, without the branches of the others (a request that needs a lookup
            # goes on in the general loop, from the same state).
            chunked = self._chunked
            queued = self.queued_prompt_tokens
            clock = self._clock
            general = fast_admitted = False
            while waiting and budget > 0 and len(running) < max_seqs:
                entry = waiting[0]
                req = entry[2]
                if cache is not None and (req.kv_holder is not None or req.context or req.prefix_blocks):
                    general = True
                    break
                swapped = req.swapped_tokens
                received = req.kv_received_tokens
                computed = received if received > swapped else swapped
                remaining = req.prefill_target - computed
                chunk = remaining if remaining <= budget else (budget if chunked else 0)
                if not chunk:
                    break
                new_blocks = -(-(computed + chunk) // bs)  # blocks_for(computed + chunk), nothing cached
                if new_blocks > kv.num_blocks - kv.used_blocks - pending:
                    break
                heappop(waiting)
                pending += new_blocks
                if swapped:
                    self._swap_tokens += swapped
                    self.swap_free_blocks += blocks_for(swapped, bs)
                    req.swapped_tokens = 0
                if received:
                    req.kv_received_tokens = 0
                req.kv_tokens = computed
                queued -= computed
                running[req.id] = req
                insort(prefilling, entry)
                if req.first_scheduled_s != req.first_scheduled_s:  # nan: first admission
                    req.first_scheduled_s = clock
                    req.cached_tokens = 0
                chunks.append((req, chunk))
                budget -= chunk
                fast_admitted = True
            if fast_admitted:
                self.queued_prompt_tokens = queued
                self._changed = True
            if not general:
                if pending:
                    kv.allocate(pending)
                return budget
        slots = self.slot_cache
        tier = self._tier
        breaks = self._breaks
        chunked = self.config.chunked_prefill
        slot_ids = self._slot_ids
        queued_prompt_tokens = self.queued_prompt_tokens
        clock = self._clock
        admitted = False
        while waiting and budget > 0 and len(running) < max_seqs:
            entry = waiting[0]
            req = entry[2]
            holder: Holder | None = req.kv_holder  # type: ignore[assignment]  # set only by this engine, to a Holder
            if slots is not None:
                # llama.cpp: the slot chosen for it holds its cached prefix (no shared blocks)
                found = slots.plan(req)
                if found is None:  # every slot busy: never below max_num_seqs (one slot per sequence)
                    break
                plan = found
                cached = plan.cached
                hits = pinned_free = 0
            elif cache is not None and (holder is not None or req.context or req.prefix_blocks):
                if pending:
                    kv.allocate(pending)
                    pending = 0
                if holder is None:
                    holder = req.kv_holder = cache.holder(req, self._reusable_tail)
                match = cache.match(holder, (req.prefill_target - 1) // bs)
                hits = match.blocks
                pinned_free = match.evictable
                cached = hits * bs
            else:
                # No prefix cache, or content all its own and never released by a preemption
                # (then it has no holder: no lookup can find anything, see _release_kv).
                hits = pinned_free = cached = 0
            swapped = req.swapped_tokens
            computed = cached if cached >= swapped else swapped
            received = req.kv_received_tokens
            if received > computed:
                computed = received
            remaining = req.prefill_target - computed
            if breaks:
                chunk = self._chunk_size(remaining, budget)
            else:  # _chunk_size without prefill breaks, inline
                chunk = remaining if remaining <= budget else (budget if chunked else 0)
            if not chunk:
                break
            new_blocks = -(-(computed + chunk) // bs) - hits  # blocks_for(computed + chunk) - hits
            if new_blocks + pinned_free > kv.num_blocks - kv.used_blocks - pending:
                break
            heappop(waiting)
            if slot_ids is not None:
                slot_ids.take(req.id)
            if slots is not None:
                slots.admit(req, plan)
                if plan.restored:
                    self._restores += 1
            elif holder is not None and cache is not None:  # (a holder exists only with a cache)
                cache.pin(holder, match)
                if hits:
                    self._restores += 1
                if tier is not None:
                    restored = match.cpu * bs
                    self._restore_tokens += restored
                    tier.looked_up_tokens += req.prefill_target
                    tier.gpu_hit_tokens += cached - restored
                    tier.cpu_hit_tokens += restored
                    if restored:
                        tier.restore_s += restored * self._offload_bytes_per_token / (self._offload_bandwidth_gb_per_s * 1e9)
            if holder is not None and cache is not None:  # (never with a slot cache: nothing is shared)
                kv.allocate(new_blocks)
                cache.register_shared(holder, computed + chunk)
            elif tier is None:
                pending += new_blocks
            else:  # the CPU tier sees each take as it was made
                kv.allocate(new_blocks)
            if swapped:
                if swapped > cached:
                    self._swap_tokens += swapped - cached
                self.swap_free_blocks += blocks_for(swapped, bs)
                req.swapped_tokens = 0
            if received:
                req.kv_received_tokens = 0
            req.kv_tokens = computed
            queued_prompt_tokens -= computed
            running[req.id] = req
            insort(prefilling, entry)
            if req.first_scheduled_s != req.first_scheduled_s:  # nan: first admission
                req.first_scheduled_s = clock
                req.cached_tokens = cached
            chunks.append((req, chunk))
            budget -= chunk
            admitted = True
        if admitted:
            self.queued_prompt_tokens = queued_prompt_tokens
            self._changed = True
        if pending:
            kv.allocate(pending)
        return budget

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Prefill tokens to schedule for a request with *remaining* uncomputed tokens:
        all of them if they fit *budget*, else a budget-sized chunk (chunked prefill)
        or none (the prompt must go whole); a chunk stops where *remaining* reaches a
        prefill break (``EngineConfig.prefill_breaks``)."""
        chunk = remaining if remaining <= budget else (budget if self.config.chunked_prefill else 0)
        for brk in self._breaks:  # descending: the first below remaining is the next one reached
            if brk < remaining:
                return min(chunk, remaining - brk)
        return chunk

    def _allocate_in_order(self) -> tuple[list[tuple[Request, int]], int]:
        """Slow path when the step's blocks do not all fit: walk the running batch in key
        order, preempting the largest key until each request's blocks fit."""
        kv = self.kv
        cache = self.prefix_cache
        bs = kv.block_size
        running = self.running
        order = self._key_order()
        budget = self.config.max_num_batched_tokens - (len(running) - len(self._prefilling))
        chunks: list[tuple[Request, int]] = []
        scheduled_decoders = 0
        for _k, _q, req in list(order):
            if req.id not in running:
                break  # preempted as a victim: so is everyone after it
            if req.decode_anchor_step < 0:
                chunk = self._chunk_size(req.prefill_target - req.kv_tokens, budget)
                if not chunk:
                    continue
                need = blocks_for(req.kv_tokens + chunk, bs) - blocks_for(req.kv_tokens, bs)
            else:
                chunk = 0
                need = 1 if self._decoder_kv_tokens(req) % bs == 0 else 0
            while need > kv.free_blocks:
                victim = order[-1][2]
                self._preempt(victim, order)
                if victim is req:
                    break
            if req.id not in running:
                break
            kv.allocate(need)
            if chunk:
                holder: Holder | None = req.kv_holder  # type: ignore[assignment]  # set only by this engine, to a Holder
                if holder is not None and cache is not None:  # (a holder exists only with a cache)
                    cache.register_shared(holder, req.kv_tokens + chunk)
                chunks.append((req, chunk))
                budget -= chunk
            else:
                scheduled_decoders += 1
        return chunks, scheduled_decoders

    def _preempt(self, req: Request, order: list[tuple[Any, int, Request]]) -> None:
        """Take *req* (the largest key, the last entry of *order*, the running batch in key
        order) out of the running batch, release its blocks, swap its KV out if it fits the
        swap space, and put it back into the waiting queue."""
        if self.slot_cache is not None:  # EngineConfig refuses a slot cache whose slots could run out
            raise RuntimeError(f"replica {self.index}: a slot cache never preempts, but request {req.id} ran out of KV")
        bs = self.kv.block_size
        now = self._clock
        entry = order.pop()
        del self.running[req.id]
        if req.decode_anchor_step < 0:
            self._prefilling.pop(bisect_left(self._prefilling, entry))
            tokens = req.kv_tokens
            self.queued_prompt_tokens -= req.prefill_target - tokens
        else:
            tokens = self._decoder_kv_tokens(req)
            self._leave_decoding(req)
            req.generated_tokens += self.step - req.decode_anchor_step
            req.decode_anchor_step = -1  # its finish-heap entry is now stale
            req.last_token_engine_s = now
        self._release_kv(req, tokens)
        if self._slot_ids is not None:
            self._slot_ids.free(req.id, now)
        mode = "recompute"
        if self.swap and tokens and self.swap_free_blocks >= blocks_for(tokens, bs):
            mode = "swap"
            self.swap_free_blocks -= blocks_for(tokens, bs)
            req.swapped_tokens = tokens
            self._swap_tokens += tokens
        req.kv_tokens = 0
        req.prefill_target = req.prompt_tokens + req.generated_tokens
        self.queued_prompt_tokens += req.prefill_target
        if req.preemption_times_s is None:
            req.preemption_times_s = []
        req.preemption_times_s.append(now)
        new_entry = (self._key(req, now), entry[1], req)
        req.sched_key = new_entry[:2]
        heapq.heappush(self.waiting, new_entry)
        self.num_preemptions += 1
        self.recorder.on_preemption(req, self.index, now, mode)
        self._changed = True

    def _release_kv(self, req: Request, tokens: int, done: bool = False) -> None:
        """Give back the blocks of *req*, which holds *tokens* tokens of KV; *done* when it
        completed (then only a later round of its session could look its content up)."""
        cache = self.prefix_cache
        if cache is None:
            self.kv.release(blocks_for(tokens, self.kv.block_size))
            return
        findable = not done or req.continuable
        holder: Holder | None = req.kv_holder  # type: ignore[assignment]  # set only by this engine, to a Holder
        if holder is None:
            # Admitted without a holder: its content is all its own and it referenced nothing.
            if not findable:
                cache.release_own(tokens)
                return
            holder = req.kv_holder = cache.holder(req, self._reusable_tail)
        # A finished request leaves findable its prompt less the reusable tail (llama.cpp's checkpoints).
        keep = max(req.prompt_tokens - self._reusable_tail, 0) if done and self._reusable_tail is not None else None
        cache.unref(holder, tokens, findable=findable, findable_tokens=keep)

    def _leave_decoding(self, req: Request) -> None:
        self._residue[(req.kv_tokens - req.decode_anchor_step) % self.kv.block_size] -= 1
        self._ctx_base -= req.kv_tokens - req.decode_anchor_step
        if req.streaming and not req.warm_up:
            self._measured_streamers -= 1

    def _stretch_length(self) -> int:
        """Steps from ``self.step`` on that need no scheduling decision: up to and
        including the first finish, and no further than the KV cache can grow."""
        heap = self._finish_heap
        while heap[0][4].decode_anchor_step != heap[0][3]:
            heapq.heappop(heap)
        k_finish = heap[0][0] - self.step + 1
        # Steps after this one whose block allocations still fit.
        residue = self._residue
        kv = self.kv
        bs = kv.block_size
        n = len(self.running)
        free = kv.num_blocks - kv.used_blocks
        full_cycles = free // n
        if k_finish <= 1 + full_cycles * bs:  # the KV cache outlasts the first finish (k_kv is larger)
            return k_finish
        left = free - full_cycles * n
        extra = 0
        base = self.step + 1 + full_cycles * bs
        while extra < bs:
            a = residue[-(base + extra) % bs]
            if a > left:
                break
            left -= a
            extra += 1
        k_kv = 1 + full_cycles * bs + extra
        return k_finish if k_finish < k_kv else k_kv

    # --- settling -----------------------------------------------------------
    def _settle_decode_stretch(self, k: int, n_decode: int, kv_used: int, step_s: float) -> None:
        """Account *k* pure-decode steps starting at ``self.step``."""
        s0 = self.step
        bs = self.kv.block_size
        residue = self._residue
        # Blocks allocated at steps s0+1 .. s0+k-1 and their time integral.
        if k <= 2:  # the usual stretch, cut or ended by a finish within two steps
            grown = weighted = residue[-(s0 + 1) % bs] if k == 2 else 0  # step s0 + 1's class, held one step
        elif k > 12 or k > bs + 1:
            grown, weighted = kv_growth(residue, s0, k)
        else:  # the same sums step by step (each class allocates once): cheaper for short stretches
            grown = weighted = 0
            # Step s0 + r (r = 1 .. k - 1) allocates for class -(s0 + r) % bs, held k - r steps;
            # the classes run down from -(s0 + 1) % bs, and a negative index wraps (k - 1 <= bs).
            i = -(s0 + 1) % bs
            for held in range(k - 1, 0, -1):
                a = residue[i]
                grown += a
                weighted += a * held
                i -= 1
        if grown:
            self.kv.allocate(grown)
        recorder = self.recorder
        recorder.on_steps(self.index, step_s, k, n_decode, 0, n_decode, step_s * (kv_used * k + weighted))
        if self._energy is not None:
            recorder.on_energy(self.index, self._step_j * k)
        if self._measured_streamers:  # (a tally takes no zero-weight values)
            recorder.on_token_gaps(step_s + self._alpha2, self._measured_streamers * k)
        last = s0 + k - 1
        # _advance(k), inline: the stretch's settling runs once per stretch.
        self.step = s0 + k
        d_ns = self._step_ns
        if d_ns:  # steps that take no time leave the clock where it is
            self._clock_ns = ns = self._clock_ns + k * d_ns
            self._clock = ns / NS_PER_S
        heap = self._finish_heap
        if heap and heap[0][0] <= last:  # a stretch cut short finishes nobody
            self._finish_decoders(last, self._clock)

    def _settle_step(
        self,
        chunks: list[tuple[Request, int]],
        n_decode: int,
        prefill_tokens: int,
        kv_used: int,
        step_s: float,
    ) -> None:
        """Account one (possibly mixed) step: decoders advance, prefill chunks land."""
        s = self.step
        recorder = self.recorder
        recorder.on_steps(self.index, step_s, 1, n_decode + len(chunks), prefill_tokens, n_decode, step_s * kv_used)
        if self._energy is not None:
            recorder.on_energy(self.index, self._step_j)
        alpha2 = self._alpha2
        if self._measured_streamers:
            recorder.on_token_gaps(step_s + alpha2, self._measured_streamers)
        # _advance(1), inline: this runs once per mixed step.
        self.step = s + 1
        d_ns = self._step_ns
        if d_ns:  # steps that take no time leave the clock where it is
            self._clock_ns = ns = self._clock_ns + d_ns
            self._clock = ns / NS_PER_S
        end = self._clock
        listener = self.token_listener
        if n_decode:
            if listener is not None:
                self._report_decode_tokens(listener, end)
            heap = self._finish_heap
            if heap and heap[0][0] <= s:
                self._finish_decoders(s, end)
        if not chunks:
            return
        bs = self.kv.block_size
        prefilling = self._prefilling
        self.queued_prompt_tokens -= prefill_tokens  # the chunks' tokens, computed now
        for req, chunk in chunks:
            req.kv_tokens = kv_tokens = req.kv_tokens + chunk
            if kv_tokens < req.prefill_target:
                continue
            # Prefill complete: this step emitted a token.
            self._changed = True
            if prefilling[0][2] is req:  # the usual case: chunks go in key order
                del prefilling[0]
            else:
                prefilling.pop(bisect_left(prefilling, (*req.sched_key, req)))
            req.generated_tokens = g = req.generated_tokens + 1
            if self._prefill_only and g < req.output_tokens:
                self._hand_off(req, end)
                continue
            streamer = req.streaming and not req.warm_up
            if g == 1:
                req.first_token_s = end + alpha2
            elif streamer:
                recorder.on_token_gaps(end - req.last_token_engine_s + alpha2, 1)
            if listener is not None:
                listener(req, g, end + g * alpha2)
            if g >= req.output_tokens:
                self._complete(req, end, kv_tokens)
                continue
            req.decode_anchor_step = s + 1
            base = kv_tokens - s - 1
            self._residue[base % bs] += 1
            self._ctx_base += base
            if streamer:
                self._measured_streamers += 1
            key, seq = req.sched_key
            heapq.heappush(self._finish_heap, (s + req.output_tokens - g, key, seq, s + 1, req))

    def _report_decode_tokens(self, listener: TokenListener, end: float) -> None:
        """Tell *listener* of the token each decoding request produced in the step ending at
        *end* (called after the step counter moved past it, before finished decoders leave the
        batch)."""
        alpha2 = self._alpha2
        step = self.step
        for _k, _q, req in self._key_order():
            if req.decode_anchor_step >= 0:
                g = req.generated_tokens + step - req.decode_anchor_step
                listener(req, g, end + g * alpha2)

    def _finish_decoders(self, last_step: int, end: float) -> None:
        """Complete the decoders whose last token came out of step *last_step* (in key order)."""
        heap = self._finish_heap
        residue = self._residue
        bs = self.kv.block_size
        heappop = heapq.heappop
        while heap and heap[0][0] <= last_step:
            _, _, _, anchor, req = heappop(heap)
            if req.decode_anchor_step != anchor:
                continue  # stale: preempted since it was pushed
            steps = last_step + 1 - anchor
            # _leave_decoding, inline (once per request)
            kv_tokens = req.kv_tokens
            base = kv_tokens - anchor
            residue[base % bs] -= 1
            self._ctx_base -= base
            if req.streaming and not req.warm_up:
                self._measured_streamers -= 1
            req.generated_tokens += steps
            req.kv_tokens = kv_tokens = kv_tokens + steps
            req.decode_anchor_step = -1
            self._complete(req, end, kv_tokens)

    def _hand_off(self, req: Request, end: float) -> None:
        """A prefill replica computed *req*'s prompt and first token at *end*: it leaves for a
        decode replica, its KV released here (cached, findable if a later round may use it)."""
        del self.running[req.id]
        cache = self.prefix_cache
        if cache is not None and req.kv_holder is None and not req.continuable:
            cache.release_own(req.kv_tokens)  # _release_kv's way for content all its own (as _complete)
        else:
            self._release_kv(req, req.kv_tokens, done=True)
        req.kv_holder = None
        if self.slot_cache is not None:
            self.slot_cache.release(req, req.kv_tokens, end)
        elif self._slot_ids is not None:
            self._slot_ids.free(req.id, end)
        req.last_token_engine_s = end
        self.departed += 1
        self.departed_tokens += req.prompt_tokens
        self._changed = True
        send = self._send_handoff
        if send is None:  # __init__ gives every prefill replica one
            raise RuntimeError(f"replica {self.index}: a prefill replica without a handoffs Wire")
        send(req)

    def _complete(self, req: Request, end: float, tokens: int) -> None:
        del self.running[req.id]
        cache = self.prefix_cache
        if cache is not None and req.kv_holder is None and not req.continuable:
            cache.release_own(tokens)  # _release_kv's way for content all its own, findable by nobody
        else:
            self._release_kv(req, tokens, done=True)
        req.kv_holder = None
        if self._slotted:
            if self.slot_cache is not None:
                self.slot_cache.release(req, tokens, end)
            elif self._slot_ids is not None:
                self._slot_ids.free(req.id, end)
        req.completion_s = completion_s = end + req.output_tokens * self._alpha2
        self.departed += 1
        self.departed_tokens += req.prompt_tokens
        self._changed = True
        recorder = self.recorder
        if completion_s < self._until_s:
            recorder.on_complete(req)
        else:  # its answer reaches the client after the run stops: still in flight there
            self._seen_after_cut.append(req)
        recorder.on_departure(end)
        if self._send_done is not None:
            self._send_done(req)

    # --- stopping early ---------------------------------------------------------
    def settle(self, until_s: float) -> None:
        """Account the state at *until_s* when the run stops there: the steps of a stretch
        in progress that ended before *until_s*, each decoding request's tokens, and the
        client-side times at or after *until_s* (a token's post-processing ending after the
        cut), which did not happen: those first-token and completion times become NaN (the
        requests concerned were left in flight, see ``until_s``).

        Called once, after the environment stopped; the replica must not run afterwards.
        """
        if self._stretch is not None:
            k, n_decode, step_s = self._stretch
            if k > 1:
                j = min(self._steps_to(until_s) - 1, k - 1)
                if j > 0:
                    # No decoder finishes before the stretch's last step, so j < k settles none.
                    self._settle_decode_stretch(j, n_decode, self.kv.used_blocks, step_s)
            self._stretch = None
        in_order = self._key_order()
        for _k, _q, req in in_order:
            if req.decode_anchor_step >= 0:
                steps = self.step - req.decode_anchor_step
                req.generated_tokens += steps
                req.kv_tokens += steps
                req.decode_anchor_step = self.step
        nan = math.nan
        for req in (*self._seen_after_cut, *(r for _k, _q, r in in_order), *(r for _k, _q, r in self.waiting)):
            if req.first_token_s >= until_s:
                req.first_token_s = nan
            if req.completion_s >= until_s:
                req.completion_s = nan
