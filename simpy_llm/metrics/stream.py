"""Streamed records: a run's request records written in chunks as it goes, and read back.

``Simulation(scenario, stream_to=DIR)`` (``simpy-llm run --stream-records DIR``) hands the
recorder a :class:`RecordStream`: every :data:`DEFAULT_CHUNK_REQUESTS` records (settable
with ``stream_chunk_requests``) the recorder passes the oldest ones over and forgets them,
and the stream writes them as one file, ``records-00000.parquet``, ``records-00001.parquet``...
(Parquet with the ``parquet`` extra, pyarrow; ``.csv`` otherwise). A chunk holds exactly
that many records, in the order the requests left (completed or dropped; the requests still
in flight at the end come last), except the last chunk, which holds the rest; a run without
records writes none. Each chunk has the columns of ``Results.to_dataframe()``, so the
chunks put together and sorted by ``request_id`` are the in-memory run's frame, row for row.

What stays in memory while the run goes is one chunk of records, not the run's: records
cost up to ~370 bytes each in memory (the recorder's columns), so a chunk of 16,384
takes about 6 MB.

The summary of a streamed run (:class:`StreamedRequestResults`) is the in-memory one,
figure for figure: counts, sums, minima and maxima (and which columns hold one value in
every record) are kept as each chunk is written; percentiles and means are taken at the
end over the chunks read back one column at a time, placed in request-id order, so that
each is the same sum in the same order as in memory (not a sketch: equal to the last
bit). The largest thing the summary holds is then a few columns of one number per
request (8 bytes each), not the records; the diagnostics gather what they need chunk
by chunk too. Every other figure that needs a record column (a batch server's bins,
speculation, the planner, the device figures) reads that column from the chunks when it
is asked for (:class:`ChunkColumns`: a column of one value is a view of it, any other is
filled chunk by chunk in request-id order), and so does ``to_dataframe()``, which builds
the whole frame.

Examples
--------
>>> import tempfile
>>> from simpy_llm import Simulation, load_scenario
>>> sc = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])
>>> with tempfile.TemporaryDirectory() as d:
...     r = Simulation(sc, stream_to=d, stream_chunk_requests=16).run(progress=False)
...     chunks = [p.name.split(".")[0] for p in r.streamed_records.files]
...     same = r.to_dataframe().equals(Simulation(sc).run(progress=False).to_dataframe())
>>> chunks, len(r), same
(['records-00000', 'records-00001', 'records-00002', 'records-00003'], 50, True)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simpy_llm.metrics.record import RECORD_FIELDS
from simpy_llm.metrics.requests import RequestOutcomes, RequestResults
from simpy_llm.metrics.stats import latency_stats, move_to_front, squeeze, weighted_stats
from simpy_llm.serving.replica_results import RecordTotals

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.monitors import WeightedTally
    from simpy_llm.metrics.record import RequestRecord
    from simpy_llm.metrics.requests import LatencySections, RateSections, WindowedRates
    from simpy_llm.metrics.summary import ClassGoodput, ClassLatency, CountedLatencyStats, Fairness, Latency, PrefixCacheStats, RequestCounts

__all__ = ["DEFAULT_CHUNK_REQUESTS", "ChunkColumns", "RecordStream", "StreamedRecords", "StreamedRequestResults", "stream_format"]

DEFAULT_CHUNK_REQUESTS = 16_384
"""Records per chunk file unless told otherwise (~6.5 MB of records in memory at a time; the frame written from them takes a few times that)."""

_KINDS = dict(RECORD_FIELDS)
_NAMES = tuple(name for name, _ in RECORD_FIELDS)
_SERVER_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_delay_s")
_CLIENT_METRICS = ("client_ttft_s", "client_e2e_s")


def stream_format() -> str:
    """``"parquet"`` when pyarrow (the ``parquet`` extra) is installed, else ``"csv"``."""
    try:
        import pyarrow  # noqa: F401 - optional (the parquet extra)
    except ImportError:
        return "csv"
    return "parquet"


def _empty(kind: str) -> np.ndarray:
    return np.array([], dtype=object if kind == "s" else np.float64 if kind == "f" else np.int64)


class _Tally:
    """What the summary counts, summed as each chunk is written (exact: integers, minima, maxima)."""

    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.warm_up = 0
        self.unmeasured = 0
        self.drops: Counter[tuple[str, str]] = Counter()
        """(slo_class, reason) per drop (``unknown``: no reason)."""
        self.arrival_min: list[float] = []
        self.arrival_max: list[float] = []
        """Per chunk with a measured request: its measured arrivals' extremes (NaN stays NaN, as in memory)."""
        self.completion_max: list[float] = []
        self.network = False
        self.gapped = 0
        self.cached_tokens = 0
        self.prompt_tokens = 0
        self.preempted = 0
        """Records with at least one preemption."""
        self.completed_tokens = [0, 0]
        """Prompt and output tokens of the completed records (warm-up included)."""
        self.single: dict[str, np.ndarray] = {}
        """Columns that hold one value in every record written so far: that value (an array
        of one; a number to the bit)."""
        self.varied: set[str] = set()
        """Columns that hold more than one value."""

    def add(self, c: dict[str, np.ndarray]) -> None:
        for name, values in c.items():
            if name in self.varied or not values.size:
                continue
            first = self.single.setdefault(name, values[:1].copy())
            if values.dtype == object:
                same = bool((values == first[0]).all())
            else:  # to the bit: -0.0 is not 0.0, NaN is NaN
                same = bool((values.view(np.int64) == first.view(np.int64)[0]).all())
            if not same:
                del self.single[name]
                self.varied.add(name)
        status = c["status"]
        self.status.update(status.tolist())
        measured = c["warm_up"] == 0
        self.warm_up += int((~measured).sum())
        self.unmeasured += int((~measured).sum())
        dropped = status == "dropped"
        self.drops.update(zip(c["slo_class"][dropped].tolist(), [r or "unknown" for r in c["dropped_reason"][dropped].tolist()], strict=True))
        if measured.any():
            self.arrival_min.append(float(c["arrival_s"][measured].min()))
            self.arrival_max.append(float(c["arrival_s"][measured].max()))
        completed = status == "completed"
        if completed.any():
            self.completion_max.append(float(c["completion_s"][completed].max()))
        self.network = self.network or bool((c["upload_s"] != 0).any() or (c["download_s"] != 0).any())
        self.gapped += int((measured & (c["streaming"] != 0) & (c["generated_tokens"] >= 2)).sum())
        admitted = measured & ~np.isnan(c["first_scheduled_s"])
        self.cached_tokens += int(c["cached_tokens"][admitted].sum())
        self.prompt_tokens += int(c["prompt_tokens"][admitted].sum())
        self.preempted += int((c["num_preemptions"] > 0).sum())
        self.completed_tokens[0] += int(c["prompt_tokens"][completed].sum())
        self.completed_tokens[1] += int(c["output_tokens"][completed].sum())

    def totals(self) -> RecordTotals:
        """The totals of the records written that the replicas' sections need."""
        return RecordTotals(requests_preempted=self.preempted, completed=self.status["completed"],
                            completed_prompt_tokens=self.completed_tokens[0], completed_output_tokens=self.completed_tokens[1])


