"""Axis labels in words, with units, for the key paths that name a figure's columns.

A :func:`~simpy_llm.explore.sweep` frame's columns are key paths: the settings swept
(``serving.replicas``, ``workload.aggregate_rate``) and the summary's figures
(``latency_s.ttft.p99``, ``batch_servers.requests_per_busy_s[0]``); a request table's
are per-request columns (``ttft_s``, ``prompt_tokens``). :func:`axis_label` says such a
path as a paper's axis would: ``TTFT p99 (s)``, ``offered load (requests/s)``,
``busy throughput of batch server 0 (requests/s)``. :func:`is_count` tells whether a
path counts things (replicas, bins, requests), so that its axis gets integer ticks.

How a path becomes a label, first match wins:

1. :data:`LABELS`, the table of exact paths (settings, summary figures, the columns of
   the request, time-series and batch tables).
2. The families of summary paths: ``latency_s.<metric>.<stat>`` is
   ``<METRIC> <stat> (s)`` with the metric named by :data:`LATENCY_METRICS`
   (``latency_s.tpot.mean``: ``TPOT mean (s)``; a ``count`` has no unit);
   ``latency_s_by_class`` and ``latency_s_by_tenant`` likewise;
   ``batch_size.<stat>`` is ``batch size <stat> (requests)``; ``batch_servers.<figure>``
   is named by :data:`BATCH_SERVER_LABELS` (its ``batch_size``, ``service_s`` and
   ``by_bin.e2e_s`` statistics by the same rule as the latencies).
3. A path's group, the ``[...]`` a sweep column carries for per-class, per-replica and
   per-server figures, is said after the words, before the unit, with the noun
   :data:`GROUP_NOUNS` gives its path (``latency_s_by_class.ttft.p99[chat]``:
   ``TTFT p99 of class chat (s)``; ``batch_servers.by_bin.requests_per_s[0/1]``:
   ``throughput of batch server 0, bin 1 (requests/s)``).
4. Any other path is its own label: an unknown column is never an error.

A label's unit is its last parenthesised part; :func:`title_words` is the label without
it, for a title: :func:`title_against` (``TTFT p99 against offered load, by replicas``)
and :func:`title_over_time` say what a figure compares.

The module holds data and string rules only: it imports nothing, so any layer may name
its axes with it.

Examples
--------
>>> axis_label("latency_s.ttft.p99"), axis_label("workload.aggregate_rate")
('TTFT p99 (s)', 'offered load (requests/s)')
>>> axis_label("batch_servers.requests_per_busy_s[0]")
'busy throughput of batch server 0 (requests/s)'
>>> axis_label("my_column"), title_words("goodput.fraction")
('my_column', 'goodput')
>>> is_count("serving.replicas"), is_count("latency_s.ttft.p99")
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

__all__ = [
    "BATCH_SERVER_LABELS",
    "COUNT_NAMES",
    "GROUP_NOUNS",
    "LABELS",
    "LATENCY_METRICS",
    "axis_label",
    "is_count",
    "legend_label",
    "title_against",
    "title_over_time",
    "title_words",
]

LATENCY_METRICS: Mapping[str, str] = MappingProxyType({
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2e": "E2E",
    "queue_delay": "queue delay",
})
"""The latency metrics of the summary (``latency_s.<metric>``, a calibration's metric), by name."""

_STATISTICS = frozenset({"mean", "std", "min", "max", "p50", "p90", "p95", "p99", "count"})

LABELS: Mapping[str, str] = MappingProxyType({
    # Settings a sweep varies (scenario keys).
    "serving.replicas": "replicas",
    "workload.aggregate_rate": "offered load (requests/s)",
    "workload.num_requests": "requests",
    "workload.horizon_s": "arrival window (s)",
    "serving.router.kind": "router",
    "serving.engine.max_num_seqs": "max running requests",
    "serving.engine.max_num_batched_tokens": "token budget per step (tokens)",
    "serving.batch_server.batch_size": "batch size (requests)",
    "serving.batch_server.bins.count": "bins",
    "seed": "seed",
    "overloaded": "overloaded (1 = yes)",
    # Summary figures (sweep columns).
    "throughput.requests_per_s": "throughput (requests/s)",
    "throughput.output_tokens_per_s": "output tokens/s",
    "throughput.input_tokens_per_s": "input tokens/s",
    "throughput.offered_requests_per_s": "arrival rate (requests/s)",
    "throughput.whole_run_requests_per_s": "throughput over the whole run (requests/s)",
    "throughput.whole_run_output_tokens_per_s": "output tokens/s over the whole run",
    "throughput.whole_run_input_tokens_per_s": "input tokens/s over the whole run",
    "goodput.requests_per_s": "goodput (requests/s)",
    "goodput.whole_run_requests_per_s": "goodput over the whole run (requests/s)",
    "goodput.fraction": "goodput (share of requests)",
    "goodput.by_class.fraction": "goodput (share of requests)",
    "goodput.by_class.completed": "completed requests",
    "goodput.by_class.met": "requests meeting their SLO",
    "requests.arrived": "arrived requests",
    "requests.completed": "completed requests",
    "requests.dropped": "dropped requests",
    "requests.in_flight": "requests in flight at the end",
    "gpu_utilization.mean": "GPU utilization (share of time)",
    "gpu_utilization.per_replica": "GPU utilization (share of time)",
    "gpu_utilization.by_group": "GPU utilization (share of time)",
    "kv_utilization.time_weighted_mean": "KV cache use (share of blocks)",
    "kv_utilization.per_replica": "KV cache use (share of blocks)",
    "engine.busy_s": "busy time (s)",
    "engine.steps": "engine steps",
    "in_system.time_average": "requests in the system (time average)",
    "in_system.peak": "peak requests in the system",
    "preemptions.total": "preemptions",
    "preemptions.by_mode": "preemptions",
    "prefix_cache.hit_rate": "prefix cache hit rate (share of prompt tokens)",
    "devices.gpus": "GPUs",
    "devices.energy_j": "energy (J)",
    "devices.energy_j_per_replica": "energy (J)",
    "devices.energy_j_per_output_token": "energy per output token (J)",
    "devices.energy_j_per_request": "energy per request (J)",
    "devices.cost_usd": "cost (USD)",
    "devices.cost_usd_per_replica": "cost (USD)",
    "devices.cost_usd_per_1k_tokens": "cost per 1k tokens (USD)",
    "devices.goodput_per_gpu": "goodput per GPU (requests/s)",
    "duration_s.value": "simulated time (s)",
    "wall_s": "wall-clock time (s)",
    # Per-request columns (Results.to_dataframe()).
    "ttft_s": "TTFT (s)",
    "tpot_s": "TPOT (s)",
    "itl_s": "ITL (s)",
    "e2e_s": "E2E latency (s)",
    "queue_delay_s": "queue delay (s)",
    "client_ttft_s": "TTFT at the client (s)",
    "client_e2e_s": "E2E latency at the client (s)",
    "prompt_tokens": "prompt tokens",
    "output_tokens": "output tokens",
    "slo_class": "SLO class",
    "tenant_id": "tenant",
    "replica": "replica",
    "replica_group": "replica group",
    # Time series (Results.timeseries(), Results.gamma_timeline()).
    "time_s": "time (s)",
    "waiting": "waiting requests",
    "running": "running requests",
    "kv_used_blocks": "KV blocks in use",
    "kv_utilization": "KV cache use (share of blocks)",
    "busy": "busy (1 = yes)",
    "mean_gamma": "mean γ (draft tokens)",
    # The autoscaler's decisions (Results.autoscaler_decisions()).
    "seen": "metric seen (per replica)",
    "recommended": "recommended replicas",
    "stabilized": "stabilised replicas",
    # Batches (Results.batches()).
    "start_s": "start (s)",
    "end_s": "end (s)",
    "size": "batch size (requests)",
    "b_target": "target batch size (requests)",
    "service_s": "service time (s)",
})
"""Labels of exact key paths. A path that carries a group in a sweep column
(``gpu_utilization.per_replica[0]``) is found here without it, and the group is added as
:data:`GROUP_NOUNS` says."""

BATCH_SERVER_LABELS: Mapping[str, str] = MappingProxyType({
    "batches": "batches",
    "requests_per_s": "throughput (requests/s)",
    "requests_per_busy_s": "busy throughput (requests/s)",
    "gpu_utilization": "utilization (share of time)",
    "c_max_requests_per_s": "saturated capacity (requests/s)",
    "sla.d_sla_s": "SLA target (s)",
    "sla.violation_rate": "SLA violations (share of requests)",
    "memory.limit_tokens": "memory limit (tokens)",
    "memory.peak_tokens": "peak memory (tokens)",
    "memory.time_weighted_mean_tokens": "mean memory (tokens)",
    "memory.overflows": "memory overflows",
    "controller.final_b_target": "final target batch size (requests)",
    "controller.settled_b_target": "settled target batch size (requests)",
    "controller.convergence_s": "controller convergence time (s)",
    "by_bin.completed": "completed requests",
    "by_bin.requests_per_s": "throughput (requests/s)",
    "by_bin.mean_queue_length": "mean queue length (requests)",
    "by_bin.queued_at_end": "requests queued at the end",
})
"""Labels of a batch server's figures, the path after ``batch_servers.`` (its group, the
server's index, is added after the words)."""

_BATCH_SERVER_STATISTICS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "batch_size": ("batch size", "requests"),
    "service_s": ("service time", "s"),
    "by_bin.e2e_s": ("E2E latency", "s"),
})

