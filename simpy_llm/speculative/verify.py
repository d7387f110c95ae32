"""A target replica of speculative decoding: a verify server (seed 003 §6.2, §7).

Kept whole (over 800 lines): the start and end of a pass, the cut of a pass by an
at-risk job and its re-run, admission and departure all change one state (the two
queues, the pass in progress, the KV) from SimPy callbacks, and read best side by side;
what prefix caching adds to the KV is :mod:`simpy_llm.speculative.verify_cache`.

A :class:`VerifyServer` takes three kinds of job and runs them in **passes**, one
SimPy timeout per pass:

* **prefill** of a newly routed request (its prompt, computing the first token);
* **verify** of a bundle of γ draft tokens a draft device sent (distributed mode);
* **fused** round: the target drafts γ tokens with its own draft model and verifies
  them in the same pass (fused mode; no bundle crosses the network).

Which job goes first is the verify ``order``: ``fcfs`` (arrival), ``edf`` (deadline:
the round's start plus the request's SLO class's ``tvt_s``, else ``tpot_s x (γ + 1)``,
else none; a prefill's deadline is its arrival plus ``ttft_s``) or ``least_slack``
(deadline minus the job's own verify time). A pass is either prefills (taken in order
while their prompts fit ``max_num_batched_tokens`` and the KV guard admits them) or
verify/fused jobs (up to ``max_microbatch``, with selective batching by context
bucket and, with ``verify.cohort: prefix``, by prefix group: jobs outside the first one's
bucket or group wait unless already past their deadline).
Whichever queue's head comes first in the order runs. A pass in progress is not
interrupted (a forward pass is not preemptible), so at-risk work leads at pass
boundaries, where overdue jobs go first; with ``verify.preemption_slack_ms`` a round
job arriving that close to its deadline cuts the round pass in progress instead (its
work is lost): the job runs alone, then the cut pass again, whole, with the same draws.

A server is a resource driven by callbacks, not a process: a pass starts the moment the
server is idle and a job can run (an arrival, the end of the previous pass, or a
departure freeing KV), and its end is one timeout (so a round costs one event here).

Costs (``docs/speculative.md``): a prefill pass is the latency model's
``step_time_s(P, 0)``; a verify pass over sequences with contexts ``c_i`` verifying
``v_i`` drafted positions is read off a LUT's ``verify`` rows (``fanout_k = max v_i``,
at the mean context and ``microbatch`` = sequences) when the latency model is a LUT that
has them, else a decode step of ``sum(v_i + 1)`` tokens with attention over
``sum((v_i + 1) c_i)`` context tokens (with ``verify.cohort: prefix``, a shared prefix of
``P`` tokens read once: ``P + sum((v_i + 1) (c_i - P))``); plus, if fused jobs are in it,
``max γ`` draft steps of ``fused.draft_token_ms`` (a pass of fused jobs only: the LUT's
``fused_decode`` row instead, when it has one, drafting included), plus
``rollback_penalty_ms`` per mis-speculation partial verification let through. Each job's accepted prefix is
drawn from its drafter's acceptance curve at its context when the pass starts (one
uniform through the inverse CDF of the accepted-prefix distribution).

KV: a request is admitted (its prefill may run) only while the KV in use plus its
prompt and output fit the guard, ``max_kv_utilization x capacity`` (``kv_spill:
queue``); with ``kv_spill: fused`` it is admitted up to the whole capacity and runs
fused when it pushed use past the guard. It holds that reservation until it leaves.
With ``verify.prefix_caching`` the KV is the engine's paged prefix cache
(:class:`~simpy_llm.serving.prefix_cache.PrefixCache`): a request reserves the blocks of
its prompt and output less those it finds cached, its prefill computes the uncached
prompt tokens only, and its blocks stay cached, evictable, when it leaves.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from simpy_llm.policies.mode import ModeState
from simpy_llm.serving.kv_cache import TokenMemory
from simpy_llm.speculative.verify_cache import VerifyCache

if TYPE_CHECKING:
    import numpy as np
    from simpy.events import Event

    from simpy_llm.config.speculation import SpeculationConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.serving.prefix_cache import PrefixCache
    from simpy_llm.wire import Wire

__all__ = ["VerifyServer", "verify_pass_s"]

PREFILL, VERIFY, FUSED = 0, 1, 2
UNIFORM_CHUNK = 1024
"""Uniforms a verify server draws from its stream at a time."""
WAIT_EWMA = 0.2
"""Weight of the newest job in a server's smoothed verify queue wait and pass time."""


def verify_pass_s(latency: Any, contexts: list[int], verified: list[int]) -> float:
    """Time of one verify pass on *latency*: its ``verify_time_s(contexts, verified)`` when it
    has one that answers (a LUT with ``verify`` rows for the pass's fanout), else a decode
    step of ``sum(v + 1)`` tokens whose attention reads ``sum((v + 1) c)`` context tokens
    (module docstring).

    >>> from simpy_llm.serving.latency import BlisLinearLatency
    >>> verify_pass_s(BlisLinearLatency(beta0_us=5000.0, beta2_us=100.0), [512, 512], [4, 3])
    0.0059
    """
    return _pass_time_s(latency.verify_time_s, latency.uses_context, latency.step_time_s, contexts, verified)


