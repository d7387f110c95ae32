"""A benchmark predicted by the simulator (``simpy_llm.calibrate.bench_predict``, ``simpy-llm
bench predict`` / ``bench compare``): each run is the benchmark's own workload file under the
run's cap, checked against closed forms of a step-time table, and a prediction scored against
a benchmark gives the errors its figures imply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simpy_llm.calibrate.bench_predict import bench_errors, predict_bench, predict_measured
from simpy_llm.cli import main as cli
from simpy_llm.loading import scenario_from_dict
from simpy_llm.observe.bench import sweep_rates

D_US = [10_000.0, 12_000.0, 14_000.0, 16_000.0]
PREFILL_STEP_US, PREFILL_TOKEN_US = 20_000.0, 100.0
PROMPT, OUTPUT = 100, 8


def _scenario(d1_us: float = D_US[0]) -> Any:
    return scenario_from_dict({
        "name": "table",
        "seed": 1,
        "workload": {"aggregate_rate": 1.0, "num_requests": 1,
                     "clients": [{"id": "c", "arrival": {"process": "poisson"},
                                  "input_distribution": {"type": "constant", "params": {"value": 10}},
                                  "output_distribution": {"type": "constant", "params": {"value": 10}}}]},
        "serving": {"replicas": 1, "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
                    "latency_model": {"kind": "batch_table", "params": {
                        "decode_step_us": [d1_us, *D_US[1:]], "prefill_step_us": PREFILL_STEP_US, "prefill_token_us": PREFILL_TOKEN_US}}},
    })


def _alone_s(d1_us: float = D_US[0]) -> float:
    """One request alone: a prompt step, then OUTPUT - 1 decode steps of D(1)."""
    return (PREFILL_STEP_US + PROMPT * PREFILL_TOKEN_US + (OUTPUT - 1) * d1_us) / 1e6


def _sweep(out: Path, n: int = 4, rates: int = 2, scenario: Any = None) -> dict[str, Any]:
    return predict_bench(scenario or _scenario(), out, dataset="synthetic", num_prompts=n, profile="sweep", rates=rates,
                         input_len=PROMPT, output_len=OUTPUT, percentiles=(50.0, 99.0))


def test_a_predicted_synchronous_run_sends_one_request_after_another(tmp_path: Path) -> None:
    """Synchronous: each request takes the table's isolated time S and the next is sent when
    it ends, so the run lasts n x S, its request rate is 1 / S and its median E2E is S."""
    result = predict_bench(_scenario(), tmp_path, dataset="synthetic", num_prompts=5, profile="synchronous",
                           input_len=PROMPT, output_len=OUTPUT)
    (run,) = result["runs"]
    s = _alone_s()
    assert run["completed"] == 5 and run["max_concurrency"] == 1
    assert run["duration"] == pytest.approx(5 * s, abs=1e-5)
    assert run["request_throughput"] == pytest.approx(1 / s, rel=1e-5)
    assert run["median_e2el_ms"] == pytest.approx(1e3 * s, abs=1e-3)


def test_a_predicted_sweep_places_its_rates_from_its_own_two_first_runs(tmp_path: Path) -> None:
    """Sweep over four requests: the throughput run sends all four at once, one prompt step of
    4 x 100 tokens and 7 steps of D(4); the constant runs' rates are sweep_rates of the two
    first runs' request rates; bench.json holds the runs in that order."""
    result = _sweep(tmp_path)
    sync, thr, *rest = result["runs"]
    together = (PREFILL_STEP_US + 4 * PROMPT * PREFILL_TOKEN_US + (OUTPUT - 1) * D_US[3]) / 1e6
    assert thr["strategy"] == "throughput" and thr["request_throughput"] == pytest.approx(4 / together, rel=1e-5)
    assert [r["request_rate"] for r in rest] == sweep_rates(sync["request_throughput"], thr["request_throughput"], 2)
    assert json.loads((tmp_path / "bench.json").read_text())["runs"] == result["runs"]
    assert result["predicted"] is True


