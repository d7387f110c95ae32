"""Streamed records (``Simulation(..., stream_to=DIR)``, ``simpy-llm run --stream-records``):
the chunks hold the in-memory run's records, no more and no less, and the summary is the same."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpy_llm import Simulation, load_scenario
from simpy_llm.cli import main
from simpy_llm.config.schema import Scenario
from simpy_llm.metrics.results import Results
from simpy_llm.metrics.stream import stream_format

QUICKSTART = "scenarios/quickstart.yaml"


def _scenario(requests: int, *more: str) -> Scenario:
    return load_scenario(QUICKSTART, [f"workload.num_requests={requests}", *more])


def _streamed(scenario: Scenario, directory: Path, chunk: int, fmt: str) -> Results:
    sim = Simulation(scenario, stream_to=directory, stream_chunk_requests=chunk)
    assert sim.record_stream is not None
    sim.record_stream.format = fmt  # the test chooses; by default the extra decides (stream_format)
    return sim.run(progress=False)


def _summary_json(results: Results) -> str:
    return json.dumps(results.summary(), default=str)


needs_pyarrow = pytest.mark.skipif(stream_format() != "parquet", reason="Parquet chunks need pyarrow (the parquet extra)")


@needs_pyarrow
def test_parquet_chunks_sorted_by_request_id_are_the_in_memory_frame(tmp_path: Path) -> None:
    """The Parquet chunk files, read as they are, put together and sorted by request id, equal
    ``to_dataframe()`` of the in-memory run (values, dtypes and the CSV text of both)."""
    scenario = _scenario(250)
    _streamed(scenario, tmp_path, 64, "parquet")
    chunks = pd.concat([pd.read_parquet(f) for f in sorted(tmp_path.glob("records-*.parquet"))], ignore_index=True)
    streamed = chunks.sort_values("request_id", kind="stable").reset_index(drop=True)
    memory = Simulation(scenario).run(progress=False).to_dataframe()
    pd.testing.assert_frame_equal(streamed, memory, check_exact=True)
    assert streamed.to_csv(index=False) == memory.to_csv(index=False)


def test_csv_chunk_lines_sorted_by_request_id_are_the_in_memory_csv(tmp_path: Path) -> None:
    """The CSV chunks' rows, sorted by request id (their first field), are byte for byte the rows
    of the in-memory run's ``to_dataframe().to_csv()``, under the same header."""
    scenario = _scenario(250)
    _streamed(scenario, tmp_path, 64, "csv")
    header, rows = None, []
    for path in sorted(tmp_path.glob("records-*.csv")):
        first, *lines = path.read_text().splitlines()
        assert header in (None, first)
        header = first
        rows.extend(lines)
    rows.sort(key=lambda line: int(line.split(",", 1)[0]))
    memory = Simulation(scenario).run(progress=False).to_dataframe().to_csv(index=False).splitlines()
    assert [header, *rows] == memory


@pytest.mark.parametrize("fmt", ["csv", pytest.param("parquet", marks=needs_pyarrow)])
def test_streamed_frame_and_summary_equal_the_in_memory_run(tmp_path: Path, fmt: str) -> None:
    """A streamed run's ``to_dataframe()`` and ``summary()`` (means and percentiles included,
    compared as JSON) equal those of the same run in memory."""
    scenario = _scenario(400)
    streamed = _streamed(scenario, tmp_path, 100, fmt)
    memory = Simulation(scenario).run(progress=False)
    assert streamed.to_dataframe().equals(memory.to_dataframe())
    assert _summary_json(streamed) == _summary_json(memory)


def test_streamed_summary_of_a_disaggregated_fleet_with_clusters_and_network_equals_in_memory(tmp_path: Path) -> None:
    """The summary's sections that only some fleets have (client latency over a network, KV
    transfers, per-group figures) are the same streamed as in memory."""
    scenario = load_scenario("scenarios/disaggregated.yaml", ["workload.num_requests=600"])
    streamed = _streamed(scenario, tmp_path, 128, "csv")
    assert _summary_json(streamed) == _summary_json(Simulation(scenario).run(progress=False))


def test_chunks_hold_the_chunk_size_and_the_last_the_rest(tmp_path: Path) -> None:
    """250 records in chunks of 64 make files of 64, 64, 64 and 58 records, and the Results
    count all 250."""
    results = _streamed(_scenario(250), tmp_path, 64, "csv")
    assert results.streamed_records is not None
    sizes = [len(pd.read_csv(f)) for f in results.streamed_records.files]
    assert sizes == [64, 64, 64, 58]
    assert len(results) == 250 == results.streamed_records.count


