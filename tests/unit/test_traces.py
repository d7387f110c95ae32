"""Traces: the trace v2 format, its incremental writer, the importers, replay and errors.

Reads only the copies in ``data/azure_llm_2023`` and ``data/mooncake`` (see their
NOTICE.md); BurstGPT and generic CSV files are written by the tests. Expected
values are recomputed from the raw files with the standard library (``csv``,
``json``, ``datetime``), independently of the module under test. Nothing is timed.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import FieldValueError, ScenarioError
from simpy_llm.config.schema import TraceSource
from simpy_llm.workload.traces import (
    V2_COLUMNS,
    Trace,
    TraceV2Writer,
    load_trace,
    read_azure,
    read_burstgpt,
    read_csv_mapped,
    read_mooncake,
    read_trace_v2,
    trace_requests,
    trace_rows,
    trace_v2_paths,
    write_generated_trace,
    write_trace_v2,
)
from tests.helpers import tiny_scenario

DATA = Path(__file__).resolve().parents[2] / "data"
AZURE = DATA / "azure_llm_2023"
AZURE_FILES = [AZURE / "AzureLLMInferenceTrace_code.csv", AZURE / "AzureLLMInferenceTrace_conv.csv"]
MOONCAKE = DATA / "mooncake"
MOONCAKE_FILES = [MOONCAKE / "conversation_trace.jsonl", MOONCAKE / "synthetic_trace.jsonl"]
HEADER = "trace_version: 2\ntime_unit: microseconds\ncreated_at: '2026-02-16T14:30:00Z'\nmode: real\n"
V2_HEADER_LINE = ",".join(V2_COLUMNS)


# --------------------------------------------------------------------------- independent readers


def _azure_raw(path: Path) -> tuple[list[int], list[int], list[int]]:
    """(arrival us after the first row, context tokens, generated tokens) with csv/datetime."""
    epoch = datetime(1970, 1, 1)
    ticks, inputs, outputs = [], [], []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            whole, frac = row["TIMESTAMP"].split(".")
            seconds = (datetime.strptime(whole, "%Y-%m-%d %H:%M:%S") - epoch) // timedelta(seconds=1)
            ticks.append(seconds * 10**7 + int(frac.ljust(7, "0")))  # 100-ns ticks
            inputs.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    return [(t - ticks[0] + 5) // 10 for t in ticks], inputs, outputs


def _mooncake_raw(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _scaled(us: list[int], time_scale: float, rate_scale: float) -> list[int]:
    first = min(us)
    return [first + round((t - first) * time_scale / rate_scale) for t in us]


def _tricky_frame() -> pd.DataFrame:
    """Every column with values that stress the CSV text: commas, quotes, line breaks,
    NA-like strings, missing times, floats with long representations, extra columns."""
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 7],
            "client_id": ["a,b", 'q"uote', "", "ünï"],
            "tenant_id": ["t", "NA", "null", " padded "],
            "slo_class": ["realtime", "interactive", "batch", ""],
            "session_id": ["s1", "s1", "", "N/A"],
            "round_index": [0, 1, 0, 3],
            "prefix_group": ["g", "g", "", "nan"],
            "streaming": [True, False, True, False],
            "input_tokens": [512, 698, 0, 10**12],
            "output_tokens": [128, 64, 1, 0],
            "text_tokens": [512, 0, 0, 3],
            "image_tokens": [0, 576, 0, 0],
            "audio_tokens": [0, 0, 9, 0],
            "video_tokens": [0, 0, 0, 12],
            "reason_ratio": [0.0, 0.1 + 0.2, 1.0, 1e-300],
            "arrival_time_us": [0, 1590500, 1590500, 2**53 + 1],
            "send_time_us": pd.array([1708100000000000, None, 3, None], dtype="Int64"),
            "first_chunk_time_us": pd.array([1708100000045200, None, None, 0], dtype="Int64"),
            "last_chunk_time_us": pd.array([1708100001590300, None, None, None], dtype="Int64"),
            "num_chunks": pd.array([47, None, 0, None], dtype="Int64"),
            "status": ["ok", "error", "timeout", "ok"],
            "error_message": ["", "HTTP 500: boom,\nsecond line", 'said "no"', ""],
            "priority": [0, 5, -1, 2],
            "prefix_blocks": ["1 2 3", "", "4", ""],
            "note": ["x", "", "NaN", "True"],
        }
    )


# --------------------------------------------------------------------------- trace v2


def test_trace_v2_round_trip_is_exact(tmp_path: Path) -> None:
    """Writing a trace v2 and reading it back gives an equal header and frame
    (values, dtypes, column order), tricky strings and missing times included."""
    trace = Trace({"created_at": "2026-02-16T14:30:00Z", "mode": "real", "server": {"type": "vllm", "block_size": 16}}, _tricky_frame())
    write_trace_v2(trace, tmp_path / "run")
    back = read_trace_v2(tmp_path / "run.csv")
    pd.testing.assert_frame_equal(back.frame, trace.frame, check_exact=True)
    assert back.header == trace.header


def test_written_header_has_version_unit_created_at_and_mode(tmp_path: Path) -> None:
    """The YAML header starts with trace_version 2, time_unit microseconds, created_at and
    mode (generated unless given), then the extra keys."""
    header_path, _ = write_trace_v2(_tricky_frame(), tmp_path / "t", header={"warm_up_requests": 10})
    text = header_path.read_text().splitlines()
    assert text[0] == "trace_version: 2"
    assert text[1] == "time_unit: microseconds"
    assert text[2].startswith("created_at: ")
    assert text[3] == "mode: generated"
    assert read_trace_v2(header_path).header["warm_up_requests"] == 10


def test_file_pairing_stem_csv_yaml_and_directory(tmp_path: Path) -> None:
    """A trace v2 is <stem>.yaml + <stem>.csv; a path given as the CSV, the YAML, the stem
    or a directory (stem <directory>/trace) names the same pair."""
    assert trace_v2_paths(tmp_path / "a.csv") == (tmp_path / "a.yaml", tmp_path / "a.csv")
    assert trace_v2_paths(tmp_path / "a.yaml") == (tmp_path / "a.yaml", tmp_path / "a.csv")
    assert trace_v2_paths(tmp_path / "a") == (tmp_path / "a.yaml", tmp_path / "a.csv")
    assert trace_v2_paths(tmp_path) == (tmp_path / "trace.yaml", tmp_path / "trace.csv")
    assert write_trace_v2(_tricky_frame(), tmp_path) == (tmp_path / "trace.yaml", tmp_path / "trace.csv")
    frames = [read_trace_v2(p).frame for p in (tmp_path, tmp_path / "trace", tmp_path / "trace.csv", tmp_path / "trace.yaml")]
    for frame in frames[1:]:
        pd.testing.assert_frame_equal(frame, frames[0])


def test_explicit_header_path(tmp_path: Path) -> None:
    """read_trace_v2 takes the header from header_path when given (any name)."""
    (tmp_path / "meta.yaml").write_text(HEADER + "note: explicit\n")
    (tmp_path / "data.csv").write_text("arrival_time_us,input_tokens,output_tokens\n0,1,1\n")
    assert read_trace_v2(tmp_path / "data.csv", header_path=tmp_path / "meta.yaml").header["note"] == "explicit"


def test_missing_v2_columns_take_defaults(tmp_path: Path) -> None:
    """A CSV with only arrival_time_us, input_tokens and output_tokens reads with every
    v2 column: request ids 0.., empty strings, zeros, streaming true, status ok, <NA> times."""
    (tmp_path / "t.yaml").write_text(HEADER)
    (tmp_path / "t.csv").write_text("arrival_time_us,input_tokens,output_tokens\n0,10,2\n250,20,3\n")
    f = read_trace_v2(tmp_path / "t.csv").frame
    assert list(f.columns) == list(V2_COLUMNS)
    assert f.request_id.tolist() == [0, 1]
    assert f.client_id.tolist() == ["", ""] and f.error_message.tolist() == ["", ""]
    assert f.status.tolist() == ["ok", "ok"] and f.streaming.tolist() == [True, True]
    assert f.image_tokens.tolist() == [0, 0] and f.reason_ratio.tolist() == [0.0, 0.0]
    assert f.send_time_us.isna().all() and f.num_chunks.isna().all()
    assert f.arrival_time_us.dtype == np.int64 and str(f.send_time_us.dtype) == "Int64"


def test_reads_the_seed_example(tmp_path: Path) -> None:
    """The seed's §7 example rows read as written (its stray trailing comma on row 2 removed)."""
    (tmp_path / "t.yaml").write_text(HEADER)
    (tmp_path / "t.csv").write_text(
        "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,streaming,input_tokens,"
        "output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,arrival_time_us,send_time_us,"
        "first_chunk_time_us,last_chunk_time_us,num_chunks\n"
        "0,client_42,tenant_A,realtime,sess_7,0,group_X,true,512,128,512,0,0,0,0.0,0,1708100000000,1708100000045200,"
        "1708100001590300,47\n"
        "1,client_42,tenant_A,realtime,sess_7,1,group_X,true,698,64,698,0,0,0,0.0,1590500,,,,\n"
    )
    t = read_trace_v2(tmp_path / "t.csv")
    assert t.frame.round_index.tolist() == [0, 1]
    assert t.arrival_s().tolist() == [0.0, 1.5905]
    assert t.frame.num_chunks.tolist() == [47, pd.NA]
    assert t.frame.status.tolist() == ["ok", "ok"]