def _pass_time_s(
    from_table: Callable[[list[int], list[int]], float | None] | None, uses_context: bool, step_time_s: Callable[..., float],
    contexts: list[int], verified: list[int], shared: int = 0,
) -> float:
    """:func:`verify_pass_s` given what it reads off the latency model: its ``verify_time_s``
    (None: it has none), whether it ``uses_context``, and its ``step_time_s``. With *shared* > 0
    (a cohort's common prefix, ``verify.cohort: prefix``) the attention reads the first *shared*
    context tokens of every sequence once for the pass: ``shared + sum((v + 1) (c - shared))``."""
    if from_table is not None:
        found = from_table(contexts, verified)
        if found is not None:
            return found
    tokens = 0
    context = shared
    for c, v in zip(contexts, verified, strict=True):
        tokens += v + 1
        context += (v + 1) * (c - shared)
    if uses_context:
        return step_time_s(0, tokens, decode_context_tokens=context)
    return step_time_s(0, tokens)


def _pass_timer(latency: Any) -> Callable[..., float]:
    """:func:`verify_pass_s` on *latency* as a server calls it every pass and round: the model's
    optional capabilities read once, and a model that has no verify table and ignores the
    context times ``sum(v + 1)`` decode tokens directly."""
    from_table = latency.verify_time_s
    uses_context = latency.uses_context
    step_time_s = latency.step_time_s
    if from_table is None and not uses_context:
        return lambda contexts, verified, shared=0: step_time_s(0, sum(verified) + len(verified))
    return functools.partial(_pass_time_s, from_table, uses_context, step_time_s)


class _Pass:
    """A round pass: its jobs, their accepted counts and rollbacks (drawn as it started), and
    its duration."""

    __slots__ = ("accepted", "batch", "rollback", "step_s")

    def __init__(self, batch: list[_Job], accepted: list[float], rollback: list[bool], step_s: float) -> None:
        self.batch = batch
        self.accepted = accepted
        self.rollback = rollback
        self.step_s = step_s


class _Job:
    """One unit of work waiting at a verify server."""

    __slots__ = ("deadline_s", "enqueued_s", "gamma", "kind", "req")

    def __init__(self, kind: int, req: Request, gamma: int, enqueued_s: float, deadline_s: float) -> None:
        self.kind = kind
        self.req = req
        self.gamma = gamma
        self.enqueued_s = enqueued_s
        self.deadline_s = deadline_s


