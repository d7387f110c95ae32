"""The summary's rates and their windows: throughput over the arrival window, the drain apart,
and the whole-run rates under their own names.

Each figure is checked against a hand count or a closed form: evenly spaced arrivals and a
constant service make every arrival and completion time known in advance.
"""

from __future__ import annotations

import math

import pytest

from simpy_llm import Recorder, Request, Results, Simulation, scenario_from_dict
from simpy_llm.cli import main
from tests.helpers import tiny_scenario

RATE = 10.0
"""Arrivals per second of the deterministic single server."""
SERVICE_S = 0.02
"""Its service time: one step of beta0 = 20 ms (a 100-token prompt, one output token)."""
N = 50


def deterministic_server(n: int = N, rate: float = RATE, beta0_us: float = SERVICE_S * 1e6) -> dict:
    """One FIFO server (one request at a time), arrivals every 1 / *rate* s from 1 / *rate*, each
    served in one step of *beta0_us*: a D/D/1 queue that never waits when 1 / rate > service."""
    return {
        "seed": 3,
        "workload": {
            "aggregate_rate": rate,
            "num_requests": n,
            "clients": [{
                "id": "only",
                "rate_fraction": 1.0,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 100}},
                "output_distribution": {"type": "constant", "params": {"value": 1}},
            }],
        },
        "serving": {
            "replicas": 1,
            "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 1024, "chunked_prefill": False,
                       "kv_block_size": 16, "kv_num_blocks": 64},
            "latency_model": {"kind": "blis_linear", "params": {
                "beta0_us": beta0_us, "beta1_us": 0.0, "beta2_us": 0.0,
                "alpha0_us": 0.0, "alpha1_us": 0.0, "alpha2_us": 0.0}},
        },
    }


@pytest.fixture(scope="module")
def dd1() -> dict:
    return Simulation(scenario_from_dict(deterministic_server())).run(progress=False).summary()


def test_windowed_throughput_equals_the_offered_rate_and_the_whole_run_rate_does_not(dd1):
    """Arrivals at k / 10 s (k = 1..50), each done 20 ms later: the window (0.1, 5.0] holds
    49 arrivals and 49 completions (the 50th ends at 5.02 s), so both rates are 49 / 4.9 =
    10/s exactly, while the whole run gives 50 / 5.02 s = 9.96/s."""
    tp = dd1["throughput"]
    assert tp["requests_per_s"] == pytest.approx(RATE, rel=1e-9)
    assert tp["offered_requests_per_s"] == pytest.approx(RATE, rel=1e-9)
    whole = N / (N / RATE + SERVICE_S)
    assert tp["whole_run_requests_per_s"] == pytest.approx(whole, rel=1e-9)
    assert tp["whole_run_requests_per_s"] < 0.997 * RATE


def test_the_window_and_the_drain_are_the_arrival_span_and_the_last_service(dd1):
    """The window runs from the first arrival (0.1 s) to the last (5.0 s); the drain is the
    last request's 20 ms service."""
    tp = dd1["throughput"]
    assert tp["window_start_s"] == pytest.approx(1 / RATE, rel=1e-9)
    assert tp["window_s"] == pytest.approx((N - 1) / RATE, rel=1e-9)
    assert tp["drain_s"] == pytest.approx(SERVICE_S, rel=1e-6)
    assert dd1["measurement"]["duration_s"] == pytest.approx(N / RATE + SERVICE_S, rel=1e-9)


def test_token_rates_count_the_window_completions_tokens(dd1):
    """49 completions of 100 prompt and 1 output tokens in 4.9 s: 1000 input and 10 output tokens/s."""
    tp = dd1["throughput"]
    assert tp["input_tokens_per_s"] == pytest.approx(100 * RATE, rel=1e-9)
    assert tp["output_tokens_per_s"] == pytest.approx(RATE, rel=1e-9)
    assert tp["whole_run_input_tokens_per_s"] == pytest.approx(100 * N / (N / RATE + SERVICE_S), rel=1e-9)


# --- hand-filled runs ---------------------------------------------------------------------
def _results(requests: list[tuple[float, float, bool]], end_s: float, slo: dict | None = None) -> Results:
    """Completed requests ``(arrival_s, completion_s, warm_up)`` (5 output tokens, 100 prompt
    tokens each) in a hand-filled recorder."""
    rec = Recorder()
    for i, (arrival, completion, warm_up) in enumerate(requests):
        req = Request(id=i, client_id="c", prompt_tokens=100, output_tokens=5, arrival_s=arrival, enqueue_s=arrival,
                      first_scheduled_s=arrival, first_token_s=arrival, completion_s=completion, replica=0,
                      warm_up=warm_up)
        rec.on_arrival(req, arrival)
        req.generated_tokens = 5
        rec.on_complete(req)
    data = tiny_scenario()
    if slo is not None:
        data["slo"] = slo
    return Results.from_recorder(rec, scenario=scenario_from_dict(data), end_s=end_s, wall_s=0.0, events=0, steps=0,
                                 kv_blocks=[64])