def test_unquoted_created_at_is_read_as_text(tmp_path: Path) -> None:
    """An unquoted created_at (a YAML timestamp) comes back as ISO 8601 text."""
    (tmp_path / "t.yaml").write_text("trace_version: 2\ntime_unit: microseconds\ncreated_at: 2026-02-16T14:30:00Z\n")
    (tmp_path / "t.csv").write_text("arrival_time_us,input_tokens,output_tokens\n0,1,1\n")
    assert read_trace_v2(tmp_path / "t").header["created_at"] == "2026-02-16T14:30:00Z"


def test_generated_workload_trace(tmp_path: Path) -> None:
    """write_generated_trace turns seconds into whole microseconds, keeps priority and
    records mode, spec and seed in the header."""
    frame = pd.DataFrame(
        {
            "request_id": [0, 1],
            "client_id": ["a", "b"],
            "input_tokens": [5, 6],
            "output_tokens": [1, 2],
            "priority": [0, 3],
            "arrival_time_s": [0.1234564, 2.5],
        }
    )
    _header_path, csv_path = write_generated_trace(frame, tmp_path / "trace", source="spec.yaml", seed=7)
    t = read_trace_v2(csv_path)
    assert t.frame.arrival_time_us.tolist() == [123456, 2500000]
    assert t.frame.priority.tolist() == [0, 3]
    assert (t.header["mode"], t.header["workload_spec"], t.header["seed"]) == ("generated", "spec.yaml", 7)


