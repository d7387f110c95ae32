"""Results of a run: per-request records, summaries, files.

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
from collections import Counter
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpy_llm.metrics.diagnostics import diagnose
from simpy_llm.metrics.fairness import tenant_fairness
from simpy_llm.metrics.manifest import input_files
from simpy_llm.metrics.record import FRAME_DTYPES, RECORD_FIELDS, RequestRecord
from simpy_llm.metrics.summary import FRAME_COLUMNS, Summary, flatten_summary

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import BatchServerConfig, Scenario
    from simpy_llm.metrics.monitors import WeightedTally
    from simpy_llm.metrics.recorder import Recorder

__all__ = ["Results", "rate_lines"]

QUANTILES = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))
TIMESERIES_COLUMNS = ("time_s", "replica", "waiting", "running", "kv_used_blocks", "kv_utilization", "busy")
PREEMPTION_MODES = ("recompute", "swap")


def _mean_of_known(values: list[float]) -> float:
    """Mean of the values that are not NaN (a batch server without a memory limit has no KV
    utilisation); NaN when none is known."""
    known = [v for v in values if v == v]
    return float(np.mean(known)) if known else math.nan


CONVERGENCE_WINDOW_BATCHES = 50
"""Consecutive batches a dynamic batcher's target must stay within its band to count as settled."""


def _controller_stats(targets: np.ndarray, starts: np.ndarray, window: int = CONVERGENCE_WINDOW_BATCHES) -> dict[str, Any]:
    """``final_b_target``, ``settled_b_target`` and ``convergence_s`` of a dynamic batcher's
    targets (per batch, in order) and the batches' start times (see
    :class:`~simpy_llm.metrics.summary.BatchController`).

    >>> targets = np.array([9, 7, 5, 4, 4, 5, 4, 4, 4, 4], dtype=float)
    >>> _controller_stats(targets, np.arange(10.0), window=4)  # band: 4 +- max(0.4, 1)
    {'final_b_target': 4, 'settled_b_target': 4.0, 'convergence_s': 2.0}
    >>> _controller_stats(targets[:3], np.arange(3.0), window=4)["convergence_s"] is None  # too short to tell
    True
    """
    if targets.size == 0:
        return {"final_b_target": None, "settled_b_target": None, "convergence_s": None}
    final = int(targets[-1])
    if targets.size < window:
        return {"final_b_target": final, "settled_b_target": None, "convergence_s": None}
    settled = float(np.median(targets[-window:]))
    band = max(0.1 * settled, 1.0)
    inside = np.concatenate(([0], np.cumsum(np.abs(targets - settled) <= band)))
    # A run of `window` batches in the band starts at i when inside[i + window] - inside[i] == window.
    runs = np.flatnonzero(inside[window:] - inside[:-window] == window)
    return {
        "final_b_target": final,
        "settled_b_target": settled,
        "convergence_s": float(starts[runs[0]]) if runs.size else None,
    }


def _stats(values: np.ndarray) -> dict[str, float | None]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {"mean": None, **{k: None for k, _ in QUANTILES}}
    qs = np.percentile(values, [q for _, q in QUANTILES])
    return {"mean": float(values.mean()), **{k: float(v) for (k, _), v in zip(QUANTILES, qs, strict=True)}}


def _counted_stats(values: np.ndarray) -> dict[str, float | int | None]:
    return {**_stats(values), "count": int((~np.isnan(values)).sum())}


def _weighted_stats(tally: WeightedTally) -> dict[str, float | int | None]:
    if tally.count == 0:
        return {"mean": None, **{k: None for k, _ in QUANTILES}, "count": 0}
    return {"mean": tally.mean(), **{k: tally.quantile(q / 100) for k, q in QUANTILES}, "count": tally.count}


