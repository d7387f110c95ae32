"""The load-generator benchmark reports a case that failed instead of stopping at it."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_loadgen import median_row, print_rows, spawn, verdict


def _args(**kw: object) -> argparse.Namespace:
    base = {"duration": 1.0, "arrivals": "poisson", "seed": 0, "input_tokens": 8, "output_tokens": 4, "profile": False,
            "profile_top": 5, "new_connections": False, "transport": "lean", "prepare_bytes": 0,
            "max_connections": None}
    return argparse.Namespace(**{**base, **kw})


def test_a_case_whose_process_fails_is_a_failed_saturated_row_that_does_not_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """A case process that exits without figures (here: refused by its own argument parser) gives
    a row marked failed and saturated, with the exit code and its last words; the table prints it,
    the repeated runs' median keeps the failure, and the verdict does not count it as passing."""
    row = spawn(1000.0, "asyncio", 1, 1, 0, _args(transport="no-such-transport"))
    assert row["failed"].startswith("exit code 2: ") and "invalid choice" in row["failed"]
    assert row["saturated"] and row["delay_p99_s"] is None and row["n_requests"] == 1000
    merged = median_row([row, row])
    assert merged["failed"].startswith("2 of 2 runs: exit code 2") and merged["saturated"]
    print_rows([merged])
    assert "failed" in capsys.readouterr().out
    assert verdict([merged]) == (None, None)


def test_the_in_memory_benchmark_sends_every_request_and_gets_every_answer() -> None:
    """The in-memory benchmark's connections answer every request of its run with the no-op
    server's streamed answer: every request ends ok, and the CPU per request is a positive figure."""
    pytest.importorskip("httptools")
    from benchmarks.bench_loadgen_memory import run_case

    out = run_case(300, 3000.0)
    assert out["status_counts"] == {"ok": 300}
    assert out["cpu_us_per_request"] > 0