# --------------------------------------------------------------------------- incremental writer


def _row(i: int) -> dict[str, Any]:
    return {
        "client_id": f"c{i % 2}",
        "input_tokens": 100 + i,
        "output_tokens": 10 + i,
        "arrival_time_us": 1000 * i,
        "send_time_us": 5 + 1000 * i if i % 2 else None,
        "status": "ok" if i != 2 else "error",
        "error_message": "" if i != 2 else "HTTP 503, retry",
        "reason_ratio": i / 7,
    }


def test_incremental_writer_file_is_readable_before_close(tmp_path: Path) -> None:
    """Rows written by a TraceV2Writer that is never closed (a run cut short) are all in
    the file: reading it gives every row written so far."""
    writer = TraceV2Writer(tmp_path / "trace", {"created_at": "2026-02-16T14:30:00Z"})
    try:
        for i in range(3):
            writer.write_row(_row(i))
        partial = read_trace_v2(tmp_path / "trace.csv")
        assert partial.frame.input_tokens.tolist() == [100, 101, 102]
        assert partial.frame.error_message.tolist() == ["", "", "HTTP 503, retry"]
        assert partial.header["mode"] == "real"
        writer.write_row(_row(3))
        assert len(read_trace_v2(tmp_path / "trace.csv")) == 4
    finally:
        writer.close()  # only so the test leaves no open file behind


def test_incremental_writer_matches_whole_file_writer(tmp_path: Path) -> None:
    """The rows written one at a time (context manager) read back equal to the same rows
    written at once by write_trace_v2; request ids default to the row number."""
    rows = [_row(i) for i in range(5)]
    with TraceV2Writer(tmp_path / "inc", extra_columns=["priority"]) as w:
        for r in rows:
            w.write_row({**r, "priority": 1})
    write_trace_v2(pd.DataFrame(rows).assign(priority=1), tmp_path / "whole")
    inc, whole = read_trace_v2(tmp_path / "inc"), read_trace_v2(tmp_path / "whole")
    pd.testing.assert_frame_equal(inc.frame, whole.frame, check_exact=True)
    assert inc.frame.request_id.tolist() == [0, 1, 2, 3, 4]


def test_incremental_writer_rejects_unknown_columns(tmp_path: Path) -> None:
    """A row with a column that is neither v2 nor a declared extra raises ValueError."""
    with TraceV2Writer(tmp_path / "t") as w, pytest.raises(ValueError, match="bogus"):
        w.write_row({**_row(0), "bogus": 1})


def test_closed_writer_without_rows_leaves_an_empty_trace(tmp_path: Path) -> None:
    """Closing a writer that wrote nothing still leaves a readable, empty trace."""
    TraceV2Writer(tmp_path / "t").close()
    assert len(read_trace_v2(tmp_path / "t")) == 0


# --------------------------------------------------------------------------- Azure and Mooncake


@pytest.mark.parametrize("path", AZURE_FILES, ids=lambda p: p.name)
def test_azure_import_matches_raw_file(path: Path) -> None:
    """read_azure keeps every row in file order; arrivals are the microseconds since the
    first TIMESTAMP and token counts are ContextTokens / GeneratedTokens, exactly."""
    us, inputs, outputs = _azure_raw(path)
    t = read_azure(path)
    assert len(t) == len(us)
    assert t.frame.arrival_time_us.tolist() == us
    assert t.frame.input_tokens.tolist() == inputs
    assert t.frame.output_tokens.tolist() == outputs
    assert t.arrival_s().tolist() == [u / 1e6 for u in us]


