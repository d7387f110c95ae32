"""The schema of :meth:`Results.summary() <simpy_llm.metrics.results.Results.summary>`.

Kept whole (over 800 lines): it is the summary's one page of reference:
every key is declared here with its unit and meaning.

The summary is plain data (dicts, lists, numbers, strings and ``None``: JSON-ready),
typed here as a tree of :class:`typing.TypedDict` classes rooted at :class:`Summary`,
with every key's unit and meaning documented where it is declared. A test checks
that a real run's summary has exactly these keys, so this page and the code cannot
drift apart.

Conventions:

* Times are simulated seconds (``_s``), rates per simulated second (``_per_s``),
  utilisations ratios in [0, 1].
* A statistic with nothing to be taken over is ``None`` (not NaN), except the rates
  of a run of zero duration, which are NaN, and the arrival-window rates of a run whose
  arrival window has no length (one arrival, or all at once), NaN too.
* Every rate names its window: ``throughput.requests_per_s`` and the other unprefixed
  rates count completions inside the arrival window (first to last measured arrival);
  ``whole_run_*`` rates divide by ``measurement.duration_s``, the drain included (see
  "Rates and their windows" in :mod:`simpy_llm.metrics.results`).
* Mappings keyed by an open-ended name (an SLO class, a tenant, a drop reason, a
  replica group...) are typed ``dict[str, ...]``; their keys are sorted.
* *Measured* requests are those that are not warm-up (``warm_up == 0``, see
  :mod:`simpy_llm.metrics.results`).

Client-side latency
-------------------
A request that does not stream (``streaming == 0``) reaches its client in one
response at the end, so the client sees no time to first token, no time per output
token and no inter-token gaps. ``latency_s`` therefore takes TTFT and TPOT over
*streaming* requests only and E2E and queueing delay over all of them; each
statistic says how many values it covers in ``count``. ITL is tallied by the engine
over the token gaps of measured streaming requests only (``count`` token gaps from
``requests`` requests). The per-request columns of
:meth:`~simpy_llm.metrics.results.Results.to_dataframe` keep the server-side
``ttft_s`` and ``tpot_s`` of every request (filter on ``streaming`` for the
client's view), and SLO targets (goodput) judge every completed request by them.

Long format
-----------
:meth:`~simpy_llm.metrics.results.Results.summary_frame` flattens a summary into
one row per number, with the columns :data:`FRAME_COLUMNS`, walking this schema:

* ``section``: the summary's top-level key (``latency_s``, ``latency_s_by_class``,
  ``requests``, ``throughput``...).
* ``metric``: the fixed keys between the section and the statistic, joined with
  ``.`` (``ttft``, ``completed_share``); the section itself when there are none.
* ``statistic``: the last fixed key (``p99``, ``count``, ``completed``,
  ``requests_per_s``); ``value`` for a section that is a number (``duration_s``).
* ``group``: the open-ended keys on the way (an SLO class, a tenant, a drop reason,
  a replica index...), joined with ``/`` when there are several
  (``dropped_by_class``: ``gold/max_queue``); empty for figures of the whole run.
* ``value``: the number as a float (``None`` becomes NaN). Strings (``engine.group``)
  are left out.

So ``frame.query("metric == 'ttft' and statistic == 'p99'")`` holds the run's TTFT
p99 (section ``latency_s``, empty group) and each class's and tenant's (sections
``latency_s_by_class`` and ``latency_s_by_tenant``, grouped by name).
"""

# Annotations stay evaluated (no ``from __future__ import annotations``): Python 3.11's
# TypedDict recognises NotRequired keys only in evaluated annotations.
import types
import typing
from typing import NotRequired, TypedDict

__all__ = [
    "FRAME_COLUMNS",
    "AutoscalerSection",
    "AutoscalerStats",
    "BatchController",
    "BatchMemory",
    "BatchServerStats",
    "BatchSizeDistribution",
    "BatchSizeStats",
    "BatchSla",
    "BinStats",
    "ClassGoodput",
    "ClassLatency",
    "ClientLatency",
    "CohortFairness",
    "CohortGroup",
    "CountedLatencyStats",
    "DeviceStats",
    "DisaggregationStats",
    "EngineCounts",
    "Fairness",
    "FairnessIndex",
    "GatewaySection",
    "GatewayStats",
    "Goodput",
    "GpuUtilization",
    "InSystem",
    "IterationStats",
    "KvUtilization",
    "Latency",
    "LatencyStats",
    "LinkFigures",
    "Measurement",
    "NetworkStats",
    "Preemptions",
    "PrefixCacheStats",
    "PrefixCacheTiers",
    "RequestCounts",
    "SessionStats",
    "Summary",
    "Throughput",
    "TokenGapStats",
    "WorkflowStats",
    "flatten_summary",
]

