"""What a run's request-level batch servers did (``docs/batching.md``): one row per batch,
and the summary's ``batch_servers`` section.

:class:`~simpy_llm.metrics.results.Results` shows them as ``batches()`` and
``summary()["batch_servers"]`` (:class:`~simpy_llm.metrics.summary.BatchServerStats`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from simpy_llm.metrics.stats import latency_stats

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import BatchServerConfig, Scenario
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.metrics.summary import BatchController, BatchServerStats, BinStats

__all__ = ["CONVERGENCE_WINDOW_BATCHES", "BatchServerResults", "BatchServerSection", "controller_stats"]

CONVERGENCE_WINDOW_BATCHES = 50
"""Consecutive batches a dynamic batcher's target must stay within its band to count as settled."""

_RECORDED = ["replica", "batch", "bin", "size", "formed_s", "start_s", "end_s", "b_target", "b_mem", "b_sla", "memory_tokens"]
"""The fields of a batch as the recorder keeps it (:meth:`~simpy_llm.metrics.recorder.Recorder.on_batch`)."""


class BatchServerSection(TypedDict, total=False):
    """The summary's ``batch_servers`` section (absent when the fleet has no batch server)."""

    batch_servers: dict[str, BatchServerStats]


def controller_stats(targets: np.ndarray, starts: np.ndarray, window: int = CONVERGENCE_WINDOW_BATCHES) -> BatchController:
    """``final_b_target``, ``settled_b_target`` and ``convergence_s`` of a dynamic batcher's
    targets (per batch, in order) and the batches' start times (see
    :class:`~simpy_llm.metrics.summary.BatchController`).

    >>> targets = np.array([9, 7, 5, 4, 4, 5, 4, 4, 4, 4], dtype=float)
    >>> controller_stats(targets, np.arange(10.0), window=4)  # band: 4 +- max(0.4, 1)
    {'final_b_target': 4, 'settled_b_target': 4.0, 'convergence_s': 2.0}
    >>> controller_stats(targets[:3], np.arange(3.0), window=4)["convergence_s"] is None  # too short to tell
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


class BatchServerResults:
    """The batch servers of a run.

    Parameters
    ----------
    recorder
        The run's recorder (its batches and the replicas' busy time).
    columns
        The record columns (each request's replica, bin, status and times).
    scenario
        The scenario run (the batch servers' settings).
    end_s
        The run's simulated duration, s.
    replica_groups
        Each replica's group name (``None``: not known).
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        columns: dict[str, np.ndarray],
        scenario: Scenario,
        end_s: float,
        replica_groups: list[str] | None,
    ) -> None:
        self.recorder = recorder
        self.columns = columns
        self.scenario = scenario
        self.end_s = end_s
        self.replica_groups = replica_groups

    def servers(self) -> list[tuple[int, str, BatchServerConfig]]:
        """(replica index, group name, settings) of each request-level batch server in the fleet."""
        if self.scenario is None:  # Results built by hand may have no scenario
            return []
        out = []
        index = 0
        for group in self.scenario.serving.groups():
            for _ in range(group.count):
                if group.batch_server is not None:
                    out.append((index, group.name, group.batch_server))
                index += 1
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """One row per batch a batch server finished, in (replica, batch) order (see
        :meth:`Results.batches() <simpy_llm.metrics.results.Results.batches>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        frame = pd.DataFrame(sorted(self.recorder.batches, key=lambda r: (r[0], r[1])), columns=_RECORDED)
        frame = frame.astype({name: "int64" for name in ("replica", "batch", "bin", "size", "memory_tokens")})
        for name in ("formed_s", "start_s", "end_s"):
            frame[name] = frame[name].astype("float64")
        for name in ("b_target", "b_mem", "b_sla"):
            frame[name] = frame[name].where(frame[name] >= 0).astype("float64")
        frame.insert(6, "service_s", frame["end_s"] - frame["start_s"])
        groups = self.replica_groups
        frame.insert(1, "replica_group", pd.array([groups[i] if groups is not None else "" for i in frame["replica"]], dtype="string"))
        limits = {
            i: cfg.dynamic.memory.eta_tokens for i, _g, cfg in self.servers() if cfg.dynamic is not None and cfg.dynamic.memory is not None
        }
        frame["memory_limit_tokens"] = [float(limits.get(i, math.nan)) for i in frame["replica"]]
        return frame

    def summary(self, duration_s: float) -> BatchServerSection:
        """``{"batch_servers": ...}`` over a run of *duration_s* (NaN: of zero duration); empty
        when the fleet has no batch server."""
        servers = self.servers()
        if not servers:
            return {}
        c = self.columns
        rows = np.array(sorted(self.recorder.batches, key=lambda r: (r[0], r[1])), dtype=np.float64).reshape(-1, len(_RECORDED))
        e2e = c["completion_s"] - c["arrival_s"]
        out: dict[str, BatchServerStats] = {}
        for index, _group, cfg in servers:
            mine = rows[rows[:, 0] == index]
            size = mine[:, 3].astype(np.int64)
            service = mine[:, 6] - mine[:, 5]
            memory = mine[:, 10]
            here = c["replica"] == index
            done = here & (c["status"] == "completed")
            waiting = here & (c["status"] == "in_flight")
            by_bin: dict[str, BinStats] = {}
            # Time each request spent in its bin's queue (to the end of the run if never served).
            queued_s = np.where(np.isnan(c["first_scheduled_s"]), self.end_s, c["first_scheduled_s"]) - c["enqueue_s"]
            for b in range(cfg.bins.count):
                in_bin = done & (c["bin"] == b)
                n = int(in_bin.sum())
                mine_b = here & (c["bin"] == b)
                by_bin[str(b)] = {
                    "completed": n,
                    "requests_per_s": n / duration_s if duration_s > 0 else math.nan,
                    "mean_queue_length": float(queued_s[mine_b].sum() / duration_s) if duration_s > 0 else None,
                    "queued_at_end": int((waiting & (c["bin"] == b)).sum()),
                    "e2e_s": latency_stats(e2e[in_bin]),
                }
            dyn = cfg.dynamic
            target_s = cfg.sla_target_s
            limit = dyn.memory.eta_tokens if dyn is not None and dyn.memory is not None else None
            hist = dict(sorted(Counter(size.tolist()).items()))
            c_max = None
            if cfg.batch_size is not None and cfg.service.kind == "sampled":
                from simpy_llm.serving.batching import SampledServiceTimes, build_service_model  # batch servers' only

                model = build_service_model(cfg, None, np.random.default_rng(0))
                # The "sampled" kind is SampledServiceTimes, the model whose mean service time is known.
                if isinstance(model, SampledServiceTimes):
                    c_max = cfg.batch_size / model.mean_s if model.mean_s > 0 else None
            n_done = int(done.sum())
            span_s = float(mine[:, 6].max()) if size.size else 0.0
            busy_s = self.recorder.busy_s[index]
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
                "service_s": latency_stats(service),
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
                    controller_stats(mine[:, 7], mine[:, 5])
                    if dyn is not None
                    else {"final_b_target": None, "settled_b_target": None, "convergence_s": None}
                ),
                "c_max_requests_per_s": c_max,
            }
        return {"batch_servers": out}
