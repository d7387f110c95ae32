"""Real data, deterministic: a benchmark of the llama.cpp server predicted from a fit of two
short runs (``tests/data/bench/llamacpp_bench``, recorded by ``tests/data/bench/record_benchmark.py``).

The fit (``profile.yaml``) comes from a synchronous run of 8 requests and one constant-rate run
of 24 (``fit_synchronous``, ``fit_rate``); the sweep (``sweep``) was recorded after them on the
same server and is predicted run by run from each run's own workload file. Every figure
asserted is the figure reached (``docs/calibration.md``, "Predicting a benchmark before it is
run")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpy_llm.calibrate.bench_predict import bench_errors, predict_measured
from simpy_llm.calibrate.scenario import scenario_from_trace
from simpy_llm.loading import scenario_from_dict, scenario_to_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "bench" / "llamacpp_bench"


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sweep predicted with the fitted profile, and its errors."""
    measured = json.loads((DATA / "sweep" / "bench.json").read_text())
    scenario = scenario_from_trace(DATA / "sweep" / "rate_0" / "trace", profile=DATA / "profile.yaml")
    predicted = predict_measured(scenario, DATA / "sweep", tmp_path_factory.mktemp("predicted"))
    return bench_errors(measured["runs"], predicted["runs"])


def test_the_saturation_rate_is_predicted_within_one_percent(scored: dict) -> None:
    """The throughput run's request rate: measured 0.576/s, predicted 0.575/s (-0.3 %), inside
    the goal of 10 %."""
    saturation = scored["saturation"]
    assert (saturation["measured"], saturation["predicted"]) == pytest.approx((0.5763, 0.5747), abs=5e-5)
    assert saturation["error"] == pytest.approx(-0.0027, abs=5e-4)


def test_median_e2e_errors_run_by_run(scored: dict) -> None:
    """Replayed with the server's KV stream per slot (the traces say ``kv_unified: false``), p50
    E2E errors: synchronous +21.7 %, throughput +0.8 %, then at 0.465, 0.502, 0.539 and 0.576
    requests/s +34.8 %, +4.8 %, +1.5 % and +6.1 %. Below saturation two of four miss the goal of
    10 % (the synchronous run and 0.465/s: docs/calibration.md says what the fit shows); TTFT p50
    stays within 3.5 % except at the saturated rate (+28.9 %)."""
    runs = scored["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant", "constant", "constant"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.217, 0.008, 0.348, 0.048, 0.015, 0.061], abs=5e-4)
    assert [r["median_ttft_ms"] for r in runs] == pytest.approx([-0.020, 0.008, 0.035, -0.005, -0.003, 0.289], abs=5e-4)
    assert scored["mape"]["median_e2el_ms"] == pytest.approx(0.157, abs=5e-4)
    assert scored["mape"]["median_ttft_ms"] == pytest.approx(0.016, abs=5e-4)


def test_one_kv_cache_would_miss_only_the_synchronous_run(tmp_path: Path) -> None:
    """The same profile replayed as one KV cache (passes in order: not the layout this server
    ran): p50 E2E +21.7 %, +0.8 %, +6.1 %, -1.9 %, -1.4 %, +0.1 %. The synchronous run's miss is
    the fitted single-decoder step, whatever the layout; the miss at 0.465/s comes with passes
    by slot only."""
    measured = json.loads((DATA / "sweep" / "bench.json").read_text())
    data = scenario_to_dict(scenario_from_trace(DATA / "sweep" / "rate_0" / "trace", profile=DATA / "profile.yaml"))
    assert data["serving"]["engine"]["ubatch_split"] == "by_slot"
    data["serving"]["engine"]["ubatch_split"] = "simple"
    predicted = predict_measured(scenario_from_dict(data), DATA / "sweep", tmp_path)
    runs = bench_errors(measured["runs"], predicted["runs"])["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.217, 0.008, 0.061, -0.019, -0.014, 0.001], abs=5e-4)