FRAME_COLUMNS = ("section", "metric", "statistic", "group", "value")
"""Columns of :meth:`~simpy_llm.metrics.results.Results.summary_frame`."""


class LatencyStats(TypedDict):
    """Statistics of one latency metric, s (``None`` when there is no value to take them over).

    Percentiles use numpy's default (linear) interpolation, except ITL's (see
    :class:`TokenGapStats`).
    """

    mean: float | None
    """Arithmetic mean, s."""
    p50: float | None
    """Median, s."""
    p90: float | None
    """90th percentile, s."""
    p95: float | None
    """95th percentile, s."""
    p99: float | None
    """99th percentile, s."""


class CountedLatencyStats(LatencyStats):
    """:class:`LatencyStats` with the number of values they cover."""

    count: int
    """Requests the statistics are taken over (completed measured requests; for TTFT and
    TPOT only the streaming ones, and for TPOT only those with more than one output token)."""


class TokenGapStats(CountedLatencyStats):
    """Inter-token latency: the gaps between consecutive output tokens of a request, s.

    Kept by the engine as weighted values (a stretch of identical steps is one value
    weighted by its tokens), for measured streaming requests of any outcome (the gaps of
    a request still in flight at ``until_s`` count too), including the long gap across
    a preemption. Percentiles are the inverted CDF of the weighted gaps (the smallest
    gap whose cumulative weight reaches the quantile), not interpolated.
    """

    requests: int
    """Requests with at least one gap: measured streaming requests that produced two or
    more output tokens (``count`` is their gaps: the sum of output tokens produced - 1)."""


class Latency(TypedDict):
    """Client-side latency over the measured requests (see "Client-side latency" above)."""

    ttft: CountedLatencyStats
    """Time to first token, ``first_token_s - arrival_s``, over completed streaming requests."""
    tpot: CountedLatencyStats
    """Time per output token after the first, ``(completion_s - first_token_s) /
    (output_tokens - 1)``, over completed streaming requests with more than one output token."""
    itl: TokenGapStats
    """Inter-token latency over the token gaps of streaming requests."""
    e2e: CountedLatencyStats
    """End to end, ``completion_s - arrival_s``, over every completed request."""
    queue_delay: CountedLatencyStats
    """Time in a replica's waiting queue before the first schedule, ``first_scheduled_s -
    enqueue_s``, over every completed request."""


class DisaggregationStats(TypedDict):
    """A disaggregated fleet's KV transfers (``docs/network.md``)."""

    kv_transfers: int
    """Requests whose KV crossed from a prefill replica to a decode replica."""
    kv_bytes: float
    """Their KV bytes."""
    kv_transfer_s: LatencyStats
    """Transfer time (hand-off to arrival at the decode replica), s."""
    by_prefill_replica: dict[str, int]
    """Transfers per prefill replica (fleet index as a string key)."""
    by_decode_replica: dict[str, int]
    """Transfers per decode replica (fleet index as a string key)."""
    groups: NotRequired[dict[str, str]]
    """Each of those replicas' group, when replica groups are known."""


class DeviceStats(TypedDict):
    """Energy and cost of a fleet whose replica groups name device profiles or whose latency
    model gives step energies (a LUT's ``energy_mj``; ``docs/devices.md``); replicas with
    neither count as None and add nothing."""

    gpus: int
    """Devices in the fleet: each replica's tensor-parallel degree, summed."""
    energy_j: float
    """Energy over the run, J: per device ``active_w`` x busy time + ``idle_w`` x idle time;
    with a table of step energies, the steps' energies in place of ``active_w`` x busy time
    (plus ``idle_w`` x idle time with a device profile)."""
    energy_j_per_replica: list[float | None]
    """Per replica (its devices together), J."""
    energy_j_per_output_token: float | None
    """Energy over the output tokens of completed requests, J."""
    energy_j_per_request: float | None
    """Energy over completed requests, J."""
    cost_usd: float | None
    """Price of the devices over the run (None unless every replica's device has a price)."""
    cost_usd_per_replica: list[float | None]
    """Per replica, USD (None without a device or a price)."""
    cost_usd_per_1k_tokens: float | None
    """Cost per thousand prompt and output tokens of completed requests, USD."""
    goodput_per_gpu: float | None
    """``goodput.requests_per_s`` (over the arrival window) per device."""


