"""What a run keeps per record: a column that holds one value is kept as that value (in the
recorder and in the Results), to the bit, and the summary of a streamed run reads no record
column whole into memory."""

from __future__ import annotations

import json
import math
import struct
from array import array
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import Request, Simulation, load_scenario
from simpy_llm.metrics import recorder as recorder_module
from simpy_llm.metrics import stats as stats_module
from simpy_llm.metrics import stream as stream_module
from simpy_llm.metrics.monitors import WeightedTally
from simpy_llm.metrics.record import RECORD_FIELDS
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.metrics.requests import RequestResults
from simpy_llm.metrics.results import Results
from simpy_llm.metrics.stats import counted_stats, weighted_quantiles

_FLUSHES = 5_000
"""More records than the recorder buffers before it fills its columns (4,096), so a column
is first kept as one value, then sees another."""


def _record(rec: Recorder, i: int, **attrs: object) -> None:
    req = Request(id=i, client_id="c", prompt_tokens=4, output_tokens=2, arrival_s=float(i))
    for name, value in attrs.items():
        setattr(req, name, value)
    rec.on_arrival(req, req.arrival_s)
    rec.on_complete(req)


def test_a_column_of_one_value_is_kept_as_that_value_and_written_out_when_another_comes() -> None:
    """After 4,096 records with ``upload_s`` 0.0 the recorder keeps that column as one value;
    a later -0.0 (equal to 0.0, not the same bits) makes it an array holding every record's
    value to the bit; a column that never changes stays one value."""
    rec = Recorder()
    for i in range(_FLUSHES):
        _record(rec, i, upload_s=0.0 if i < 4_500 else -0.0)
    assert rec.rows == _FLUSHES
    assert rec.single_value("upload_s") is None
    upload = np.frombuffer(rec.columns["upload_s"], dtype=np.float64)
    assert upload.size == _FLUSHES
    assert not np.signbit(upload[:4_500]).any() and np.signbit(upload[4_500:]).all()
    assert rec.single_value("download_s") == np.float64(0.0).tobytes()
    assert rec.single_value("request_id") is None


def test_results_hold_a_column_of_one_value_as_a_read_only_view_of_it() -> None:
    """``Results.from_recorder`` gives a one-value column as a read-only view of that value
    (no memory per record), strings decoded, every other column as an array in request-id
    order; NaN keeps its bits."""
    rec = Recorder()
    for i in reversed(range(_FLUSHES)):
        _record(rec, i, tenant_id="t", kv_transfer_s=math.nan)
    scenario = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=10"])
    results = Results.from_recorder(rec, scenario=scenario, end_s=1.0, wall_s=0.0, events=0, steps=0, kv_blocks=[1])
    tenant = results.columns["tenant_id"]
    assert tenant.shape == (_FLUSHES,) and not tenant.flags.writeable and tenant.strides == (0,)
    assert set(tenant.tolist()) == {"t"}
    kv = results.columns["kv_transfer_s"]
    assert kv.strides == (0,) and kv[:1].tobytes() == np.float64(math.nan).tobytes()
    assert results.columns["request_id"].tolist() == list(range(_FLUSHES))
    assert results.columns["arrival_s"].flags.writeable


def test_a_run_keeps_as_one_value_the_columns_its_records_share() -> None:
    """The quickstart's records share most columns (no speculation, network, sessions...):
    those are views of one value, and the frame built from them is the same as from arrays."""
    results = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=300"])).run(progress=False)
    views = {name for name, _ in RECORD_FIELDS if results.columns[name].strides == (0,)}
    assert {"spec_rounds", "draft_group", "upload_s", "image_tokens"} <= views
    assert "request_id" not in views and "arrival_s" not in views
    as_arrays = {name: np.array(values) for name, values in results.columns.items()}
    in_arrays = RequestResults(as_arrays, scenario=results.scenario, end_s=results.end_s, replica_groups=results.replica_groups)
    assert results.to_dataframe().to_csv() == in_arrays.to_dataframe().to_csv()

def test_the_summary_of_a_streamed_run_reads_no_record_column_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure of a streamed run's summary is taken chunk by chunk (or over one number per
    request): no record column is read back whole, except as a view of the one value it
    holds; and the summary is still the in-memory run's."""
    scenario = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=600"])
    sim = Simulation(scenario, stream_to=tmp_path, stream_chunk_requests=128)
    assert sim.record_stream is not None
    sim.record_stream.format = "csv"
    streamed = sim.run(progress=False)
    whole: list[str] = []
    column = stream_module.StreamedRecords.column

    def watched(self: stream_module.StreamedRecords, name: str) -> np.ndarray:
        values = column(self, name)
        if values.strides != (0,):
            whole.append(name)
        return values

    monkeypatch.setattr(stream_module.StreamedRecords, "column", watched)
    summary = json.dumps(streamed.summary(), default=str)
    assert whole == []
    assert summary == json.dumps(Simulation(scenario).run(progress=False).summary(), default=str)


