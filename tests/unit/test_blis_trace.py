"""The trace of the side-by-side with BLIS (benchmarks/blis_trace.py) and the scenario that
replays it (scenarios/blis_linear.yaml)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.blis_trace import (
    MAX_MODEL_LEN,
    VOCAB,
    blis_arrival_text,
    main,
    read_blis_csv,
    requests_frame,
    write_blis_csv,
    write_trace,
)
from simpy_llm import Results, Simulation, load_scenario
from simpy_llm.entities import Request
from simpy_llm.metrics.record import TRACE_COLUMNS
from simpy_llm.serving.latency import BlisLinearLatency
from simpy_llm.workload.traces import Trace, read_trace_v2, trace_requests, trace_rows
from simpy_llm.workload.traces.replay import _PASSED_ON

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "blis_linear.yaml"
SMALL = REPO / "data" / "blis_linear"
COLUMNS = ["arrival_time_us", "input_tokens", "output_tokens"]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_generator_is_deterministic(tmp_path: Path) -> None:
    """The same arguments write byte-identical files, in both formats; another seed does not."""
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        assert main(["--out", str(tmp_path / name), "--requests", "300", "--seed", str(seed), "--blis"]) == 0
    a, b, c = (_files(tmp_path / name) for name in "abc")
    assert sorted(a) == ["blis_trace.csv", "trace.csv", "trace.yaml"]
    assert a == b
    assert a["trace.csv"] != c["trace.csv"] and a["blis_trace.csv"] != c["blis_trace.csv"]


def test_committed_trace_is_the_generators() -> None:
    """data/blis_linear is what the generator writes for 2,000 requests at seed 42, byte for byte."""
    frame = requests_frame(2000, seed=42)
    assert read_trace_v2(SMALL / "trace.csv").frame[COLUMNS].equals(frame)


def test_committed_trace_bytes(tmp_path: Path) -> None:
    """Writing the 2,000-request trace again gives the committed header and rows exactly."""
    write_trace(requests_frame(2000, seed=42), tmp_path / "trace", seed=42, rate=20.0)
    assert (tmp_path / "trace.csv").read_bytes() == (SMALL / "trace.csv").read_bytes()
    assert (tmp_path / "trace.yaml").read_bytes() == (SMALL / "trace.yaml").read_bytes()


def test_longer_trace_starts_with_the_shorter() -> None:
    """The first k requests of an n-request trace are the k-request trace (one stream per column)."""
    assert requests_frame(1000, seed=3).head(250).equals(requests_frame(250, seed=3))


def test_two_formats_describe_the_same_requests(tmp_path: Path) -> None:
    """Read as BLIS reads its CSV (arrival = int(seconds * 1e6), lengths of the token arrays),
    BLIS's file gives the trace v2's arrival times and lengths, row for row."""
    frame = requests_frame(500, seed=11)
    write_trace(frame, tmp_path / "trace", seed=11, rate=20.0)
    write_blis_csv(frame, tmp_path / "blis.csv", seed=11)
    v2 = read_trace_v2(tmp_path / "trace.csv").frame[COLUMNS]
    assert v2.equals(frame)
    assert read_blis_csv(tmp_path / "blis.csv").equals(frame)


def test_lengths_fit_blis_max_model_len() -> None:
    """Every request has a prompt and an output of at least one token and at most 2,048 together."""
    f = requests_frame(20_000, seed=42)
    assert int(f.input_tokens.min()) >= 1 and int(f.output_tokens.min()) >= 1
    assert int((f.input_tokens + f.output_tokens).max()) <= MAX_MODEL_LEN
    assert bool(np.all(np.diff(f.arrival_time_us.to_numpy()) >= 0))


def test_blis_prompts_share_no_block(tmp_path: Path) -> None:
    """BLIS's token ids are in the vocabulary and no two prompts share their first 16-token
    block, so BLIS's prefix cache finds nothing (as this project's finds nothing in the trace v2)."""
    import csv
    import json

    write_blis_csv(requests_frame(400, seed=5), tmp_path / "blis.csv", seed=5)
    with open(tmp_path / "blis.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    prompts = [json.loads(r[3]) for r in rows]
    ids = np.concatenate([np.array(json.loads(r[3]) + json.loads(r[4])) for r in rows])
    assert int(ids.min()) >= 0 and int(ids.max()) < VOCAB
    first_blocks = [tuple(p[:16]) for p in prompts if len(p) >= 16]
    assert len(set(first_blocks)) == len(first_blocks) == sum(len(p) >= 16 for p in prompts)


@given(st.integers(min_value=0, max_value=10**12))
def test_blis_reads_back_the_arrival(arrival_us: int) -> None:
    """BLIS's truncating read of the written seconds, int(float(text) * 1e6), is the arrival in µs
    (up to 10^12 µs, 11.6 days)."""
    assert int(float(blis_arrival_text(arrival_us)) * 1e6) == arrival_us


@functools.cache
def _small_run() -> Results:
    return Simulation(load_scenario(SCENARIO)).run()


def test_scenario_replays_every_request() -> None:
    """The shipped scenario replays the 2,000-request trace: every request arrives and completes,
    none is dropped, with the trace's lengths in trace order."""
    results = _small_run()
    s = results.summary()
    assert (s["requests"]["arrived"], s["requests"]["completed"], s["requests"]["dropped"]) == (2000, 2000, 0)
    df = results.to_dataframe().sort_values("request_id")
    frame = requests_frame(2000, seed=42)
    assert df["prompt_tokens"].tolist() == frame.input_tokens.tolist()
    assert df["output_tokens"].tolist() == df["generated_tokens"].tolist() == frame.output_tokens.tolist()
    assert np.allclose(df["arrival_s"], frame.arrival_time_us / 1e6, rtol=0, atol=1e-9)