GROUP_NOUNS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "latency_s_by_class": ("class",),
    "latency_s_by_tenant": ("tenant",),
    "goodput.by_class": ("class",),
    "batch_servers.by_bin": ("batch server", "bin"),
    "batch_servers": ("batch server",),
    "gpu_utilization.by_group": ("replica group",),
    "preemptions.by_mode": ("mode",),
    "per_replica": ("replica",),
    "engine.busy_s": ("replica",),
    "devices.energy_j_per_replica": ("replica",),
    "devices.cost_usd_per_replica": ("replica",),
    "batch_size.histogram": ("batch size",),
    "by_tenant": ("tenant",),
})
"""The nouns of a path's group levels (``0/1``: one noun per level), by the longest dotted
prefix of the path found here, else by one of its parts (``per_replica``)."""

COUNT_NAMES = frozenset({
    "replicas", "count", "num_requests", "max_num_seqs", "max_num_batched_tokens", "batch_size", "batches",
    "bins", "gpus", "steps", "seed", "arrived", "completed", "dropped", "in_flight", "warm_up", "met", "total",
    "requests_preempted", "tenants", "peak", "overflows", "queued_at_end", "prompt_tokens", "output_tokens",
    "waiting", "running", "kv_used_blocks", "size", "replica", "num_preemptions", "recommended", "stabilized",
    "current",
})
"""Last parts of key paths that count things (``serving.replicas``, ``latency_s.ttft.count``,
``serving.batch_server.bins.count``): :func:`is_count` is true for them."""