class LinkFigures(TypedDict):
    """One network link at the end of the run (:meth:`Results.links` has the same columns)."""

    messages: int
    """Messages put on it."""
    delivered: int
    """Messages delivered."""
    dropped: int
    """Messages dropped (loss beyond the retransmissions allowed, an outage in drop mode)."""
    in_flight: int
    """Messages neither delivered nor dropped when the run stopped."""
    bytes: float
    """Bytes delivered."""
    retransmissions: int
    """Retransmissions after losses."""
    busy_s: float
    """Time with bytes moving, s."""
    utilisation: float
    """``busy_s`` over the run's duration."""
    mean_queueing_s: float
    """Per delivered message, time beyond what it would take alone on an idle link, s."""
    outage_wait_s: float
    """Time messages waited for outages to end, s."""


class NetworkStats(TypedDict):
    """The network links of a run (``docs/network.md``)."""

    links: dict[str, LinkFigures]
    """Per link, by name (``client/<id>/up``, ``kv/<prefill>-><decode>``)."""


class ClientLatency(TypedDict):
    """Latency as clients with a ``network`` see it: the server's plus the prompt's upload
    and one token's download (``docs/network.md``), over completed measured requests."""

    ttft: CountedLatencyStats
    """Client time to first token, ``client_ttft_s``, over streaming requests."""
    e2e: CountedLatencyStats
    """Client end to end, ``client_e2e_s``, over every completed request."""


class ClassLatency(TypedDict):
    """Latency of one SLO class or tenant, over its completed measured requests (TTFT and
    TPOT over the streaming ones, as in :class:`Latency`)."""

    ttft: LatencyStats
    """Time to first token, s (streaming requests)."""
    tpot: LatencyStats
    """Time per output token after the first, s (streaming requests with more than one output token)."""
    e2e: LatencyStats
    """End to end, s."""
    queue_delay: LatencyStats
    """Queueing delay in a replica's waiting queue, s."""


class RequestCounts(TypedDict):
    """How many requests ended how (every request, warm-up included):
    ``arrived == completed + dropped + in_flight``."""

    arrived: int
    """Requests that entered the serving system (and those a run cut off while they
    crossed their client's network: in flight, with ``upload_s`` NaN)."""
    completed: int
    """Requests whose last token the client received."""
    dropped: int
    """Requests rejected (admission policy, or longer than the model allows)."""
    in_flight: int
    """Requests still in the system when the run stopped (``until_s``)."""
    warm_up: int
    """Of all of them, how many were warm-up requests."""
    dropped_by_reason: dict[str, int]
    """Drops per reason (``max_model_len``, or the admission policy's reason such as
    ``max_queue``; ``unknown`` for a drop without a reason)."""
    dropped_by_class: dict[str, dict[str, int]]
    """Drops per SLO class, then per reason."""


class Measurement(TypedDict):
    """The span the whole-run rates divide by (``throughput.whole_run_*``,
    ``goodput.whole_run_requests_per_s``), the drain included."""

    start_s: float
    """Start, s: 0, or the first measured arrival when there is warm-up."""
    duration_s: float
    """Length, s: from ``start_s`` to the end of the run."""


class Throughput(TypedDict):
    """Work done per second, over the arrival window and over the whole run (see "Rates and
    their windows" in :mod:`simpy_llm.metrics.results`).

    The arrival window is ``(window_start_s, window_start_s + window_s]``, from the first
    to the last arrival of a measured request. Its rates count the completions inside it
    (of any request) and are NaN when it has no length."""

    requests_per_s: float
    """Requests completed inside the arrival window per second of it: what the system
    serves while the load lasts (the offered rate when it keeps up, its capacity when
    overloaded)."""
    output_tokens_per_s: float
    """Output tokens of those completions per second of the arrival window."""
    input_tokens_per_s: float
    """Prompt tokens of those completions per second of the arrival window."""
    offered_requests_per_s: float
    """Measured arrivals inside the arrival window (the first one opens it) per second of it."""
    window_start_s: float
    """Start of the arrival window, s: the first measured arrival."""
    window_s: float
    """Length of the arrival window, s: the first to the last measured arrival."""
    drain_s: float
    """From the last measured arrival to the last completion, s (0 when nothing completed
    after it): time spent emptying the backlog, left out of the windowed rates."""
    whole_run_requests_per_s: float
    """Completed measured requests per second of ``measurement.duration_s`` (the drain
    included)."""
    whole_run_output_tokens_per_s: float
    """Output tokens of the completed measured requests per second of ``measurement.duration_s``."""
    whole_run_input_tokens_per_s: float
    """Prompt tokens of the completed measured requests per second of ``measurement.duration_s``."""


class ClassGoodput(TypedDict):
    """Goodput of one SLO class."""

    completed: int
    """Completed measured requests of the class."""
    met: int
    """Of those, how many met every target of the class."""
    fraction: float
    """``met / completed`` (NaN when none completed)."""


