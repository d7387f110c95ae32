"""A replica: vLLM-style continuous batching over a paged KV cache.

The model
---------
A replica has a waiting queue (FIFO; preempted requests go back to its
front) and a running batch in admission order. Every engine step it

1. gives each *decoding* request one token (decodes are scheduled first,
   so ``max_num_batched_tokens >= max_num_seqs`` guarantees every decoding
   request advances every step, as in vLLM's chunked-prefill scheduler);
2. gives each running request still in prefill a chunk of the remaining
   token budget, in admission order;
3. admits waiting requests in FIFO order while a sequence slot, token
   budget and KV blocks for their first chunk remain (nothing is admitted in
   a step that had to preempt).

A request holds ``ceil(computed_tokens / block_size)`` blocks. When a step
cannot get the blocks it needs, the most recently admitted running request
is preempted: its blocks are freed and it returns to the front of the
waiting queue, to be *recomputed* (its next prefill covers the prompt plus
every token generated so far). The step that completes a prefill emits a
token; each decode step emits one more. Step duration comes from the
:class:`~simpy_llm.serving.latency.LatencyModel`.

One event per batch-composition change
--------------------------------------
In ``event_per_change`` mode a stretch of pure-decode steps in which no
request joins or leaves is a single timeout: its length is the smaller of
the steps until the first request finishes and the steps until the KV cache
cannot grow. A request entering the waiting queue mid-stretch wakes the
engine, which waits for the step in progress to end, settles the steps done
and schedules the newcomer at that boundary. Per-request token counts and KV
blocks during decoding are derived from the step counter at which decoding
started (``decode_anchor_step``), never incremented per step; KV growth over
a stretch is counted through a histogram of each decoder's position within
its last block.

``event_per_step`` mode takes one event per step and runs the full scheduler
every step; it is the reference the fast mode is tested against (identical
records), and the mode in which an optional :data:`TokenListener` hears of
every output token as its step ends (the emulated server streams with it).
Both modes compute a step's end as ``segment_start + k * step_s`` over a run
of identical steps, so their clocks agree to the bit. Step ends
are scheduled at a priority after every ordinary event, so a request arriving
exactly at a step boundary is admitted at that boundary in both modes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import simpy
from simpy.events import Event

from simpy_llm.entities import Request
from simpy_llm.serving.kv_cache import PagedKVCache, blocks_for

if TYPE_CHECKING:
    from simpy_llm.wire import Wire
    from collections.abc import Generator

    from simpy_llm.config.schema import EngineConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.serving.latency import LatencyModel

__all__ = ["LATE", "Replica", "ReplicaStats", "TokenListener"]

LATE = 2
"""SimPy priority of step-end events: after NORMAL (1) events at the same instant."""

TokenListener = Callable[[Request, int, float], None]
"""Called as ``listener(request, tokens, visible_s)`` each time *request* produces an output
token: *tokens* is its output tokens so far, *visible_s* when the client sees that token
(the step's end plus ``tokens x output_token_overhead_s``, so the first call's time is
``first_token_s`` and the last call's ``completion_s``). Called from the step-end event,
before the request completes; it must not touch the environment or the replica."""


class _StepEnd(Event):
    """A timeout processed after every NORMAL event scheduled for the same time."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        # Same initialisation as simpy.Timeout, but scheduled at LATE priority.
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        env.schedule(self, LATE, delay if delay > 0.0 else 0.0)


@attrs.frozen(kw_only=True)
class ReplicaStats:
    """A snapshot of a replica's counters."""

    steps: int
    """Engine steps run."""
    waiting: int
    """Requests in the waiting queue."""
    running: int
    """Requests in the running batch."""
    outstanding: int
    """Requests routed here and not finished."""
    kv_used_blocks: int
    """KV blocks held."""
    kv_peak_used_blocks: int
    """Most KV blocks held at once."""
    preemptions: int
    """Preemptions so far."""


class Replica:
    """One model replica: an ingress process and a continuous-batching engine process.

    Parameters
    ----------
    env
        The SimPy environment.
    index
        The replica's number (in records and routing views).
    inbox
        Store the router puts requests into.
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
    ) -> None:
        if token_listener is not None and fast:
            raise ValueError("a token_listener needs one event per step: fast=False (simulation.mode event_per_step)")
        self.env = env
        self.index = index
        self.inbox = inbox
        self.config = config
        self.latency = latency
        self.recorder = recorder
        self.fast = fast
        self.completions = completions
        self.token_listener = token_listener

        bs = config.kv_block_size
        self.kv = PagedKVCache(config.kv_num_blocks, bs)
        capacity = config.kv_num_blocks * bs
        limit = config.max_model_len if config.max_model_len is not None else capacity
        if not config.chunked_prefill:
            limit = min(limit, config.max_num_batched_tokens)
        self.max_model_len = min(limit, capacity)
        """Longest prompt + output accepted; longer requests are dropped."""

        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        """Running batch by request id, in admission order."""
        self._prefilling: dict[int, Request] = {}
        """The running requests still in prefill, in admission order."""
        self._finish_heap: list[tuple[int, int, int, Request]] = []
        """(step producing the last token, request id, anchor step, request) per decoder; an
        entry whose anchor differs from the request's current one is stale (preempted since)."""
        self._residue = [0] * bs
        """Decoders by ``(kv_tokens_at_anchor - anchor_step) % block_size``: a decoder
        needs a new block at step ``s`` iff ``(residue + s) % block_size == 0``."""
        self.outstanding = 0
        self.num_preemptions = 0

        self.step = 0
        """Engine step counter: steps completed so far."""
        self._clock = 0.0
        self._seg_start = 0.0
        self._seg_step_s = -1.0
        self._seg_steps = 0
        self._changed = True
        self._preempted_now = False
        self._idle_signal: Event | None = None
        """Succeeds when a request enters the waiting queue of an idle engine."""
        self._interruptible = False
        """True while the engine sits in a decode stretch that a newcomer could join."""
        self._alpha2 = latency.output_token_overhead_s

        env.process(self._ingress())
        self.process = env.process(self._engine())

    # --- read-only view for routing policies -----------------------------
    @property
    def outstanding_requests(self) -> int:
        return self.outstanding

    @property
    def waiting_requests(self) -> int:
        return len(self.waiting)

    @property
    def running_requests(self) -> int:
        return len(self.running)

    @property
    def kv_free_blocks(self) -> int:
        return self.kv.free_blocks

    def statistics(self) -> ReplicaStats:
        """Current counters."""
        return ReplicaStats(
            steps=self.step,
            waiting=len(self.waiting),
            running=len(self.running),
            outstanding=self.outstanding,
            kv_used_blocks=self.kv.used_blocks,
            kv_peak_used_blocks=self.kv.peak_used_blocks,
            preemptions=self.num_preemptions,
        )

    def in_flight(self) -> list[Request]:
        """Requests routed here that have not finished (running, waiting or in ingress)."""
        seen = {**self.running, **{r.id: r for r in self.waiting}}
        return list(seen.values())

    # --- ingress -----------------------------------------------------------
    def _ingress(self) -> Generator[Event, Request, None]:
        """Take routed requests from the inbox; each enters the waiting queue after
        the latency model's queueing time (requests over ``max_model_len`` are dropped).

        Yields
        ------
        StoreGet
            The next request from the inbox.
        """
        env = self.env
        queueing_time_s = self.latency.queueing_time_s
        get = self.inbox.get
        while True:
            req = yield get()
            if req.prompt_tokens + req.output_tokens > self.max_model_len:
                req.dropped_reason = f"prompt + output exceeds max_model_len {self.max_model_len}"
                self.outstanding -= 1
                self.recorder.on_drop(req)
                self.recorder.on_departure(env.now)
                if self.completions is not None:
                    self.completions.put(req)
                continue
            delay = queueing_time_s(req.prompt_tokens)
            if delay > 0.0:
                env.timeout(delay, req).callbacks.append(self._enqueue_event)
            else:
                self._enqueue(req)

    def _enqueue_event(self, event: Event) -> None:
        self._enqueue(event.value)

    def _enqueue(self, req: Request) -> None:
        req.enqueue_s = self.env.now
        req.prefill_target = req.prompt_tokens
        self.waiting.append(req)
        if self._interruptible:
            self._interruptible = False
            self.process.interrupt()
        elif self._idle_signal is not None and not self._idle_signal.triggered:
            self._idle_signal.succeed()

    # --- engine ----------------------------------------------------------
    def _engine(self) -> Generator[Event, object, None]:
        """The engine loop: schedule a step (or a stretch of identical decode steps),
        wait for it to end, settle it.

        Yields
        ------
        Event
            The idle signal (a request entered the waiting queue) and step-end
            events (LATE priority); a decode stretch may be interrupted by an
            arrival that can join the batch.
        """
        env = self.env
        step_time_s = self.latency.step_time_s
        running = self.running
        waiting = self.waiting
        while True:
            if not running and not waiting:
                self._idle_signal = Event(env)
                yield self._idle_signal
                self._idle_signal = None
                self._clock = env.now
                self._changed = True

            chunks, n_decode, prefill_tokens, kv_used = self._schedule()
            step_s = step_time_s(prefill_tokens, n_decode)
            if chunks or self._changed or step_s != self._seg_step_s:
                self._seg_start = self._clock
                self._seg_step_s = step_s
                self._seg_steps = 0
            self._changed = False
            seg_start = self._seg_start
            done = self._seg_steps

            if not chunks and not n_decode:
                raise RuntimeError(f"replica {self.index}: waiting requests but nothing schedulable")
            if chunks or not self.fast or self._preempted_now:
                # A mixed step, the reference mode, or a step after a preemption
                # (whose victims may be readmitted next step): one event.
                yield _StepEnd(env, seg_start + (done + 1) * step_s - env.now)
                self._settle_step(chunks, n_decode, prefill_tokens, kv_used, step_s)
                continue

            # A stretch of identical pure-decode steps, one event. An arrival that
            # could join the batch interrupts it (see _enqueue).
            k = self._stretch_length()
            self._interruptible = not waiting and len(running) < self.config.max_num_seqs
            try:
                yield _StepEnd(env, seg_start + (done + k) * step_s - env.now)
            except simpy.Interrupt:
                # Finish the step in progress; the newcomer is scheduled at its end.
                now = env.now
                j = done + 1 + max(int((now - seg_start) / step_s) - done - 1, 0)
                while seg_start + j * step_s < now:
                    j += 1
                while j > done + 1 and seg_start + (j - 1) * step_s >= now:
                    j -= 1
                k = min(j - done, k)
                yield _StepEnd(env, seg_start + (done + k) * step_s - now)
            self._interruptible = False
            self._settle_decode_stretch(k, n_decode, kv_used, step_s)

    # --- scheduling --------------------------------------------------------
    def _decoder_kv_tokens(self, req: Request) -> int:
        return req.kv_tokens + (self.step - req.decode_anchor_step)

    def _schedule(self) -> tuple[list[tuple[Request, int]], int, int, int]:
        """Plan step ``self.step``: allocate its KV blocks, preempting if needed, and
        admit waiting requests.

        Returns (prefill chunks, decoding requests, prefill tokens, KV blocks used).
        """
        cfg = self.config
        kv = self.kv
        bs = kv.block_size
        s = self.step
        running = self.running
        prefilling = self._prefilling
        n_decode = len(running) - len(prefilling)
        budget = cfg.max_num_batched_tokens - n_decode

        decode_need = self._residue[-s % bs] if n_decode else 0
        chunks: list[tuple[Request, int]] = []
        need = decode_need
        for req in prefilling.values():
            chunk = self._chunk_size(req.prefill_target - req.kv_tokens, budget)
            if not chunk:
                break
            chunks.append((req, chunk))
            budget -= chunk
            need += blocks_for(req.kv_tokens + chunk, bs) - blocks_for(req.kv_tokens, bs)

        preempted = self._preempted_now = False
        if need <= kv.free_blocks:
            kv.allocate(need)
        else:
            chunks, n_decode, budget = self._allocate_in_order()
            preempted = self._preempted_now = True

        if not preempted:
            max_seqs = cfg.max_num_seqs
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < max_seqs:
                req = waiting[0]
                chunk = self._chunk_size(req.prefill_target, budget)
                if not chunk:
                    break
                blocks = blocks_for(chunk, bs)
                if blocks > kv.free_blocks:
                    break
                waiting.popleft()
                kv.allocate(blocks)
                running[req.id] = req
                prefilling[req.id] = req
                if req.first_scheduled_s != req.first_scheduled_s:  # nan: first time
                    req.first_scheduled_s = self._clock
                chunks.append((req, chunk))
                budget -= chunk
                self._changed = True

        prefill_tokens = 0
        for _req, chunk in chunks:
            prefill_tokens += chunk
        return chunks, n_decode, prefill_tokens, kv.used_blocks

    def _chunk_size(self, remaining: int, budget: int) -> int:
        """Prefill tokens to schedule for a request with *remaining* uncomputed tokens:
        all of them if they fit *budget*, else a budget-sized chunk (chunked prefill)
        or none (the prompt must go whole)."""
        if remaining <= budget:
            return remaining
        return budget if self.config.chunked_prefill else 0

    def _allocate_in_order(self) -> tuple[list[tuple[Request, int]], int, int]:
        """Slow path when the step's blocks do not all fit: walk the running batch in
        admission order, preempting the most recently admitted request until each
        request's blocks fit (vLLM's recompute preemption)."""
        cfg = self.config
        kv = self.kv
        bs = kv.block_size
        running = self.running
        prefilling = self._prefilling
        budget = cfg.max_num_batched_tokens - (len(running) - len(prefilling))
        chunks: list[tuple[Request, int]] = []
        scheduled_decoders = 0
        order = list(running.values())
        for req in order:
            if req.id not in running:
                break  # preempted as a victim: so is everyone after it
            if req.id in prefilling:
                chunk = self._chunk_size(req.prefill_target - req.kv_tokens, budget)
                if not chunk:
                    continue
                need = blocks_for(req.kv_tokens + chunk, bs) - blocks_for(req.kv_tokens, bs)
            else:
                chunk = 0
                need = 1 if (self._decoder_kv_tokens(req)) % bs == 0 else 0
            while need > kv.free_blocks:
                victim = running[next(reversed(running))]
                self._preempt(victim)
                if victim is req:
                    break
            if req.id not in running:
                break
            kv.allocate(need)
            if chunk:
                chunks.append((req, chunk))
                budget -= chunk
            else:
                scheduled_decoders += 1
        return chunks, scheduled_decoders, budget

    def _preempt(self, req: Request) -> None:
        """Free *req*'s blocks and put it at the front of the waiting queue for recompute."""
        bs = self.kv.block_size
        now = self._clock
        del self.running[req.id]
        if req.id in self._prefilling:
            del self._prefilling[req.id]
            held = blocks_for(req.kv_tokens, bs)
        else:
            tokens = self._decoder_kv_tokens(req)
            held = blocks_for(tokens, bs)
            self._residue[(req.kv_tokens - req.decode_anchor_step) % bs] -= 1
            req.generated_tokens += self.step - req.decode_anchor_step
            req.decode_anchor_step = -1  # its finish-heap entry is now stale
            req.last_token_engine_s = now
        self.kv.release(held)
        req.kv_tokens = 0
        req.prefill_target = req.prompt_tokens + req.generated_tokens
        if req.preemption_times_s is None:
            req.preemption_times_s = []
        req.preemption_times_s.append(now)
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        self.recorder.on_preemption(req, self.index, now)
        self._changed = True

    def _stretch_length(self) -> int:
        """Steps from ``self.step`` on that need no scheduling decision: up to and
        including the first finish, and no further than the KV cache can grow."""
        heap = self._finish_heap
        while heap[0][3].decode_anchor_step != heap[0][2]:
            heapq.heappop(heap)
        k_finish = heap[0][0] - self.step + 1
        # Steps after this one whose block allocations still fit.
        residue = self._residue
        bs = self.kv.block_size
        n = len(self.running)
        free = self.kv.free_blocks
        full_cycles = free // n
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
    def _advance(self, steps: int, step_s: float) -> float:
        self.step += steps
        self._seg_steps += steps
        self._clock = self._seg_start + self._seg_steps * step_s
        return self._clock

    def _settle_decode_stretch(self, k: int, n_decode: int, kv_used: int, step_s: float) -> None:
        """Account *k* pure-decode steps starting at ``self.step``."""
        s0 = self.step
        bs = self.kv.block_size
        residue = self._residue
        # Blocks allocated at steps s0+1 .. s0+k-1 and their time integral.
        grown = 0
        weighted = 0
        for r in range(1, min(bs, k - 1) + 1):
            a = residue[-(s0 + r) % bs]
            if a:
                count = (k - 1 - r) // bs + 1
                grown += a * count
                weighted += a * (count * (k - r) - bs * count * (count - 1) // 2)
        if grown:
            self.kv.allocate(grown)
        self.recorder.on_steps(self.index, step_s, k, n_decode, 0, n_decode, step_s * (kv_used * k + weighted))
        self.recorder.on_token_gaps(step_s + self._alpha2, n_decode * k)
        last = s0 + k - 1
        end = self._advance(k, step_s)
        self._finish_decoders(last, end)

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
        batch = n_decode + len(chunks)
        self.recorder.on_steps(self.index, step_s, 1, batch, prefill_tokens, n_decode, step_s * kv_used)
        if n_decode:
            self.recorder.on_token_gaps(step_s + self._alpha2, n_decode)
        end = self._advance(1, step_s)
        listener = self.token_listener
        if n_decode:
            if listener is not None:
                self._report_decode_tokens(listener, end)
            self._finish_decoders(s, end)
        bs = self.kv.block_size
        alpha2 = self._alpha2
        for req, chunk in chunks:
            req.kv_tokens += chunk
            if req.kv_tokens < req.prefill_target:
                continue
            # Prefill complete: this step emitted a token.
            self._changed = True
            del self._prefilling[req.id]
            req.generated_tokens += 1
            g = req.generated_tokens
            if g == 1:
                req.first_token_s = end + alpha2
            else:
                self.recorder.on_token_gaps(end - req.last_token_engine_s + alpha2, 1)
            if listener is not None:
                listener(req, g, end + g * alpha2)
            if g >= req.output_tokens:
                self._complete(req, end, blocks_for(req.kv_tokens, bs))
                continue
            req.decode_anchor_step = s + 1
            self._residue[(req.kv_tokens - s - 1) % bs] += 1
            heapq.heappush(self._finish_heap, (s + req.output_tokens - g, req.id, s + 1, req))

    def _report_decode_tokens(self, listener: TokenListener, end: float) -> None:
        """Tell *listener* of the token each decoding request produced in the step ending at
        *end* (called after ``_advance``, before finished decoders leave the batch)."""
        alpha2 = self._alpha2
        step = self.step
        prefilling = self._prefilling
        for req in self.running.values():
            if req.id not in prefilling:
                g = req.generated_tokens + step - req.decode_anchor_step
                listener(req, g, end + g * alpha2)

    def _finish_decoders(self, last_step: int, end: float) -> None:
        """Complete the decoders whose last token came out of step *last_step*."""
        heap = self._finish_heap
        bs = self.kv.block_size
        while heap and heap[0][0] <= last_step:
            _, _, anchor, req = heapq.heappop(heap)
            if req.decode_anchor_step != anchor:
                continue  # stale: preempted since it was pushed
            steps = last_step + 1 - req.decode_anchor_step
            tokens = req.kv_tokens + steps
            self._residue[(req.kv_tokens - req.decode_anchor_step) % bs] -= 1
            req.generated_tokens += steps
            req.kv_tokens = tokens
            req.decode_anchor_step = -1
            self._complete(req, end, blocks_for(tokens, bs))

    def _complete(self, req: Request, end: float, held_blocks: int) -> None:
        del self.running[req.id]
        self.kv.release(held_blocks)
        req.completion_s = end + req.output_tokens * self._alpha2
        self.outstanding -= 1
        self._changed = True
        self.recorder.on_complete(req)
        self.recorder.on_departure(end)
        if self.completions is not None:
            self.completions.put(req)