class StreamedRecords:
    """The chunk files of a streamed run, read back: a column at a time in request-id order
    (:meth:`column`), a chunk at a time (:meth:`chunk`), or all at once (:meth:`columns`).

    Parameters
    ----------
    directory
        Where the chunks are.
    files
        The chunk files, in the order they were written.
    fmt
        ``"parquet"`` or ``"csv"``.
    count
        Records over all chunks.
    """

    def __init__(self, directory: Path, files: list[Path], fmt: str, count: int, tally: _Tally | None = None) -> None:
        self.directory = directory
        self.files = list(files)
        self.format = fmt
        self.count = count
        self.tally = tally if tally is not None else _Tally()
        self._sorted_ids: np.ndarray | None = None
        self._dense: bool | None = None
        """Whether the request ids are 0 to count - 1 (then an id is its own position, and
        nothing per record is kept to place it)."""

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<StreamedRecords: {self.count:,} records in {len(self.files)} {self.format} chunks in {str(self.directory)!r}>"

    def chunk(self, index: int, names: tuple[str, ...] = _NAMES) -> dict[str, np.ndarray]:
        """The record columns *names* of chunk *index*, in the order written (strings as objects)."""
        path = self.files[index]
        if self.format == "parquet":
            import pyarrow as pa  # optional (the parquet extra): imported where a chunk is read
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=list(names))
            out: dict[str, np.ndarray] = {}
            for name in names:
                column = table.column(name)
                if _KINDS[name] == "s":  # one object per distinct string, not per record
                    coded = column.dictionary_encode().combine_chunks()
                    out[name] = np.array(coded.dictionary.to_pylist(), dtype=object)[coded.indices.to_numpy(zero_copy_only=False)]
                else:
                    out[name] = self._array(column.to_numpy(), name)
            del table
            # pyarrow's pool keeps what a chunk's reading freed for its next allocations, and the
            # more chunks are read the more it keeps (tens of MB over a million records): handing
            # it back after each chunk keeps a streamed summary's memory that of one chunk.
            pa.default_memory_pool().release_unused()
            return out
        import pandas as pd  # pandas is imported where a chunk is read: importing the package stays fast

        floats = [n for n in names if _KINDS[n] == "f"]
        frame = pd.read_csv(
            path, usecols=list(names), keep_default_na=False, na_values={n: [""] for n in floats},
            dtype={n: str if _KINDS[n] == "s" else "float64" if _KINDS[n] == "f" else "int64" for n in names},
        )
        return {name: self._array(frame[name].to_numpy(), name) for name in names}

    @staticmethod
    def _array(values: np.ndarray, name: str) -> np.ndarray:
        kind = _KINDS[name]
        if kind == "s":
            return np.asarray(values, dtype=object)
        return np.asarray(values, dtype=np.float64 if kind == "f" else np.int64)

    def chunks(self, names: tuple[str, ...] = _NAMES) -> Iterator[dict[str, np.ndarray]]:
        """Each chunk's columns *names*, in the order written."""
        for index in range(len(self.files)):
            yield self.chunk(index, names)

    def _place(self) -> None:
        if self._dense is not None:
            return
        # Dense when every id lies in [0, count) and none comes twice: a bit per record to tell.
        seen = np.zeros(self.count, dtype=bool)
        dense = True
        for c in self.chunks(("request_id",)):
            ids = c["request_id"]
            if ids.size and (ids.min() < 0 or ids.max() >= self.count or seen[ids].any()):
                dense = False
                break
            seen[ids] = True
        del seen
        self._dense = dense
        if not dense:
            ids = np.concatenate([c["request_id"] for c in self.chunks(("request_id",))])
            ids.sort()
            self._sorted_ids = ids

    def sorted_ids(self) -> np.ndarray:
        """Every request id, sorted (kept when the ids are not 0 to count - 1: one integer per record)."""
        self._place()
        return np.arange(self.count, dtype=np.int64) if self._sorted_ids is None else self._sorted_ids

    def positions(self, request_ids: np.ndarray) -> np.ndarray:
        """Where the records of *request_ids* stand in request-id order."""
        self._place()
        if self._sorted_ids is None:
            return np.asarray(request_ids, dtype=np.int64)
        return np.searchsorted(self._sorted_ids, request_ids)

    def column(self, name: str) -> np.ndarray:
        """One record column over every chunk, in request-id order (the in-memory run's column).

        A column that holds one value in every record is a read-only view of it (no memory
        per record); any other is filled chunk by chunk, in place."""
        if not self.files:
            return _empty(_KINDS[name])
        single = self.tally.single.get(name)
        if single is not None:
            return np.broadcast_to(single, (self.count,))
        kind = _KINDS[name]
        out = np.empty(self.count, dtype=object if kind == "s" else np.float64 if kind == "f" else np.int64)
        for c in self.chunks(("request_id", name) if name != "request_id" else (name,)):
            out[self.positions(c["request_id"])] = c[name]
        return out

    def columns(self) -> dict[str, np.ndarray]:
        """Every record column in request-id order: the whole run's records in memory."""
        return {name: self.column(name) for name in _NAMES}


