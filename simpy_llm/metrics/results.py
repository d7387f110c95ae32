"""Results of a run: per-request records, summaries, files.

Metric definitions (seconds unless named otherwise):

* ``ttft_s`` = first_token_s - arrival_s
* ``e2e_s`` = completion_s - arrival_s
* ``tpot_s`` = (completion_s - first_token_s) / (output_tokens - 1), for requests with
  more than one output token
* ``queue_delay_s`` = first_scheduled_s - enqueue_s (time in a replica's waiting queue)
* ITL: every gap between consecutive output tokens of a request, weighted one per
  token (kept as weighted values by the engine, not per token)

Percentiles of per-request metrics use numpy's default (linear) interpolation
over completed requests; ITL percentiles use the inverted CDF of the weighted
gaps. Throughput and goodput are counts divided by the run's duration
(``duration_s``: the last completion, or ``until_s``).
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.metrics.recorder import RECORD_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.monitors import WeightedTally
    from simpy_llm.metrics.recorder import Recorder

__all__ = ["RequestRecord", "Results"]

QUANTILES = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One request's fate (a row of :meth:`Results.to_dataframe`)."""

    request_id: int
    client_id: str
    tenant_id: str
    slo_class: str
    status: str
    """completed | dropped | in_flight"""
    replica: int
    priority: int
    streaming: int
    session_id: str
    round_index: int
    prefix_group: str
    prefix_tokens: int
    text_tokens: int
    image_tokens: int
    audio_tokens: int
    video_tokens: int
    reason_ratio: float
    prompt_tokens: int
    output_tokens: int
    generated_tokens: int
    num_preemptions: int
    cached_tokens: int
    arrival_s: float
    enqueue_s: float
    first_scheduled_s: float
    first_token_s: float
    completion_s: float
    dropped_reason: str
    warm_up: int


def _stats(values: np.ndarray) -> dict[str, float | None]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {"mean": None, **{k: None for k, _ in QUANTILES}}
    qs = np.percentile(values, [q for _, q in QUANTILES])
    return {"mean": float(values.mean()), **{k: float(v) for (k, _), v in zip(QUANTILES, qs, strict=True)}}


def _weighted_stats(tally: WeightedTally) -> dict[str, float | None]:
    if tally.count == 0:
        return {"mean": None, **{k: None for k, _ in QUANTILES}}
    return {"mean": tally.mean(), **{k: tally.quantile(q / 100) for k, q in QUANTILES}}


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
    ) -> Results:
        """Freeze a recorder's columns into Results (records sorted by request id)."""
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
        return {
            "ttft_s": c["first_token_s"] - c["arrival_s"],
            "tpot_s": tpot,
            "e2e_s": c["completion_s"] - c["arrival_s"],
            "queue_delay_s": c["first_scheduled_s"] - c["enqueue_s"],
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request with the record fields and derived metrics."""
        import pandas as pd

        frame = pd.DataFrame({**self.columns, **self.derived()})
        for name in ("client_id", "tenant_id", "slo_class", "status", "session_id", "prefix_group", "dropped_reason"):
            frame[name] = frame[name].astype("string")
        return frame

    def preemptions(self) -> pd.DataFrame:
        """One row per preemption: request_id, replica, time_s, mode (``recompute`` or ``swap``)."""
        import pandas as pd

        rows = sorted(self._recorder.preemptions)
        return pd.DataFrame(rows, columns=["request_id", "replica", "time_s", "mode"]).astype(
            {"request_id": "int64", "replica": "int64", "time_s": "float64", "mode": "string"}
        )

    def sessions(self) -> pd.DataFrame:
        """One row per session: session_id, client_id, rounds (created), end_reason."""
        import pandas as pd

        rows = sorted(self._recorder.sessions)
        return pd.DataFrame(rows, columns=["session_id", "client_id", "rounds", "end_reason"]).astype(
            {"session_id": "string", "client_id": "string", "rounds": "int64", "end_reason": "string"}
        )

    # --- summary -----------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Headline metrics as plain data (JSON-ready); deterministic for a seed."""
        c = self.columns
        rec = self._recorder
        status = c["status"]
        done = status == "completed"
        d = {k: v[done] for k, v in self.derived().items()}
        duration = self.end_s if self.end_s > 0 else float("nan")
        completed = int(done.sum())
        out_tokens = int(c["output_tokens"][done].sum())
        in_tokens = int(c["prompt_tokens"][done].sum())

        met = self._slo_met(done, d)
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
            bs / (blocks * duration) if duration == duration else math.nan
            for bs, blocks in zip(rec.kv_block_seconds, self._kv_blocks, strict=True)
        ]
        n_preempted = int((c["num_preemptions"] > 0).sum())
        return {
            "requests": {
                "arrived": rec.arrived,
                "completed": completed,
                "dropped": int((status == "dropped").sum()),
                "in_flight": int((status == "in_flight").sum()),
            },
            "duration_s": self.end_s,
            "latency_s": {
                "ttft": _stats(d["ttft_s"]),
                "tpot": _stats(d["tpot_s"]),
                "itl": _weighted_stats(rec.itl),
                "e2e": _stats(d["e2e_s"]),
                "queue_delay": _stats(d["queue_delay_s"]),
            },
            "throughput": {
                "requests_per_s": completed / duration,
                "output_tokens_per_s": out_tokens / duration,
                "input_tokens_per_s": in_tokens / duration,
            },
            "goodput": {
                "requests_per_s": int(met.sum()) / duration,
                "fraction": float(met.mean()) if completed else math.nan,
                "by_class": by_class,
            },
            "preemptions": {"total": len(rec.preemptions), "requests_preempted": n_preempted},
            "kv_utilization": {
                "time_weighted_mean": float(np.mean(kv_per_replica)),
                "per_replica": kv_per_replica,
            },
            "batch_size": batch,
            "in_system": {"time_average": rec.in_system.time_average(self.end_s), "peak": rec.in_system.peak},
            "engine": {"steps": self.steps, "busy_s": list(rec.busy_s)},
            "sessions": self._session_summary(),
        }

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
            for metric, limit in (("ttft_s", target.ttft_s), ("tpot_s", target.tpot_s), ("e2e_s", target.e2e_s)):
                if limit is not None:
                    values = d[metric]
                    # A request with no TPOT (one output token) cannot miss a TPOT target.
                    ok = (values <= limit) | np.isnan(values) if metric == "tpot_s" else values <= limit
                    met &= ~mask | ok
        return met

    # --- files ---------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write ``records.csv`` (and ``records.parquet`` when pyarrow is installed),
        ``preemptions.csv``, ``summary.json`` and ``manifest.json`` into *directory*."""
        from simpy_llm.config.loader import scenario_hash, scenario_to_dict

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        frame = self.to_dataframe()
        frame.to_csv(out / "records.csv", index=False)
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            pass
        else:
            frame.to_parquet(out / "records.parquet", index=False)
        self.preemptions().to_csv(out / "preemptions.csv", index=False)
        if self._recorder.sessions:
            self.sessions().to_csv(out / "sessions.csv", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary(), indent=2, default=_json_default) + "\n")
        manifest = {
            "seed": self.scenario.seed,
            "scenario_sha256": scenario_hash(self.scenario),
            "scenario": scenario_to_dict(self.scenario),
            "versions": _versions(),
            "python": platform.python_version(),
            "run": {
                "wall_s": self.wall_s,
                "requests": len(self),
                "requests_per_wall_s": len(self) / self.wall_s if self.wall_s > 0 else None,
                "simpy_events": self.events,
                "engine_steps": self.steps,
            },
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=_json_default) + "\n")
        return out


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