@pytest.mark.parametrize("path", MOONCAKE_FILES, ids=lambda p: p.name)
def test_mooncake_import_matches_raw_file(path: Path) -> None:
    """read_mooncake keeps every line in order; arrivals are timestamp x 1000 us, token
    counts are input/output_length, hash_ids become space-separated prefix_blocks and
    prefix_group is the first hash id."""
    raw = _mooncake_raw(path)
    t = read_mooncake(path)
    assert len(t) == len(raw)
    assert t.frame.arrival_time_us.tolist() == [r["timestamp"] * 1000 for r in raw]
    assert t.frame.input_tokens.tolist() == [r["input_length"] for r in raw]
    assert t.frame.output_tokens.tolist() == [r["output_length"] for r in raw]
    assert t.frame.prefix_blocks.tolist() == [" ".join(map(str, r["hash_ids"])) for r in raw]
    assert t.frame.prefix_group.tolist() == [str(r["hash_ids"][0]) for r in raw]
    assert t.header["prefix_block_tokens"] == 512


@pytest.mark.parametrize("path", MOONCAKE_FILES, ids=lambda p: p.name)
def test_mooncake_requests_carry_prefix_blocks(path: Path) -> None:
    """trace_requests gives each Mooncake request its hash ids as a tuple of ints, in order."""
    raw = _mooncake_raw(path)
    reqs = list(trace_requests(read_mooncake(path)))
    assert [r.prefix_blocks for r in reqs] == [tuple(r["hash_ids"]) for r in raw]
    assert [r.arrival_s for r in reqs] == [r["timestamp"] / 1000 for r in raw]


@pytest.mark.parametrize(("fmt", "path"), [("azure", AZURE_FILES[1]), ("mooncake", MOONCAKE_FILES[0])], ids=["azure", "mooncake"])
@pytest.mark.parametrize(("time_scale", "rate_scale"), [(1.0, 1.0), (3.0, 1.0), (1.0, 4.0), (2.5, 0.7)])
def test_load_trace_scales_arrivals(fmt: str, path: Path, time_scale: float, rate_scale: float) -> None:
    """load_trace maps each arrival t to first + round((t - first) * time_scale / rate_scale) us,
    keeping count, order and token counts."""
    if fmt == "azure":
        us, inputs, outputs = _azure_raw(path)
    else:
        raw = _mooncake_raw(path)
        us, inputs, outputs = ([r[k] * (1000 if k == "timestamp" else 1) for r in raw] for k in ("timestamp", "input_length", "output_length"))
    t = load_trace(TraceSource(path=str(path), format=fmt, time_scale=time_scale, rate_scale=rate_scale))
    assert t.frame.arrival_time_us.tolist() == _scaled(us, time_scale, rate_scale)
    assert t.frame.input_tokens.tolist() == inputs
    assert t.frame.output_tokens.tolist() == outputs


def test_time_scale_and_rate_scale_are_inverses() -> None:
    """time_scale 2 and rate_scale 0.5 give the same arrivals; so do 4/2 and 2/1."""
    path = str(AZURE_FILES[0])

    def arrivals(ts: float, rs: float) -> list[int]:
        return load_trace(TraceSource(path=path, format="azure", time_scale=ts, rate_scale=rs)).frame.arrival_time_us.tolist()

    assert arrivals(2.0, 1.0) == arrivals(1.0, 0.5) == arrivals(4.0, 2.0)
    assert arrivals(2.0, 1.0) != arrivals(1.0, 1.0)


def test_max_requests_keeps_the_first_arrivals() -> None:
    """max_requests keeps the first N requests in arrival order, unchanged."""
    full = read_mooncake(MOONCAKE_FILES[1]).frame
    t = load_trace(TraceSource(path=str(MOONCAKE_FILES[1]), format="mooncake", max_requests=25))
    assert len(t) == 25
    assert t.frame.arrival_time_us.tolist() == full.arrival_time_us.tolist()[:25]
    assert t.frame.prefix_blocks.tolist() == full.prefix_blocks.tolist()[:25]


def test_max_requests_on_an_unsorted_trace_uses_arrival_order(tmp_path: Path) -> None:
    """On a trace v2 written out of arrival order, max_requests keeps the earliest arrivals
    (ties in file order)."""
    write_trace_v2(
        pd.DataFrame({"arrival_time_us": [30, 10, 20, 10], "input_tokens": [3, 1, 2, 4], "output_tokens": [1, 1, 1, 1]}),
        tmp_path,
    )
    t = load_trace(TraceSource(path=str(tmp_path / "trace.csv"), max_requests=3))
    assert t.frame.input_tokens.tolist() == [1, 4, 2]


def test_load_trace_fills_client_tenant_and_slo(tmp_path: Path) -> None:
    """Blank client ids take source.client_id (default: the file stem), blank tenants the
    client id, blank SLO classes source.slo_class; values in the file are kept."""
    write_trace_v2(
        pd.DataFrame(
            {
                "arrival_time_us": [0, 1],
                "input_tokens": [1, 1],
                "output_tokens": [1, 1],
                "client_id": ["", "mine"],
                "slo_class": ["", "batch"],
            }
        ),
        tmp_path / "recorded",
    )
    t = load_trace(TraceSource(path=str(tmp_path / "recorded.csv"), slo_class="interactive"))
    assert t.frame.client_id.tolist() == ["recorded", "mine"]
    assert t.frame.tenant_id.tolist() == ["recorded", "mine"]
    assert t.frame.slo_class.tolist() == ["interactive", "batch"]
    named = load_trace(TraceSource(path=str(tmp_path / "recorded.csv"), client_id="replay"))
    assert named.frame.client_id.tolist() == ["replay", "mine"]