class ChunkColumns(dict[str, np.ndarray]):
    """The record columns of a streamed run as a mapping that reads each column from the
    chunks when it is looked up (and does not keep it): what a summary section or a
    diagnostic that needs a whole column gets in place of the in-memory columns."""

    def __init__(self, records: StreamedRecords) -> None:
        super().__init__()
        self.records = records

    def __missing__(self, name: str) -> np.ndarray:
        return self.records.column(name)


class RecordStream:
    """Writes a run's records to *directory* in chunks of *chunk_requests* records (what the
    recorder's ``sink`` is given, :class:`~simpy_llm.metrics.recorder.RecordSink`).

    Parameters
    ----------
    directory
        Created if missing; must not hold chunk files already (a stream is one run's).
    scenario
        The scenario run (its clusters, for the ``cluster`` column).
    replica_groups
        Each replica's group name, for the ``replica_group`` column.
    chunk_requests
        Records per chunk (the last chunk holds the rest).
    fmt
        ``"parquet"`` or ``"csv"``; default: :func:`stream_format`.
    """

    def __init__(
        self, directory: str | Path, *, scenario: Scenario, replica_groups: list[str] | None,
        chunk_requests: int = DEFAULT_CHUNK_REQUESTS, fmt: str | None = None,
    ) -> None:
        if chunk_requests < 1:
            raise ValueError(f"stream_chunk_requests must be at least 1, got {chunk_requests}")
        self.format = fmt or stream_format()
        if self.format not in ("parquet", "csv"):
            raise ValueError(f"record stream format must be parquet or csv, got {self.format!r}")
        if self.format == "parquet" and stream_format() != "parquet":
            raise ValueError("streamed Parquet records need pyarrow: pip install 'simpy-llm[parquet]'")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        old = sorted(self.directory.glob("records-*.parquet")) + sorted(self.directory.glob("records-*.csv"))
        if old:
            raise ValueError(f"{self.directory} already holds streamed records ({old[0].name}...): give an empty directory")
        self.chunk_size = chunk_requests
        self.scenario = scenario
        self.replica_groups = replica_groups
        self.files: list[Path] = []
        self.count = 0
        self.tally = _Tally()

    def write(self, columns: dict[str, np.ndarray]) -> None:
        """Write one chunk: record columns in the order the requests left, strings decoded."""
        frame = RequestResults(columns, scenario=self.scenario, end_s=math.nan, replica_groups=self.replica_groups).to_dataframe()
        path = self.directory / f"records-{len(self.files):05d}.{self.format}"
        if self.format == "parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        self.files.append(path)
        self.count += len(frame)
        self.tally.add(columns)

    def close(self) -> StreamedRecords:
        """The chunks written, to read back."""
        return StreamedRecords(self.directory, self.files, self.format, self.count, self.tally)