class Goodput(TypedDict):
    """Completed measured requests meeting every target of their SLO class (a class without
    targets always meets). TTFT and TPOT targets judge the server-side figures, streaming or not."""

    requests_per_s: float
    """Requests completed inside the arrival window meeting their targets, per second of it
    (``throughput.window_s``; NaN when it has no length)."""
    whole_run_requests_per_s: float
    """Completed measured requests meeting their targets per second of ``measurement.duration_s``
    (the drain included)."""
    fraction: float
    """Share of the completed measured requests meeting their targets (NaN when none completed)."""
    by_class: dict[str, ClassGoodput]
    """Per SLO class with a completed measured request."""


class Preemptions(TypedDict):
    """Preemptions over the whole run (warm-up included)."""

    total: int
    """Preemptions."""
    requests_preempted: int
    """Requests preempted at least once."""
    by_mode: dict[str, int]
    """Preemptions per mode (``recompute``, ``swap``; both always present)."""


class KvUtilization(TypedDict):
    """KV cache use: the time integral of used blocks over blocks x ``duration_s``, a ratio."""

    time_weighted_mean: float
    """Mean over replicas."""
    per_replica: list[float]
    """Per replica, by index."""


class BatchSizeStats(TypedDict):
    """Requests per engine step, weighted one per step, over every replica's steps (``None``
    statistics when no step ran). Percentiles are the inverted CDF, not interpolated."""

    mean: float | None
    """Mean batch size, requests."""
    p50: float | None
    """Median, requests."""
    p90: float | None
    """90th percentile, requests."""
    p95: float | None
    """95th percentile, requests."""
    p99: float | None
    """99th percentile, requests."""
    max: int
    """Largest batch, requests (0 when no step ran)."""
    histogram: dict[str, int]
    """Steps per batch size (the size as a string key, ascending)."""


class InSystem(TypedDict):
    """Requests between arrival and their last token being computed."""

    time_average: float
    """Time-weighted mean over ``duration_s``, requests."""
    peak: int
    """Most at once, requests."""


class EngineCounts(TypedDict):
    """The engines' own counters, whole run."""

    steps: int
    """Engine steps over all replicas."""
    busy_s: list[float]
    """Per replica, the summed duration of its steps (and of its model loads), s."""
    cold_starts: NotRequired[int]
    """Model loads (cold starts) over all replicas; only when some replica had one."""
    cold_start_s: NotRequired[float]
    """Time spent loading models, s (counted busy)."""
    group: NotRequired[list[str]]
    """Per replica, its replica group's name (when the Results know the groups, as every
    :class:`~simpy_llm.simulation.Simulation` run does)."""


class GpuUtilization(TypedDict):
    """Busy time (summed step durations) over ``duration_s``, a ratio in [0, 1]
    (``None`` for a run of zero duration)."""

    mean: float | None
    """Mean over replicas."""
    per_replica: list[float | None]
    """Per replica, by index."""
    by_group: NotRequired[dict[str, float | None]]
    """Mean over each replica group's replicas (when the groups are known)."""


class PrefixCacheTiers(TypedDict):
    """The prefix cache's two tiers over the whole run (warm-up included), summed over the
    replicas with a CPU tier, counted at every admission that looked the cache up (a
    preempted request's readmissions too): ``docs/model.md``, "A CPU tier for the prefix cache"."""

    looked_up_tokens: int
    """Tokens (prefill targets) of those admissions, tokens."""
    gpu_hit_tokens: int
    """Tokens they found on the GPU tier, tokens."""
    gpu_hit_rate: float | None
    """``gpu_hit_tokens / looked_up_tokens`` (``None`` when nothing was looked up)."""
    cpu_hit_tokens: int
    """Tokens they found on the CPU tier only (restored to the GPU), tokens."""
    cpu_hit_rate: float | None
    """``cpu_hit_tokens / looked_up_tokens`` (``None`` when nothing was looked up)."""
    cpu_capacity_blocks: int
    """Blocks the CPU tiers can hold."""
    cpu_held_blocks: int
    """Blocks the CPU tiers hold at the end."""
    offloaded_blocks: int
    """Blocks copied from the GPU to the CPU tier (not charged to steps)."""
    restored_blocks: int
    """Blocks restored from the CPU tier to the GPU."""
    restore_s: float
    """Transfer time the restores added to steps, s."""


class PrefixCacheStats(TypedDict):
    """Prefix-cache hits over measured requests admitted at least once, counted at each
    request's first admission."""

    hit_rate: float | None
    """``cached_tokens / prompt_tokens`` (``None`` when no request was admitted)."""
    cached_tokens: int
    """Prompt tokens found in the cache, tokens."""
    prompt_tokens: int
    """Prompt tokens of those requests, tokens."""
    tiers: NotRequired[PrefixCacheTiers]
    """The GPU and CPU tiers' figures; only when some replica has a CPU tier
    (``EngineConfig.kv_offload_blocks``)."""