def _split_group(path: str) -> tuple[str, str]:
    """(``a.b``, ``g``) for ``a.b[g]``; (*path*, "") without a group."""
    if path.endswith("]") and "[" in path:
        base, _, group = path[:-1].partition("[")
        return base, group
    return path, ""


def _with_unit(words: str, unit: str) -> str:
    return f"{words} ({unit})" if unit else words


def _statistic(name: str, statistic: str, unit: str) -> str | None:
    """``<name> <statistic> (<unit>)``; a count has no unit; None for an unknown statistic."""
    if statistic not in _STATISTICS:
        return None
    return _with_unit(f"{name} {statistic}", "" if statistic == "count" else unit)


def _words(base: str) -> str | None:
    """The label of a path without its group, or None when no rule knows it."""
    if base in LABELS:
        return LABELS[base]
    section, _, rest = base.partition(".")
    metric, _, statistic = rest.rpartition(".")
    if section in ("latency_s", "latency_s_by_class", "latency_s_by_tenant") and metric in LATENCY_METRICS:
        return _statistic(LATENCY_METRICS[metric], statistic, "s")
    if section == "batch_size":
        return _statistic("batch size", rest, "requests")
    if section == "batch_servers":
        if rest in BATCH_SERVER_LABELS:
            return BATCH_SERVER_LABELS[rest]
        if metric in _BATCH_SERVER_STATISTICS:
            name, unit = _BATCH_SERVER_STATISTICS[metric]
            return _statistic(name, statistic, unit)
    return None


def _group_nouns(base: str) -> tuple[str, ...]:
    parts = base.split(".")
    for end in range(len(parts), 0, -1):
        nouns = GROUP_NOUNS.get(".".join(parts[:end]))
        if nouns is not None:
            return nouns
    for part in reversed(parts):
        if part in GROUP_NOUNS:
            return GROUP_NOUNS[part]
    return ()


def _qualified(label: str, qualifier: str) -> str:
    """*label* with *qualifier* after its words and before its unit."""
    words, unit = _parts(label)
    return _with_unit(f"{words} {qualifier}", unit)


def _parts(label: str) -> tuple[str, str]:
    """(words, unit) of a label whose unit is its last parenthesised part; (label, "") otherwise."""
    if label.endswith(")") and " (" in label:
        words, _, unit = label[:-1].rpartition(" (")
        return words, unit
    return label, ""


def axis_label(path: str) -> str:
    """The words, and the unit, that say key path *path* on an axis; *path* itself when no
    rule of the table knows it (see the module docstring).

    Parameters
    ----------
    path
        A column of a sweep frame or of a result table (``latency_s.e2e.p50``,
        ``serving.replicas``, ``ttft_s``), possibly with a group (``...[interactive]``).

    Returns
    -------
    str
        ``words (unit)``, or ``words`` for a count or a figure without a unit.

    Examples
    --------
    >>> axis_label("latency_s.e2e.p50"), axis_label("latency_s.tpot.mean"), axis_label("latency_s.ttft.count")
    ('E2E p50 (s)', 'TPOT mean (s)', 'TTFT count')
    >>> axis_label("throughput.requests_per_s"), axis_label("throughput.output_tokens_per_s")
    ('throughput (requests/s)', 'output tokens/s')
    >>> axis_label("latency_s_by_class.ttft.p99[interactive]"), axis_label("batch_servers.by_bin.requests_per_s[0/1]")
    ('TTFT p99 of class interactive (s)', 'throughput of batch server 0, bin 1 (requests/s)')
    >>> axis_label("gpu_utilization.per_replica[2]"), axis_label("latency_s.ttft.p42")
    ('GPU utilization of replica 2 (share of time)', 'latency_s.ttft.p42')
    """
    base, group = _split_group(path)
    words = _words(base)
    if words is None:
        return path
    if not group:
        return words
    levels = group.split("/")
    nouns = _group_nouns(base)
    said = [f"{noun} {level}" for noun, level in zip(nouns, levels, strict=False)] + levels[len(nouns):]
    return _qualified(words, "of " + ", ".join(said))


def title_words(path: str) -> str:
    """:func:`axis_label` without its unit, for a title.

    Examples
    --------
    >>> title_words("latency_s.ttft.p99"), title_words("throughput.output_tokens_per_s"), title_words("k")
    ('TTFT p99', 'output tokens/s', 'k')
    """
    return _parts(axis_label(path))[0]


def legend_label(path: str, value: object = None) -> str:
    """A legend entry in words: the curve of column *path*, or with *value*, the group whose
    column *path* has that value.

    Examples
    --------
    >>> legend_label("latency_s.ttft.p99"), legend_label("serving.replicas", 2), legend_label("policy", "fcfs")
    ('TTFT p99', 'replicas 2', 'policy fcfs')
    """
    words = title_words(path)
    return words if value is None else f"{words} {value}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def title_against(y: str, x: str, by: str | None = None) -> str:
    """The title of a plot of column *y* against column *x*, one curve per value of *by*.

    Examples
    --------
    >>> title_against("latency_s.ttft.p99", "workload.aggregate_rate", "serving.replicas")
    'TTFT p99 against offered load, by replicas'
    """
    return _sentence(f"{title_words(y)} against {title_words(x)}" + ("" if by is None else f", by {title_words(by)}"))


def title_over_time(columns: Sequence[str], by: str | None = None) -> str:
    """The title of a plot of *columns* against time, one line per value of *by* and column.

    Examples
    --------
    >>> title_over_time(["waiting", "running", "kv_utilization"], "replica")
    'Waiting requests, running requests and KV cache use over time, by replica'
    """
    words = [title_words(c) for c in columns]
    said = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
    return _sentence(f"{said} over time" + ("" if by is None else f", by {title_words(by)}"))


def is_count(path: str) -> bool:
    """Whether key path *path* counts things (its last part, before any group, is one of
    :data:`COUNT_NAMES`), so that its axis takes integer ticks.

    Examples
    --------
    >>> [is_count(p) for p in ("serving.replicas", "serving.batch_server.bins.count", "workload.num_requests",
    ...                        "batch_servers.batches[0]", "latency_s.ttft.mean", "workload.aggregate_rate")]
    [True, True, True, True, False, False]
    """
    return _split_group(path)[0].rpartition(".")[2] in COUNT_NAMES