def test_an_overloaded_run_reads_its_capacity_in_the_window():
    """Ten arrivals at t = 0..9 (1/s) served one every 2 s (done at 2, 4, ..., 20): the window
    (0, 9] holds the completions at 2, 4, 6, 8, so 4 / 9 req/s, the server's pace, against 9 / 9
    offered; the drain is 20 - 9 = 11 s and the whole run 10 / 20."""
    s = _results([(float(k), 2.0 * (k + 1), False) for k in range(10)], end_s=20.0).summary()
    tp = s["throughput"]
    assert tp["requests_per_s"] == pytest.approx(4 / 9)
    assert tp["offered_requests_per_s"] == pytest.approx(1.0)
    assert tp["drain_s"] == pytest.approx(11.0)
    assert tp["whole_run_requests_per_s"] == pytest.approx(0.5)


def test_warm_up_completions_inside_the_window_count_as_departures():
    """Warm-up requests arrive at 0 and 1 and end at 2.5 and 3.5; measured ones arrive at 2, 3, 4
    and end at 3, 4, 6. The window is (2, 4]: completions at 2.5, 3, 3.5, 4 (two of them
    warm-up) give 4 / 2 req/s, while the whole-run rate counts the 3 measured completions over
    2..6 s."""
    s = _results(
        [(0.0, 2.5, True), (1.0, 3.5, True), (2.0, 3.0, False), (3.0, 4.0, False), (4.0, 6.0, False)], end_s=6.0
    ).summary()
    tp = s["throughput"]
    assert (tp["window_start_s"], tp["window_s"]) == (2.0, 2.0)
    assert tp["requests_per_s"] == pytest.approx(2.0)
    assert tp["output_tokens_per_s"] == pytest.approx(4 * 5 / 2.0)
    assert tp["offered_requests_per_s"] == pytest.approx(1.0)  # 3 and 4 in (2, 4]
    assert tp["whole_run_requests_per_s"] == pytest.approx(3 / 4.0)


def test_windowed_goodput_counts_the_window_completions_meeting_their_slo():
    """E2E target 1.5 s; arrivals at 0, 1, 2, 3, 4 with E2E 1, 2, 1, 1, 1. The window (0, 4]
    holds the completions at 1, 3, 3, 4 (the 2 s one at 3 misses): 3 met / 4 s; the whole run
    counts 4 met / 5 s; 4 of 5 completed requests met their target."""
    e2e = (1.0, 2.0, 1.0, 1.0, 1.0)
    s = _results([(float(k), k + e, False) for k, e in enumerate(e2e)], end_s=5.0,
                 slo={"default": {"e2e_s": 1.5}}).summary()
    gp = s["goodput"]
    assert gp["requests_per_s"] == pytest.approx(3 / 4)
    assert gp["whole_run_requests_per_s"] == pytest.approx(4 / 5)
    assert gp["fraction"] == pytest.approx(0.8)


def test_a_window_of_no_length_refuses_its_rates_and_keeps_the_whole_run_ones():
    """Every request arriving at once has no arrival rate: the windowed rates are NaN, the
    whole-run rate is 2 completions over 4 s."""
    s = _results([(0.0, 2.0, False), (0.0, 4.0, False)], end_s=4.0).summary()
    tp = s["throughput"]
    assert tp["window_s"] == 0.0
    assert math.isnan(tp["requests_per_s"]) and math.isnan(tp["offered_requests_per_s"])
    assert math.isnan(s["goodput"]["requests_per_s"])
    assert tp["whole_run_requests_per_s"] == pytest.approx(0.5)
    assert tp["drain_s"] == pytest.approx(4.0)


# --- what people read -----------------------------------------------------------------------
def test_the_run_table_names_the_window_of_each_rate(tmp_path, capsys, monkeypatch):
    """``simpy-llm run`` prints the windowed rate with its window and the offered rate, the
    drain, and the whole-run rate with its span: the D/D/1 run's 10/s, 4.9 s window, 20 ms
    drain and 50 / 5.02 s."""
    import yaml

    path = tmp_path / "dd1.yaml"
    path.write_text(yaml.safe_dump(deterministic_server()))
    monkeypatch.setenv("COLUMNS", "400")  # wide enough for each cell on one line
    assert main(["run", str(path), "--progress", "off"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "10.000 req/s, 10.0 output tokens/s, 1,000.0 input tokens/s: completions in the arrival window" in out
    assert "(0.100-5.000 s, 4.900 s; 10.000 req/s offered)" in out
    assert "0.020 s from the last arrival to the last completion, left out of the rates above" in out
    assert f"whole-run rate │ {N / 5.02:.3f} req/s" in out
    assert "over 0.000-5.020 s, drain included" in out