def test_columns_only_with_csv_format() -> None:
    """A column mapping given for a format other than csv is refused when the source is made
    (in a scenario: a ScenarioError at the source's ``columns`` when it is loaded)."""
    with pytest.raises(FieldValueError) as info:
        TraceSource(path=str(AZURE_FILES[0]), format="azure", columns={"input_tokens": "x"})
    assert info.value.field == "columns"


# --------------------------------------------------------------------------- BurstGPT and generic CSV

BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118.5,GPT-4,417,276,693,API log\n"
)


def test_burstgpt_import(tmp_path: Path) -> None:
    """read_burstgpt: arrivals are Timestamp seconds in us, tokens are Request/Response
    tokens, Model and Log Type are kept, and 0-response rows are kept with status error."""
    path = tmp_path / "BurstGPT_sample.csv"
    path.write_text(BURSTGPT)
    f = read_burstgpt(path).frame
    assert f.arrival_time_us.tolist() == [5_000_000, 45_000_000, 118_500_000]
    assert f.input_tokens.tolist() == [472, 1087, 417]
    assert f.output_tokens.tolist() == [18, 0, 276]
    assert f.status.tolist() == ["ok", "error", "ok"]
    assert f.error_message.tolist()[1].startswith("failed request")
    assert f.model.tolist() == ["ChatGPT", "ChatGPT", "GPT-4"]
    assert f.log_type.tolist() == ["Conversation log", "Conversation log", "API log"]


def test_burstgpt_failures_replay_as_one_token(tmp_path: Path) -> None:
    """trace_rows replays every row, a BurstGPT failure (0 response tokens) as a 1-token
    response, with the source's client id and SLO class."""
    path = tmp_path / "BurstGPT_sample.csv"
    path.write_text(BURSTGPT)
    source = TraceSource(path=str(path), format="burstgpt", slo_class="batch")
    rows = list(trace_rows(load_trace(source), source))
    assert [(t, p, o) for t, p, o, _ in rows] == [(5.0, 472, 18), (45.0, 1087, 1), (118.5, 417, 276)]
    assert {(f["client_id"], f["tenant_id"], f["slo_class"]) for *_, f in rows} == {("BurstGPT_sample", "BurstGPT_sample", "batch")}


def test_csv_mapped_import(tmp_path: Path) -> None:
    """read_csv_mapped reads the mapped columns (seconds -> us, integral floats as tokens,
    identity fields) and defaults the rest."""
    path = tmp_path / "log.csv"
    path.write_text(
        "when,prompt,completion,user,stream,ignored\n"
        "0.000001,100,20.0,alice,false,x\n"
        "1.5,80,10,bob,true,y\n"
    )
    columns = {"arrival_time_s": "when", "input_tokens": "prompt", "output_tokens": "completion", "client_id": "user", "streaming": "stream"}
    f = read_csv_mapped(path, columns).frame
    assert f.arrival_time_us.tolist() == [1, 1_500_000]
    assert f.input_tokens.tolist() == [100, 80] and f.output_tokens.tolist() == [20, 10]
    assert f.client_id.tolist() == ["alice", "bob"] and f.streaming.tolist() == [False, True]
    assert "ignored" not in f.columns and f.status.tolist() == ["ok", "ok"]


def test_csv_mapped_milliseconds_and_datetimes(tmp_path: Path) -> None:
    """arrival_time_ms is scaled to us; arrival_datetime is made relative to the earliest."""
    path = tmp_path / "log.csv"
    path.write_text("ms,at,i,o\n2.5,2024-01-01T00:00:01.000002,1,1\n7,2024-01-01T00:00:00,1,1\n")
    ms = read_csv_mapped(path, {"arrival_time_ms": "ms", "input_tokens": "i", "output_tokens": "o"})
    assert ms.frame.arrival_time_us.tolist() == [2500, 7000]
    dt = read_csv_mapped(path, {"arrival_datetime": "at", "input_tokens": "i", "output_tokens": "o"})
    assert dt.frame.arrival_time_us.tolist() == [1_000_002, 0]
    assert dt.header["start_time"] == "2024-01-01T00:00:00"


def test_csv_without_mapping_uses_matching_names(tmp_path: Path) -> None:
    """With no column mapping, columns named like trace fields are read as those fields."""
    path = tmp_path / "plain.csv"
    path.write_text("arrival_time_s,input_tokens,output_tokens,tenant_id\n0.25,3,4,acme\n")
    source = TraceSource(path=str(path), format="csv")
    f = load_trace(source).frame
    assert (f.arrival_time_us.tolist(), f.tenant_id.tolist(), f.client_id.tolist()) == ([250000], ["acme"], ["plain"])


# --------------------------------------------------------------------------- replay