def test_scenario_queueing_is_blis_alpha() -> None:
    """As in BLIS, each request enters the queue alpha0 + alpha1 x prompt tokens (µs) after it arrives
    (H100 TP2 profile of Llama-3.1-8B), and its completion is alpha2 per output token after the
    step that computed its last token, so completion - first token = alpha2 x (output - 1) at the least."""
    blis = BlisLinearLatency.from_params({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2})
    df = _small_run().to_dataframe()
    expected = (blis.alpha0_us + blis.alpha1_us * df["prompt_tokens"]) * 1e-6
    assert np.allclose(df["enqueue_s"] - df["arrival_s"], expected, rtol=0, atol=1e-9)
    gap = df["completion_s"] - df["first_token_s"]
    assert bool((gap >= blis.alpha2_us * 1e-6 * (df["output_tokens"] - 1) - 1e-9).all())


def test_scenario_settings_are_blis_defaults() -> None:
    """The engine has BLIS's default batch limits, block size and this profile's KV blocks."""
    engine = load_scenario(SCENARIO).serving.engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, engine.kv_block_size, engine.kv_num_blocks) == (256, 2048, 16, 132139)
    assert engine.chunked_prefill and engine.prefix_caching


@pytest.mark.parametrize("seed", [1, 2])
def test_rate_sets_the_mean_gap(seed: int) -> None:
    """Arrivals are Poisson at the rate asked: the mean gap of 20,000 requests at 20/s is 50 ms within 3%."""
    f = requests_frame(20_000, seed=seed, rate=20.0)
    assert f.arrival_time_us.diff().dropna().mean() == pytest.approx(50_000, rel=0.03)


def _reference_rows(trace: Trace) -> list[tuple[float, int, int, dict[str, Any]]]:
    """trace_rows as it was written before it left default fields out: every passed-on field
    of every row, from trace_requests (no source, no prefix groups, no warm-up)."""
    out = []
    for r in trace_requests(trace):
        client = r.client_id or "trace"
        fields: dict[str, Any] = {"client_id": client, "tenant_id": r.tenant_id or client}
        fields.update(slo_class=r.slo_class or "default", priority=r.priority)
        fields.update((name, getattr(r, TRACE_COLUMNS[name])) for name in _PASSED_ON)
        if r.prefix_blocks:
            fields["prefix_blocks"] = r.prefix_blocks
            fields["prefix_block_tokens"] = 16
        out.append((r.arrival_s, max(r.input_tokens, 1), max(r.output_tokens, 1), fields))
    return out


def _request(row: tuple[float, int, int, dict[str, Any]]) -> dict[str, Any]:
    return attrs.asdict(Request(id=0, prompt_tokens=row[1], output_tokens=row[2], arrival_s=row[0], **row[3]), recurse=False)


_COLUMN_VALUES = {
    "session_id": st.sampled_from(["", "s1"]),
    "round_index": st.integers(0, 3),
    "streaming": st.booleans(),
    "text_tokens": st.integers(0, 5),
    "reason_ratio": st.sampled_from([0.0, -0.0, 0.25]),
    "priority": st.integers(0, 2),
    "prefix_blocks": st.sampled_from(["", "1 2"]),
    "tenant_id": st.sampled_from(["", "t"]),
}


@given(
    st.integers(1, 6).flatmap(
        lambda n: st.fixed_dictionaries(
            {},
            optional={name: st.lists(values, min_size=n, max_size=n) for name, values in _COLUMN_VALUES.items()},
        ).map(lambda cols: (n, cols))
    )
)
def test_trace_rows_make_the_requests_every_field_would(case: tuple[int, dict[str, list[Any]]]) -> None:
    """Leaving out the fields whose every row holds the request's default (and keeping -0.0)
    makes the same requests as passing every field of every row."""
    n, cols = case
    trace = Trace({}, {"arrival_time_us": list(range(n)), "input_tokens": [5] * n, "output_tokens": [3] * n, **cols})
    fast = list(trace_rows(trace))
    slow = _reference_rows(trace)
    assert [row[:3] for row in fast] == [row[:3] for row in slow]
    for a, b in zip(fast, slow, strict=True):
        ra, rb = _request(a), _request(b)
        assert ra == rb
        assert math.copysign(1.0, ra["reason_ratio"]) == math.copysign(1.0, rb["reason_ratio"])
