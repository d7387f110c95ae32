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


def test_the_saturation_rate_is_predicted_within_two_percent(scored: dict) -> None:
    """The throughput run's request rate: measured 0.576/s, predicted 0.587/s (+1.9 %), inside
    the goal of 10 %."""
    saturation = scored["saturation"]
    assert (saturation["measured"], saturation["predicted"]) == pytest.approx((0.5763, 0.5875), abs=5e-5)
    assert saturation["error"] == pytest.approx(0.0194, abs=5e-4)


def test_median_e2e_errors_run_by_run(scored: dict) -> None:
    """p50 E2E errors: synchronous +9.0 %, throughput -1.4 %, then at 0.465, 0.502, 0.539 and
    0.576 requests/s -22.3 %, -18.5 %, +0.9 % and +5.4 %. Below saturation two of four miss the
    goal of 10 % (docs/calibration.md says what the traces show); TTFT p50 stays within 5.3 %
    except at the saturated rate (+19.6 %)."""
    runs = scored["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant", "constant", "constant"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.090, -0.014, -0.223, -0.185, 0.009, 0.054], abs=5e-4)
    assert [r["median_ttft_ms"] for r in runs] == pytest.approx([0.017, -0.024, -0.053, -0.042, -0.019, 0.196], abs=5e-4)
    assert scored["mape"]["median_e2el_ms"] == pytest.approx(0.127, abs=5e-4)
    assert scored["mape"]["median_ttft_ms"] == pytest.approx(0.033, abs=5e-4)


def test_passes_by_slot_bring_the_median_e2e_below_saturation_within_ten_percent(tmp_path: Path) -> None:
    """The same profile replayed with a KV stream per slot (``kv_unified: false``, the
    launcher's setting): p50 E2E +9.0 %, -1.4 %, +0.2 %, +7.2 %, +6.9 %, +15.7 % (every run below
    saturation within 10 %), while p50 TTFT near saturation is over-predicted (+28.4 %, +58.3 %:
    docs/calibration.md says why)."""
    measured = json.loads((DATA / "sweep" / "bench.json").read_text())
    data = scenario_to_dict(scenario_from_trace(DATA / "sweep" / "rate_0" / "trace", profile=DATA / "profile.yaml"))
    data["serving"]["engine"]["ubatch_split"] = "by_slot"  # the preset with kv_unified: false
    predicted = predict_measured(scenario_from_dict(data), DATA / "sweep", tmp_path)
    runs = bench_errors(measured["runs"], predicted["runs"])["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.090, -0.014, 0.002, 0.072, 0.069, 0.157], abs=5e-4)
    assert [r["median_ttft_ms"] for r in runs] == pytest.approx([0.017, -0.024, -0.027, 0.037, 0.284, 0.583], abs=5e-4)