class FairnessIndex(TypedDict):
    """Jain's index J = (sum x)^2 / (n sum x^2) of one per-tenant allocation x."""

    jain: float | None
    """The index, in [1/n, 1] (1 for one tenant; ``None`` with no tenant or every x 0)."""
    by_tenant: dict[str, float]
    """x per tenant (tenants without a value are left out)."""


class CohortGroup(TypedDict):
    """One group of a fairness cohort: its measured requests and how they were served."""

    requests: int
    """Measured requests in the group."""
    completed: int
    """Those that completed."""
    met: int
    """Completed ones that met every target of their SLO class."""
    completed_share: float
    """``completed / requests``."""
    slo_attainment: float | None
    """``met / completed`` (``None`` without SLOs or without a completion)."""


class CohortFairness(TypedDict):
    """A fairness cohort (``metrics.fairness.cohorts``): the measured requests grouped by one key."""

    by: str
    """The record key grouped by."""
    groups: dict[str, CohortGroup]
    """Each group, by its key value (length bins in edge order)."""
    attainment_gap: float | None
    """Highest minus lowest ``slo_attainment`` over the groups with one (``None`` without any)."""
    attainment_jain: float | None
    """Jain's index of the groups' ``slo_attainment`` (``None`` without any, or all 0)."""


class Fairness(TypedDict):
    """Fairness across the tenants of the measured requests (see :mod:`simpy_llm.metrics.fairness`)."""

    tenants: int
    """Tenants with a measured request."""
    completed_share: FairnessIndex
    """x = completed / all measured requests of the tenant, a ratio."""
    inverse_normalized_e2e: FairnessIndex
    """x = 1 / mean of ``e2e_s / output_tokens`` over the tenant's completed requests, 1/s
    per token (tenants with no completion left out)."""
    cohorts: NotRequired[dict[str, CohortFairness]]
    """Each configured cohort (``metrics.fairness.cohorts``), by name; absent without any."""


class SessionStats(TypedDict):
    """Multi-turn and conversational sessions that ended (every session, warm-up included)."""

    count: int
    """Sessions."""
    mean_rounds: float | None
    """Mean rounds created per session (``None`` without sessions)."""
    end_reasons: dict[str, int]
    """Sessions per end reason (``max_rounds``, ``user_stopped``, ``horizon``, ``dropped``,
    ``in_progress``...)."""


class DiagnosticEntry(TypedDict):
    """A finding about the run (:func:`simpy_llm.metrics.diagnostics.diagnose`)."""

    code: str
    """What was found: ``overload``, ``step_below_weight_read``, ``post_processing_dominates``,
    ``idle_engine``."""
    severity: str
    """``warning`` (the results may mislead) or ``info``."""
    message: str
    """The finding in plain words, with its figures."""
    figures: dict[str, float]
    """The numbers behind it (units in the names)."""
    group: str | None
    """The replica group it is about (``None``: the whole run)."""


class BatchSizeDistribution(TypedDict):
    """Sizes of a batch server's batches, requests (``None`` statistics when none ran)."""

    mean: float | None
    """Mean batch size."""
    std: float | None
    """Standard deviation (population)."""
    min: int | None
    """Smallest batch."""
    max: int | None
    """Largest batch."""
    histogram: dict[str, int]
    """Batches per size (the size as a string key, ascending)."""


class BinStats(TypedDict):
    """One bin of a batch server, over the whole run."""

    completed: int
    """Requests of the bin completed."""
    requests_per_s: float
    """Completed / ``duration_s``, requests per s."""
    mean_queue_length: float | None
    """Time-weighted mean of the requests waiting in the bin over ``duration_s`` (their
    summed waits over ``duration_s``, Little's law; a request counts in the bin it was
    served from)."""
    queued_at_end: int
    """Requests of the bin still waiting when the run ended."""
    e2e_s: LatencyStats
    """E2E latency of its completed requests, s."""


class BatchSla(TypedDict):
    """The batch latency target and how often batches missed it."""

    d_sla_s: float | None
    """Target batch latency D_SLA, s: the dynamic batcher's ``dynamic.d_sla_s``, or with a
    fixed batch size the server's ``d_sla_s`` (``None`` when a fixed-B server has none)."""
    violation_rate: float | None
    """Share of served requests whose batch took longer than ``d_sla_s`` (``None`` without
    a target or before any batch ended)."""