class VerifyServer:
    """A target replica running prefills, verify passes and fused rounds (module docstring).

    It offers what routing views and the simulation read from a replica (``waiting``,
    ``running``, ``kv``, ``departed``, ``settle``...), so the scenario's routers and
    clusters route prompts to it unchanged.

    Parameters
    ----------
    env
        The SimPy environment.
    index
        Its fleet index.
    inbox
        Wire the router puts prompts into (connected to :meth:`arrive`).
    latency
        Its group's latency model.
    recorder
        Where lifecycle, pass and round records go.
    config
        The scenario's ``speculation`` section.
    kv_capacity_tokens
        KV capacity, tokens (its engine's blocks x block size).
    max_prefill_tokens
        Most prompt tokens one prefill pass takes (its engine's ``max_num_batched_tokens``).
    max_seqs
        Most requests admitted at once (its engine's ``max_num_seqs``; None: no limit).
    max_model_len
        Longest prompt plus output it serves; a longer request is dropped (``max_model_len``).
    rng
        Random stream of its acceptance draws and partial-verification samples (uniforms,
        drawn :data:`UNIFORM_CHUNK` at a time, used in order: per job of a pass, its
        partial-verification samples, then its acceptance draw).
    fused_acceptance
        The fused draft model's acceptance curve (None without ``speculation.fused``).
    slo
        ``{class: (ttft_s, tpot_s, tvt_s)}`` targets (None where not set), for deadlines.
    send_verdict
        ``send_verdict(req, tokens)``: the verdict of a distributed round (or a finished
        request's answer) goes back to its draft device.
    completions
        Optional Wire receiving each request that leaves (completed or dropped).
    group
        Its replica group's name.
    throttle
        ``(after_s, factor)``: after that long busy without a break, passes take
        ``1 / factor`` as long, until it idles.
    load_s
        Cold start before its first pass (busy meanwhile), and before the first pass after
        each unload (``warm_retention_s``).
    warm_retention_s
        With a cold start: idle longer than this (no job queued and no request admitted), it
        unloads its model and pays ``load_s`` again before its next pass (None: it never
        unloads).
    kv_block_size
        Tokens per KV block of its prefix cache (its engine's ``kv_block_size``; read only
        with ``verify.prefix_caching``).
    """

    prefix_cache: PrefixCache | None = None
    """Its KV blocks with ``verify.prefix_caching`` (None without: each conversation's KV is its own)."""

    def prefix_hit_tokens(self, request: Request) -> int:
        """Prompt tokens of *request* its prefix cache would find now (0 without one)."""
        cache = self.prefix_cache
        return 0 if cache is None else cache.hit_tokens(request)

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        inbox: Wire,
        latency: Any,
        recorder: Recorder,
        config: SpeculationConfig,
        *,
        kv_capacity_tokens: int,
        max_prefill_tokens: int,
        max_seqs: int | None = None,
        max_model_len: int | None = None,
        rng: np.random.Generator,
        fused_acceptance: Any,
        slo: dict[str, tuple[float | None, float | None, float | None]],
        send_verdict: Callable[[Request, int], None],
        completions: Wire | None = None,
        group: str = "default",
        throttle: tuple[float, float] | None = None,
        load_s: float = 0.0,
        kv_block_size: int = 16,
        warm_retention_s: float | None = None,
    ) -> None:
        self.env = env
        self.index = index
        self.group = group
        self.latency = latency
        self.recorder = recorder
        self.config = config
        self.verify = config.verify
        self._memory = TokenMemory(kv_capacity_tokens)
        """KV counted in tokens, each request's reserved whole (without prefix caching)."""
        self.kv: TokenMemory | PrefixCache = self._memory
        self._kv_capacity = kv_capacity_tokens
        self._blocks: VerifyCache | None = None
        """The KV with ``verify.prefix_caching`` (None without)."""
        if config.verify.prefix_caching:
            share = 1.0 if config.verify.kv_spill == "fused" else config.verify.max_kv_utilization
            self._blocks = VerifyCache(kv_capacity_tokens // kv_block_size, kv_block_size, share)
            self.kv = self.prefix_cache = self._blocks.cache
        self.max_prefill_tokens = max_prefill_tokens
        self.max_seqs = max_seqs
        self.max_model_len = max_model_len
        self.rng = rng
        self._uniforms: list[float] = []
        self._pass_s = _pass_timer(latency)
        self._fused_table = latency.fused_time_s
        """The latency model's table of fused steps (a LUT's ``fused_decode`` rows), or None."""
        self._cohort = self.verify.cohort == "prefix"
        """Whether a pass takes one prefix group's jobs (``verify.cohort: prefix``)."""
        # Read on every pass: the settings as plain attributes.
        self._temperature = config.temperature
        self._expected = config.acceptance_sampling == "expected"
        self._partial = config.verify.partial
        self._rollback_s = config.verify.rollback_penalty_ms / 1e3
        self.fused_acceptance = fused_acceptance
        self.fused_draft_s = config.fused.draft_token_ms / 1e3 if config.fused is not None else 0.0
        self.slo = slo
        self.send_verdict = send_verdict
        self.completions = completions
        self.throttle = throttle
        self.load_s = load_s
        self.step = 0
        """Passes run."""
        self.departed = 0
        self.departed_tokens = 0
        self.queued_prompt_tokens = 0
        """Prompt tokens waiting for their prefill."""
        self.prefill_s_per_token = latency.step_time_s(1024, 0) / 1024
        """What routers assume a prompt token costs."""
        self.running: dict[int, Request] = {}
        """Admitted requests (prefilled or being prefilled) that have not left, by id."""
        self.prefills: list[tuple] = []
        """Heap of waiting prefill jobs."""
        self.rounds: list[tuple] = []
        """Heap of waiting verify and fused jobs."""
        self.queue_wait_s = 0.0
        """Smoothed wait of a verify job before its pass, s."""
        self.pass_s = 0.0
        """Smoothed duration of a verify pass, s."""
        self._seq = 0
        self._busy = False
        self._loaded = load_s <= 0.0
        self._retention = warm_retention_s if load_s > 0.0 else None
        """Idle time after which it unloads (None: never; a server without a cold start keeps its model)."""
        self._idle_since = math.inf
        """Since when it has had no job and no admitted request (inf: it has one now), kept with a retention."""
        self._load_end_s: float | None = None
        """When the cold start in progress ends (None: none is)."""
        self.cold_starts = 0
        """Cold starts paid, the first included."""
        self._busy_since: float | None = None
        self._kv_since = 0.0
        self._pass_start = math.nan
        self._preempt_s = None if config.verify.preemption_slack_ms is None else config.verify.preemption_slack_ms / 1e3
        """Slack below which an arriving round job cuts the round pass in progress, s (None: never)."""
        self._round_pass: _Pass | None = None
        """The round pass in progress (None: none runs); a pass's end timer that finds another
        here was cut, and does nothing."""
        self._cut: tuple[_Pass, float] | None = None
        """The round pass cut by an at-risk job, to run again after it: the pass and its
        duration before throttling."""
        # Optional capabilities of the latency model (absent: none), read once.
        self._output_overhead_s = float(latency.output_token_overhead_s)
        self._queueing = latency.queueing_time_s
        self._uses_context = latency.uses_context
        inbox.connect(self.arrive)

    # ------------------------------------------------------------------ views
    @property
    def waiting(self) -> list[tuple]:
        """Waiting prefill jobs (``len()``: requests waiting for their prefill)."""
        return self.prefills

    def in_flight(self) -> list[Request]:
        """Requests routed here that have not left."""
        waiting = [entry[-1].req for entry in self.prefills]
        return sorted([*self.running.values(), *waiting], key=lambda r: r.id)

    def set_max_num_seqs(self, value: int) -> None:
        """Admit new requests only while it holds fewer than *value* (requests already
        admitted above a lowered limit keep running); a raised limit may admit at once."""
        self.max_seqs = value
        if not self._busy:
            self._kick()

    # ------------------------------------------------------------------ arrivals
    def arrive(self, req: Request) -> None:
        """A routed prompt: queued for prefill after the latency model's queueing overhead
        (dropped at once when longer than ``max_model_len`` or than the whole KV)."""
        limit = self.max_model_len
        if (limit is not None and req.prompt_tokens + req.output_tokens > limit) or (
            req.prompt_tokens + req.output_tokens > self._kv_capacity
        ):
            self.abort(req, "max_model_len" if limit is not None and req.prompt_tokens + req.output_tokens > limit else "kv_capacity")
            self.send_verdict(req, 0)
            return
        delay = self._queueing(req.prompt_tokens)
        self.queued_prompt_tokens += req.prompt_tokens
        if delay > 0.0:
            self.env.timeout(delay).callbacks.append(functools.partial(self._enqueue_prefill, req))
        else:
            self._enqueue_prefill(req)

    def _enqueue_prefill(self, req: Request, _event: Event | None = None) -> None:
        now = self.env.now
        req.enqueue_s = now
        ttft = self.slo.get(req.slo_class, (None, None, None))[0]
        deadline = now + ttft if ttft is not None else math.inf
        self._push(self.prefills, _Job(PREFILL, req, 0, now, deadline), 0.0)

    def submit(self, req: Request, gamma: int, round_start_s: float, kind: int = VERIFY) -> None:
        """A round of *req* proposing *gamma* tokens waits for a pass (a bundle that arrived,
        or the next fused round)."""
        now = self.env.now
        _ttft, tpot, tvt = self.slo.get(req.slo_class, (None, None, None))
        if tvt is not None:
            deadline = round_start_s + tvt
        elif tpot is not None:
            deadline = round_start_s + tpot * (gamma + 1)
        else:
            deadline = math.inf
        own = self._own_s(kind, req, gamma) if self.verify.order == "least_slack" else 0.0
        job = _Job(kind, req, gamma, now, deadline)
        if self._preempt_s is not None and self._busy and self._preempts(job):
            return
        self._push(self.rounds, job, own)

    def _push(self, heap: list[tuple], job: _Job, own_s: float) -> None:
        order = self.verify.order
        self._seq += 1
        key = job.enqueued_s if order == "fcfs" else (job.deadline_s - own_s if order == "least_slack" else job.deadline_s)
        heapq.heappush(heap, (key, self._seq, job))
        if not self._busy:
            self._kick()

    # ------------------------------------------------------------------ the server
    def _admissible(self, req: Request) -> bool:
        if self.max_seqs is not None and len(self.running) >= self.max_seqs:
            return False
        blocks = self._blocks
        if blocks is not None:
            return blocks.plan(req) is not None
        need = req.prompt_tokens + req.output_tokens
        memory = self._memory
        limit = memory.num_blocks * (1.0 if self.verify.kv_spill == "fused" else self.verify.max_kv_utilization)
        return memory.used_blocks + need <= limit

    def _kv_change(self, tokens: int) -> None:
        """KV in use changes by *tokens*: the time integral of use so far goes to the recorder
        (a request holds its reservation between passes too, while its bundle travels)."""
        now = self.env.now
        memory = self._memory
        self.recorder.kv_block_seconds[self.index] += memory.used_blocks * (now - self._kv_since)
        self._kv_since = now
        memory.used_blocks += tokens

    def _kv_mark(self) -> None:
        """The prefix cache's use is about to change: the time integral of use so far goes to
        the recorder, in blocks."""
        now = self.env.now
        self.recorder.kv_block_seconds[self.index] += self.kv.used_blocks * (now - self._kv_since)
        self._kv_since = now

    def _kick(self) -> None:
        """Start the next pass if the server is idle and a job can run (work-conserving: a
        pass starts the moment both hold; jobs arriving during a pass wait for the next)."""
        if self._busy:
            return
        heap = self._next_heap() if self.prefills else (self.rounds or None)
        if heap is None:
            self._busy_since = None
            if self._retention is not None:
                self._idle_since = self.env.now if not self.running else math.inf
            return
        env = self.env
        self._busy = True
        if self._busy_since is None:  # from idle: a cold start first when unloaded
            if not self._loaded or (self._retention is not None and env.now - self._idle_since > self._retention):
                self._start_load()
                return
            self._busy_since = env.now
        if heap is self.prefills:
            self._prefill_pass()
        else:
            self._verify_pass(self._take_round_batch())

    def _start_load(self) -> None:
        """Load the model (``load_s``, busy): the passes wait for its end."""
        env = self.env
        self._busy = True
        self._loaded = False
        self._load_end_s = env.now + self.load_s
        timer = env.timeout(self.load_s)
        timer.callbacks.append(functools.partial(self._loaded_at, env.now))

    def _loaded_at(self, start_s: float, _event: Event) -> None:
        """The cold start that began at *start_s* is over."""
        now = self.env.now
        self.recorder.on_cold_start(self.index, start_s, now)
        self.cold_starts += 1
        self._loaded = True
        self._load_end_s = None
        self._idle_since = now  # loaded now: its retention counts from here
        self._busy = False
        self._kick()

    def cold_wait_s(self) -> float:
        """The load a pass starting now would wait for, s: what is left of the cold start in
        progress, ``load_s`` when it is unloaded (never loaded, or idle past its
        ``warm_retention_s``), else 0.

        >>> import types
        >>> server = types.SimpleNamespace(  # a server idle since t = 1 s, with a 2 s load and 10 s of retention
        ...     env=types.SimpleNamespace(now=20.0), _load_end_s=None, _busy=False, _loaded=True,
        ...     _retention=10.0, _idle_since=1.0, load_s=2.0)
        >>> VerifyServer.cold_wait_s(server)  # idle 19 s: unloaded, the whole load
        2.0
        >>> server._idle_since = 15.0
        >>> VerifyServer.cold_wait_s(server)  # idle 5 s: still loaded
        0.0
        """
        end = self._load_end_s
        if end is not None:
            return end - self.env.now
        if self._busy:
            return 0.0  # a pass runs: the model is loaded
        if not self._loaded or (self._retention is not None and self.env.now - self._idle_since > self._retention):
            return self.load_s
        return 0.0

    def _pass_over(self) -> None:
        """A pass's jobs are settled: the server is idle until it starts the next (or runs
        the round pass an at-risk job cut, again)."""
        cut = self._cut
        if cut is not None:
            self._rerun(cut)
            return
        self._busy = False
        self._kick()

    def _next_heap(self) -> list[tuple] | None:
        """The queue whose head goes next (None: nothing can run now)."""
        prefill_ok = bool(self.prefills) and self._admissible(self.prefills[0][-1].req)
        if prefill_ok and self.rounds:
            return self.prefills if self.prefills[0][:2] <= self.rounds[0][:2] else self.rounds
        if prefill_ok:
            return self.prefills
        return self.rounds if self.rounds else None

    def _speed(self) -> float:
        """Duration factor of a pass starting now (thermal throttling)."""
        if self.throttle is None or self._busy_since is None:
            return 1.0
        after_s, factor = self.throttle
        return 1.0 / factor if self.env.now - self._busy_since >= after_s else 1.0

    def _prefill_pass(self) -> None:
        """Start a prefill pass: the waiting prompts, in order, while they fit."""
        blocks = self._blocks
        if blocks is not None:
            self._cached_prefill_pass(blocks)
            return
        env = self.env
        now = env.now
        batch: list[Request] = []
        tokens = 0
        heap = self.prefills
        while heap:
            req = heap[0][-1].req
            if batch and tokens + req.prompt_tokens > self.max_prefill_tokens:
                break
            if not self._admissible(req):
                break
            heapq.heappop(heap)
            batch.append(req)
            tokens += req.prompt_tokens
            need = req.prompt_tokens + req.output_tokens
            self._kv_change(need)
            self.running[req.id] = req
            req.first_scheduled_s = now
            self._choose_mode(req)
        kv = self._memory
        if kv.used_blocks > kv.peak_used_blocks:
            kv.peak_used_blocks = kv.used_blocks
        self.queued_prompt_tokens -= tokens
        lat = self.latency
        if self._uses_context:
            pairs = sum(r.prompt_tokens * (r.prompt_tokens + 1) / 2 for r in batch)
            step_s = lat.step_time_s(tokens, 0, prefill_attention_pairs=pairs)
        else:
            step_s = lat.step_time_s(tokens, 0)
        step_s *= self._speed()
        self._pass_start = now
        env.timeout(step_s).callbacks.append(functools.partial(self._prefill_done, batch, tokens, step_s))

    def _cached_prefill_pass(self, blocks: VerifyCache) -> None:
        """Start a prefill pass with prefix caching: the waiting prompts, in order, while their
        uncached tokens fit ``max_num_batched_tokens`` and the KV guard admits them
        (:meth:`VerifyCache.admit <simpy_llm.speculative.verify_cache.VerifyCache.admit>`)."""
        env = self.env
        now = env.now
        batch: list[Request] = []
        tokens = 0
        prompts = 0
        pairs = 0.0
        restores = 0
        heap = self.prefills
        max_seqs = self.max_seqs
        while heap:
            req = heap[0][-1].req
            if max_seqs is not None and len(self.running) >= max_seqs:
                break
            plan = blocks.plan(req)
            if plan is None:
                break
            cached = plan[1].blocks * blocks.cache.block_size
            fresh = req.prompt_tokens - cached
            if batch and tokens + fresh > self.max_prefill_tokens:
                break
            heapq.heappop(heap)
            self._kv_mark()
            blocks.admit(req, plan)
            batch.append(req)
            tokens += fresh
            prompts += req.prompt_tokens
            pairs += fresh * cached + fresh * (fresh + 1) / 2  # token i after c cached attends to c + i + 1 keys
            self.running[req.id] = req
            req.first_scheduled_s = now
            req.cached_tokens = cached
            restores += cached > 0
            self._choose_mode(req)
        self.queued_prompt_tokens -= prompts
        lat = self.latency
        step_s = lat.step_time_s(tokens, 0, prefill_attention_pairs=pairs) if self._uses_context else lat.step_time_s(tokens, 0)
        if restores:  # a model that copies saved state back pays it per prompt starting from a cached prefix
            step_s += restores * lat.cache_restore_s
        step_s *= self._speed()
        self._pass_start = now
        env.timeout(step_s).callbacks.append(functools.partial(self._prefill_done, batch, tokens, step_s))

    def _prefill_done(self, batch: list[Request], tokens: int, step_s: float, _event: Event) -> None:
        """A prefill pass ended: each prompt has its first token."""
        self._pass_start = math.nan
        self.step += 1
        self.recorder.on_steps(self.index, step_s, 1, len(batch), tokens, 0, 0.0)
        end = self.env.now
        for req in batch:
            spec = req.spec
            assert spec is not None  # set while its device runs it
            req.generated_tokens = 1
            req.first_token_s = end + self._output_overhead_s
            spec.last_token_s = end
            if req.generated_tokens >= req.output_tokens:
                self._complete(req, 1)
                continue
            if spec.mode == "fused":
                self._next_fused(req, end)
            else:
                self.send_verdict(req, 1)
        self._pass_over()

    def _choose_mode(self, req: Request) -> None:
        """A request's mode, decided as its prefill starts (``hybrid``: the mode selector's;
        under a planned fused fraction: the draft fleet's :meth:`~simpy_llm.speculative.draft.DraftFleet.planned_mode`;
        ``kv_spill: fused``: fused once admitting it pushed KV use past the guard)."""
        spec = req.spec
        assert spec is not None  # set while its device runs it
        cfg = self.config
        if spec.fleet.fused_fraction is not None:  # the planner's mode mix
            spec.mode = spec.fleet.planned_mode()
        elif cfg.mode != "hybrid":
            spec.mode = cfg.mode
        else:
            spec.mode = spec.fleet.mode_selector.choose(self._mode_state(req))
        if cfg.verify.kv_spill == "fused" and self.kv.used_blocks > self.kv.num_blocks * cfg.verify.max_kv_utilization:
            spec.mode = "fused"
        req.spec_mode = spec.mode
        if spec.mode == "distributed":
            req.drafter = spec.drafter.name

    def _mode_state(self, req: Request) -> ModeState:
        spec = req.spec
        assert spec is not None  # set while its device runs it
        context = req.prompt_tokens + 1
        gamma = spec.first_gamma(self)
        drafter = spec.drafter
        rtt = spec.path.rtt_s  # the round trip to this target (rtt_ms_by_target)
        verify_s = self._pass_s([context], [gamma])
        temp = self.config.temperature
        dist_e = drafter.acceptance.expected_tokens(context, gamma, temp)
        dist = (gamma * drafter.draft_token_s + rtt + verify_s) / dist_e
        fused_e = self.fused_acceptance.expected_tokens(context, gamma, temp)
        fused = (gamma * self.fused_draft_s + verify_s) / fused_e
        return ModeState(
            draft_group=spec.device.group, rtt_s=rtt, verify_queue_wait_s=self.queue_wait_s,
            kv_utilization=min(1.0, self.kv.used_blocks / self.kv.num_blocks) if self.kv.num_blocks else 0.0,
            distributed_token_s=dist, fused_token_s=fused, gamma=gamma,
            target_cold_s=self.cold_wait_s(), distributed_ahead_s=gamma * drafter.draft_token_s + rtt,
            distributed_round_tokens=dist_e, fused_round_tokens=fused_e,
        )

    def _next_fused(self, req: Request, now: float) -> None:
        """Queue *req*'s next fused round (γ from its policy, seen from the target)."""
        spec = req.spec
        assert spec is not None  # set while its device runs it
        gamma = spec.next_gamma(self, fused=True)
        spec.round_start_s = now
        self.submit(req, gamma, now, FUSED)

    def _shared_prefix(self, batch: list[_Job]) -> int:
        """The prefix every request of *batch* shares (``verify.cohort: prefix``): its prefix
        group's tokens when all are of one non-empty group, else 0."""
        group = batch[0].req.prefix_group
        if not group or any(job.req.prefix_group != group for job in batch):
            return 0
        return min(job.req.prefix_tokens for job in batch)

    def _take_round_batch(self) -> list[_Job]:
        heap = self.rounds
        cap = self.verify.max_microbatch
        bucket_tokens = self.verify.context_bucket_tokens
        first = heapq.heappop(heap)[-1]
        batch = [first]
        if bucket_tokens is None and not self._cohort:
            while heap and len(batch) < cap:
                batch.append(heapq.heappop(heap)[-1])
            return batch
        now = self.env.now
        bucket = (first.req.prompt_tokens + first.req.generated_tokens) // bucket_tokens if bucket_tokens is not None else 0
        group = first.req.prefix_group
        skipped = []
        while heap and len(batch) < cap:
            entry = heapq.heappop(heap)
            job = entry[-1]
            req = job.req
            if job.deadline_s < now or (
                (bucket_tokens is None or (req.prompt_tokens + req.generated_tokens) // bucket_tokens == bucket)
                and (not self._cohort or req.prefix_group == group)
            ):
                batch.append(job)
            else:
                skipped.append(entry)
        for entry in skipped:
            heapq.heappush(heap, entry)
        return batch

    def uniforms(self, n: int) -> list[float]:
        """The next *n* uniforms of its stream, in drawing order (drawn
        :data:`UNIFORM_CHUNK` at a time; acceptance draws and partial-verification samples)."""
        if n <= 0:
            return []
        buffer = self._uniforms
        if len(buffer) < n:
            buffer[:0] = self.rng.random(max(UNIFORM_CHUNK, n))[::-1].tolist()
        taken = buffer[-n:]
        del buffer[-n:]
        taken.reverse()
        return taken

    def _verify_pass(self, batch: list[_Job]) -> None:
        """Start a verify pass over *batch*, a microbatch of verify and fused rounds.

        Per job: the positions the target verifies (``verify.partial``: all, the first, or
        sampled: the first, and each later one when its uniform is below ``sample_rate``),
        its accepted prefix (the curve's expectation, or its inverse CDF at one uniform,
        drawn after the job's samples) and whether it rolls back (its rejection, position
        ``accepted + 1``, went unverified)."""
        env = self.env
        now = env.now
        contexts: list[int] = []
        verified_counts: list[int] = []
        accepted: list[float] = []
        rollback = []
        draft_steps = 0
        temp, expected, partial = self._temperature, self._expected, self._partial
        sampled, rate = partial == "sampled", self.verify.sample_rate
        wait_total = 0.0
        for job in batch:
            req = job.req
            gamma = job.gamma
            context = req.prompt_tokens + req.generated_tokens
            contexts.append(context)
            if gamma == 0:
                m, verified, rolled = 0, 0, False
            else:
                plan = None
                if job.kind == FUSED:
                    model = self.fused_acceptance
                else:
                    spec = req.spec
                    assert spec is not None  # set while its device runs it
                    plan = spec.plan  # a tree or chained round: its own model and verified positions
                    model = spec.drafter.acceptance if plan is None else plan.acceptance
                # The job's draws in order: the samples of positions 2..gamma, then its uniform.
                draws = self.uniforms((gamma - 1 if sampled else 0) + (not expected))
                m = model.expected_tokens(context, gamma, temp) - 1.0 if expected else model.accepted_at(draws[-1], context, gamma, temp)
                whole = int(m)
                if sampled:
                    verified = 1 + len([u for u in draws[: gamma - 1] if u < rate])
                    rolled = 0 < whole < gamma and not draws[whole - 1] < rate
                elif partial == "first_token":
                    verified, rolled = 1, 0 < whole < gamma
                else:
                    verified, rolled = (gamma if plan is None else plan.nodes), False
            verified_counts.append(verified)
            accepted.append(m)
            rollback.append(rolled)
            if job.kind == FUSED:
                draft_steps = max(draft_steps, gamma)
            wait_total += now - job.enqueued_s
        shared = self._shared_prefix(batch) if self._cohort else 0
        pass_s = self._pass_s(contexts, verified_counts, shared) if shared else self._pass_s(contexts, verified_counts)
        self.pass_s += WAIT_EWMA * (pass_s - self.pass_s)
        self.queue_wait_s += WAIT_EWMA * (wait_total / len(batch) - self.queue_wait_s)
        fused_s = None
        if draft_steps and self._fused_table is not None and all(job.kind == FUSED for job in batch):
            fused_s = self._fused_table(contexts, [job.gamma for job in batch])  # the table's fused step, drafting included
        if fused_s is None:
            step_s = draft_steps * self.fused_draft_s + pass_s + sum(rollback) * self._rollback_s
        else:
            step_s = fused_s + sum(rollback) * self._rollback_s
        step_s *= self._speed()
        self._start_round_pass(_Pass(batch, accepted, rollback, step_s))

    def _start_round_pass(self, round_pass: _Pass) -> None:
        """Run *round_pass*: one timeout of its duration, ending in :meth:`_verify_done`."""
        env = self.env
        self._pass_start = env.now
        self._round_pass = round_pass
        env.timeout(round_pass.step_s).callbacks.append(functools.partial(self._verify_done, round_pass))

    def _verify_done(self, round_pass: _Pass, _event: Event) -> None:
        """A verify pass ended: each round's tokens count, and its request goes on or ends."""
        if round_pass is not self._round_pass:
            return  # a pass an at-risk job cut: it runs again whole (_rerun)
        self._round_pass = None
        batch, accepted, rollback, step_s = round_pass.batch, round_pass.accepted, round_pass.rollback, round_pass.step_s
        self._pass_start = math.nan
        self.step += 1
        end = self.env.now
        tokens_out = 0
        for job, m, rolled in zip(batch, accepted, rollback, strict=True):
            req = job.req
            spec = req.spec
            assert spec is not None  # set while its device runs it
            gained = spec.settle_round(req, job.gamma, m, rolled, end, self.index, job.kind == FUSED)
            tokens_out += gained
            if req.generated_tokens >= req.output_tokens:
                self._complete(req, req.output_tokens if job.kind == FUSED else gained)
            elif job.kind == FUSED:
                self._next_fused(req, end)
            else:
                self.send_verdict(req, gained)
        self.recorder.on_steps(self.index, step_s, 1, len(batch), 0, tokens_out, 0.0)
        self._pass_over()

    def _own_s(self, kind: int, req: Request, gamma: int) -> float:
        """A round's own verify time: a pass of it alone (a tree round verifies its nodes)."""
        plan = req.spec.plan if kind == VERIFY and req.spec is not None else None
        return self._pass_s([req.prompt_tokens + req.generated_tokens], [gamma if plan is None else plan.nodes])

    # ------------------------------------------------------------------ preemption
    def _slack_s(self, job: _Job, now: float) -> float:
        """*job*'s slack at *now*: its deadline, minus now, minus its own verify time (a verify
        pass of that job alone, as ``least_slack`` reckons it)."""
        return job.deadline_s - now - self._own_s(job.kind, job.req, job.gamma)

    def _preempts(self, job: _Job) -> bool:
        """Whether the round *job*, just arrived while the server is busy, cuts the pass in
        progress (``verify.preemption_slack_ms``), and if so cut it and start *job*'s own pass.

        It does when its slack is below the threshold, a round pass (not a prefill pass nor a
        cold start) is in progress, that pass was not started by such a cut, and none of its
        jobs has slack below the threshold now. The cut pass's work is lost (its time so far
        counts as busy); each of its jobs counts a preemption (mode ``verify``); it runs again
        whole after *job*'s pass, its draws kept (:meth:`_rerun`)."""
        threshold = self._preempt_s
        current = self._round_pass
        if threshold is None or current is None or self._cut is not None:
            return False  # no round pass in progress (a prefill pass or cold start may run)
        now = self.env.now
        if self._slack_s(job, now) >= threshold:
            return False
        batch = current.batch
        if any(self._slack_s(other, now) < threshold for other in batch):
            return False
        start = self._pass_start
        step_s = current.step_s
        throttle = self.throttle
        busy_since = self._busy_since
        if throttle is not None and busy_since is not None and start - busy_since >= throttle[0]:
            step_s *= throttle[1]  # its duration unthrottled: the re-run is throttled as it starts
        self._cut = (current, step_s)
        recorder = self.recorder
        recorder.on_busy(self.index, now - start)
        for other in batch:
            req = other.req
            if req.preemption_times_s is None:
                req.preemption_times_s = []
            req.preemption_times_s.append(now)
            recorder.on_preemption(req, self.index, now, "verify")
        self._verify_pass([job])
        return True

    def _rerun(self, cut: tuple[_Pass, float]) -> None:
        """The at-risk job's pass ended: the pass it cut runs again, whole, with the same jobs
        and draws (the server stays busy)."""
        cut_pass, base_s = cut
        self._cut = None
        self._start_round_pass(_Pass(cut_pass.batch, cut_pass.accepted, cut_pass.rollback, base_s * self._speed()))

    # ------------------------------------------------------------------ leaving
    def _leave(self, req: Request) -> None:
        if self.running.pop(req.id, None) is not None:
            blocks = self._blocks
            if blocks is None:
                self._kv_change(-(req.prompt_tokens + req.output_tokens))
            else:
                self._kv_mark()
                blocks.release(req)
        self.departed += 1
        self.departed_tokens += req.prompt_tokens

    def _complete(self, req: Request, tokens: int) -> None:
        """*req* made its last token: it leaves, and its device hears of its last *tokens*."""
        now = self.env.now
        req.completion_s = now + req.output_tokens * self._output_overhead_s
        self._leave(req)
        self.recorder.on_complete(req)
        self.recorder.on_departure(now)
        self.send_verdict(req, tokens)
        if self.completions is not None:
            self.completions.put(req)

    def abort(self, req: Request, reason: str) -> None:
        """*req* is dropped here: its bundle or verdict was lost on the network (*reason*
        ``network_...``), or it can never fit (``max_model_len``, ``kv_capacity``)."""
        now = self.env.now
        req.dropped_reason = reason
        self._leave(req)
        self.recorder.on_drop(req)
        self.recorder.on_departure(now)
        if self.completions is not None:
            self.completions.put(req)
        self._kick()  # its KV is free: a waiting prompt may fit now

    def settle(self, until_s: float) -> None:
        """The run stopped at *until_s*: count the busy time of the pass in progress."""
        if self._pass_start == self._pass_start:  # not NaN
            self.recorder.on_busy(self.index, until_s - self._pass_start)
        self.recorder.kv_block_seconds[self.index] += self.kv.used_blocks * (until_s - self._kv_since)
        self._kv_since = until_s

    def statistics(self) -> dict[str, float]:
        """Passes run, smoothed verify queue wait and pass time, KV in use."""
        cache = self.prefix_cache
        used = self.kv.used_blocks * (1 if cache is None else cache.block_size)
        return {"passes": self.step, "queue_wait_s": self.queue_wait_s, "pass_s": self.pass_s, "kv_used_tokens": used}