@pytest.mark.parametrize("seed", range(12))
def test_weighted_quantiles_from_one_sort_equal_the_tallys_own_to_the_bit(seed: int) -> None:
    """Every quantile taken from one sort, with the cumulative weights summed block by block,
    is the tally's own ``quantile`` (ties, zeros of both signs, more values than a block)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200_000 if seed < 2 else 500))
    tally = WeightedTally()
    values = np.round(rng.exponential(1.0, n), int(rng.integers(0, 3)))
    values[rng.random(n) < 0.05] = -0.0
    for value, weight in zip(values.tolist(), rng.integers(1, 50, n).tolist(), strict=True):
        tally.add(value, weight)
    qs = (0.0, 0.5, 0.9, 0.95, 0.99, 1.0)
    got = weighted_quantiles(*tally.arrays(), qs)
    assert [np.float64(v).tobytes() for v in got] == [np.float64(tally.quantile(q)).tobytes() for q in qs]


def test_a_streamed_run_whose_request_ids_have_gaps_places_each_record_by_its_id(tmp_path: Path) -> None:
    """Request ids that are not 0 to n - 1 (here: every record's id doubled in the chunks) are
    still placed in request-id order: the columns read back are the chunks' sorted by id."""
    scenario = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])
    sim = Simulation(scenario, stream_to=tmp_path, stream_chunk_requests=16)
    assert sim.record_stream is not None
    sim.record_stream.format = "csv"
    records = sim.run(progress=False).streamed_records
    assert records is not None
    for path in records.files:
        frame = pd.read_csv(path)
        frame["request_id"] *= 2
        frame.to_csv(path, index=False)
    reread = stream_module.StreamedRecords(records.directory, records.files, "csv", records.count)
    assert reread.sorted_ids().tolist() == list(range(0, 100, 2))
    assert reread.column("arrival_s").tolist() == pd.concat(pd.read_csv(f) for f in records.files).sort_values("request_id")["arrival_s"].tolist()


@pytest.mark.parametrize("seed", range(8))
def test_statistics_of_an_array_given_to_overwrite_are_those_of_a_copy_to_the_bit(seed: int) -> None:
    """``counted_stats(values, own=True)``, which squeezes the NaNs out of *values* in place
    (more values than a block of the squeeze) and lets the percentiles reorder them, gives
    the figures of ``counted_stats(values)`` to the bit."""
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0.0, 1.0, int(rng.integers(1, 200_000)))
    values[rng.random(values.size) < [0.0, 0.3, 1.0][seed % 3]] = np.nan
    expected = counted_stats(values)
    got = counted_stats(values.copy(), own=True)
    assert json.dumps(got) == json.dumps(expected)


@pytest.mark.parametrize("block", [1, 2, 3, 5, 64, 1 << 16])
@pytest.mark.parametrize("seed", range(6))
def test_moving_a_group_to_the_front_keeps_its_order_and_every_value(monkeypatch: pytest.MonkeyPatch, block: int, seed: int) -> None:
    """``move_to_front`` leaves the group's values first, in their order, and every value of
    the array somewhere (the rest in some order), a block of any size at a time; ``squeeze``
    leaves the kept values first, in their order."""
    monkeypatch.setattr(stats_module, "_SQUEEZE_BLOCK", block)
    rng = np.random.default_rng(seed)
    values = rng.normal(size=int(rng.integers(0, 300)))
    front = rng.random(values.size) < [0.0, 0.1, 0.5, 0.9, 1.0, 0.3][seed]
    moved = values.copy()
    k = stats_module.move_to_front(moved, front)
    assert moved[:k].tobytes() == values[front].tobytes()
    assert np.sort(moved).tobytes() == np.sort(values).tobytes()
    squeezed = values.copy()
    assert stats_module.squeeze(squeezed, front).tobytes() == values[front].tobytes()


_NAN_PAYLOAD = struct.unpack("d", struct.pack("Q", 0x7FF8_0000_0000_0001))[0]
_FLOATS = (0.0, -0.0, math.nan, _NAN_PAYLOAD, 1.5, 1, 2.0)
"""Float column values whose bits equality alone does not tell: zeros of both signs, NaNs of
two payloads (each object unequal to itself), an int equal to a float."""
_COLUMNS = {
    "upload_s": ("f", _FLOATS),
    "tvt_s": ("f", _FLOATS),
    "tenant_id": ("s", ("a", "b", "")),
    "priority": ("i", (0, 1, True, -3)),
    "streaming": ("i", (True, False, 1)),  # read through int
    "preemption_times_s": ("i", (None, [1.0], [2.0], [1.0, 2.0])),  # read as a count
}


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 6)), min_size=1, max_size=12))
def test_every_column_holds_each_records_value_to_the_bit_whatever_runs_of_one_value_it_has(
    blocks: list[tuple[int, int]],
) -> None:
    """Records whose columns hold runs of one value (of every float kind, NaN payloads and
    signed zeros included) across buffer flushes of 8 records: each column, kept as one value
    or written out, gives every record's value as ``array.fromlist`` converts it, to the bit;
    string columns decode to the values recorded."""
    rec = Recorder()
    expected: dict[str, list[object]] = {name: [] for name in _COLUMNS}
    i = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recorder_module, "_FLUSH_EVERY", 8)  # columns filled every 8 records
        for length, pick in blocks:
            for _ in range(length):
                # The odd-numbered columns step through their pool record by record; the others hold the block's value.
                values = {name: pool[(pick + i * (k % 2)) % len(pool)] for k, (name, (_kind, pool)) in enumerate(_COLUMNS.items())}
                for name, value in values.items():
                    expected[name].append(value)
                _record(rec, i, **values)
                i += 1
        assert rec.rows == i
    codes = rec.codes["tenant_id"].names
    assert [codes[c] for c in rec.column_array("tenant_id")] == expected["tenant_id"]
    for name in ("upload_s", "tvt_s"):
        assert rec.column_array(name).tobytes() == array("d", expected[name]).tobytes()
    assert rec.column_array("priority").tobytes() == array("q", expected["priority"]).tobytes()
    assert rec.column_array("streaming").tolist() == [int(v) for v in expected["streaming"]]
    counts = [0 if v is None else len(v) for v in expected["preemption_times_s"]]
    assert rec.column_array("num_preemptions").tolist() == counts