class BatchMemory(TypedDict):
    """KV memory held by the batch in service, tokens (prompt plus output of its requests)."""

    limit_tokens: int | None
    """The capacity eta (``None``: no limit)."""
    peak_tokens: int
    """Most held at once."""
    time_weighted_mean_tokens: float | None
    """Mean over ``duration_s`` (idle time counts as 0)."""
    overflows: int
    """Batches that held more than the limit (possible only with noisy predictions)."""


class BatchController(TypedDict):
    """The dynamic batcher's target size over time (``None`` with a fixed batch size).

    With W = 50 batches (``CONVERGENCE_WINDOW_BATCHES``) and the band ``settled_b_target
    +- max(10 %, 1)``: the target has settled at the start of the first W consecutive
    batches whose targets all lie in the band. Fewer than W batches are too few to tell
    (``settled_b_target`` and ``convergence_s`` are ``None``); a target that never stays
    in the band for W batches has not settled (``convergence_s`` is ``None``)."""

    final_b_target: int | None
    """``b_target`` of the last batch."""
    settled_b_target: float | None
    """Median ``b_target`` of the last W batches."""
    convergence_s: float | None
    """Start of the first of W consecutive batches whose ``b_target`` all lie within
    ``max(10 %, 1)`` of ``settled_b_target``, s."""


class BatchServerStats(TypedDict):
    """One request-level batch server (``docs/batching.md``)."""

    batches: int
    """Batches served."""
    requests_per_s: float | None
    """Requests it completed per second of its own span, from the start of the run to the
    end of its last batch (servers sharing a run's traffic finish at different times;
    ``None`` before any batch ended)."""
    requests_per_busy_s: float | None
    """Requests it completed per second it was busy: a saturated server's throughput
    (B / E[S_batch] with a fixed B)."""
    gpu_utilization: float | None
    """Busy time (batch start to its slowest request's end) / ``duration_s``."""
    batch_size: BatchSizeDistribution
    """Sizes of its batches."""
    service_s: LatencyStats
    """Batch service times, s."""
    by_bin: dict[str, BinStats]
    """Per bin (the bin index as a string key)."""
    sla: BatchSla
    """SLA adherence."""
    memory: BatchMemory
    """Memory use against the limit."""
    controller: BatchController
    """Batch-size adaptation."""
    c_max_requests_per_s: float | None
    """The theoretical maximum ``B / E[S]`` (fixed B, ``sampled`` service: E[S] the
    distribution's mean); ``None`` otherwise."""


class IterationStats(TypedDict):
    """Loop iterations per session."""

    mean: float | None
    """Mean iterations."""
    histogram: dict[str, int]
    """Sessions per iteration count (as a string key, ascending)."""


class WorkflowStats(TypedDict):
    """The agentic sessions of one workflow (``docs/agentic.md``)."""

    sessions: int
    """Sessions that started."""
    completed: int
    """Sessions that ran to their end (completed, or their loop's end)."""
    end_reasons: dict[str, int]
    """Sessions per end reason."""
    e2e_s: LatencyStats
    """Session E2E over the completed sessions: root arrival to last call's end, s."""
    llm_calls_mean: float | None
    """LLM calls per session (steps run)."""
    tool_calls_mean: float | None
    """Tool calls per session."""
    tool_wait_s_mean: float | None
    """Time in tool calls per session (waiting for the tool and running), s."""
    iterations: IterationStats
    """Loop iterations per session."""
    fan_out_utilization: float | None
    """Fan-out instances finished / started (below 1 when the run ended first)."""
    critical_queue_share_mean: float | None
    """Mean over completed sessions of the share of their E2E that the LLM calls on the
    critical path spent waiting at the replica before their first step."""


class DraftGroupStats(TypedDict):
    """One draft group of speculative decoding (``docs/speculative.md``)."""

    devices: int
    """Devices in the group."""
    completed: int
    """Completed measured requests its devices ran."""
    drafting_s: float
    """Time its devices spent drafting, summed, s."""
    utilisation: float | None
    """Drafting time over devices x the run's duration."""
    energy_j: float | None
    """Its devices' energy, J: ``active_w`` x drafting + ``idle_w`` x the rest (None without a device profile)."""
    energy_j_per_output_token: float | None
    """That over its completed requests' output tokens, J."""
    slo_attainment: float | None
    """Share of its completed requests that met their SLO."""
    tokens_per_s_per_request: float | None
    """Mean over its completed requests of output tokens / E2E, tokens/s."""


class SpeculationFairness(TypedDict):
    """Jain's index across draft groups (device classes)."""

    slo_attainment_jain: float | None
    """Over the groups' ``slo_attainment`` (None without SLOs)."""
    service_rate_jain: float | None
    """Over the groups' ``tokens_per_s_per_request``."""


