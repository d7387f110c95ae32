"""vLLM's serving-benchmark metrics, computed by hand for a small trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpy_llm.observe.bench.metrics import bench_metrics, parse_goodput, parse_percentiles, percentile_key, read_rows
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS
from simpy_llm.workload.traces import TraceV2Writer


def _row(rid: int, status: str, send: int, first: int | None, done: int, itl: str, n_in: int, n_out: int, **extra: object) -> dict[str, object]:
    return {
        "request_id": rid, "arrival_time_us": 0, "status": status, "send_time_us": send, "first_token_time_us": first,
        "done_time_us": done, "itl_us": itl, "input_tokens": n_in, "output_tokens": n_out, "requested_input_tokens": n_in,
        "requested_output_tokens": n_out, "prompt_tokens_source": "usage", "completion_tokens_source": "usage", **extra,
    }


ROWS = [
    # sent at 0 s: first token at 0.1 s, 4 tokens, gaps 0.1 0.1 0.2, done at 0.5 s.
    _row(0, "ok", 0, 100_000, 500_000, "100000 100000 200000", 10, 4),
    # sent at 0.2 s: first token at 0.5 s, 1 token (no TPOT), done at 0.6 s.
    _row(1, "ok", 200_000, 500_000, 600_000, "", 20, 1),
    # sent at 0.4 s: first token at 0.6 s, 3 tokens, gaps 0.1 0.3, done at 1.0 s.
    _row(2, "ok", 400_000, 600_000, 1_000_000, "100000 300000", 30, 3),
    _row(3, "error", 0, None, 50_000, "", 5, 5, http_status=503),
    _row(4, "timeout", 0, None, 900_000, "", 5, 5),
    _row(5, "error", 0, None, 20_000, "", 5, 5),
    _row(6, "cancelled", None, None, 800_000, "", 5, 5),
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """ROWS written as an observed trace (the columns the observer writes)."""
    with TraceV2Writer(tmp_path / "trace", header={"mode": "real"}, extra_columns=OBSERVER_COLUMNS) as writer:
        for row in ROWS:
            writer.write_row(row)
    return tmp_path


def test_metrics_of_a_small_trace_equal_the_hand_computation(trace: Path) -> None:
    """Counts, duration, token totals and throughputs, and each latency's mean, median, std and
    percentiles, are those computed by hand with vLLM's definitions."""
    m = bench_metrics(read_rows(trace), percentiles=(50, 90))
    # TTFT: 0.1, 0.3, 0.2; E2EL: 0.5, 0.4, 0.6; TPOT: (0.5-0.1)/3, (0.6-0.2)/2 (the 1-token request has none);
    # ITL pooled: 0.1 0.1 0.2 0.1 0.3. Duration: the last end, 1.0 s.
    assert (m["completed"], m["failed"], m["cancelled"], m["duration"]) == (3, 3, 1, 1.0)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 8)
    assert m["request_throughput"] == 3.0 and m["output_throughput"] == 8.0 and m["total_token_throughput"] == 68.0
    assert m["request_goodput"] is None
    assert m["mean_ttft_ms"] == pytest.approx(200.0) and m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx((((100 - 200) ** 2 + 100**2 + 0) / 3) ** 0.5)
    assert m["p90_ttft_ms"] == pytest.approx(280.0)  # numpy's linear interpolation: 200 + 0.8 * (300 - 200)
    assert m["mean_tpot_ms"] == pytest.approx((400 / 3 + 200) / 2)
    assert m["mean_itl_ms"] == pytest.approx(160.0) and m["median_itl_ms"] == pytest.approx(100.0)
    assert m["p50_e2el_ms"] == pytest.approx(500.0) and m["mean_e2el_ms"] == pytest.approx(500.0)


def test_errors_are_counted_by_kind(trace: Path) -> None:
    """A failed request's kind is its HTTP status, ``timeout``, or ``error`` (no HTTP answer)."""
    assert bench_metrics(read_rows(trace))["errors"] == {"error": 1, "http_503": 1, "timeout": 1}


def test_goodput_counts_a_one_token_request_with_tpot_zero(trace: Path) -> None:
    """As in vLLM, a request with one output token meets any TPOT bound; the others are judged
    on every bound given."""
    # TPOT bound 150 ms: request 0 (133 ms) and request 1 (one token) meet it, request 2 (200 ms) does not.
    assert bench_metrics(read_rows(trace), goodput={"tpot": 150})["request_goodput"] == 2.0
    # ... and with a TTFT bound of 250 ms request 1 (300 ms) fails too.
    assert bench_metrics(read_rows(trace), goodput={"tpot": 150, "ttft": 250})["request_goodput"] == 1.0


def test_output_tokens_without_usage_are_the_content_chunks() -> None:
    """A request the server gave no completion count for counts its content chunks (gaps + 1),
    not the length it asked for."""
    row = _row(0, "ok", 0, 100_000, 400_000, "100000 200000", 10, 50, completion_tokens_source="chunks")
    assert bench_metrics([row])["total_output_tokens"] == 3


def test_a_metric_over_no_value_reads_zero() -> None:
    """With no answered request every latency statistic is 0, as vLLM reports it."""
    m = bench_metrics([_row(0, "timeout", 0, None, 1_000_000, "", 5, 5)], percentiles=(99,))
    assert m["mean_ttft_ms"] == m["p99_itl_ms"] == m["request_throughput"] == 0.0


def test_percentile_keys_are_vllms() -> None:
    """A whole percentile is written without decimals, another with them."""
    assert [percentile_key(p, "tpot") for p in parse_percentiles("50,99.9")] == ["p50_tpot_ms", "p99.9_tpot_ms"]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["ttft"], "give KEY:MILLISECONDS"),
        (["itl:5"], "the key must be one of ttft, tpot, e2el"),
        (["tpot:fast"], "is not a number of milliseconds"),
        (["e2el:-1"], "finite number of milliseconds > 0"),
    ],
)
def test_bad_goodput_items_are_refused(items: list[str], message: str) -> None:
    """Each malformed ``--goodput`` item is refused, naming the option, the item and what is allowed."""
    with pytest.raises(ValueError, match=message) as info:
        parse_goodput(items)
    assert str(info.value).startswith("--goodput: ")


def test_e2e_is_read_as_e2el() -> None:
    """``e2e`` and vLLM's ``e2el`` name the same SLO."""
    assert parse_goodput(["e2e:900"]) == parse_goodput(["e2el:900"]) == {"e2el": 900.0}
