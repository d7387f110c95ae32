"""``simpy-llm bench run`` against the real llama.cpp server: a one-liner and a sweep (56 requests in all).

Tokens are counted by the server's own ``/tokenize``; what is checked is what the server
reported (its ``usage`` counts) and what the observer stamped, never how long anything took.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simpy_llm.cli import main
from simpy_llm.observe.bench.metrics import bench_metrics, read_rows
from simpy_llm.observe.llamacpp import LlamaCppServer

pytestmark = pytest.mark.real_server


def test_one_liner_counts_with_the_servers_tokenizer(llamacpp_server: LlamaCppServer, tmp_path: Path) -> None:
    """A synthetic one-liner counts tokens with llama.cpp's /tokenize: the server's prompt count
    of every request is the asked length (plus the start token the server adds to a completion
    prompt), and bench.json's figures are those of the trace."""
    out = tmp_path / "b"
    code = main(["bench", "run", "--url", str(llamacpp_server.url), "--dataset", "synthetic", "--input-len", "48",
                 "--output-len", "8", "--ignore-eos", "--num-prompts", "16", "--request-rate", "4", "--max-concurrency", "4",
                 "--percentiles", "50,90,99", "--server-type", "llamacpp", "--out", str(out)])
    assert code == 0
    header = yaml.safe_load((out / "rate_0" / "trace.yaml").read_text())
    assert header["token_counting"] == "server_tokenize" and header["server"]["n_parallel"] == 4
    trace = read_rows(out / "rate_0")
    assert set(trace.status) == {"ok"} and len(trace) == 16
    assert set(trace.input_tokens - trace.requested_input_tokens) <= {0, 1}
    assert list(trace.output_tokens) == [8] * 16
    row = json.loads((out / "bench.json").read_text())["runs"][0]
    assert row == {**row, **bench_metrics(trace, percentiles=(50, 90, 99))}
    assert row["total_output_tokens"] == 128


def test_sweep_against_llamacpp(llamacpp_server: LlamaCppServer, tmp_path: Path) -> None:
    """A sweep of 2 rates (10 requests per run) makes its four runs in order; the rates lie
    between the synchronous and the throughput run's request throughput, the last equal to
    the latter; every request is answered with its asked output length."""
    out = tmp_path / "b"
    code = main(["bench", "run", "--url", str(llamacpp_server.url), "--dataset", "random", "--input-len", "32",
                 "--output-len", "6", "--random-range-ratio", "0.25", "--ignore-eos", "--num-prompts", "10",
                 "--profile", "sweep", "--rates", "2", "--max-concurrency", "4", "--out", str(out)])
    assert code == 0
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant"]
    low, high = runs[0]["request_throughput"], runs[1]["request_throughput"]
    assert [r["request_rate"] for r in runs[2:]] == pytest.approx([(low + high) / 2, high], rel=1e-12)
    for k, r in enumerate(runs):
        trace = read_rows(out / f"rate_{k}")
        assert r["completed"] == 10 and set(trace.status) == {"ok"}
        assert (trace.output_tokens == trace.requested_output_tokens).all()
        assert set(pd.to_numeric(trace.requested_output_tokens)) <= set(range(4, 8))