class TvtStats(TypedDict):
    """Time to verified tokens (a request's longest round), over completed measured requests, s."""

    mean: float | None
    """Mean, s."""
    p50: float | None
    """Median, s."""
    p90: float | None
    """90th percentile, s."""
    p95: float | None
    """95th percentile, s."""
    p99: float | None
    """99th percentile, s."""


class SpeculationStats(TypedDict):
    """Speculative decoding's figures (seed 003 §8); only with a ``speculation`` section."""

    mode: str
    """``speculation.mode``."""
    rounds: int
    """Verify rounds (all requests, including warm-up)."""
    tokens_per_round: float | None
    """Mean output tokens a round added (accepted drafts plus the target's token)."""
    acceptance_rate: float | None
    """Drafts accepted over drafts proposed."""
    mean_gamma: float | None
    """Mean γ proposed per round, tokens."""
    gamma_histogram: dict[str, int]
    """Rounds per γ."""
    acceptance_by_context: dict[str, float | None]
    """Acceptance rate per context bucket (``CONTEXT_BUCKETS``; label ``low-high`` tokens)."""
    requests_by_mode: dict[str, int]
    """Completed measured requests per mode (``distributed``, ``fused``)."""
    drafter_switches: int
    """Mid-decode drafter escalations."""
    rollbacks: int
    """Rounds whose rejection partial verification missed."""
    rollback_s: float
    """Target time those cost, s."""
    tvt_s: TvtStats
    """Time to verified tokens of completed measured requests (each request's longest round)."""
    drafts: dict[str, DraftGroupStats]
    """Per draft group."""
    fairness: SpeculationFairness
    """Fairness across the draft groups (device classes)."""


class PlannerStats(TypedDict):
    """What the planner did (``docs/planner.md``); only with a ``planner`` section."""

    ticks: int
    """Ticks run (skipped ones included)."""
    changes: int
    """Ticks that applied a different configuration."""
    final: dict[str, float | None]
    """The configuration in force at the end, by knob (``None``: ``gamma`` or ``fused_fraction``
    left to the scenario's γ policy or mode selector)."""
    gpu_seconds: float
    """GPUs in use over the run, GPU-s: a replica counts while it may receive requests and
    while it drains the ones it received."""
    mean_gpus: float | None
    """``gpu_seconds`` over ``duration_s``."""
    goodput_per_gpu_second: float | None
    """Measured requests meeting their SLO per GPU-second in use."""


class AutoscalerStats(TypedDict):
    """What the autoscaler did (``docs/autoscaling.md``); only with an ``autoscaler`` section."""

    decisions: int
    """Decisions taken (those that saw no sample included)."""
    changes: int
    """Decisions that changed the active replicas."""
    final_replicas: int
    """Active replicas at the end."""
    replica_seconds: float
    """Replicas active over the run, replica-s (a removed replica's drain not counted)."""
    gpu_seconds: float
    """GPUs of the active replicas over the run, GPU-s."""
    mean_replicas: float | None
    """``replica_seconds`` over ``duration_s``."""


class GatewayStats(TypedDict):
    """The summary's ``gateway`` section (``docs/gateway.md``); only with ``serving.gateway``."""

    queued: int
    """Requests that waited at the gateway."""
    dropped: int
    """Requests dropped because ``max_queue`` were waiting."""
    max_waiting: int
    """Most requests waiting at once."""
    waiting_at_end: int
    """Requests still waiting when the run ended."""
    mean_wait_s: dict[str, float]
    """Mean wait of the dispatched requests that waited, s, per sub-queue (its key as a string)."""


class GatewaySection(TypedDict, total=False):
    """The summary's ``gateway`` section (absent without a gateway)."""

    gateway: GatewayStats
    """The gateway's queues."""


class AutoscalerSection(TypedDict, total=False):
    """The summary's ``autoscaler`` section (absent without an autoscaler)."""

    autoscaler: AutoscalerStats
    """The autoscaler's decisions and replica use."""


