"""Entities with identity: the :class:`Request` and its lifecycle.

A request's lifecycle timestamps are simulated seconds, ``nan`` until the
event happens:

``arrival_s`` (it reaches the serving system; the client sent it ``upload_s``
before) <= ``enqueue_s`` (it enters a replica's waiting queue, after the latency
model's queueing overhead) <= ``first_scheduled_s`` (start of the first engine step
that works on it) <= ``first_token_s`` (the server sends its first output token) <=
``completion_s`` (the server sends its last token). A client with a network has each
token ``download_s`` later. Each preemption's time is
kept in ``preemption_times_s``.

The engine keeps its bookkeeping on the request too (the ``kv_*``,
``prefill_*`` and ``decode_*`` fields): token counts during decoding are
*derived* from the engine's step counter, never incremented per step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from simpy_llm.speculative.draft import SpecState

__all__ = ["Batch", "Request", "RequestStatus"]

NAN = math.nan


class RequestStatus:
    """Terminal states reported in the records."""

    COMPLETED = "completed"
    DROPPED = "dropped"
    IN_FLIGHT = "in_flight"


@attrs.define(eq=False, slots=True)
class Request:
    """One inference request.

    Examples
    --------
    >>> r = Request(id=0, client_id="chat", prompt_tokens=100, output_tokens=20, arrival_s=1.5)
    >>> r.tenant_id, r.first_token_s
    ('chat', nan)
    """

    id: int
    """Request number, unique within a simulation, in arrival order."""
    client_id: str
    """The client that sent it."""
    prompt_tokens: int
    """Input length, tokens."""
    output_tokens: int
    """Output length the request will generate, tokens."""
    arrival_s: float
    """When it reached the serving system (the router), s: when the client sent it, unless
    the client has a network (then ``upload_s`` later)."""
    tenant_id: str = attrs.field(default=attrs.Factory(lambda self: self.client_id, takes_self=True))
    """Tenant, for per-tenant metrics (defaults to the client id)."""
    slo_class: str = "default"
    """SLO class whose targets decide goodput."""
    priority: int = 0
    """User priority (higher is more important)."""
    streaming: bool = True
    """Whether the response streams (TTFT and ITL are meaningful only then)."""
    session_id: str = ""
    """Session this request belongs to (empty for single requests)."""
    round_index: int = 0
    """Round within its session, from 0 (the loop iteration of a workflow's step)."""
    step_id: str = ""
    """The workflow step it runs (agentic sessions; empty otherwise)."""
    loop_iteration: int = 0
    """The iteration of its workflow's loop it belongs to (0 outside a loop)."""
    prefix_group: str = ""
    """Prefix-sharing group (empty: none)."""
    prefix_tokens: int = 0
    """Leading prompt tokens shared with the group."""
    prefix_blocks: tuple[int, ...] = ()
    """Hashes of the shared prefix blocks (``prefix_block_tokens`` tokens each), for prefix caches."""
    prefix_block_tokens: int = 16
    """Tokens per entry of ``prefix_blocks``."""
    context: tuple[tuple[int, int], ...] = ()
    """Content this request's prompt starts with, as ``(segment id, tokens)`` pairs: a
    multi-turn round carries the whole previous round (its prompt and answer); see
    :func:`~simpy_llm.serving.prefix_cache.content_segments`. Empty: none."""
    text_tokens: int = 0
    """Text part of the prompt (multimodal requests; 0 otherwise)."""
    image_tokens: int = 0
    """Image tokens in the prompt."""
    audio_tokens: int = 0
    """Audio tokens in the prompt."""
    video_tokens: int = 0
    """Video tokens in the prompt."""
    reason_ratio: float = 0.0
    """Share of the output that is reasoning tokens (reasoning models; 0 otherwise)."""
    replica: int = -1
    """Index of the replica it was routed to (-1 before routing)."""
    enqueue_s: float = NAN
    """Entered the replica's waiting queue, s."""
    first_scheduled_s: float = NAN
    """Start of the first engine step that computed any of its tokens, s."""
    first_token_s: float = NAN
    """The client sees the first output token, s."""
    completion_s: float = NAN
    """The client sees the last output token, s."""
    preemption_times_s: list[float] | None = None
    """Time of each preemption, s (``None`` if never preempted)."""
    dropped_reason: str = ""
    """Why the request was dropped (a short code: ``max_model_len``, or the admission
    policy's reason; empty unless dropped)."""
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache at its first admission."""
    warm_up: bool = False
    """A warm-up request of a replayed trace (simulated, left out of the summary)."""
    bin: int = -1
    """The bin of the request-level batch server that queued it (-1: none)."""
    upload_s: float = 0.0
    """Time its prompt spent crossing its client's network, s (0 without one; the client
    sent it at ``arrival_s - upload_s``)."""
    download_s: float = 0.0
    """Time each output token takes from the server to its client, s (0 without a network)."""
    prefill_replica: int = -1
    """The prefill replica that computed its prompt when prefill and decode are
    disaggregated (then ``replica`` is its decode replica); -1 otherwise."""
    kv_transfer_s: float = 0.0
    """Time its KV took from the prefill replica to the decode replica, s (0 unless
    disaggregated)."""
    draft_group: str = ""
    """The draft group whose device ran it (speculative decoding; empty otherwise)."""
    draft_device: int = -1
    """Its draft device's number within the group (-1: none)."""
    spec_mode: str = ""
    """How its speculative decoding ran: ``distributed`` or ``fused`` (empty: none)."""
    drafter: str = ""
    """The drafter of its last draft round (distributed; empty otherwise)."""
    spec_rounds: int = 0
    """Verify rounds after its prefill."""
    drafted_tokens: int = 0
    """Draft tokens proposed over its rounds."""
    accepted_tokens: int = 0
    """Draft tokens the target accepted over its rounds."""
    tvt_s: float = NAN
    """Time to verified tokens: the longest round, from the start of drafting to the
    verdict reaching whoever drafted, s (NaN: no round)."""
    rollbacks: int = 0
    """Rounds whose rejection fell on a position partial verification skipped."""
    draft_wait_s: float = 0.0
    """Time it waited for its draft device to finish the device's previous request (and
    think), s; its client sent it at ``arrival_s - upload_s - draft_wait_s``."""
    continuable: bool = False
    """A later request of its session may start with its content (prompt and output): the
    next round of an accumulating step, a replayed session's round. A prefix cache keeps
    only such a request's own blocks findable after it completes; no lookup could find
    anyone else's."""

    # --- engine bookkeeping (read by the engine and recorder only) ---
    generated_tokens: int = 0
    """Output tokens produced, as of the last time the engine settled them."""
    prefill_target: int = 0
    """Tokens the current prefill must compute (prompt + tokens generated before a preemption)."""
    kv_tokens: int = 0
    """Tokens whose KV is computed (during prefill; derived during decode)."""
    decode_anchor_step: int = -1
    """Engine step counter at which decoding (re)started; -1 while not decoding."""
    last_token_engine_s: float = NAN
    """Engine time of the last emitted token before a preemption (for the resume gap)."""
    sched_key: tuple = ()
    """``(policy key, entry order)``: the scheduler's sort key since it last entered the waiting queue."""
    kv_holder: object = None
    """Its :class:`~simpy_llm.serving.prefix_cache.Holder` while it runs with prefix caching."""
    kv_received_tokens: int = 0
    """Tokens of KV it brought from a prefill replica, until a decode replica admits it."""
    swapped_tokens: int = 0
    """Tokens of KV swapped out to CPU memory (swap preemption; 0 otherwise)."""
    spec: SpecState | None = None
    """Its :class:`~simpy_llm.speculative.draft.SpecState` while speculative decoding runs it."""

    @property
    def num_preemptions(self) -> int:
        """How often it was preempted."""
        return 0 if self.preemption_times_s is None else len(self.preemption_times_s)