def test_trace_requests_in_arrival_order_with_all_fields() -> None:
    """trace_requests yields requests by arrival (ties in frame order) with every field the
    generator needs, arrival in seconds."""
    frame = _tricky_frame()
    frame["arrival_time_us"] = [30, 10, 20, 10]
    reqs = list(trace_requests(Trace({}, frame)))
    assert [r.request_id for r in reqs] == [1, 7, 2, 0]
    assert [r.arrival_s for r in reqs] == [1e-5, 1e-5, 2e-5, 3e-5]
    first = reqs[0]
    assert (first.client_id, first.tenant_id, first.session_id, first.round_index) == ('q"uote', "NA", "s1", 1)
    assert (first.streaming, first.image_tokens, first.reason_ratio, first.priority, first.status) == (False, 576, 0.1 + 0.2, 5, "error")
    assert reqs[3].prefix_blocks == (1, 2, 3) and reqs[0].prefix_blocks == ()


def test_trace_requests_in_chunks_equal_one_pass() -> None:
    """Converting a few rows at a time gives the same requests as one pass."""
    t = read_mooncake(MOONCAKE_FILES[1])
    assert list(trace_requests(t, chunk=7)) == list(trace_requests(t))


def test_simulation_replays_a_trace_at_its_times() -> None:
    """A scenario replaying Mooncake (rate_scale 4, 40 requests) creates one request per
    row, arriving at the scaled trace times, with the trace's lengths and the file stem
    as client."""
    path = MOONCAKE_FILES[1]
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": str(path), "format": "mooncake", "max_requests": 40, "rate_scale": 4.0}]}
    records = Simulation(scenario_from_dict(data)).run().to_dataframe().sort_values("request_id")
    raw = _mooncake_raw(path)[:40]
    expected_us = _scaled([r["timestamp"] * 1000 for r in raw], 1.0, 4.0)
    assert records.arrival_s.tolist() == pytest.approx([u / 1e6 for u in expected_us], abs=1e-9)
    assert records.prompt_tokens.tolist() == [r["input_length"] for r in raw]
    assert set(records.client_id) == {"synthetic_trace"}


# --------------------------------------------------------------------------- malformed input

V2_OK = "arrival_time_us,input_tokens,output_tokens,streaming,reason_ratio\n0,10,2,true,0.5\n"