class StreamedRequestResults(RequestResults):
    """:class:`~simpy_llm.metrics.requests.RequestResults` of a streamed run: the same table
    and summary sections, from the chunks (see the module docstring for what each reads)."""

    def __init__(self, records: StreamedRecords, *, scenario: Scenario, end_s: float, replica_groups: list[str] | None) -> None:
        super().__init__(ChunkColumns(records), scenario=scenario, end_s=end_s, replica_groups=replica_groups)
        self.stream = records
        self._outcomes: RequestOutcomes | None = None
        self._by_class: dict[str, ClassGoodput] = {}
        self._done_tokens = (0, 0)

    def __len__(self) -> int:
        return self.stream.count

    def _whole(self) -> RequestResults:
        return RequestResults(self.stream.columns(), scenario=self.scenario, end_s=self.end_s, replica_groups=self.replica_groups)

    def _of(self, chunk: dict[str, np.ndarray]) -> RequestResults:
        return RequestResults(chunk, scenario=self.scenario, end_s=self.end_s, replica_groups=self.replica_groups)

    def to_dataframe(self) -> pd.DataFrame:
        """The whole run's frame, read from every chunk into memory (request-id order)."""
        return self._whole().to_dataframe()

    def records(self) -> Iterator[RequestRecord]:
        """The records as frozen objects, in request-id order (every chunk read into memory)."""
        return self._whole().records()

    def has_client_network(self) -> bool:
        return self.stream.tally.network

    def counts(self, arrived: int) -> RequestCounts:
        t = self.stream.tally
        reasons: Counter[str] = Counter()
        by_class: dict[str, dict[str, int]] = {}
        for (cls_name, reason), n in t.drops.items():
            reasons[reason] += n
            by_class.setdefault(cls_name, {})[reason] = n
        return {
            "arrived": arrived,
            "completed": t.status["completed"],
            "dropped": t.status["dropped"],
            "in_flight": t.status["in_flight"],
            "warm_up": t.warm_up,
            "dropped_by_reason": dict(sorted(reasons.items())),
            "dropped_by_class": {k: dict(sorted(v.items())) for k, v in sorted(by_class.items())},
        }

    def outcomes(self) -> RequestOutcomes:
        """Which requests the summary covers, one pass over the chunks (kept for the run)."""
        if self._outcomes is not None:
            return self._outcomes
        t, n = self.stream.tally, self.stream.count
        if t.arrival_min:
            a0, a1 = float(np.min(t.arrival_min)), float(np.max(t.arrival_max))
        else:
            a0 = a1 = self.end_s
        measured = np.zeros(n, dtype=bool)
        done = np.zeros(n, dtype=bool)
        met_all = np.zeros(n, dtype=bool)
        inside_n = inside_out = inside_in = offered = met_in = done_out = done_in = 0
        classes: dict[str, list[int]] = {}
        for chunk in self.stream.chunks():
            part = self._of(chunk)
            d = part.derived()
            pos = self.stream.positions(chunk["request_id"])
            measured_c = chunk["warm_up"] == 0
            completed = chunk["status"] == "completed"
            done_c = completed & measured_c
            met_c = part.slo_met(done_c, {k: v[done_c] for k, v in d.items()})
            measured[pos] = measured_c
            done[pos] = done_c
            met_all[pos[done_c]] = met_c
            comp, arrival = chunk["completion_s"], chunk["arrival_s"]
            inside = completed & (comp > a0) & (comp <= a1)
            inside_n += int(inside.sum())
            inside_out += int(chunk["output_tokens"][inside].sum())
            inside_in += int(chunk["prompt_tokens"][inside].sum())
            offered += int((measured_c & (arrival > a0) & (arrival <= a1)).sum())
            met_in += int(part.slo_met(inside, {k: v[inside] for k, v in d.items()}).sum())
            done_out += int(chunk["output_tokens"][done_c].sum())
            done_in += int(chunk["prompt_tokens"][done_c].sum())
            for cls_name, ok in zip(chunk["slo_class"][done_c].tolist(), met_c.tolist(), strict=True):
                tally = classes.setdefault(cls_name, [0, 0])
                tally[0] += 1
                tally[1] += ok
        window_s = a1 - a0
        span = window_s if window_s > 0 else float("nan")
        last = float(np.max(t.completion_max)) if t.completion_max else a1
        windowed: WindowedRates = {
            "requests_per_s": inside_n / span,
            "output_tokens_per_s": inside_out / span,
            "input_tokens_per_s": inside_in / span,
            "offered_requests_per_s": offered / span,
            "window_start_s": a0,
            "window_s": window_s,
            "drain_s": max(last - a1, 0.0),
        }
        start_s = 0.0
        if t.unmeasured:
            start_s = a0 if t.arrival_min else self.end_s
        self._by_class = {k: {"completed": c, "met": m, "fraction": m / c if c else math.nan} for k, (c, m) in sorted(classes.items())}
        self._done_tokens = (done_out, done_in)
        self._outcomes = RequestOutcomes(measured, done, met_all[done], start_s, self.end_s - start_s, windowed, met_in)
        return self._outcomes

    def windowed_rates(self, measured: np.ndarray) -> tuple[WindowedRates, int]:
        out = self.outcomes()
        return out.windowed, out.met_in_window

    def rates(self, outcomes: RequestOutcomes) -> RateSections:
        met = outcomes.met
        duration = outcomes.duration_s
        completed = int(outcomes.done.sum())
        done_out, done_in = self._done_tokens
        return {
            "throughput": {
                **outcomes.windowed,
                "whole_run_requests_per_s": completed / duration,
                "whole_run_output_tokens_per_s": done_out / duration,
                "whole_run_input_tokens_per_s": done_in / duration,
            },
            "goodput": {
                "requests_per_s": outcomes.goodput_per_s,
                "whole_run_requests_per_s": int(met.sum()) / duration,
                "fraction": float(met.mean()) if completed else math.nan,
                "by_class": dict(self._by_class),
            },
        }

    def prefix_cache(self, measured: np.ndarray) -> PrefixCacheStats:
        t = self.stream.tally
        cached, prompt = t.cached_tokens, t.prompt_tokens
        return {"hit_rate": cached / prompt if prompt > 0 else None, "cached_tokens": cached, "prompt_tokens": prompt}

    def _codes(self, key: str) -> tuple[np.ndarray, list[str]]:
        """Each request's code under *key* (``slo_class``, ``tenant_id`` or ``cluster``), in
        request-id order, and the names the codes stand for."""
        # A byte per request for up to 127 names (the usual classes and tenants), widened when more come.
        codes = np.zeros(self.stream.count, dtype=np.int8)
        names: dict[str, int] = {}
        for chunk in self.stream.chunks(("request_id", "replica", key) if key != "cluster" else ("request_id", "replica")):
            values = self._of(chunk).cluster_column() if key == "cluster" else chunk[key]
            here = [names.setdefault(v, len(names)) for v in values.tolist()]
            if len(names) > np.iinfo(codes.dtype).max:
                codes = codes.astype(np.int16 if len(names) <= np.iinfo(np.int16).max else np.int32)
            codes[self.stream.positions(chunk["request_id"])] = here
        return codes, list(names)

    def _metric(self, name: str, done: np.ndarray) -> np.ndarray:
        """One metric of :meth:`client_derived` for the requests in *done* (a mask in request-id
        order), in request-id order: filled chunk by chunk into one array for every request,
        then kept for those in *done* only."""
        out = np.empty(self.stream.count, dtype=np.float64)
        needed = ("request_id", "arrival_s", "enqueue_s", "first_scheduled_s", "first_token_s", "completion_s",
                  "output_tokens", "upload_s", "download_s", "streaming")
        for chunk in self.stream.chunks(needed):
            out[self.stream.positions(chunk["request_id"])] = self._of(chunk).metric(name, client=True)
        return out if done.all() else squeeze(out, done)

    def latency(self, outcomes: RequestOutcomes, itl: WeightedTally) -> LatencySections:
        done, measured = outcomes.done, outcomes.measured
        keys = ["slo_class", "tenant_id", *(["cluster"] if self.scenario.serving.clusters else [])]
        groups = {key: self._codes(key) for key in keys}
        present = {key: sorted(names[int(i)] for i in np.unique(codes[measured])) for key, (codes, names) in groups.items()}
        by: dict[str, dict[str, ClassLatency]] = {key: {name: {} for name in present[key]} for key in keys}  # type: ignore[typeddict-item]  # filled below, metric by metric
        # Each key's codes over the done requests only: the statistics never look at the rest.
        done_codes = {key: codes[done] for key, (codes, _) in groups.items()}
        stats: dict[str, CountedLatencyStats] = {}
        metrics = (*_SERVER_METRICS, *(_CLIENT_METRICS if self.has_client_network() else ()))
        for metric in metrics:
            values = self._metric(metric, done)
            known = ~np.isnan(values)
            count = int(known.sum())
            codes = done_codes
            if count < values.size:  # the NaNs out, of the values and of their groups' codes alike
                values = squeeze(values, known)
                codes = {key: squeeze(c.copy(), known) for key, c in done_codes.items()}
            del known
            # The run's mean before anything moves (the same sum, in the same order, as in memory).
            mean = float(values.mean()) if count else None
            if metric not in _CLIENT_METRICS:
                # Each group's figures from a copy of its values, but the largest group's: its
                # values are moved to the front of the array, in order, last.
                sizes = {(key, name): int((codes[key] == i).sum()) for key, (_, names) in groups.items()
                         for i, name in enumerate(names) if name in present[key]}
                largest = max(sizes, key=sizes.__getitem__, default=None)
                for key, (_, names) in groups.items():
                    code_of = {name: i for i, name in enumerate(names)}
                    for name in present[key]:
                        if (key, name) != largest:
                            by[key][name][metric.removesuffix("_s")] = latency_stats(values[codes[key] == code_of[name]], own=True)  # type: ignore[literal-required]  # one of ClassLatency's keys
                if largest is not None:
                    key, name = largest
                    front = move_to_front(values, codes[key] == groups[key][1].index(name))
                    by[key][name][metric.removesuffix("_s")] = latency_stats(values[:front], own=True)  # type: ignore[literal-required]  # one of ClassLatency's keys
            # Last: the run's percentiles (of every value, wherever the groups moved them).
            run = latency_stats(values, own=True)
            stats[metric] = {"mean": mean, "p50": run["p50"], "p90": run["p90"], "p95": run["p95"], "p99": run["p99"], "count": count}
            del values, codes
        gaps = weighted_stats(itl)
        latency: Latency = {
            "ttft": stats["ttft_s"],
            "tpot": stats["tpot_s"],
            "itl": {"mean": gaps["mean"], "p50": gaps["p50"], "p90": gaps["p90"], "p95": gaps["p95"], "p99": gaps["p99"],
                    "count": gaps["count"], "requests": self.stream.tally.gapped},
            "e2e": stats["e2e_s"],
            "queue_delay": stats["queue_delay_s"],
        }
        out: LatencySections = {"latency_s": latency, "latency_s_by_class": by["slo_class"], "latency_s_by_tenant": by["tenant_id"]}
        if self.has_client_network():
            out = {"latency_s": latency, "client_latency_s": {"ttft": stats["client_ttft_s"], "e2e": stats["client_e2e_s"]},
                   "latency_s_by_class": by["slo_class"], "latency_s_by_tenant": by["tenant_id"]}
        if "cluster" in by:
            out["latency_s_by_cluster"] = by["cluster"]
        return out

    def fairness(self, measured: np.ndarray) -> Fairness:
        if self.scenario.metrics.fairness.cohorts:
            return super().fairness(measured)  # the cohorts' keys: read from the chunks, column by column
        from simpy_llm.metrics.fairness import jain_index

        codes, names = self._codes("tenant_id")
        # Per request, whether it completed and its e2e_s / max(output_tokens, 1) (read where it did).
        completed = np.zeros(self.stream.count, dtype=bool)
        normalized = np.empty(self.stream.count, dtype=np.float64)
        for chunk in self.stream.chunks(("request_id", "status", "completion_s", "arrival_s", "output_tokens")):
            pos = self.stream.positions(chunk["request_id"])
            completed[pos] = chunk["status"] == "completed"
            normalized[pos] = (chunk["completion_s"] - chunk["arrival_s"]) / np.maximum(chunk["output_tokens"], 1)
        share: dict[str, float] = {}
        done_n: dict[str, int] = {}
        code_of = {name: i for i, name in enumerate(names)}
        present = sorted(names[int(i)] for i in np.unique(codes[measured]))
        for name in present:
            mask = measured & (codes == code_of[name])
            done = mask & completed
            share[name] = float(done.sum() / mask.sum())
            done_n[name] = int(done.sum())
        # Each tenant's mean over a copy of its values, in request-id order; the tenant with the
        # most last, over the array itself with the others squeezed out (no copy of its size).
        means: dict[str, float] = {}
        largest = max(present, key=done_n.__getitem__, default=None)
        for name in [*(n for n in present if n != largest), *([largest] if largest is not None else [])]:
            if done_n[name]:
                done = measured & (codes == code_of[name]) & completed
                means[name] = float((squeeze(normalized, done) if name == largest else normalized[done]).mean())
        inverse = {name: 1.0 / means[name] for name in present if name in means and means[name] > 0}
        return {
            "tenants": len(share),
            "completed_share": {"jain": jain_index(list(share.values())), "by_tenant": share},
            "inverse_normalized_e2e": {"jain": jain_index(list(inverse.values())), "by_tenant": inverse},
        }

    def column_difference(self, a: str, b: str) -> np.ndarray:
        """Column *a* less column *b* for every request, in request-id order, a chunk at a time."""
        out = np.empty(self.stream.count, dtype=np.float64)
        for chunk in self.stream.chunks(("request_id", a, b)):
            out[self.stream.positions(chunk["request_id"])] = chunk[a] - chunk[b]
        return out