@attrs.define(eq=False, slots=True)
class Batch:
    """A batch of a request-level batch server (:mod:`simpy_llm.serving.batching`).

    Examples
    --------
    >>> b = Batch(id=0, bin=2, requests=[], formed_s=1.0)
    >>> b.size, b.start_s
    (0, nan)
    """

    id: int
    """Batch number within its server, in formation order."""
    bin: int
    """The bin its requests came from."""
    requests: list[Request]
    """Its requests, in the order they left the bin."""
    formed_s: float
    """When it was formed, s."""
    sizes: list[float] = attrs.Factory(list)
    """Its requests' true sizes (service time, s, or tokens: see the service model)."""
    b_target: int = -1
    """The dynamic batcher's target size ``min(b_mem, b_SLA)`` (-1 with a fixed batch size)."""
    b_mem: int = -1
    """The memory-limited size (-1 with a fixed batch size)."""
    b_sla: int = -1
    """The SLA controller's size (-1 with a fixed batch size)."""
    start_s: float = NAN
    """Service began, s."""
    end_s: float = NAN
    """Its slowest request ended, s."""
    memory_tokens: int = 0
    """KV tokens it holds while served: its requests' prompt plus output tokens."""

    @property
    def size(self) -> int:
        """Requests in the batch."""
        return len(self.requests)