class Summary(TypedDict):
    """What :meth:`Results.summary() <simpy_llm.metrics.results.Results.summary>` returns."""

    requests: RequestCounts
    """Request counts by outcome."""
    duration_s: float
    """Simulated duration of the run, s: the last completion (or arrival), or ``until_s``."""
    measurement: Measurement
    """The span the whole-run rates divide by."""
    latency_s: Latency
    """Latency over completed measured requests at the server (from when a request
    reached it), s; TTFT, TPOT and ITL over the streaming ones."""
    client_latency_s: NotRequired[ClientLatency]
    """TTFT and E2E as clients see them, with their networks' delays; only when some
    client has a ``network`` (otherwise they equal ``latency_s``'s)."""
    latency_s_by_class: dict[str, ClassLatency]
    """Latency per SLO class with a measured request (``None`` statistics where none completed)."""
    latency_s_by_cluster: NotRequired[dict[str, ClassLatency]]
    """Latency per cluster of a multi-cluster fleet (``""``: requests never routed)."""
    latency_s_by_tenant: dict[str, ClassLatency]
    """Latency per tenant with a measured request (``None`` statistics where none completed)."""
    throughput: Throughput
    """Work done per second: over the arrival window, and over the whole run."""
    goodput: Goodput
    """Completed requests meeting their SLO."""
    preemptions: Preemptions
    """Preemption counts."""
    kv_utilization: KvUtilization
    """KV cache utilisation."""
    batch_size: BatchSizeStats
    """Requests per engine step."""
    in_system: InSystem
    """Requests in the system over time."""
    engine: EngineCounts
    """Engine counters."""
    gpu_utilization: GpuUtilization
    """Busy share of each replica."""
    prefix_cache: PrefixCacheStats
    """Prefix-cache hits."""
    fairness: Fairness
    """Fairness across tenants."""
    sessions: SessionStats
    """Ended sessions."""
    network: NotRequired[NetworkStats]
    """Per-link figures; only when the run had links (client networks, KV transfers)."""
    devices: NotRequired[DeviceStats]
    """Energy, cost and cold starts; only when some replica group names a device."""
    speculation: NotRequired[SpeculationStats]
    """Speculative decoding's figures; only with a ``speculation`` section."""
    planner: NotRequired[PlannerStats]
    """The planner's ticks, changes and GPU use; only with a ``planner`` section."""
    autoscaler: NotRequired[AutoscalerStats]
    """The autoscaler's decisions and replica use; only with an ``autoscaler`` section."""
    gateway: NotRequired[GatewayStats]
    """The gateway's queues; only with ``serving.gateway``."""
    disaggregation: NotRequired[DisaggregationStats]
    """KV transfers between the prefill and decode pools; only for a disaggregated fleet."""
    workflows: NotRequired[dict[str, WorkflowStats]]
    """Per workflow, its agentic sessions; only when there were some."""
    batch_servers: NotRequired[dict[str, BatchServerStats]]
    """Per request-level batch server (its replica index as a string key); only when the
    fleet has one."""
    diagnostics: list[DiagnosticEntry]
    """Findings that should change how the results are read (overload, an implausible
    latency profile, an idle fleet); empty when there is nothing to say."""


def flatten_summary(summary: Summary) -> list[tuple[str, str, str, str, float]]:
    """Rows ``(section, metric, statistic, group, value)`` of *summary*, one per number, in
    the summary's order (see "Long format" in the module docstring).

    Examples
    --------
    >>> stats = {"mean": 1.0, "p50": 1.0, "p90": 2.0, "p95": 2.0, "p99": None}
    >>> rows = flatten_summary({"duration_s": 4.0, "latency_s_by_class": {"gold": {"e2e": stats}}})
    >>> for row in rows[:2] + rows[-1:]:
    ...     print(row)
    ('duration_s', 'duration_s', 'value', '', 4.0)
    ('latency_s_by_class', 'e2e', 'mean', 'gold', 1.0)
    ('latency_s_by_class', 'e2e', 'p99', 'gold', nan)
    """
    hints = _hints(Summary)
    rows: list[tuple[str, str, str, str, float]] = []
    for section, value in summary.items():
        _walk(value, hints[section], section, [], [], rows)
    return rows


def _hints(typed_dict: object) -> dict[str, object]:
    return typing.get_type_hints(typed_dict)


def _walk(
    value: object,
    tp: object,
    section: str,
    fixed: list[str],
    groups: list[str],
    rows: list[tuple[str, str, str, str, float]],
) -> None:
    """Append the numbers under *value* (of schema type *tp*) to *rows*; *fixed* are the
    schema's keys below *section* so far, *groups* the open-ended keys."""
    tp = _without_none(tp)
    if isinstance(value, dict):
        if typing.is_typeddict(tp):
            hints = _hints(tp)
            for key, item in value.items():
                _walk(item, hints[key], section, [*fixed, key], groups, rows)
        else:
            item_tp = typing.get_args(tp)[1]
            for key, item in value.items():
                _walk(item, item_tp, section, fixed, [*groups, str(key)], rows)
    elif isinstance(value, list):
        item_tp = typing.get_args(tp)[0]
        for i, item in enumerate(value):
            _walk(item, item_tp, section, fixed, [*groups, str(i)], rows)
    elif value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        metric = ".".join(fixed[:-1]) or section
        statistic = fixed[-1] if fixed else "value"
        rows.append((section, metric, statistic, "/".join(groups), float("nan") if value is None else float(value)))


def _without_none(tp: object) -> object:
    """``X`` for ``X | None``; *tp* otherwise."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp

