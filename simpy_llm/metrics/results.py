"""Results of a run: per-request records, summaries, files.

Kept whole (over 800 lines): it is the one object a user reads a run through; the figures
themselves live with their subsystems (:class:`Subsystems`), and what is left here is their
joining, the request table's accessors and the files a run saves.

Metric definitions (seconds unless named otherwise):

* ``ttft_s`` = first_token_s - arrival_s
* ``e2e_s`` = completion_s - arrival_s
* ``tpot_s`` = (completion_s - first_token_s) / (output_tokens - 1), for requests with
  more than one output token
* ``queue_delay_s`` = first_scheduled_s - enqueue_s (time in a replica's waiting queue)
* ``client_ttft_s`` = ttft_s + upload_s + download_s and ``client_e2e_s`` = e2e_s +
  upload_s + download_s: what a client with a ``network`` sees (the prompt's upload and
  one token's download, ``docs/network.md``); equal to the server's without one. Client
  ITL and TPOT equal the server's (every token is delayed alike). SLO targets are
  judged on the client's TTFT and E2E.
* ITL: every gap between consecutive output tokens of a measured streaming request,
  weighted one per token (kept as weighted values by the engine, not per token)

A request that does not stream (``streaming == 0``) reaches its client in one
response, so the summary's client-side TTFT, TPOT and ITL leave it out; E2E and
queueing delay cover every request. The per-request ``ttft_s`` and ``tpot_s`` of
:meth:`Results.derived` and :meth:`Results.to_dataframe` are the server's, for every
request. :mod:`simpy_llm.metrics.summary` documents every key of the summary.

Percentiles of per-request metrics use numpy's default (linear) interpolation
over completed requests; ITL percentiles use the inverted CDF of the weighted
gaps.

Rates and their windows
-----------------------
A run has two spans a rate can divide by, and the summary says which each uses:

* the **arrival window** ``(a0, a1]``, from the first to the last arrival of a
  measured request (``throughput.window_start_s`` and ``throughput.window_s``).
  ``throughput.requests_per_s``, its token rates and ``goodput.requests_per_s``
  count the completions *inside* it (of any request: a warm-up request finishing
  in the window is work done in it) and divide by its length. This is the
  departure-counting estimate of a queue's throughput: while requests keep
  arriving, a system that keeps up completes them as fast as they come (with
  deterministic arrivals and service it equals the offered rate exactly), and an
  overloaded one completes them at its capacity. ``throughput.offered_requests_per_s``
  is the arrivals in the same window over its length, so the two compare directly.
  What happens after the last arrival, the **drain** (``throughput.drain_s``: the
  last arrival to the last completion), is left out: a backlog emptying after the
  load has stopped says nothing about the load.
* the **whole run**, from ``measurement.start_s`` (0, or the first measured arrival
  with warm-up) to the end of the run (``duration_s``: the last completion, or
  ``until_s``), drain included: ``throughput.whole_run_*`` and
  ``goodput.whole_run_requests_per_s`` count the completed measured requests over
  it. A short run's whole-run rate falls well below its offered load when its
  drain is long.

A window of zero length (a single arrival, or every request arriving at once) has
no arrival rate: its windowed rates are NaN, and the whole-run rates remain.

Warm-up requests (``warm_up == 1``, the first requests of a replayed trace) are
simulated like any other but left out of every latency, fairness and
prefix-cache figure, of the goodput fraction and of the whole-run rates; they
only open the arrival window later (it starts at the first measured arrival),
and a warm-up request completing inside it counts as a completion there. Request
counts, drops, preemptions and the engine's figures (busy time, KV use, batch
sizes) cover the whole run, warm-up included: the engine's counters are not kept
per request. ITL is not one of them: the engine tallies the gaps of measured
streaming requests only.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Iterator
from html import escape
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import numpy as np

from simpy_llm.config.plain import scenario_hash, scenario_to_dict
from simpy_llm.metrics.diagnostics import diagnose
from simpy_llm.metrics.manifest import input_files
from simpy_llm.metrics.record import RECORD_FIELDS
from simpy_llm.metrics.requests import RequestResults
from simpy_llm.metrics.speculation import SpeculationResults
from simpy_llm.metrics.stats import latency_stats
from simpy_llm.metrics.stream import ChunkColumns, StreamedRecords, StreamedRequestResults
from simpy_llm.metrics.summary import (
    FRAME_COLUMNS,
    GatewaySection,
    GatewayStats,
    PrefixCacheStats,
    Summary,
    flatten_summary,
)
from simpy_llm.network.link_results import LinkResults
from simpy_llm.serving.autoscaler import AutoscalerLog, autoscaler_summary
from simpy_llm.serving.batch_results import CONVERGENCE_WINDOW_BATCHES, BatchServerResults, controller_stats
from simpy_llm.serving.disaggregation_results import KvTransferResults
from simpy_llm.serving.planner_results import PlannerResults
from simpy_llm.serving.replica_results import ReplicaResults
from simpy_llm.workload.session_results import SessionResults, WorkflowResults

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.record import RequestRecord
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.network.link import LinkStats
    from simpy_llm.serving.devices import DeviceProfile
    from simpy_llm.serving.planner import PlannerLog
    from simpy_llm.serving.prefix_cache import CpuTier

__all__ = ["CONVERGENCE_WINDOW_BATCHES", "Results", "Subsystems", "rate_lines"]

_controller_stats = controller_stats
"""The batch controller's statistics under the name this module gave them first
(:func:`~simpy_llm.serving.batch_results.controller_stats`)."""


@attrs.frozen(eq=False)
class Subsystems:
    """A run's results by subsystem, each next to what it reports on, with ``to_dataframe()``
    and its part of the summary; :class:`Results` shows them together."""

    requests: RequestResults
    """The request table (:meth:`Results.to_dataframe`) and the request sections of the summary."""
    replicas: ReplicaResults
    """Sampled replica state (:meth:`Results.timeseries`), preemptions, engine counters and devices."""
    batch_servers: BatchServerResults
    """Request-level batch servers (:meth:`Results.batches`)."""
    sessions: SessionResults
    """Ended multi-turn sessions (:meth:`Results.sessions`)."""
    workflows: WorkflowResults
    """Agentic sessions and their tool calls (:meth:`Results.workflow_sessions`, :meth:`Results.tool_calls`)."""
    kv_transfers: KvTransferResults
    """A disaggregated fleet's KV transfers (:meth:`Results.kv_transfers`)."""
    links: LinkResults
    """Network links (:meth:`Results.links`)."""
    speculation: SpeculationResults
    """Speculative decoding's rounds and drafter switches (:meth:`Results.spec_rounds`)."""
    planner: PlannerResults
    """The planner's decisions (:meth:`Results.planner_decisions`)."""


class Results:
    """What a run produced. Build with :meth:`from_recorder`; read with
    :meth:`to_dataframe`, :meth:`summary`, :meth:`records`; write with :meth:`save`.

    Each subsystem's results live next to it (:attr:`subsystems`); the methods here show
    them together, and :meth:`summary` joins their parts in one order.
    """

    def __init__(
        self,
        columns: dict[str, np.ndarray],
        *,
        scenario: Scenario,
        end_s: float,
        wall_s: float,
        events: int,
        steps: int,
        recorder: Recorder,
        kv_blocks: list[int],
        replica_groups: list[str] | None = None,
        replica_devices: list[tuple[DeviceProfile | None, int]] | None = None,
        links: dict[str, LinkStats] | None = None,
        draft_busy_s: dict[str, list[float]] | None = None,
        planner: PlannerLog | None = None,
        autoscaler: AutoscalerLog | None = None,
        gateway: GatewayStats | None = None,
        streamed: StreamedRecords | None = None,
    ) -> None:
        self.streamed_records = streamed
        """A streamed run's chunk files (``Simulation(..., stream_to=DIR)``, :mod:`simpy_llm.metrics.stream`):
        its records are there, not in memory; None: the records are in :attr:`columns`."""
        if streamed is not None:
            columns = ChunkColumns(streamed)
        self.columns = columns
        """Record columns (strings decoded), sorted by request id (a streamed run: each read
        from the chunks when looked up, :class:`~simpy_llm.metrics.stream.ChunkColumns`).
        A column whose records all hold one value is a read-only view of that value
        (:func:`numpy.broadcast_to`: no memory per record); copy it to write into it."""
        self.scenario = scenario
        self.end_s = end_s
        """Simulated duration, s."""
        self.wall_s = wall_s
        """Wall-clock seconds the run took."""
        self.events = events
        """SimPy events scheduled."""
        self.steps = steps
        """Engine steps over all replicas."""
        self._recorder = recorder
        self._kv_blocks = kv_blocks
        if replica_groups is not None and len(replica_groups) != len(kv_blocks):
            raise ValueError(
                f"replica_groups names {len(replica_groups)} replicas, kv_blocks {len(kv_blocks)}"
            )
        self.replica_groups = None if replica_groups is None else list(replica_groups)
        """Replica group name per replica index (``None``: not given)."""
        self.replica_devices = None if replica_devices is None else list(replica_devices)
        """``(device profile or None, GPUs)`` per replica index (``None``: not given)."""
        self.link_stats = dict(links or {})
        """:class:`~simpy_llm.network.link.LinkStats` of every link at the end of the run, by name."""
        self.draft_busy_s = dict(draft_busy_s or {})
        """Speculative decoding: each draft group's devices' drafting time, s, by group name."""
        self.planner_log = planner
        """The planner's :class:`~simpy_llm.serving.planner.PlannerLog` (None: no planner)."""
        self.autoscaler_log = autoscaler
        """The autoscaler's :class:`~simpy_llm.serving.autoscaler.AutoscalerLog` (None: no autoscaler)."""
        self.gateway_stats = gateway
        """The gateway's figures at the end (:class:`~simpy_llm.metrics.summary.GatewayStats`; None: no gateway)."""
        groups = self.replica_groups
        kv = KvTransferResults(recorder.kv_transfers, groups)
        requests = (
            RequestResults(columns, scenario=scenario, end_s=end_s, replica_groups=groups) if streamed is None
            else StreamedRequestResults(streamed, scenario=scenario, end_s=end_s, replica_groups=groups)
        )
        self.subsystems = Subsystems(
            requests=requests,
            replicas=ReplicaResults(
                recorder, columns=columns, end_s=end_s, steps=steps, kv_blocks=kv_blocks, replica_groups=groups,
                replica_devices=self.replica_devices, totals=None if streamed is None else streamed.tally.totals(),
            ),
            batch_servers=BatchServerResults(recorder, columns=columns, scenario=scenario, end_s=end_s, replica_groups=groups),
            sessions=SessionResults(recorder.sessions),
            workflows=WorkflowResults(recorder.workflow_sessions, recorder.tool_calls),
            kv_transfers=kv,
            links=LinkResults(self.link_stats, end_s),
            speculation=SpeculationResults(recorder, scenario=scenario, columns=columns, draft_busy_s=self.draft_busy_s, end_s=end_s),
            planner=PlannerResults(planner, columns=columns, kv_transfers=kv, end_s=end_s),
        )
        """The results of each subsystem (:class:`Subsystems`)."""

    @classmethod
    def from_recorder(
        cls,
        recorder: Recorder,
        *,
        scenario: Scenario,
        end_s: float,
        wall_s: float,
        events: int,
        steps: int,
        kv_blocks: list[int],
        replica_groups: list[str] | None = None,
        replica_devices: list[tuple[DeviceProfile | None, int]] | None = None,
        links: dict[str, LinkStats] | None = None,
        draft_busy_s: dict[str, list[float]] | None = None,
        planner: PlannerLog | None = None,
        autoscaler: AutoscalerLog | None = None,
        gateway: GatewayStats | None = None,
        streamed: StreamedRecords | None = None,
    ) -> Results:
        """Freeze a recorder's columns into Results (records sorted by request id); the
        recorder's columns are emptied as they are taken.

        *kv_blocks* is each replica's KV block count; *replica_groups*, when given,
        each replica's group name (both indexed by replica); *streamed*, the chunks a
        streamed run's records went to (the recorder then holds none).
        """
        order = np.argsort(np.frombuffer(recorder.columns["request_id"], dtype=np.int64), kind="stable")
        rows = recorder.rows
        columns: dict[str, np.ndarray] = {}
        for name, kind in RECORD_FIELDS:
            dtype = np.float64 if kind == "f" else np.int64
            single = recorder.single_value(name)
            if single is not None:
                # One value in every record: a read-only view of it, no memory per record
                # (the same values, in any order, as the array it stands for).
                arr = np.frombuffer(single, dtype=dtype)
            else:
                # taken out of the recorder (memory for one copy); indexing by *order* copies
                arr = np.frombuffer(recorder.take_column(name), dtype=dtype)[order]
            if kind == "s":
                names = np.array(recorder.codes[name].names, dtype=object)
                arr = names[arr] if arr.size else np.array([], dtype=object)
            if single is not None:
                arr = np.broadcast_to(arr, (rows,))
            columns[name] = arr
        return cls(
            columns,
            scenario=scenario,
            end_s=end_s,
            wall_s=wall_s,
            events=events,
            steps=steps,
            recorder=recorder,
            kv_blocks=kv_blocks,
            replica_groups=replica_groups,
            replica_devices=replica_devices,
            links=links,
            draft_busy_s=draft_busy_s,
            planner=planner,
            autoscaler=autoscaler,
            gateway=gateway,
            streamed=streamed,
        )

    def __len__(self) -> int:
        if self.streamed_records is not None:
            return self.streamed_records.count
        return len(self.columns["request_id"])

    # --- the request table ---------------------------------------------------
    def records(self) -> Iterator[RequestRecord]:
        """The records as frozen objects, in request-id order."""
        return self.subsystems.requests.records()

    def derived(self) -> dict[str, np.ndarray]:
        """Per-request latency metrics (see the module docstring), aligned with the records."""
        return self.subsystems.requests.derived()

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request with the record fields, ``replica_group`` and the derived metrics.

        ``replica_group`` is the group of the request's replica; empty for requests
        never routed (``replica == -1``) and when the Results were built without
        ``replica_groups``.
        """
        return self.subsystems.requests.to_dataframe()

    # --- the other subsystems' tables -----------------------------------------
    def timeseries(self) -> pd.DataFrame:
        """Sampled replica state, one row per (sample time, replica), sorted by both.

        Columns: ``time_s``, ``replica``, ``waiting`` (requests in its waiting queue),
        ``running`` (requests in its batch), ``kv_used_blocks``, ``kv_utilization``
        (used / the replica's KV blocks) and ``busy`` (1 if it had a batch, else 0).
        Samples exist only when the scenario sets ``simulation.timeseries_interval_s``
        (every replica each interval, from t = 0 to the end of the run); otherwise the
        frame is empty, with these columns.

        Examples
        --------
        >>> from simpy_llm import Simulation, load_scenario
        >>> overrides = ["workload.num_requests=20", "simulation.timeseries_interval_s=0.25"]
        >>> ts = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run().timeseries()
        >>> list(ts.columns)
        ['time_s', 'replica', 'waiting', 'running', 'kv_used_blocks', 'kv_utilization', 'busy']
        >>> ts["time_s"].iloc[:3].tolist()
        [0.0, 0.25, 0.5]
        """
        return self.subsystems.replicas.to_dataframe()

    def preemptions(self) -> pd.DataFrame:
        """One row per preemption: request_id, replica, time_s, mode (``recompute`` or ``swap``)."""
        return self.subsystems.replicas.preemptions()

    def batches(self) -> pd.DataFrame:
        """One row per batch a request-level batch server finished, in (replica, batch) order.

        Columns: ``replica``, ``replica_group``, ``batch`` (number within its server, in
        formation order), ``bin``, ``size``, ``formed_s``, ``start_s``, ``end_s``,
        ``service_s`` (end - start), ``b_target``, ``b_mem``, ``b_sla`` (the dynamic
        batcher's sizes; NaN with a fixed batch size), ``memory_tokens`` (prompt plus
        output tokens held) and ``memory_limit_tokens`` (NaN without a limit).

        Examples
        --------
        >>> from simpy_llm import Simulation, load_scenario
        >>> r = Simulation(load_scenario("scenarios/multi_bin_only.yaml", {"workload.num_requests": 64})).run()
        >>> frame = r.batches()
        >>> int(frame["size"].sum()) <= 64, bool((frame["end_s"] >= frame["start_s"]).all())
        (True, True)
        """
        return self.subsystems.batch_servers.to_dataframe()

    def workflow_sessions(self) -> pd.DataFrame:
        """One row per agentic session (``docs/agentic.md``), in session-id order.

        Columns: ``session_id``, ``client_id``, ``workflow``, ``start_s`` (its root request's
        arrival), ``end_s`` (its last call's end), ``e2e_s``, ``llm_calls``, ``tool_calls``,
        ``tool_wait_s`` (summed time of its tool calls, waiting for the tool included),
        ``iterations`` (loop iterations started; 0 without a loop), ``fan_out_planned`` and
        ``fan_out_done`` (instances of fan-out steps started and finished),
        ``critical_queue_s`` (time the LLM calls on its critical path, the chain of calls
        each released by the one before, waited at the replica before their first step),
        ``critical_queue_share`` (that over ``e2e_s``) and ``end_reason``.
        """
        return self.subsystems.workflows.to_dataframe()

    def tool_calls(self) -> pd.DataFrame:
        """One row per tool call of an agentic session that returned, in (session, start) order.

        Columns: ``session_id``, ``client_id``, ``step_id``, ``tool``, ``loop_iteration``,
        ``instance`` (of a fan-out step), ``start_s`` (called), ``wait_s`` (waiting for a
        tool with a capacity), ``end_s`` (returned), ``latency_s`` (its drawn latency: end -
        start - wait) and ``output_tokens``.
        """
        return self.subsystems.workflows.tool_call_frame()

    def links(self) -> pd.DataFrame:
        """One row per network link (clients' uplinks, KV links), by name, with its figures at
        the end of the run: ``messages`` put, ``delivered``, ``dropped``, ``in_flight``,
        ``bytes``, ``retransmissions``, ``busy_s`` (bytes moving), ``utilisation`` (busy over
        the run's duration), ``mean_queueing_s`` (per delivered message: time beyond what it
        would take alone on an idle link) and ``outage_wait_s``."""
        return self.subsystems.links.to_dataframe()

    def kv_transfers(self) -> pd.DataFrame:
        """One row per KV transfer of a disaggregated fleet, in request-id order.

        Columns: ``request_id``, ``prefill_replica``, ``decode_replica``, ``bytes``,
        ``start_s`` (the prefill handed it off), ``end_s`` (the KV reached the decode
        replica) and ``transfer_s`` (their difference, the request's ``kv_transfer_s``).
        """
        return self.subsystems.kv_transfers.to_dataframe()

    def sessions(self) -> pd.DataFrame:
        """One row per session: session_id, client_id, rounds (created), end_reason."""
        return self.subsystems.sessions.to_dataframe()

    def planner_decisions(self) -> pd.DataFrame:
        """The planner's ticks: one row per candidate a tick evaluated (one per skipped tick).

        Columns (:data:`~simpy_llm.serving.planner.DECISION_COLUMNS`): ``tick``, ``time_s``,
        ``status`` (``evaluated`` / ``skipped``: fewer than ``min_requests`` in the window),
        ``window_requests``, ``waiting_requests`` / ``running_requests`` (summed over the
        replicas at the tick), ``candidate`` (``knob=value,...``), ``gpus`` (it keeps
        active), ``score`` (the objective in its what-if), ``feasible``, ``violation``
        (largest relative excess over a constraint), ``chosen``, ``applied`` (chosen and
        different from the configuration in force). Empty without a planner.

        Examples
        --------
        >>> from simpy_llm import Simulation, load_scenario
        >>> sc = load_scenario("scenarios/planner_pool_split.yaml", ["workload.num_requests=1000"])
        >>> frame = Simulation(sc).run(progress=False).planner_decisions()
        >>> frame.loc[frame["chosen"], "candidate"].tolist(), int(frame["applied"].sum())
        (['active_replicas=2'], 1)

        """
        return self.subsystems.planner.to_dataframe()


    def autoscaler_decisions(self) -> pd.DataFrame:
        """The autoscaler's decisions (:data:`~simpy_llm.serving.autoscaler.DECISION_COLUMNS`); empty without one."""
        return (self.autoscaler_log or AutoscalerLog()).decisions()
    def spec_rounds(self) -> pd.DataFrame:
        """Speculative decoding: one row per verify round
        (:func:`~simpy_llm.metrics.speculation.spec_round_frame`)."""
        return self.subsystems.speculation.to_dataframe()

    def drafter_switches(self) -> pd.DataFrame:
        """Speculative decoding: one row per mid-decode drafter escalation."""
        return self.subsystems.speculation.drafter_switches()

    def gamma_timeline(self, bin_s: float = 1.0) -> pd.DataFrame:
        """Speculative decoding: mean γ, rounds and acceptance per *bin_s* of simulated time
        (:func:`~simpy_llm.metrics.speculation.gamma_timeline`)."""
        return self.subsystems.speculation.gamma_timeline(bin_s)

    # --- summary -----------------------------------------------------------
    def summary(self) -> Summary:
        """Headline metrics as plain data (JSON-ready); deterministic for a seed.

        :class:`~simpy_llm.metrics.summary.Summary` documents every key, its unit and
        meaning. Latency, throughput, goodput, fairness and prefix-cache figures are over
        measured requests (not warm-up); see the module docstring for what else
        covers the whole run. ``latency_s`` is what clients see: TTFT, TPOT and ITL
        over streaming requests only, E2E and queueing delay over all, each with the
        ``count`` of values it covers (ITL: token gaps, from ``requests`` requests).
        Besides the headline keys:

        * ``requests``: ``arrived``, ``completed``, ``dropped``, ``in_flight`` (every
          request, warm-up included), ``warm_up`` (how many were warm-up),
          ``dropped_by_reason`` ``{reason: n}`` and ``dropped_by_class``
          ``{slo_class: {reason: n}}`` (every drop; ``unknown`` for a drop without a reason).
        * ``throughput``: completions per second inside the arrival window (first to last
          measured arrival: ``window_start_s``, ``window_s``), the arrivals offered in it
          (``offered_requests_per_s``), the drain after it (``drain_s``) and the
          ``whole_run_*`` rates over ``measurement``; ``goodput.requests_per_s`` is over
          the arrival window too (see "Rates and their windows" in the module docstring).
        * ``measurement``: the span the whole-run rates divide by: ``start_s`` (0, or the
          first measured arrival when there is warm-up) and ``duration_s`` (to the end of
          the run).
        * ``latency_s_by_class`` / ``latency_s_by_tenant``: ``{name: {ttft, tpot, e2e,
          queue_delay: {mean, p50, p90, p95, p99}}}`` over completed measured requests (TTFT
          and TPOT over the streaming ones), for every class / tenant with a measured
          request (``None`` where none completed).
        * ``fairness``: Jain's index (J = (sum x)^2 / (n sum x^2)) across tenants of two
          allocations x, with the per-tenant values: ``completed_share`` (completed / all
          measured requests of the tenant) and ``inverse_normalized_e2e`` (1 / mean of
          e2e_s / output_tokens over its completed requests); see
          :mod:`simpy_llm.metrics.fairness`. One tenant gives 1.0.
        * ``gpu_utilization``: ``per_replica`` busy seconds / ``duration_s`` (a ratio in
          [0, 1]) and their ``mean`` (and ``by_group`` when replica groups are known).
        * ``prefix_cache``: ``hit_rate`` = sum of ``cached_tokens`` / sum of
          ``prompt_tokens`` over measured requests admitted at least once (``None`` when
          none was), and those two sums.
        * ``preemptions.by_mode``: preemptions per mode (``recompute``, ``swap``).
        * ``engine.group``: each replica's group, when replica groups are known.

        Each subsystem (:attr:`subsystems`) gives its own sections; this joins them in the
        order above, the optional ones where they apply.

        Examples
        --------
        >>> from simpy_llm import Simulation, load_scenario
        >>> s = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])).run().summary()
        >>> s["requests"]["completed"], s["requests"]["warm_up"], s["prefix_cache"]["cached_tokens"]
        (50, 0, 0)
        >>> 0 < s["gpu_utilization"]["mean"] <= 1, s["fairness"]["completed_share"]["jain"]
        (True, 1.0)
        >>> s["latency_s"]["ttft"]["count"], s["latency_s"]["e2e"]["count"]
        (50, 50)
        """
        parts = self.subsystems
        requests = parts.requests
        outcomes = requests.outcomes()
        whole_s = self.end_s if self.end_s > 0 else float("nan")  # the engines' figures cover the whole run
        gateway: GatewaySection = {"gateway": self.gateway_stats} if self.gateway_stats is not None else {}
        return {
            "requests": requests.counts(self._recorder.arrived),
            "duration_s": self.end_s,
            "measurement": {"start_s": outcomes.start_s, "duration_s": outcomes.run_s},
            **requests.latency(outcomes, self._recorder.itl),
            **requests.rates(outcomes),
            **parts.replicas.summary(whole_s),
            "prefix_cache": _with_tiers(requests.prefix_cache(outcomes.measured), self._recorder.kv_tiers),
            "fairness": requests.fairness(outcomes.measured),
            **parts.sessions.summary(),
            **parts.batch_servers.summary(whole_s),
            **parts.workflows.summary(),
            **parts.kv_transfers.summary(),
            **parts.replicas.devices(whole_s, outcomes.goodput_per_s),
            **parts.links.summary(),
            **parts.speculation.summary(outcomes.done, outcomes.met),
            **parts.planner.summary(int(outcomes.met.sum())),
            **autoscaler_summary(self.autoscaler_log, self.end_s),
            **gateway,
            "diagnostics": [d.to_dict() for d in diagnose(self)],
        }

    def summary_frame(self) -> pd.DataFrame:
        """The :meth:`summary` in long format: one row per number.

        Columns ``section`` (the summary's top-level key), ``metric``, ``statistic``,
        ``group`` (an SLO class, tenant, drop reason, replica... or empty for the whole
        run) and ``value`` (float; ``None`` is NaN); see "Long format" in
        :mod:`simpy_llm.metrics.summary` for how keys map to columns.

        Examples
        --------
        >>> from simpy_llm import Simulation, load_scenario
        >>> frame = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])).run().summary_frame()
        >>> list(frame.columns)
        ['section', 'metric', 'statistic', 'group', 'value']
        >>> rows = frame.query("metric == 'ttft' and statistic == 'p99'")
        >>> rows[["section", "group"]].values.tolist()  # the run's, then per class and per tenant  # doctest: +NORMALIZE_WHITESPACE
        [['latency_s', ''], ['latency_s_by_class', 'batch'], ['latency_s_by_class', 'interactive'],
         ['latency_s_by_tenant', 'batch'], ['latency_s_by_tenant', 'chat']]
        >>> frame.query("section == 'requests' and statistic == 'completed'")["value"].item()
        50.0
        """
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        frame = pd.DataFrame(flatten_summary(self.summary()), columns=list(FRAME_COLUMNS))
        return frame.astype({name: "string" for name in FRAME_COLUMNS[:-1]} | {"value": "float64"})

    # --- display -------------------------------------------------------------
    def __repr__(self) -> str:
        """Two lines: request outcomes and simulated duration; TTFT, throughput and wall time.

        TTFT and throughput are the summary's (client-side TTFT of completed measured
        streaming requests; completions per second of the arrival window, see "Rates and
        their windows" in :mod:`simpy_llm.metrics.results`), computed without the rest of
        :meth:`summary`. A streamed run's shows its records' chunks and the summary's
        counts (its TTFT needs the chunks: :meth:`summary`).
        """
        if self.streamed_records is not None:
            return self._streamed_repr(self.streamed_records)
        requests = self.subsystems.requests
        status = self.columns["status"]
        measured = self.columns["warm_up"] == 0
        done = (status == "completed") & measured
        ttft = latency_stats(requests.metric("ttft_s", done, client=True))
        tp = requests.windowed_rates(measured)[0]
        if math.isnan(tp["requests_per_s"]):
            rates = "no arrival window to rate"
        else:
            rates = f"{tp['requests_per_s']:,.2f} req/s, {tp['output_tokens_per_s']:,.1f} output tokens/s in the arrival window"
        name = f" {self.scenario.name!r}" if self.scenario.name else ""
        counts = ", ".join(
            f"{int((status == s).sum()):,} {s.replace('_', ' ')}" for s in ("completed", "dropped", "in_flight")
        )
        return (
            f"<Results{name}: {self._recorder.arrived:,} arrived, {counts}; {self.end_s:,.3f} s simulated\n"
            f" TTFT p50 {_duration(ttft['p50'])}, p99 {_duration(ttft['p99'])}; {rates}; {_duration(self.wall_s)} wall>"
        )

    def _streamed_repr(self, streamed: StreamedRecords) -> str:
        name = f" {self.scenario.name!r}" if self.scenario.name else ""
        status = streamed.tally.status
        counts = ", ".join(f"{status[s]:,} {s.replace('_', ' ')}" for s in ("completed", "dropped", "in_flight"))
        return (
            f"<Results{name}: {self._recorder.arrived:,} arrived, {counts}; {self.end_s:,.3f} s simulated; "
            f"{_duration(self.wall_s)} wall\n records streamed, not in memory: {streamed.count:,} in {len(streamed.files)} "
            f"{streamed.format} chunks in {str(streamed.directory)!r} (summary() and to_dataframe() read them)>"
        )

    def _repr_html_(self) -> str:
        """The summary as HTML tables (latency statistics, then the run's figures), for Jupyter."""
        return _summary_html(self.summary(), self.scenario.name, self.wall_s)

    # --- files ---------------------------------------------------------------
    def save(self, directory: str | Path, *, written: list[Path] | None = None) -> Path:
        """Write ``records.csv`` (and ``records.parquet`` when pyarrow is installed; not for a
        streamed run, whose records are its chunks, listed in the manifest's ``streamed_records``),
        ``preemptions.csv`` (with each preemption's mode), ``sessions.csv`` (when there
        were sessions), ``timeseries.csv`` (when the run was sampled, see
        :meth:`timeseries`), ``batches.csv`` (when batch servers ran, see :meth:`batches`),
        ``workflow_sessions.csv`` and ``tool_calls.csv`` (agentic sessions, see
        :meth:`workflow_sessions` and :meth:`tool_calls`), ``kv_transfers.csv`` (a
        disaggregated fleet, see :meth:`kv_transfers`), ``links.csv`` (network links, see
        :meth:`links`), ``spec_rounds.csv`` and ``drafter_switches.csv`` (speculative decoding),
        ``summary.json`` and ``manifest.json`` (with the SHA-256 of every data file the
        scenario reads: :func:`~simpy_llm.metrics.manifest.input_files`) into *directory*;
        return *directory*. A *written* list gets the path of each file written, in order.

        ``summary.json`` is strict JSON (RFC 8259, which has no NaN or infinity): a figure
        that :meth:`summary` gives as NaN or an infinity (nothing to take it over, a window
        of zero length) is written as ``null``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        wrote = written if written is not None else []

        def put(name: str) -> Path:
            wrote.append(out / name)
            return out / name

        if self.streamed_records is None:
            frame = self.to_dataframe()
            frame.to_csv(put("records.csv"), index=False)
            try:
                import pyarrow  # noqa: F401 - optional (the parquet extra): written only when installed
            except ImportError:
                pass
            else:
                frame.to_parquet(put("records.parquet"), index=False)
        rec = self._recorder
        self.preemptions().to_csv(put("preemptions.csv"), index=False)
        if rec.sessions:
            self.sessions().to_csv(put("sessions.csv"), index=False)
        if rec.samples:
            self.timeseries().to_csv(put("timeseries.csv"), index=False)
        if rec.batches:
            self.batches().to_csv(put("batches.csv"), index=False)
        if rec.workflow_sessions:
            self.workflow_sessions().to_csv(put("workflow_sessions.csv"), index=False)
        if rec.tool_calls:
            self.tool_calls().to_csv(put("tool_calls.csv"), index=False)
        if rec.kv_transfers:
            self.kv_transfers().to_csv(put("kv_transfers.csv"), index=False)
        if self.link_stats:
            self.links().to_csv(put("links.csv"), index=False)
        if len(rec.spec_rounds):
            self.spec_rounds().to_csv(put("spec_rounds.csv"), index=False)
        if rec.drafter_switches:
            self.drafter_switches().to_csv(put("drafter_switches.csv"), index=False)
        if self.planner_log is not None:
            self.planner_decisions().to_csv(put("planner_decisions.csv"), index=False)
        if self.autoscaler_log is not None:
            self.autoscaler_decisions().to_csv(put("autoscaler_decisions.csv"), index=False)
        put("summary.json").write_text(json.dumps(_strict_json(self.summary()), indent=2, allow_nan=False, default=_json_default) + "\n")
        manifest = {
            "seed": self.scenario.seed,
            "scenario_sha256": scenario_hash(self.scenario),
            "scenario": scenario_to_dict(self.scenario),
            "versions": _versions(),
            "inputs": input_files(self.scenario),
            "python": platform.python_version(),
            "run": {
                "wall_s": self.wall_s,
                "requests": len(self),
                "requests_per_wall_s": len(self) / self.wall_s if self.wall_s > 0 else None,
                "simpy_events": self.events,
                "engine_steps": self.steps,
            },
        }
        if self.streamed_records is not None:
            manifest["streamed_records"] = [str(f) for f in self.streamed_records.files]
        put("manifest.json").write_text(json.dumps(manifest, indent=2, default=_json_default) + "\n")
        return out


def _with_tiers(stats: PrefixCacheStats, tiers: dict[int, CpuTier]) -> PrefixCacheStats:
    """*stats* with ``tiers``, the CPU tiers' counters summed over replicas, when some
    replica has a CPU tier (else *stats* unchanged)."""
    if not tiers:
        return stats
    looked_up = gpu = cpu = capacity = held = offloaded = restored = 0
    restore_s = 0.0
    for index in sorted(tiers):
        t = tiers[index]
        looked_up += t.looked_up_tokens
        gpu += t.gpu_hit_tokens
        cpu += t.cpu_hit_tokens
        capacity += t.capacity
        held += t.held
        offloaded += t.offloaded_blocks
        restored += t.restored_blocks
        restore_s += t.restore_s
    stats["tiers"] = {
        "looked_up_tokens": looked_up,
        "gpu_hit_tokens": gpu,
        "gpu_hit_rate": gpu / looked_up if looked_up else None,
        "cpu_hit_tokens": cpu,
        "cpu_hit_rate": cpu / looked_up if looked_up else None,
        "cpu_capacity_blocks": capacity,
        "cpu_held_blocks": held,
        "offloaded_blocks": offloaded,
        "restored_blocks": restored,
        "restore_s": restore_s,
    }
    return stats


def _duration(value_s: float | None) -> str:
    """A duration for people: ms below a second, s above (``-`` for ``None``)."""
    if value_s is None:
        return "-"
    return f"{value_s * 1e3:.1f} ms" if abs(value_s) < 1.0 else f"{value_s:,.3f} s"


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None or ratio != ratio else f"{ratio * 100:.1f}%"


def _rate(value: float | None, digits: int) -> str:
    """A rate for people (``-`` for ``None`` or NaN, a window of zero length)."""
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def rate_lines(s: Summary) -> list[tuple[str, str]]:
    """``(label, text)`` lines of a summary's rates, each naming the window it divides by:
    throughput over the arrival window (with the offered rate in it), the drain, and the
    whole-run rates (the run's table and its HTML show these).

    Examples
    --------
    >>> tp = {"requests_per_s": 9.5, "output_tokens_per_s": 950.0, "input_tokens_per_s": 1900.0,
    ...       "offered_requests_per_s": 10.0, "window_start_s": 0.1, "window_s": 99.9, "drain_s": 12.0,
    ...       "whole_run_requests_per_s": 8.9, "whole_run_output_tokens_per_s": 890.0,
    ...       "whole_run_input_tokens_per_s": 1780.0}
    >>> for label, text in rate_lines({"throughput": tp, "measurement": {"start_s": 0.0, "duration_s": 112.0}}):
    ...     print(f"{label}: {text}")  # doctest: +NORMALIZE_WHITESPACE
    throughput: 9.500 req/s, 950.0 output tokens/s, 1,900.0 input tokens/s: completions in the arrival window
        (0.100-100.000 s, 99.900 s; 10.000 req/s offered)
    drain: 12.000 s from the last arrival to the last completion, left out of the rates above
    whole-run rate: 8.900 req/s, 890.0 output tokens/s over 0.000-112.000 s, drain included
    """
    tp, m = s["throughput"], s["measurement"]
    start, width = tp["window_start_s"], tp["window_s"]
    windowed = (
        f"{_rate(tp['requests_per_s'], 3)} req/s, {_rate(tp['output_tokens_per_s'], 1)} output tokens/s, "
        f"{_rate(tp['input_tokens_per_s'], 1)} input tokens/s: completions in the arrival window "
        f"({start:,.3f}-{start + width:,.3f} s, {width:,.3f} s; {_rate(tp['offered_requests_per_s'], 3)} req/s offered)"
    )
    whole = (
        f"{_rate(tp['whole_run_requests_per_s'], 3)} req/s, {_rate(tp['whole_run_output_tokens_per_s'], 1)} output "
        f"tokens/s over {m['start_s']:,.3f}-{m['start_s'] + m['duration_s']:,.3f} s, drain included"
    )
    return [
        ("throughput", windowed),
        ("drain", f"{tp['drain_s']:,.3f} s from the last arrival to the last completion, left out of the rates above"),
        ("whole-run rate", whole),
    ]


_HTML_LATENCY_ROWS: tuple[tuple[Literal["ttft", "tpot", "itl", "e2e", "queue_delay"], str], ...] = (
    ("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"), ("queue_delay", "queue delay"),
)
_HTML_STATISTICS: tuple[Literal["mean", "p50", "p90", "p95", "p99"], ...] = ("mean", "p50", "p90", "p95", "p99")


def _summary_html(s: Summary, name: str, wall_s: float) -> str:
    """Two plain HTML tables of a summary: latency statistics and the run's figures."""

    def cell(text: object, tag: str = "td", align: str = "right") -> str:
        return f'<{tag} style="text-align: {align}">{escape(str(text))}</{tag}>'

    stats = _HTML_STATISTICS
    title = f"{name}: " if name else ""
    lat = [
        "<tr>" + cell("metric", "th", "left") + "".join(cell(k, "th") for k in stats) + cell("count", "th") + "</tr>"
    ]
    for key, label in _HTML_LATENCY_ROWS:
        st = s["latency_s"][key]
        count = f"{st['count']:,}" + (" gaps" if key == "itl" else "")
        lat.append(
            "<tr>" + cell(label, align="left") + "".join(cell(_duration(st[k])) for k in stats) + cell(count) + "</tr>"
        )
    b = s["batch_size"]
    lat.append(
        "<tr>" + cell("batch size (requests per step)", align="left")
        + "".join(cell("-" if b[k] is None else f"{b[k]:.1f}") for k in stats) + cell(f"{s['engine']['steps']:,} steps")
        + "</tr>"
    )
    req, gp = s["requests"], s["goodput"]
    figures = [
        ("requests", f"{req['arrived']:,} arrived, {req['completed']:,} completed, {req['dropped']:,} dropped, "
         f"{req['in_flight']:,} in flight" + (f" ({req['warm_up']:,} warm-up)" if req["warm_up"] else "")),
        ("simulated time", f"{s['duration_s']:,.3f} s"),
        *rate_lines(s),
        ("goodput", (f"{_rate(gp['requests_per_s'], 3)} req/s in the arrival window, "
                     f"{_rate(gp['whole_run_requests_per_s'], 3)} over the whole run ({_percent(gp['fraction'])} met their SLO)")),
        ("preemptions", f"{s['preemptions']['total']:,} ({s['preemptions']['requests_preempted']:,} requests)"),
        ("KV utilisation", f"{_percent(s['kv_utilization']['time_weighted_mean'])} (time-weighted mean)"),
        ("GPU utilisation", f"{_percent(s['gpu_utilization']['mean'])} busy (mean over replicas)"),
        ("prefix cache", f"{_percent(s['prefix_cache']['hit_rate'])} of prompt tokens cached"),
        ("in system", f"{s['in_system']['time_average']:.2f} mean, {s['in_system']['peak']:,} peak"),
    ]
    if req["dropped_by_reason"]:
        figures.append(("drops", ", ".join(f"{k} {v:,}" for k, v in req["dropped_by_reason"].items())))
    ses = s["sessions"]
    if ses["count"]:
        ended = ", ".join(f"{k} {v:,}" for k, v in ses["end_reasons"].items())
        figures.append(("sessions", f"{ses['count']:,} ({ses['mean_rounds']:.2f} rounds on average; ended: {ended})"))
    figures.append(("wall time", _duration(wall_s)))
    run = ["<tr>" + cell(label, align="left") + cell(text, align="left") + "</tr>" for label, text in figures]
    return (
        f"<div><table><caption>{escape(title)}latency (TTFT, TPOT, ITL over streaming requests)</caption>"
        + "".join(lat) + f"</table><table><caption>{escape(title)}run</caption>" + "".join(run) + "</table></div>"
    )


def _strict_json(obj: Any) -> Any:
    """*obj* with every float that is NaN or infinite replaced by None (strict JSON has neither).

    >>> _strict_json({"a": [1.0, float("nan")], "b": {"c": float("inf"), "d": "x"}})
    {'a': [1.0, None], 'b': {'c': None, 'd': 'x'}}
    """
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict_json(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return str(obj)


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("simpy-llm", "simpy", "numpy", "scipy", "pandas", "attrs", "cattrs", "pyyaml"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out