def test_a_benchmark_predicted_on_its_own_system_scores_zero(tmp_path: Path) -> None:
    """Scoring a (predicted) benchmark with the serving system that made it: every run's
    every error is exactly 0, the saturation rate's too."""
    measured = _sweep(tmp_path / "measured")
    predicted = predict_measured(_scenario(), tmp_path / "measured", tmp_path / "again")
    errors = bench_errors(measured["runs"], predicted["runs"])
    assert errors["saturation"]["error"] == 0.0
    assert all(r[k] == 0.0 for r in errors["runs"] for k in ("median_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms"))


def test_a_slower_decode_step_shows_as_the_synchronous_error_it_implies(tmp_path: Path) -> None:
    """Predicting with D(1) 20 % longer: the synchronous run's E2E error is exactly
    (S' - S) / S, and its TTFT error 0 (the prompt step is unchanged)."""
    measured = predict_bench(_scenario(), tmp_path / "m", dataset="synthetic", num_prompts=3, profile="synchronous",
                             input_len=PROMPT, output_len=OUTPUT, percentiles=(50.0, 99.0))
    slower = D_US[0] * 1.2
    predicted = predict_measured(_scenario(slower), tmp_path / "m", tmp_path / "p")
    (run,) = bench_errors(measured["runs"], predicted["runs"])["runs"]
    assert run["median_e2el_ms"] == pytest.approx((_alone_s(slower) - _alone_s()) / _alone_s(), abs=1e-6)
    assert run["median_ttft_ms"] == pytest.approx(0.0, abs=1e-9)


def test_bench_errors_pair_runs_by_strategy_and_rate() -> None:
    """Runs that do not pair (another strategy or rate at the same place) are refused."""
    m = [{"strategy": "constant", "request_rate": 1.0, "request_throughput": 1.0}]
    p = [{"strategy": "constant", "request_rate": 2.0, "request_throughput": 1.0}]
    with pytest.raises(ValueError, match=r"run 0: measured constant at 1\.0, predicted constant at 2\.0"):
        bench_errors(m, p)


def test_bench_compare_writes_the_errors_and_a_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench compare on a benchmark directory with a scenario: exit 0, compare.json with the
    errors, the predicted bench.json, and an offline page holding the rate curves."""
    pytest.importorskip("plotly", reason="the HTML page needs the report extra: pip install -e '.[report]'")
    import yaml

    from simpy_llm.config.plain import scenario_to_dict

    scenario = tmp_path / "table.yaml"
    scenario.write_text(yaml.safe_dump(scenario_to_dict(_scenario())))
    _sweep(tmp_path / "m")
    code = cli(["bench", "compare", str(tmp_path / "m"), "--scenario", str(scenario), "--html", str(tmp_path / "page.html")])
    assert code == 0
    scored = json.loads((tmp_path / "m" / "predicted" / "compare.json").read_text())
    assert scored["measured"] == str(tmp_path / "m") and scored["errors"]["saturation"]["error"] == 0.0
    page = (tmp_path / "page.html").read_text()
    assert 'id="bench-rate-curves"' in page and "Prediction errors" in page
    assert "saturation rate: measured" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "predict", "--num-prompts", "2"], "give a scenario or --from-trace"),
    (["bench", "predict", "scenarios/quickstart.yaml", "--profile", "synchronous", "--max-concurrency", "2"],
     "--max-concurrency does not apply to --profile synchronous"),
    (["bench", "predict", "scenarios/quickstart.yaml", "--percentiles", "50,90", "--html", "page.html"],
     "add 99 to --percentiles"),
])
def test_bench_predict_refuses_what_it_cannot_predict(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """bench predict without a serving system, with options the profile does not take, or with a
    page whose p99 curves its percentiles leave out, exits 2 naming the problem."""
    assert cli(argv) == 2
    assert message in capsys.readouterr().err