#: (id, reader, files {name: text}, file passed, file named in the error, expected problem location)
MALFORMED: list[tuple[str, str, dict[str, str], str, str, str]] = [
    ("v2-missing-column", "v2", {"t.csv": "arrival_time_us,output_tokens\n0,1\n"}, "t.csv", "t.csv", "line 1"),
    ("v2-non-numeric-tokens", "v2", {"t.csv": V2_OK + "5,ten,2,true,0\n"}, "t.csv", "t.csv", "line 3, column input_tokens"),
    ("v2-negative-tokens", "v2", {"t.csv": V2_OK + "5,10,-2,true,0\n"}, "t.csv", "t.csv", "line 3, column output_tokens"),
    ("v2-bad-arrival", "v2", {"t.csv": V2_OK + "soon,10,2,true,0\n"}, "t.csv", "t.csv", "line 3, column arrival_time_us"),
    ("v2-missing-tokens", "v2", {"t.csv": V2_OK + "5,,2,true,0\n"}, "t.csv", "t.csv", "line 3, column input_tokens"),
    ("v2-bad-boolean", "v2", {"t.csv": V2_OK + "5,10,2,maybe,0\n"}, "t.csv", "t.csv", "line 3, column streaming"),
    ("v2-ratio-above-1", "v2", {"t.csv": V2_OK + "5,10,2,true,1.5\n"}, "t.csv", "t.csv", "line 3, column reason_ratio"),
    ("v2-extra-field", "v2", {"t.csv": V2_OK + "5,10,2,true,0,9\n"}, "t.csv", "t.csv", "line 3"),
    ("v2-extra-field-first-row", "v2", {"t.csv": "arrival_time_us,input_tokens,output_tokens\n0,10,2,7\n"}, "t.csv", "t.csv", "line 2"),
    ("v2-duplicate-column", "v2", {"t.csv": "arrival_time_us,input_tokens,output_tokens,input_tokens\n0,1,1,1\n"}, "t.csv", "t.csv", "line 1"),
    ("v2-truncated-last-row", "v2", {"t.csv": V2_OK + "7,12"}, "t.csv", "t.csv", "line 3, column output_tokens"),
    ("v2-empty-file", "v2", {"t.csv": ""}, "t.csv", "t.csv", "line 1"),
    ("v2-header-missing", "v2", {"t.csv": V2_OK, "t.yaml": None}, "t.csv", "t.yaml", ""),  # type: ignore[dict-item]
    ("v2-header-version", "v2", {"t.csv": V2_OK, "t.yaml": "time_unit: microseconds\ntrace_version: 1\n"},
     "t.csv", "t.yaml", "line 2, key trace_version"),
    ("v2-header-unit", "v2", {"t.csv": V2_OK, "t.yaml": "trace_version: 2\ntime_unit: ms\n"}, "t.csv", "t.yaml", "line 2, key time_unit"),
    ("v2-header-yaml", "v2", {"t.csv": V2_OK, "t.yaml": "trace_version: 2\nserver: [a, b\n"}, "t.csv", "t.yaml", "line 3"),
    ("v2-header-not-mapping", "v2", {"t.csv": V2_OK, "t.yaml": "- 2\n"}, "t.csv", "t.yaml", "line 1"),
    ("azure-bad-timestamp", "azure", {"a.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\nyesterday,3,4\n"},
     "a.csv", "a.csv", "line 3, column TIMESTAMP"),
    ("azure-non-numeric", "azure", {"a.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\n2023-11-16 18:15:47,x,4\n"},
     "a.csv", "a.csv", "line 3, column ContextTokens"),
    ("azure-negative", "azure", {"a.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,-2\n"},
     "a.csv", "a.csv", "line 2, column GeneratedTokens"),
    ("azure-missing-column", "azure", {"a.csv": "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,1\n"}, "a.csv", "a.csv", "line 1"),
    ("mooncake-bad-json", "mooncake", {"m.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 3, "input_length": \n'},
     "m.jsonl", "m.jsonl", "line 2"),
    ("mooncake-not-object", "mooncake", {"m.jsonl": "[1, 2]\n"}, "m.jsonl", "m.jsonl", "line 1"),
    ("mooncake-missing-key", "mooncake",
     {"m.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n{"timestamp": 3, "input_length": 5}\n'},
     "m.jsonl", "m.jsonl", "line 3"),
    ("mooncake-negative", "mooncake", {"m.jsonl": '{"timestamp": 0, "input_length": -5, "output_length": 1}\n'},
     "m.jsonl", "m.jsonl", "line 1, key input_length"),
    ("mooncake-float-tokens", "mooncake", {"m.jsonl": '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n'},
     "m.jsonl", "m.jsonl", "line 1, key input_length"),
    ("mooncake-bad-timestamp", "mooncake", {"m.jsonl": '{"timestamp": "noon", "input_length": 5, "output_length": 1}\n'},
     "m.jsonl", "m.jsonl", "line 1, key timestamp"),
    ("mooncake-bad-hash-ids", "mooncake", {"m.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}\n'},
     "m.jsonl", "m.jsonl", "line 1, key hash_ids"),
    ("burstgpt-bad-timestamp", "burstgpt", {"b.csv": BURSTGPT + "later,ChatGPT,1,1,2,API log\n"}, "b.csv", "b.csv", "line 5, column Timestamp"),
    ("burstgpt-negative", "burstgpt", {"b.csv": BURSTGPT + "200,ChatGPT,-1,1,0,API log\n"}, "b.csv", "b.csv", "line 5, column Request tokens"),
    ("burstgpt-missing-column", "burstgpt", {"b.csv": "Timestamp,Model,Request tokens\n5,ChatGPT,10\n"}, "b.csv", "b.csv", "line 1"),
    ("csv-absent-column", "csv", {"c.csv": "t,i\n0,1\n"}, "c.csv", "c.csv", "line 1"),
    ("csv-non-numeric", "csv", {"c.csv": "t,i,o\n0,1,1\n1,2,two\n"}, "c.csv", "c.csv", "line 3, column o"),
    ("csv-fractional-tokens", "csv", {"c.csv": "t,i,o\n0,1.5,1\n"}, "c.csv", "c.csv", "line 2, column i"),
    ("csv-negative-time", "csv", {"c.csv": "t,i,o\n-1,1,1\n"}, "c.csv", "c.csv", "line 2, column t"),
]
_READERS = {
    "v2": read_trace_v2,
    "azure": read_azure,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "csv": lambda p: read_csv_mapped(p, {"arrival_time_s": "t", "input_tokens": "i", "output_tokens": "o"}),
}


@pytest.mark.parametrize(("reader", "files", "given", "named", "where"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_input_names_file_and_line(tmp_path: Path, reader: str, files: dict[str, str | None], given: str, named: str, where: str) -> None:
    """Each malformed file raises ScenarioError whose source is the file at fault and whose
    problems name the line (and column or key) — nothing is loaded from it."""
    if reader == "v2" and "t.yaml" not in files:
        files = {**files, "t.yaml": HEADER}
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    with pytest.raises(ScenarioError) as info:
        _READERS[reader](tmp_path / given)
    assert info.value.source == str(tmp_path / named)
    assert info.value.problems
    assert any(p == where or p.startswith(f"{where},") for p in info.value.paths)
    assert str(tmp_path / named) in str(info.value)


def test_csv_mapping_to_unknown_field_names_the_file(tmp_path: Path) -> None:
    """Mapping a column to a field that does not exist is a ScenarioError on the file,
    at columns.<field>."""
    path = tmp_path / "c.csv"
    path.write_text("t,i,o\n0,1,1\n")
    with pytest.raises(ScenarioError) as info:
        read_csv_mapped(path, {"arrival_time_s": "t", "input_tokens": "i", "output_tokens": "o", "bogus": "t"})
    assert info.value.source == str(path) and info.value.paths == ["columns.bogus"]


def test_every_bad_row_is_reported(tmp_path: Path) -> None:
    """Problems on several lines are all listed, each with its own line."""
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n2023-11-16 18:15:47,2,2\n2023-11-16 18:15:48,-3,1\n")
    with pytest.raises(ScenarioError) as info:
        read_azure(path)
    assert info.value.paths == ["line 2, column ContextTokens", "line 4, column ContextTokens"]


def test_many_problems_are_capped(tmp_path: Path) -> None:
    """A file with thousands of bad rows lists the first 20 and counts the rest."""
    path = tmp_path / "m.jsonl"
    path.write_text("not json\n" * 1000)
    with pytest.raises(ScenarioError) as info:
        read_mooncake(path)
    assert len(info.value.problems) == 21
    assert info.value.problems[0][0] == "line 1" and info.value.problems[-1][1] == "and 980 more problem(s) not listed"


def test_missing_file_names_it(tmp_path: Path) -> None:
    """A trace file that does not exist raises ScenarioError naming it."""
    for reader, name in ((read_azure, "none.csv"), (read_mooncake, "none.jsonl")):
        with pytest.raises(ScenarioError) as info:
            reader(tmp_path / name)
        assert info.value.source == str(tmp_path / name)


def test_replay_from_send_times_skips_unsent_rows(tmp_path: Path) -> None:
    """``arrival_column: send_time_us`` replays an observed trace at its send times, leaving out rows never sent."""
    frame = {
        "arrival_time_us": [0, 1_000, 2_000, 3_000],
        "send_time_us": [5, 1_700, None, 3_020],
        "input_tokens": [10, 11, 12, 13],
        "output_tokens": [4, 4, 4, 4],
        "status": ["ok", "ok", "cancelled", "error"],
    }
    path = write_trace_v2(Trace({}, frame), tmp_path / "observed")[1]
    t = load_trace(TraceSource(path=str(path), arrival_column="send_time_us"))
    assert t.frame.arrival_time_us.tolist() == [5, 1_700, 3_020]
    assert t.frame.input_tokens.tolist() == [10, 11, 13]
    assert t.header["replay"]["arrival_column"] == "send_time_us"


def test_send_time_replay_needs_trace_v2(tmp_path: Path) -> None:
    """Asking for send times from a format without them is refused naming the key, when the
    source is made."""
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n")
    with pytest.raises(FieldValueError, match="arrival_column"):
        TraceSource(path=str(path), format="azure", arrival_column="send_time_us")


def _small_v2(tmp_path: Path, output_tokens: int) -> Path:
    frame = pd.DataFrame({"request_id": [0, 1, 2], "arrival_time_us": [0, 1_000, 2_000], "input_tokens": [10, 20, 30],
                          "output_tokens": [output_tokens] * 3})
    write_trace_v2(Trace({}, frame), tmp_path / "t")
    return tmp_path / "t.csv"


def test_load_trace_parses_an_unchanged_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the same source again while its files are unchanged copies the kept trace
    (equal to the first, not parsed again); each load is a trace of its own to change."""
    path = _small_v2(tmp_path, 5)
    source = TraceSource(path=str(path), format="trace_v2")
    first = load_trace(source)
    first.frame.loc[0, "input_tokens"] = 999
    first.header["mine"] = True
    monkeypatch.setattr("simpy_llm.workload.traces.loading.read_trace_v2", lambda _p: pytest.fail("parsed again"))
    second = load_trace(source)
    assert second.frame["input_tokens"].tolist() == [10, 20, 30] and "mine" not in second.header
    assert second.equals(load_trace(source))


def test_load_trace_reads_a_changed_file_again(tmp_path: Path) -> None:
    """A file rewritten with other contents (even of the same size, at once) is parsed
    again; a different source of the same file is loaded by its own options."""
    path = _small_v2(tmp_path, 5)
    source = TraceSource(path=str(path), format="trace_v2")
    assert load_trace(source).frame["output_tokens"].tolist() == [5, 5, 5]
    _small_v2(tmp_path, 7)
    assert load_trace(source).frame["output_tokens"].tolist() == [7, 7, 7]
    assert len(load_trace(TraceSource(path=str(path), format="trace_v2", max_requests=2))) == 2


def test_load_trace_keeps_none_when_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``LOADED_TRACES_KEPT = 0`` every load parses the file."""
    monkeypatch.setattr("simpy_llm.workload.traces.loading.LOADED_TRACES_KEPT", 0)
    source = TraceSource(path=str(_small_v2(tmp_path, 5)), format="trace_v2")
    load_trace(source)
    monkeypatch.setattr("simpy_llm.workload.traces.loading.read_trace_v2", lambda _p: pytest.fail("parsed again"))
    with pytest.raises(pytest.fail.Exception, match="parsed again"):
        load_trace(source)