def test_a_run_without_records_writes_no_chunk_and_summarises_as_in_memory(tmp_path: Path) -> None:
    """A run stopped before any request arrives writes no chunk; its frame (empty) and summary
    equal the in-memory run's."""
    scenario = _scenario(50, "simulation.until_s=0.0001")
    streamed = _streamed(scenario, tmp_path, 16, "csv")
    memory = Simulation(scenario).run(progress=False)
    assert list(tmp_path.iterdir()) == []
    assert streamed.to_dataframe().equals(memory.to_dataframe())
    assert _summary_json(streamed) == _summary_json(memory)


_RUN_100 = _scenario(100)
_IDS_100 = Simulation(_RUN_100).run(progress=False).columns["request_id"].tolist()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.integers(min_value=1, max_value=130))
def test_streaming_loses_and_duplicates_no_record(chunk: int) -> None:
    """Whatever the chunk size, every record of the run is in exactly one chunk, each chunk
    but the last holds the chunk size, and the last holds the rest (at least one)."""
    with tempfile.TemporaryDirectory() as d:
        results = _streamed(_RUN_100, Path(d), chunk, "csv")
        assert results.streamed_records is not None
        per_chunk = [pd.read_csv(f, usecols=["request_id"])["request_id"].tolist() for f in results.streamed_records.files]
    ids = [i for part in per_chunk for i in part]
    assert sorted(ids) == _IDS_100
    assert len(ids) == len(set(ids))
    assert all(len(part) == chunk for part in per_chunk[:-1])
    assert 1 <= len(per_chunk[-1]) <= chunk


def test_streamed_results_say_where_their_records_are(tmp_path: Path) -> None:
    """The Results of a streamed run hold no record column in memory, say in their repr that
    the records are streamed and where, and read a column from the chunks when asked for it."""
    results = _streamed(_scenario(40), tmp_path, 16, "csv")
    text = repr(results)
    assert "records streamed, not in memory: 40 in 3 csv chunks" in text and str(tmp_path) in text
    assert dict(results.columns) == {}
    assert np.array_equal(results.columns["request_id"], np.arange(40))


def test_save_of_a_streamed_run_lists_the_chunks_instead_of_writing_records(tmp_path: Path) -> None:
    """``save()`` of a streamed run writes no records file and lists the chunks in the manifest."""
    results = _streamed(_scenario(40), tmp_path / "chunks", 16, "csv")
    out = results.save(tmp_path / "out")
    assert not (out / "records.csv").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["streamed_records"] == [str(tmp_path / "chunks" / f"records-0000{i}.csv") for i in range(3)]


def test_a_directory_with_chunks_already_is_refused(tmp_path: Path) -> None:
    """Streaming into a directory that holds a previous run's chunks raises, naming the directory."""
    (tmp_path / "records-00000.csv").write_text("request_id\n")
    with pytest.raises(ValueError, match="already holds streamed records"):
        Simulation(_scenario(10), stream_to=tmp_path)


def test_cli_run_streams_records_in_chunks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``simpy-llm run --stream-records DIR --stream-chunk N`` writes ceil(requests / N) chunks and
    prints the summary as usual."""
    code = main(["run", QUICKSTART, "--set", "workload.num_requests=50", "--progress", "off",
                 "--stream-records", str(tmp_path), "--stream-chunk", "20"])
    assert code == 0
    assert len(list(tmp_path.glob("records-*"))) == 3
    assert "simulated 50 requests" in capsys.readouterr().out


def test_streamed_summary_counts_preempted_requests_as_in_memory(tmp_path: Path) -> None:
    """The requests preempted, counted as the chunks are written, are the in-memory summary's
    (the run does preempt; the device figures' completed tokens, counted the same way, are
    compared in the disaggregated fleet's test)."""
    scenario = load_scenario(QUICKSTART, ["workload.num_requests=400", "serving.engine.kv_num_blocks=300"])
    streamed = _streamed(scenario, tmp_path, 64, "csv")
    memory = Simulation(scenario).run(progress=False)
    assert memory.summary()["preemptions"]["requests_preempted"] > 0
    assert _summary_json(streamed) == _summary_json(memory)


def test_streamed_summary_of_more_tenants_than_a_byte_codes_equals_in_memory(tmp_path: Path) -> None:
    """With 200 tenants (more names than a byte's codes hold) the per-tenant latency and
    fairness of a streamed run are the in-memory ones."""
    clients = [{"id": f"c{i}", "tenant_id": f"t{i}", "slo_class": "interactive", "rate_fraction": 1 / 200, "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 50 + i}},
                "output_distribution": {"type": "constant", "params": {"value": 5 + i % 7}}} for i in range(200)]
    scenario = load_scenario(QUICKSTART, {"workload.num_requests": 1500, "workload.clients": clients})
    streamed = _streamed(scenario, tmp_path, 256, "csv")
    memory = Simulation(scenario).run(progress=False)
    assert len(memory.summary()["latency_s_by_tenant"]) > 127
    assert _summary_json(streamed) == _summary_json(memory)
