"""What a run's replicas did: their sampled state, preemptions and engine counters, and the
summary's engine sections (preemptions, KV use, batch sizes, requests in the system,
engine counters, busy share) and ``devices`` section (energy and cost, ``docs/devices.md``).

:class:`~simpy_llm.metrics.results.Results` shows them as ``timeseries()``,
``preemptions()`` and those sections of ``summary()``. The engines keep these counters
for the whole run, warm-up included (they are not kept per request).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, TypedDict

import numpy as np

from simpy_llm.metrics.stats import QUANTILES, mean_of_known

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.metrics.summary import (
        BatchSizeStats,
        DeviceStats,
        EngineCounts,
        GpuUtilization,
        InSystem,
        KvUtilization,
        Preemptions,
    )
    from simpy_llm.serving.devices import DeviceProfile

__all__ = ["PREEMPTION_MODES", "TIMESERIES_COLUMNS", "DeviceSection", "RecordTotals", "ReplicaResults", "ReplicaSections"]

TIMESERIES_COLUMNS = ("time_s", "replica", "waiting", "running", "kv_used_blocks", "kv_utilization", "busy")
"""Columns of :meth:`ReplicaResults.to_dataframe`, the sampled replica state."""
PREEMPTION_MODES = ("recompute", "swap")
"""How a preempted request gets its KV back (every mode has a count in the summary)."""


class RecordTotals(NamedTuple):
    """What the replicas' sections need of the records, counted as the records were written
    (a streamed run's chunks), so that no whole column is read for them."""

    requests_preempted: int
    """Records with at least one preemption."""
    completed: int
    """Records of completed requests (warm-up included)."""
    completed_prompt_tokens: int
    """Prompt tokens of those records."""
    completed_output_tokens: int
    """Output tokens of those records."""


class ReplicaSections(TypedDict):
    """The summary's engine sections, in the summary's order."""

    preemptions: Preemptions
    kv_utilization: KvUtilization
    batch_size: BatchSizeStats
    in_system: InSystem
    engine: EngineCounts
    gpu_utilization: GpuUtilization


class DeviceSection(TypedDict, total=False):
    """The summary's ``devices`` section (absent when no replica group names a device)."""

    devices: DeviceStats


class ReplicaResults:
    """The replicas' side of a run.

    Parameters
    ----------
    recorder
        The run's recorder (its samples, preemptions and engine counters).
    columns
        The record columns (each request's preemptions, outcome and tokens).
    end_s
        The run's simulated duration, s.
    steps
        Engine steps over all replicas.
    kv_blocks
        Each replica's KV block count (0: a batch server without a memory limit).
    replica_groups
        Each replica's group name (``None``: not known).
    replica_devices
        ``(device profile or None, GPUs)`` per replica (``None``: not known).
    totals
        The records' totals when already counted (``None``: counted from *columns*).
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        columns: dict[str, np.ndarray],
        end_s: float,
        steps: int,
        kv_blocks: list[int],
        replica_groups: list[str] | None,
        replica_devices: list[tuple[DeviceProfile | None, int]] | None,
        totals: RecordTotals | None = None,
    ) -> None:
        self.recorder = recorder
        self.columns = columns
        self._totals = totals
        self.end_s = end_s
        self.steps = steps
        self.kv_blocks = kv_blocks
        self.replica_groups = replica_groups
        self.replica_devices = replica_devices

    def to_dataframe(self) -> pd.DataFrame:
        """Sampled replica state, one row per (sample time, replica), sorted by both (see
        :meth:`Results.timeseries() <simpy_llm.metrics.results.Results.timeseries>`)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        rows = sorted(self.recorder.samples, key=lambda r: (r[0], r[1]))
        frame = pd.DataFrame(rows, columns=["time_s", "replica", "waiting", "running", "kv_used_blocks", "busy"])
        frame = frame.astype(
            {"time_s": "float64", "replica": "int64", "waiting": "int64", "running": "int64",
             "kv_used_blocks": "int64", "busy": "int64"}
        )
        blocks = np.array(self.kv_blocks, dtype=np.float64)[frame["replica"].to_numpy()]
        used = frame["kv_used_blocks"].to_numpy(np.float64)
        # A batch server without a memory limit has no capacity (0 blocks): utilisation NaN.
        share = np.divide(used, blocks, out=np.full_like(used, np.nan), where=blocks > 0)
        frame.insert(5, "kv_utilization", share)
        return frame[list(TIMESERIES_COLUMNS)]

    def preemptions(self) -> pd.DataFrame:
        """One row per preemption: request_id, replica, time_s, mode (``recompute`` or ``swap``)."""
        import pandas as pd  # pandas is imported where a frame is built: importing the package stays fast

        rows = sorted(self.recorder.preemptions)
        return pd.DataFrame(rows, columns=["request_id", "replica", "time_s", "mode"]).astype(
            {"request_id": "int64", "replica": "int64", "time_s": "float64", "mode": "string"}
        )

    def totals(self) -> RecordTotals:
        """The records' totals these sections need (given, or counted from the columns)."""
        if self._totals is not None:
            return self._totals
        c = self.columns
        done = c["status"] == "completed"
        return RecordTotals(
            requests_preempted=int((c["num_preemptions"] > 0).sum()), completed=int(done.sum()),
            completed_prompt_tokens=int(c["prompt_tokens"][done].sum()), completed_output_tokens=int(c["output_tokens"][done].sum()),
        )

    def summary(self, duration_s: float) -> ReplicaSections:
        """The engine sections over a run of *duration_s* (NaN: of zero duration)."""
        rec = self.recorder
        kv_per_replica = [
            bs / (blocks * duration_s) if duration_s == duration_s and blocks else math.nan
            for bs, blocks in zip(rec.kv_block_seconds, self.kv_blocks, strict=True)
        ]
        by_mode = dict.fromkeys(PREEMPTION_MODES, 0)
        for *_rest, mode in rec.preemptions:
            by_mode[mode] = by_mode.get(mode, 0) + 1
        engine: EngineCounts = {"steps": self.steps, "busy_s": list(rec.busy_s)}
        if rec.cold_starts:
            engine["cold_starts"] = len(rec.cold_starts)
            engine["cold_start_s"] = float(sum(end - start for _, start, end in rec.cold_starts))
        if self.replica_groups is not None:
            engine["group"] = list(self.replica_groups)
        return {
            "preemptions": {
                "total": len(rec.preemptions),
                "requests_preempted": self._requests_preempted(),
                "by_mode": dict(sorted(by_mode.items())),
            },
            "kv_utilization": {
                "time_weighted_mean": mean_of_known(kv_per_replica),
                "per_replica": kv_per_replica,
            },
            "batch_size": self.batch_sizes(),
            "in_system": {"time_average": rec.in_system.time_average(self.end_s), "peak": rec.in_system.peak},
            "engine": engine,
            "gpu_utilization": self.gpu_utilization(duration_s),
        }

    def _requests_preempted(self) -> int:
        if self._totals is not None:
            return self._totals.requests_preempted
        return int((self.columns["num_preemptions"] > 0).sum())

    def batch_sizes(self) -> BatchSizeStats:
        """``summary()["batch_size"]``: requests per engine step, one weight per step."""
        batch_hist = dict(sorted(self.recorder.batch_steps.items()))
        sizes = np.array(list(batch_hist.keys()), dtype=np.float64)
        weights = np.array(list(batch_hist.values()), dtype=np.int64)
        histogram = {str(k): v for k, v in batch_hist.items()}
        if not weights.sum():
            return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": 0, "histogram": histogram}
        cum = np.cumsum(weights)
        p50, p90, p95, p99 = (float(sizes[min(int(np.searchsorted(cum, q / 100 * cum[-1])), len(sizes) - 1)]) for _, q in QUANTILES)
        return {"mean": float(np.dot(sizes, weights) / weights.sum()), "p50": p50, "p90": p90, "p95": p95, "p99": p99,
                "max": int(sizes.max()), "histogram": histogram}

    def gpu_utilization(self, duration_s: float) -> GpuUtilization:
        """``summary()["gpu_utilization"]``: each replica's busy time over *duration_s*."""
        busy = self.recorder.busy_s
        shares = [b / duration_s for b in busy] if duration_s > 0 else []
        mean = float(np.mean(shares)) if shares else None
        per_replica: list[float | None] = list(shares) if duration_s > 0 else [None] * len(busy)
        out: GpuUtilization = {"mean": mean, "per_replica": per_replica}
        if self.replica_groups is not None:
            by_group: dict[str, float | None] = {}
            for name in sorted(set(self.replica_groups)):
                if mean is None:
                    by_group[name] = None
                else:
                    by_group[name] = float(np.mean([u for u, g in zip(shares, self.replica_groups, strict=True) if g == name]))
            out["by_group"] = by_group
        return out

    def devices(self, duration_s: float, goodput_per_s: float) -> DeviceSection:
        """``{"devices": ...}`` (see :class:`~simpy_llm.metrics.summary.DeviceStats`) over a run of
        *duration_s*, whose ``goodput.requests_per_s`` is *goodput_per_s*; empty without devices."""
        table_j = self.recorder.energy_j
        if self.replica_devices is None or not any(
            d is not None or j is not None for (d, _), j in zip(self.replica_devices, table_j, strict=True)
        ):
            return {}
        totals = self.totals()
        tokens = totals.completed_prompt_tokens + totals.completed_output_tokens
        out_tokens = totals.completed_output_tokens
        energy: list[float | None] = []
        cost: list[float | None] = []
        gpus, priced = 0, True
        for (device, n), busy, steps_j in zip(self.replica_devices, self.recorder.busy_s, table_j, strict=True):
            gpus += n
            if device is None:
                energy.append(steps_j)  # the table's step energy alone: no idle power is known
                cost.append(None)
                priced = False
                continue
            idle = max(duration_s - busy, 0.0)
            active = n * device.energy.active_w * busy if steps_j is None else steps_j
            energy.append(active + n * device.energy.idle_w * idle)
            price = device.price_per_hour_usd
            cost.append(None if price is None else n * price * duration_s / 3600)
            priced = priced and price is not None
        total_j = sum(e for e in energy if e is not None)
        total_usd = sum(x for x in cost if x is not None)
        return {"devices": {
            "gpus": gpus,
            "energy_j": total_j,
            "energy_j_per_replica": energy,
            "energy_j_per_output_token": total_j / out_tokens if out_tokens else None,
            "energy_j_per_request": total_j / totals.completed if totals.completed else None,
            "cost_usd": total_usd if priced else None,
            "cost_usd_per_replica": cost,
            "cost_usd_per_1k_tokens": total_usd / (tokens / 1000) if priced and tokens else None,
            "goodput_per_gpu": goodput_per_s / gpus if gpus and not math.isnan(goodput_per_s) else None,
        }}
