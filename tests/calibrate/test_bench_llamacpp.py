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
import yaml

from simpy_llm.calibrate.scenario import scenario_from_trace
from simpy_llm.loading import scenario_to_dict
from tests.data.bench.record_benchmark import predicted_errors

DATA = Path(__file__).resolve().parents[1] / "data" / "bench" / "llamacpp_bench"


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sweep predicted with the fitted profile, and its errors."""
    return predicted_errors(DATA, DATA / "profile.yaml", tmp_path_factory.mktemp("predicted"))


def test_the_saturation_rate_is_predicted_within_six_percent(scored: dict) -> None:
    """The throughput run's request rate: measured 1.946/s, predicted 1.845/s (-5.2 %), inside
    the goal of 10 %."""
    saturation = scored["saturation"]
    assert (saturation["measured"], saturation["predicted"]) == pytest.approx((1.9456, 1.8452), abs=5e-5)
    assert saturation["error"] == pytest.approx(-0.0516, abs=1e-4)


def test_median_e2e_errors_run_by_run(scored: dict) -> None:
    """Replayed with the server's KV stream per slot (the traces say ``kv_unified: false``), p50
    E2E errors: synchronous -12.8 %, throughput +5.5 %, then at 1.186, 1.439, 1.692 and 1.946
    requests/s +3.0 %, +2.5 %, +12.4 % and +20.2 %. Below saturation two of four miss the goal
    of 10 % (the synchronous run and 1.692/s: docs/calibration.md says what the fit shows);
    MAPE 7.7 %."""
    runs = scored["runs"]
    assert [r["strategy"] for r in runs] == ["synchronous", "throughput", "constant", "constant", "constant", "constant"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([-0.1285, 0.0551, 0.0305, 0.0248, 0.1235, 0.2018], abs=1e-4)
    assert [r["median_ttft_ms"] for r in runs] == pytest.approx([-0.0975, 0.0483, -0.0679, 0.0725, 1.009, 0.4023], abs=1e-4)
    assert scored["mape"]["median_e2el_ms"] == pytest.approx(0.0768, abs=1e-4)
    assert scored["mape"]["median_ttft_ms"] == pytest.approx(0.3117, abs=1e-4)


def test_one_kv_cache_would_miss_the_lowest_rate(tmp_path: Path) -> None:
    """The same profile replayed as one KV cache (passes in order: not the layout this server
    ran): p50 E2E -12.8 %, +5.5 %, -32.8 %, +2.3 %, +8.2 %, +16.9 %. The layout decides the
    lowest rate, where four to six decoders on scattered slots take passes of their own."""
    data = scenario_to_dict(scenario_from_trace(DATA / "sweep" / "rate_0" / "trace", profile=DATA / "profile.yaml"))
    assert data["serving"]["engine"]["ubatch_split"] == "by_slot"
    runs = predicted_errors(DATA, DATA / "profile.yaml", tmp_path, ubatch_split="simple")["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([-0.1285, 0.0551, -0.3281, 0.0225, 0.082, 0.1686], abs=1e-4)


def test_the_probe_and_synchronous_fit_alone_predict_every_rate_within_ten_percent(tmp_path: Path) -> None:
    """Without the rate run (the synchronous fit on the probe's priors), p50 E2E -8.1 %, -0.7 %,
    -9.5 %, +0.1 %, -1.9 %, -4.9 % (saturation +0.8 %): the rate run's fit moves the synchronous
    run's error to -12.8 % and 1.692/s's to +12.4 %."""
    scored = predicted_errors(DATA, DATA / "fit_synchronous" / "profile.yaml", tmp_path)
    runs = scored["runs"]
    assert [r["median_e2el_ms"] for r in runs] == pytest.approx([-0.0814, -0.0073, -0.0954, 0.0014, -0.0186, -0.0491], abs=1e-4)
    assert scored["saturation"]["error"] == pytest.approx(0.0080, abs=1e-4)


def test_the_probe_pinned_its_decoders_to_consecutive_slots() -> None:
    """The probe of this recording pinned each ``decode.N`` to slots 0 .. N-1 (its header says
    so), the one pass ``D(N)`` means in the model."""
    header = yaml.safe_load((DATA / "probe" / "trace.yaml").read_text())
    assert header["probe"]["pinned_slots"]["decode.N"] == "0..N-1"