class Results:
    """What a run produced. Build with :meth:`from_recorder`; read with
    :meth:`to_dataframe`, :meth:`summary`, :meth:`records`; write with :meth:`save`."""

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
        replica_devices: list[tuple[Any, int]] | None = None,
        links: dict[str, Any] | None = None,
        draft_busy_s: dict[str, list[float]] | None = None,
        planner: Any = None,
    ) -> None:
        self.columns = columns
        """Record columns (strings decoded), sorted by request id."""
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
        replica_devices: list[tuple[Any, int]] | None = None,
        links: dict[str, Any] | None = None,
        draft_busy_s: dict[str, list[float]] | None = None,
        planner: Any = None,
    ) -> Results:
        """Freeze a recorder's columns into Results (records sorted by request id).

        *kv_blocks* is each replica's KV block count; *replica_groups*, when given,
        each replica's group name (both indexed by replica).
        """
        order = np.argsort(np.frombuffer(recorder.columns["request_id"], dtype=np.int64), kind="stable")
        columns: dict[str, np.ndarray] = {}
        for name, kind in RECORD_FIELDS:
            raw = recorder.columns[name]
            arr = np.frombuffer(raw, dtype=np.float64 if kind == "f" else np.int64)[order].copy()
            if kind == "s":
                names = np.array(recorder.codes[name].names, dtype=object)
                arr = names[arr] if arr.size else np.array([], dtype=object)
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
        )

    def __len__(self) -> int:
        return len(self.columns["request_id"])

    # --- views -----------------------------------------------------------
    def records(self) -> Iterator[RequestRecord]:
        """The records as frozen objects, in request-id order."""
        names = [n for n, _ in RECORD_FIELDS]
        cols = [self.columns[n].tolist() for n in names]
        for row in zip(*cols, strict=True):
            yield RequestRecord(**dict(zip(names, row, strict=True)))

    def derived(self) -> dict[str, np.ndarray]:
        """Per-request latency metrics (see the module docstring), aligned with the records."""
        c = self.columns
        out_tokens = c["output_tokens"].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out_tokens > 1, (c["completion_s"] - c["first_token_s"]) / (out_tokens - 1), np.nan)
        network = c["upload_s"] + c["download_s"]  # 0 unless the client has a network
        ttft = c["first_token_s"] - c["arrival_s"]
        e2e = c["completion_s"] - c["arrival_s"]
        return {
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "queue_delay_s": c["first_scheduled_s"] - c["enqueue_s"],
            "client_ttft_s": ttft + network,
            "client_e2e_s": e2e + network,
        }

    def _client_derived(self) -> dict[str, np.ndarray]:
        """:meth:`derived` as clients see it: no TTFT or TPOT for a request that does not stream."""
        out = self.derived()
        silent = self.columns["streaming"] == 0
        for name in ("ttft_s", "tpot_s", "client_ttft_s"):
            out[name] = np.where(silent, np.nan, out[name])
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request with the record fields, ``replica_group`` and the derived metrics.

        ``replica_group`` is the group of the request's replica; empty for requests
        never routed (``replica == -1``) and when the Results were built without
        ``replica_groups``.
        """
        import pandas as pd

        clusters = {"cluster": self._cluster_column()} if self.scenario.serving.clusters else {}
        frame = pd.DataFrame({**self.columns, "replica_group": self._replica_group_column(), **clusters, **self.derived()})
        # Only the columns not already in their dtype are cast (the numbers are, from the
        # recorder). By name: pandas' "str" dtype compares equal to "string".
        for name, dtype in {**FRAME_DTYPES, "replica_group": "string"}.items():
            if dtype is not None and str(frame[name].dtype) != dtype:
                frame[name] = frame[name].astype(dtype)
        return frame

    def _cluster_column(self) -> np.ndarray:
        """Each request's cluster (its replica group's; "" when never routed)."""
        of = self.scenario.serving.cluster_of()
        return np.array([of.get(g, "") for g in self._replica_group_column().tolist()], dtype=object)

    def _replica_group_column(self) -> np.ndarray:
        replica = self.columns["replica"]
        out = np.full(replica.shape, "", dtype=object)
        if self.replica_groups is not None and replica.size:
            names = np.array([*self.replica_groups, ""], dtype=object)
            # -1 (never routed) indexes the trailing "".
            out = names[replica]
        return out

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
        import pandas as pd

        rows = sorted(self._recorder.samples, key=lambda r: (r[0], r[1]))
        frame = pd.DataFrame(rows, columns=["time_s", "replica", "waiting", "running", "kv_used_blocks", "busy"])
        frame = frame.astype(
            {"time_s": "float64", "replica": "int64", "waiting": "int64", "running": "int64",
             "kv_used_blocks": "int64", "busy": "int64"}
        )
        blocks = np.array(self._kv_blocks, dtype=np.float64)[frame["replica"].to_numpy()]
        used = frame["kv_used_blocks"].to_numpy(np.float64)
        # A batch server without a memory limit has no capacity (0 blocks): utilisation NaN.
        share = np.divide(used, blocks, out=np.full_like(used, np.nan), where=blocks > 0)
        frame.insert(5, "kv_utilization", share)
        return frame[list(TIMESERIES_COLUMNS)]

    def preemptions(self) -> pd.DataFrame:
        """One row per preemption: request_id, replica, time_s, mode (``recompute`` or ``swap``)."""
        import pandas as pd

        rows = sorted(self._recorder.preemptions)
        return pd.DataFrame(rows, columns=["request_id", "replica", "time_s", "mode"]).astype(
            {"request_id": "int64", "replica": "int64", "time_s": "float64", "mode": "string"}
        )

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
        import pandas as pd

        columns = ["replica", "batch", "bin", "size", "formed_s", "start_s", "end_s", "b_target", "b_mem", "b_sla", "memory_tokens"]
        frame = pd.DataFrame(sorted(self._recorder.batches, key=lambda r: (r[0], r[1])), columns=columns)
        frame = frame.astype({name: "int64" for name in ("replica", "batch", "bin", "size", "memory_tokens")})
        for name in ("formed_s", "start_s", "end_s"):
            frame[name] = frame[name].astype("float64")
        for name in ("b_target", "b_mem", "b_sla"):
            frame[name] = frame[name].where(frame[name] >= 0).astype("float64")
        frame.insert(6, "service_s", frame["end_s"] - frame["start_s"])
        groups = self.replica_groups
        frame.insert(1, "replica_group", pd.array([groups[i] if groups is not None else "" for i in frame["replica"]], dtype="string"))
        limits = {
            i: cfg.dynamic.memory.eta_tokens for i, _g, cfg in self._batch_servers() if cfg.dynamic is not None and cfg.dynamic.memory is not None
        }
        frame["memory_limit_tokens"] = [float(limits.get(i, math.nan)) for i in frame["replica"]]
        return frame

    def _batch_servers(self) -> list[tuple[int, str, BatchServerConfig]]:
        """(replica index, group name, settings) of each request-level batch server in the fleet."""
        if self.scenario is None:
            return []
        out = []
        index = 0
        for group in self.scenario.serving.groups():
            for _ in range(group.count):
                if group.batch_server is not None:
                    out.append((index, group.name, group.batch_server))
                index += 1
        return out

    def _batch_servers_summary(self, duration_s: float) -> dict[str, Any]:
        """``summary()["batch_servers"]``: see :class:`~simpy_llm.metrics.summary.BatchServerStats`."""
        c = self.columns
        rows = np.array(sorted(self._recorder.batches, key=lambda r: (r[0], r[1])), dtype=np.float64).reshape(-1, 11)
        e2e = c["completion_s"] - c["arrival_s"]
        out: dict[str, Any] = {}
        for index, _group, cfg in self._batch_servers():
            mine = rows[rows[:, 0] == index]
            size = mine[:, 3].astype(np.int64)
            service = mine[:, 6] - mine[:, 5]
            memory = mine[:, 10]
            here = c["replica"] == index
            done = here & (c["status"] == "completed")
            waiting = here & (c["status"] == "in_flight")
            bins = cfg.bins.count
            by_bin = {}
            # Time each request spent in its bin's queue (to the end of the run if never served).
            queued_s = np.where(np.isnan(c["first_scheduled_s"]), self.end_s, c["first_scheduled_s"]) - c["enqueue_s"]
            for b in range(bins):
                in_bin = done & (c["bin"] == b)
                n = int(in_bin.sum())
                mine_b = here & (c["bin"] == b)
                by_bin[str(b)] = {
                    "completed": n,
                    "requests_per_s": n / duration_s if duration_s > 0 else math.nan,
                    "mean_queue_length": float(queued_s[mine_b].sum() / duration_s) if duration_s > 0 else None,
                    "queued_at_end": int((waiting & (c["bin"] == b)).sum()),
                    "e2e_s": _stats(e2e[in_bin]),
                }
            dyn = cfg.dynamic
            target_s = cfg.sla_target_s
            limit = dyn.memory.eta_tokens if dyn is not None and dyn.memory is not None else None
            hist = dict(sorted(Counter(size.tolist()).items()))
            c_max = None
            if cfg.batch_size is not None and cfg.service.kind == "sampled":
                from simpy_llm.serving.batching import build_service_model

                mean_s = build_service_model(cfg, None, np.random.default_rng(0)).mean_s
                c_max = cfg.batch_size / mean_s if mean_s > 0 else None
            n_done = int(done.sum())
            span_s = float(mine[:, 6].max()) if size.size else 0.0
            busy_s = self._recorder.busy_s[index]
            out[str(index)] = {
                "batches": int(size.size),
                "requests_per_s": n_done / span_s if span_s > 0 else None,
                "requests_per_busy_s": n_done / busy_s if busy_s > 0 else None,
                "gpu_utilization": busy_s / duration_s if duration_s > 0 else None,
                "batch_size": {
                    "mean": float(size.mean()) if size.size else None,
                    "std": float(size.std()) if size.size else None,
                    "min": int(size.min()) if size.size else None,
                    "max": int(size.max()) if size.size else None,
                    "histogram": {str(k): v for k, v in hist.items()},
                },
                "service_s": _stats(service),
                "by_bin": by_bin,
                "sla": {
                    "d_sla_s": target_s,
                    "violation_rate": float(size[service > target_s].sum() / size.sum()) if target_s is not None and size.sum() else None,
                },
                "memory": {
                    "limit_tokens": limit,
                    "peak_tokens": int(memory.max()) if memory.size else 0,
                    "time_weighted_mean_tokens": float(np.dot(memory, service) / duration_s) if duration_s > 0 else None,
                    "overflows": int((memory > limit).sum()) if limit is not None else 0,
                },
                "controller": (
                    _controller_stats(mine[:, 7], mine[:, 5])
                    if dyn is not None
                    else {"final_b_target": None, "settled_b_target": None, "convergence_s": None}
                ),
                "c_max_requests_per_s": c_max,
            }
        return out

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
        import pandas as pd

        columns = ["session_id", "client_id", "workflow", "start_s", "end_s", "llm_calls", "tool_calls", "tool_wait_s",
                   "iterations", "fan_out_planned", "fan_out_done", "critical_queue_s", "end_reason"]
        frame = pd.DataFrame(sorted(self._recorder.workflow_sessions), columns=columns)
        frame = frame.astype({"session_id": "string", "client_id": "string", "workflow": "string", "end_reason": "string",
                              "start_s": "float64", "end_s": "float64", "tool_wait_s": "float64", "critical_queue_s": "float64",
                              "llm_calls": "int64", "tool_calls": "int64", "iterations": "int64",
                              "fan_out_planned": "int64", "fan_out_done": "int64"})
        frame.insert(5, "e2e_s", frame["end_s"] - frame["start_s"])
        with np.errstate(invalid="ignore", divide="ignore"):
            frame["critical_queue_share"] = frame["critical_queue_s"] / frame["e2e_s"]
        return frame[[*columns[:5], "e2e_s", *columns[5:12], "critical_queue_share", "end_reason"]]

    def tool_calls(self) -> pd.DataFrame:
        """One row per tool call of an agentic session that returned, in (session, start) order.

        Columns: ``session_id``, ``client_id``, ``step_id``, ``tool``, ``loop_iteration``,
        ``instance`` (of a fan-out step), ``start_s`` (called), ``wait_s`` (waiting for a
        tool with a capacity), ``end_s`` (returned), ``latency_s`` (its drawn latency: end -
        start - wait) and ``output_tokens``.
        """
        import pandas as pd

        columns = ["session_id", "client_id", "step_id", "tool", "loop_iteration", "instance", "start_s", "wait_s", "end_s",
                   "latency_s", "output_tokens"]
        rows = sorted(self._recorder.tool_calls, key=lambda r: (r[0], r[6], r[2], r[4], r[5]))
        return pd.DataFrame(rows, columns=columns).astype(
            {"session_id": "string", "client_id": "string", "step_id": "string", "tool": "string",
             "loop_iteration": "int64", "instance": "int64", "start_s": "float64", "wait_s": "float64",
             "end_s": "float64", "latency_s": "float64", "output_tokens": "int64"}
        )

    def links(self) -> pd.DataFrame:
        """One row per network link (clients' uplinks, KV links), by name, with its figures at
        the end of the run: ``messages`` put, ``delivered``, ``dropped``, ``in_flight``,
        ``bytes``, ``retransmissions``, ``busy_s`` (bytes moving), ``utilisation`` (busy over
        the run's duration), ``mean_queueing_s`` (per delivered message: time beyond what it
        would take alone on an idle link) and ``outage_wait_s``."""
        import pandas as pd

        rows = [{"link": name, **fig} for name, fig in sorted(self._link_figures().items())]
        columns = ["link", "messages", "delivered", "dropped", "in_flight", "bytes", "retransmissions", "busy_s",
                   "utilisation", "mean_queueing_s", "outage_wait_s"]
        return pd.DataFrame(rows, columns=columns)

    def _link_figures(self) -> dict[str, dict[str, Any]]:
        span = self.end_s if self.end_s > 0 else float("nan")
        return {
            name: {
                "messages": st.puts, "delivered": st.delivered, "dropped": st.dropped, "in_flight": st.in_flight,
                "bytes": float(st.bytes_delivered), "retransmissions": st.retransmissions, "busy_s": st.busy_s,
                "utilisation": st.utilisation(span), "mean_queueing_s": st.mean_queueing_s,
                "outage_wait_s": st.total_outage_wait_s,
            }
            for name, st in self.link_stats.items()
        }

    def kv_transfers(self) -> pd.DataFrame:
        """One row per KV transfer of a disaggregated fleet, in request-id order.

        Columns: ``request_id``, ``prefill_replica``, ``decode_replica``, ``bytes``,
        ``start_s`` (the prefill handed it off), ``end_s`` (the KV reached the decode
        replica) and ``transfer_s`` (their difference, the request's ``kv_transfer_s``).
        """
        import pandas as pd

        columns = ["request_id", "prefill_replica", "decode_replica", "bytes", "start_s", "end_s"]
        frame = pd.DataFrame(sorted(self._recorder.kv_transfers), columns=columns).astype(
            {"request_id": "int64", "prefill_replica": "int64", "decode_replica": "int64", "bytes": "float64",
             "start_s": "float64", "end_s": "float64"}
        )
        frame["transfer_s"] = frame["end_s"] - frame["start_s"]
        return frame

    def _disaggregation_summary(self) -> dict[str, Any]:
        """``summary()["disaggregation"]``: see :class:`~simpy_llm.metrics.summary.DisaggregationStats`."""
        frame = self.kv_transfers()
        groups = self.replica_groups
        prefill = sorted(set(frame["prefill_replica"].tolist()))
        decode = sorted(set(frame["decode_replica"].tolist()))
        return {
            "kv_transfers": len(frame),
            "kv_bytes": float(frame["bytes"].sum()),
            "kv_transfer_s": _stats(frame["transfer_s"].to_numpy(np.float64)),
            "by_decode_replica": {str(j): int((frame["decode_replica"] == j).sum()) for j in decode},
            "by_prefill_replica": {str(i): int((frame["prefill_replica"] == i).sum()) for i in prefill},
            **({"groups": {str(i): groups[i] for i in prefill + decode}} if groups is not None else {}),
        }

    def _workflow_summary(self) -> dict[str, Any]:
        """``summary()["workflows"]``: see :class:`~simpy_llm.metrics.summary.WorkflowStats`."""
        frame = self.workflow_sessions()
        out: dict[str, Any] = {}
        for name in sorted(set(frame["workflow"].tolist())):
            f = frame[frame["workflow"] == name]
            done = f[f["end_reason"].isin(["completed", "max_rounds", "user_stopped"])]
            iters = f["iterations"].to_numpy()
            planned = int(f["fan_out_planned"].sum())
            share = done["critical_queue_share"].to_numpy(np.float64)
            out[name] = {
                "sessions": len(f),
                "completed": len(done),
                "end_reasons": dict(sorted(Counter(f["end_reason"].tolist()).items())),
                "e2e_s": _stats(done["e2e_s"].to_numpy(np.float64)),
                "llm_calls_mean": float(f["llm_calls"].mean()) if len(f) else None,
                "tool_calls_mean": float(f["tool_calls"].mean()) if len(f) else None,
                "tool_wait_s_mean": float(f["tool_wait_s"].mean()) if len(f) else None,
                "iterations": {
                    "mean": float(iters.mean()) if iters.size else None,
                    "histogram": {str(k): v for k, v in sorted(Counter(iters.tolist()).items())},
                },
                "fan_out_utilization": int(f["fan_out_done"].sum()) / planned if planned else None,
                "critical_queue_share_mean": float(share[~np.isnan(share)].mean()) if (~np.isnan(share)).any() else None,
            }
        return out

    def sessions(self) -> pd.DataFrame:
        """One row per session: session_id, client_id, rounds (created), end_reason."""
        import pandas as pd

        rows = sorted(self._recorder.sessions)
        return pd.DataFrame(rows, columns=["session_id", "client_id", "rounds", "end_reason"]).astype(
            {"session_id": "string", "client_id": "string", "rounds": "int64", "end_reason": "string"}
        )

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
        c = self.columns
        rec = self._recorder
        status = c["status"]
        measured = c["warm_up"] == 0
        done = (status == "completed") & measured
        d = {k: v[done] for k, v in self.derived().items()}
        seen = {k: v[done] for k, v in self._client_derived().items()}
        gapped = measured & (c["streaming"] != 0) & (c["generated_tokens"] >= 2)
        duration_all = self.end_s if self.end_s > 0 else float("nan")
        start_s, run_s = self._measurement(measured)
        duration = run_s if run_s > 0 else float("nan")
        completed = int(done.sum())
        out_tokens = int(c["output_tokens"][done].sum())
        in_tokens = int(c["prompt_tokens"][done].sum())

        met = self._slo_met(done, d)
        throughput, met_in_window = self._windowed_rates(measured)
        window = throughput["window_s"] if throughput["window_s"] > 0 else float("nan")
        by_class: dict[str, dict[str, float | int]] = {}
        for cls_name in sorted(set(c["slo_class"][done].tolist())):
            mask = c["slo_class"][done] == cls_name
            n = int(mask.sum())
            m = int(met[mask].sum())
            by_class[cls_name] = {"completed": n, "met": m, "fraction": m / n if n else math.nan}

        batch_hist = dict(sorted(rec.batch_steps.items()))
        sizes = np.array(list(batch_hist.keys()), dtype=np.float64)
        weights = np.array(list(batch_hist.values()), dtype=np.int64)
        if weights.sum():
            cum = np.cumsum(weights)
            bq = {k: float(sizes[min(int(np.searchsorted(cum, q / 100 * cum[-1])), len(sizes) - 1)]) for k, q in QUANTILES}
            batch = {"mean": float(np.dot(sizes, weights) / weights.sum()), **bq, "max": int(sizes.max())}
        else:
            batch = {"mean": None, **{k: None for k, _ in QUANTILES}, "max": 0}
        batch["histogram"] = {str(k): v for k, v in batch_hist.items()}

        kv_per_replica = [
            bs / (blocks * duration_all) if duration_all == duration_all and blocks else math.nan
            for bs, blocks in zip(rec.kv_block_seconds, self._kv_blocks, strict=True)
        ]
        n_preempted = int((c["num_preemptions"] > 0).sum())
        by_mode = dict.fromkeys(PREEMPTION_MODES, 0)
        for *_rest, mode in rec.preemptions:
            by_mode[mode] = by_mode.get(mode, 0) + 1
        engine: dict[str, Any] = {"steps": self.steps, "busy_s": list(rec.busy_s)}
        if rec.cold_starts:
            engine["cold_starts"] = len(rec.cold_starts)
            engine["cold_start_s"] = float(sum(end - start for _, start, end in rec.cold_starts))
        if self.replica_groups is not None:
            engine["group"] = list(self.replica_groups)
        return {
            "requests": {
                "arrived": rec.arrived,
                "completed": int((status == "completed").sum()),
                "dropped": int((status == "dropped").sum()),
                "in_flight": int((status == "in_flight").sum()),
                "warm_up": int((~measured).sum()),
                **self._drop_counts(),
            },
            "duration_s": self.end_s,
            "measurement": {"start_s": start_s, "duration_s": run_s},
            "latency_s": {
                "ttft": _counted_stats(seen["ttft_s"]),
                "tpot": _counted_stats(seen["tpot_s"]),
                "itl": {**_weighted_stats(rec.itl), "requests": int(gapped.sum())},
                "e2e": _counted_stats(seen["e2e_s"]),
                "queue_delay": _counted_stats(seen["queue_delay_s"]),
            },
            **({"client_latency_s": {
                "ttft": _counted_stats(seen["client_ttft_s"]),
                "e2e": _counted_stats(seen["client_e2e_s"]),
            }} if self._has_client_network() else {}),
            "latency_s_by_class": self._latency_by("slo_class", done),
            "latency_s_by_tenant": self._latency_by("tenant_id", done),
            **({"latency_s_by_cluster": self._latency_by(self._cluster_column(), done)} if self.scenario.serving.clusters else {}),
            "throughput": {
                **throughput,
                "whole_run_requests_per_s": completed / duration,
                "whole_run_output_tokens_per_s": out_tokens / duration,
                "whole_run_input_tokens_per_s": in_tokens / duration,
            },
            "goodput": {
                "requests_per_s": met_in_window / window,
                "whole_run_requests_per_s": int(met.sum()) / duration,
                "fraction": float(met.mean()) if completed else math.nan,
                "by_class": by_class,
            },
            "preemptions": {
                "total": len(rec.preemptions),
                "requests_preempted": n_preempted,
                "by_mode": dict(sorted(by_mode.items())),
            },
            "kv_utilization": {
                "time_weighted_mean": _mean_of_known(kv_per_replica),
                "per_replica": kv_per_replica,
            },
            "batch_size": batch,
            "in_system": {"time_average": rec.in_system.time_average(self.end_s), "peak": rec.in_system.peak},
            "engine": engine,
            "gpu_utilization": self._gpu_utilization(duration_all),
            "prefix_cache": self._prefix_cache(measured),
            "fairness": tenant_fairness(
                c["tenant_id"][measured],
                (status == "completed")[measured],
                (c["completion_s"] - c["arrival_s"])[measured],
                c["output_tokens"][measured],
            ),
            "sessions": self._session_summary(),
            **({"batch_servers": self._batch_servers_summary(duration_all)} if self._batch_servers() else {}),
            **({"workflows": self._workflow_summary()} if rec.workflow_sessions else {}),
            **({"disaggregation": self._disaggregation_summary()} if rec.kv_transfers else {}),
            **({"devices": self._device_summary(duration_all, met_in_window / window)} if self._has_devices() else {}),
            **({"network": {"links": dict(sorted(self._link_figures().items()))}} if self.link_stats else {}),
            **({"speculation": self._speculation_summary(done, met)} if self.scenario.speculation is not None else {}),
            **({"planner": self._planner_summary(int(met.sum()), duration)} if self.planner_log is not None else {}),
            "diagnostics": [d.to_dict() for d in diagnose(self)],
        }

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
        import pandas as pd

        from simpy_llm.serving.planner import DECISION_COLUMNS

        rows = self.planner_log.rows if self.planner_log is not None else []
        return pd.DataFrame(rows, columns=list(DECISION_COLUMNS))

    def _planner_summary(self, met: int, duration: float) -> dict[str, Any]:
        """``summary()["planner"]``: see :class:`~simpy_llm.metrics.summary.PlannerStats`."""
        from simpy_llm.serving.planner import gpu_seconds

        log = self.planner_log
        kv_starts = {int(t[0]): float(t[4]) for t in self._recorder.kv_transfers}
        used = gpu_seconds(self.columns, kv_starts, log, self.end_s)
        return {
            "ticks": log.ticks,
            "changes": log.changes,
            "final": dict(log.final),
            "gpu_seconds": used,
            "mean_gpus": used / self.end_s if self.end_s > 0 else None,
            "goodput_per_gpu_second": met / used if used > 0 else None,
        }

    def spec_rounds(self) -> pd.DataFrame:
        """Speculative decoding: one row per verify round
        (:func:`~simpy_llm.metrics.speculation.spec_round_frame`)."""
        from simpy_llm.metrics.speculation import spec_round_frame

        return spec_round_frame(self._recorder.spec_rounds)

    def drafter_switches(self) -> pd.DataFrame:
        """Speculative decoding: one row per mid-decode drafter escalation."""
        from simpy_llm.metrics.speculation import drafter_switch_frame

        return drafter_switch_frame(self._recorder.drafter_switches)

    def gamma_timeline(self, bin_s: float = 1.0) -> pd.DataFrame:
        """Speculative decoding: mean γ, rounds and acceptance per *bin_s* of simulated time
        (:func:`~simpy_llm.metrics.speculation.gamma_timeline`)."""
        from simpy_llm.metrics.speculation import gamma_timeline

        return gamma_timeline(self._recorder.spec_rounds, bin_s)

    def _speculation_summary(self, done: np.ndarray, met: np.ndarray) -> dict[str, Any]:
        """``summary()["speculation"]``: see :class:`~simpy_llm.metrics.summary.SpeculationStats`."""
        from simpy_llm.metrics.speculation import speculation_summary

        rec = self._recorder
        return speculation_summary(
            self.scenario, rec.spec_rounds, rec.drafter_switches, self.columns, done, met, self.draft_busy_s,
            self.end_s,
        )

    def _has_devices(self) -> bool:
        return self.replica_devices is not None and any(d is not None for d, _ in self.replica_devices)

    def _device_summary(self, duration_s: float, goodput_per_s: float) -> dict[str, Any]:
        """``summary()["devices"]``: see :class:`~simpy_llm.metrics.summary.DeviceStats`
        (*goodput_per_s*: ``goodput.requests_per_s``)."""
        rec = self._recorder
        c = self.columns
        done = c["status"] == "completed"
        tokens = int(c["prompt_tokens"][done].sum() + c["output_tokens"][done].sum())
        out_tokens = int(c["output_tokens"][done].sum())
        energy, cost, gpus, priced = [], [], 0, True
        for (device, n), busy in zip(self.replica_devices, rec.busy_s, strict=True):
            gpus += n
            if device is None:
                energy.append(None)
                cost.append(None)
                priced = False
                continue
            idle = max(duration_s - busy, 0.0)
            energy.append(n * (device.energy.active_w * busy + device.energy.idle_w * idle))
            price = device.price_per_hour_usd
            cost.append(None if price is None else n * price * duration_s / 3600)
            priced = priced and price is not None
        total_j = sum(e for e in energy if e is not None)
        total_usd = sum(x for x in cost if x is not None)
        return {
            "gpus": gpus,
            "energy_j": total_j,
            "energy_j_per_replica": energy,
            "energy_j_per_output_token": total_j / out_tokens if out_tokens else None,
            "energy_j_per_request": total_j / int(done.sum()) if done.any() else None,
            "cost_usd": total_usd if priced else None,
            "cost_usd_per_replica": cost,
            "cost_usd_per_1k_tokens": total_usd / (tokens / 1000) if priced and tokens else None,
            "goodput_per_gpu": goodput_per_s / gpus if gpus and not math.isnan(goodput_per_s) else None,
        }

    def _has_client_network(self) -> bool:
        """Whether some request crossed a client network (then client and server views differ)."""
        c = self.columns
        return bool((c["upload_s"] != 0).any() or (c["download_s"] != 0).any())

    def _measurement(self, measured: np.ndarray) -> tuple[float, float]:
        """``(start_s, duration_s)`` of the span the whole-run rates divide by (``summary()["measurement"]``)."""
        start_s = 0.0
        if not measured.all():
            # Warm-up precedes measurement: rates count from the first measured arrival.
            start_s = float(self.columns["arrival_s"][measured].min()) if measured.any() else self.end_s
        return start_s, self.end_s - start_s

    def _windowed_rates(self, measured: np.ndarray) -> tuple[dict[str, float], int]:
        """The arrival-window part of ``summary()["throughput"]`` and how many completions
        inside the window met their SLO (see "Rates and their windows" in the module docstring)."""
        c = self.columns
        arrival = c["arrival_s"]
        if measured.any():
            a0, a1 = float(arrival[measured].min()), float(arrival[measured].max())
        else:
            a0 = a1 = self.end_s
        window_s = a1 - a0
        span = window_s if window_s > 0 else float("nan")
        completed = c["status"] == "completed"
        # Departures inside (a0, a1]: the first arrival opens the window, so it is not one of
        # its arrivals, and a request completing at a0 left before the window began.
        inside = completed & (c["completion_s"] > a0) & (c["completion_s"] <= a1)
        offered = int((measured & (arrival > a0) & (arrival <= a1)).sum())
        last_completion = float(c["completion_s"][completed].max()) if completed.any() else a1
        met = self._slo_met(inside, {k: v[inside] for k, v in self.derived().items()})
        rates = {
            "requests_per_s": int(inside.sum()) / span,
            "output_tokens_per_s": int(c["output_tokens"][inside].sum()) / span,
            "input_tokens_per_s": int(c["prompt_tokens"][inside].sum()) / span,
            "offered_requests_per_s": offered / span,
            "window_start_s": a0,
            "window_s": window_s,
            "drain_s": max(last_completion - a1, 0.0),
        }
        return rates, int(met.sum())

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
        import pandas as pd

        frame = pd.DataFrame(flatten_summary(self.summary()), columns=list(FRAME_COLUMNS))
        return frame.astype({name: "string" for name in FRAME_COLUMNS[:-1]} | {"value": "float64"})

    def _drop_counts(self) -> dict[str, Any]:
        c = self.columns
        dropped = c["status"] == "dropped"
        reasons = np.array([r or "unknown" for r in c["dropped_reason"][dropped].tolist()], dtype=object)
        classes = c["slo_class"][dropped]
        by_reason = {r: int((reasons == r).sum()) for r in sorted(set(reasons.tolist()))}
        by_class: dict[str, dict[str, int]] = {}
        for cls_name in sorted(set(classes.tolist())):
            in_class = reasons[classes == cls_name]
            by_class[cls_name] = {r: int((in_class == r).sum()) for r in sorted(set(in_class.tolist()))}
        return {"dropped_by_reason": by_reason, "dropped_by_class": by_class}

    def _latency_by(self, column: str | np.ndarray, done: np.ndarray) -> dict[str, dict[str, dict[str, float | None]]]:
        """Latency statistics per value of *column* (a record column's name, or values aligned
        with the records), over the requests in *done*, for every value a measured request has."""
        c = self.columns
        values = c[column] if isinstance(column, str) else column
        keys = values[c["warm_up"] == 0]
        derived = self._client_derived()
        out = {}
        for name in sorted(set(keys.tolist())):
            mask = done & (values == name)
            out[name] = {
                metric: _stats(derived[f"{metric}_s"][mask]) for metric in ("ttft", "tpot", "e2e", "queue_delay")
            }
        return out

    def _gpu_utilization(self, duration_s: float) -> dict[str, Any]:
        busy = self._recorder.busy_s
        if not duration_s > 0:
            per_replica: list[float | None] = [None] * len(busy)
            mean = None
        else:
            per_replica = [b / duration_s for b in busy]
            mean = float(np.mean(per_replica)) if per_replica else None
        out: dict[str, Any] = {"mean": mean, "per_replica": per_replica}
        if self.replica_groups is not None:
            by_group = {}
            for name in sorted(set(self.replica_groups)):
                values = [u for u, g in zip(per_replica, self.replica_groups, strict=True) if g == name]
                by_group[name] = None if mean is None else float(np.mean(values))
            out["by_group"] = by_group
        return out

    def _prefix_cache(self, measured: np.ndarray) -> dict[str, Any]:
        c = self.columns
        admitted = measured & ~np.isnan(c["first_scheduled_s"])
        cached = int(c["cached_tokens"][admitted].sum())
        prompt = int(c["prompt_tokens"][admitted].sum())
        return {"hit_rate": cached / prompt if prompt > 0 else None, "cached_tokens": cached, "prompt_tokens": prompt}

    def _session_summary(self) -> dict[str, Any]:
        sessions = self._recorder.sessions
        reasons: dict[str, int] = {}
        for *_rest, reason in sessions:
            reasons[reason] = reasons.get(reason, 0) + 1
        rounds = [r for _, _, r, _ in sessions]
        return {
            "count": len(sessions),
            "mean_rounds": float(np.mean(rounds)) if rounds else None,
            "end_reasons": dict(sorted(reasons.items())),
        }

    def _slo_met(self, done: np.ndarray, d: dict[str, np.ndarray]) -> np.ndarray:
        classes = self.columns["slo_class"][done]
        met = np.ones(int(done.sum()), dtype=bool)
        for name, target in self.scenario.slo.items():
            mask = classes == name
            # Judged as the client sees it (the same as the server without a client network).
            limits = (
                ("client_ttft_s", target.ttft_s), ("tpot_s", target.tpot_s), ("client_e2e_s", target.e2e_s),
                ("tvt_s", target.tvt_s),
            )
            for metric, limit in limits:
                if limit is not None:
                    values = d[metric] if metric != "tvt_s" else self.columns["tvt_s"][done]
                    # A request with no TPOT (one output token) or no verify round cannot miss that target.
                    ok = (values <= limit) | np.isnan(values) if metric in ("tpot_s", "tvt_s") else values <= limit
                    met &= ~mask | ok
        return met

    # --- display -------------------------------------------------------------
    def __repr__(self) -> str:
        """Two lines: request outcomes and simulated duration; TTFT, throughput and wall time.

        TTFT and throughput are the summary's (client-side TTFT of completed measured
        streaming requests; completions per second of the arrival window, see "Rates and
        their windows" in :mod:`simpy_llm.metrics.results`), computed without the rest of
        :meth:`summary`.
        """
        c = self.columns
        status = c["status"]
        measured = c["warm_up"] == 0
        done = (status == "completed") & measured
        ttft = _stats(self._client_derived()["ttft_s"][done])
        tp = self._windowed_rates(measured)[0]
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

    def _repr_html_(self) -> str:
        """The summary as HTML tables (latency statistics, then the run's figures), for Jupyter."""
        return _summary_html(self.summary(), self.scenario.name, self.wall_s)

    # --- files ---------------------------------------------------------------
    def save(self, directory: str | Path, *, written: list[Path] | None = None) -> Path:
        """Write ``records.csv`` (and ``records.parquet`` when pyarrow is installed),
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
        from simpy_llm.config.plain import scenario_hash, scenario_to_dict

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        wrote = written if written is not None else []

        def put(name: str) -> Path:
            wrote.append(out / name)
            return out / name

        frame = self.to_dataframe()
        frame.to_csv(put("records.csv"), index=False)
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            pass
        else:
            frame.to_parquet(put("records.parquet"), index=False)
        self.preemptions().to_csv(put("preemptions.csv"), index=False)
        if self._recorder.sessions:
            self.sessions().to_csv(put("sessions.csv"), index=False)
        if self._recorder.samples:
            self.timeseries().to_csv(put("timeseries.csv"), index=False)
        if self._recorder.batches:
            self.batches().to_csv(put("batches.csv"), index=False)
        if self._recorder.workflow_sessions:
            self.workflow_sessions().to_csv(put("workflow_sessions.csv"), index=False)
        if self._recorder.tool_calls:
            self.tool_calls().to_csv(put("tool_calls.csv"), index=False)
        if self._recorder.kv_transfers:
            self.kv_transfers().to_csv(put("kv_transfers.csv"), index=False)
        if self.link_stats:
            self.links().to_csv(put("links.csv"), index=False)
        if len(self._recorder.spec_rounds):
            self.spec_rounds().to_csv(put("spec_rounds.csv"), index=False)
        if self._recorder.drafter_switches:
            self.drafter_switches().to_csv(put("drafter_switches.csv"), index=False)
        if self.planner_log is not None:
            self.planner_decisions().to_csv(put("planner_decisions.csv"), index=False)
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
        put("manifest.json").write_text(json.dumps(manifest, indent=2, default=_json_default) + "\n")
        return out


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


_HTML_LATENCY_ROWS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"), ("queue_delay", "queue delay"))


def _summary_html(s: Summary, name: str, wall_s: float) -> str:
    """Two plain HTML tables of a summary: latency statistics and the run's figures."""
    from html import escape

    def cell(text: object, tag: str = "td", align: str = "right") -> str:
        return f'<{tag} style="text-align: {align}">{escape(str(text))}</{tag}>'

    stats = ("mean", "p50", "p90", "p95", "p99")
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
