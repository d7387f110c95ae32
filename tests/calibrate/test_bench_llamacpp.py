"""Real data, deterministic: a benchmark of the llama.cpp server predicted from a fit of two
short runs (``tests/data/bench/llamacpp_bench``, recorded by ``tests/data/bench/record_benchmark.py``).

The fit (``profile.yaml``) comes from a synchronous run of 12 requests, with a probe's profile as
priors, and one constant-rate run of 32 (``probe``, ``fit_synchronous``, ``fit_rate``); the sweep
(``sweep``) was recorded after them on the same server and is predicted run by run from each
run's own workload file. Every figure asserted is the figure reached (``docs/calibration.md``,
"Predicting a benchmark before it is run"), computed as ``python -m tests.data.bench.record_benchmark
--figures`` prints them (:func:`~tests.data.bench.record_benchmark.predicted_errors`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpy_llm.calibrate.scenario import scenario_from_trace
from simpy_llm.loading import scenario_to_dict
from tests.data.bench.record_benchmark import predicted_errors

DATA = Path(__file__).resolve().parents[1] / "data" / "bench" / "llamacpp_bench"


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sweep predicted with the fitted profile, and its errors."""
    return predicted_errors(DATA, DATA / "profile.yaml", tmp_path_factory.mktemp("predicted"))


def test_the_saturation_rate_is_predicted_within_four_percent(scored: dict) -> None:
    """The throughput run's request rate: measured 1.850/s, predicted 1.916/s (+3.6 %), inside
    the goal of 10 %."""
    saturation = scored["saturation"]
    assert (saturation["measured"], saturation["predicted"]) == pytest.approx((1.8498, 1.9156), abs=5e-5)
    assert saturation["error"] == pytest.approx(0.0356, abs=1e-4)


def test_median_e2e_errors_run_by_run(scored: dict) -> None:
    """Replayed with the server's KV stream per slot (the traces say ``kv_unified: false``), p50
    E2E errors: synchronous +5.9 %, throughput -4.0 %, then at 1.164, 1.393, 1.621 and 1.850
    requests/s +19.1 %, +1.7 %, +5.9 % and +24.6 %. Below saturation one of four misses the goal
    of 10 % (1.164/s: docs/calibration.md says what the fit shows); MAPE 8.2 %."""
    runs = scored["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant", "constant", "constant"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.0594, -0.0404, 0.1911, 0.0168, 0.0588, 0.2458], abs=1e-4)
    assert [r["median_ttft_ms"] for r in runs] == pytest.approx([-0.0879, -0.0474, 0.0576, 0.0679, 0.3597, 0.5168], abs=1e-4)
    assert scored["mape"]["median_e2el_ms"] == pytest.approx(0.0815, abs=1e-4)
    assert scored["mape"]["median_ttft_ms"] == pytest.approx(0.1433, abs=1e-4)


def test_one_kv_cache_would_miss_the_lowest_rate_the_other_way(tmp_path: Path) -> None:
    """The same profile replayed as one KV cache (passes in order: not the layout this server
    ran): p50 E2E +5.9 %, -4.0 %, -33.7 %, +1.5 %, +1.5 %, +20.1 %. The layout decides the
    lowest rate, where four to six decoders on scattered slots take passes of their own."""
    data = scenario_to_dict(scenario_from_trace(DATA / "sweep" / "rate_0" / "trace", profile=DATA / "profile.yaml"))
    assert data["serving"]["engine"]["ubatch_split"] == "by_slot"
    runs = predicted_errors(DATA, DATA / "profile.yaml", tmp_path, ubatch_split="simple")["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([0.0594, -0.0404, -0.3372, 0.0151, 0.0145, 0.2005], abs=1e-4)


def test_the_probe_and_synchronous_fit_alone_miss_the_lowest_rate_below(tmp_path: Path) -> None:
    """Without the rate run (the synchronous fit on the probe's priors), p50 E2E -0.1 %, -3.5 %,
    -14.4 %, +0.7 %, +0.3 %, +12.3 %: the rate run moves the lowest rate's error from -14.4 to
    +19.1 % and leaves the others within 10 %."""
    runs = predicted_errors(DATA, DATA / "fit_synchronous" / "profile.yaml", tmp_path)["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([-0.0010, -0.0354, -0.1444, 0.0067, 0.0026, 0.1230], abs=1e-4)
