"""``simpy-llm calibrate compare | fit`` on traces the simulator made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simpy_llm.calibrate import simulated_observation
from simpy_llm.cli import main
from simpy_llm.loading import scenario_from_dict

TRUTH = {"decode_step_us": [12000.0, 30000.0], "prefill_step_us": 4000.0, "prefill_token_us": 2000.0, "alpha0_us": 1000.0}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A 60-request simulated observation of a 2-slot llama.cpp-like server, in an observer's layout."""
    scenario = scenario_from_dict({
        "seed": 9,
        "workload": {"aggregate_rate": 0.8, "num_requests": 60, "clients": [{
            "id": "a", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "uniform", "params": {"low": 20, "high": 200}},
            "output_distribution": {"type": "uniform", "params": {"low": 5, "high": 40}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 1024, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": TRUTH}},
    })
    out = tmp_path_factory.mktemp("obs")
    simulated_observation(scenario, out / "trace", warm_up_requests=3)
    return out


def test_fit_writes_a_profile_and_rates_it(trace, tmp_path, capsys):
    """``calibrate fit`` writes the profile, prints the fit and the rating table, and with
    --report writes the report with the fit's statistics in it."""
    profile = tmp_path / "profile.yaml"
    assert main(["calibrate", "fit", str(trace), "--out", str(profile), "--max-evaluations", "5",
                 "--report", str(tmp_path / "rep"), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {profile}" in out and "excellent" in out and "ttft" in out
    params = yaml.safe_load(profile.read_text())["latency_model"]["params"]
    assert params["decode_step_us"] == pytest.approx(TRUTH["decode_step_us"], rel=0.02)
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["fit"]["trace"].endswith("trace.csv") and report["request_summary"]["excluded_warm_up"] == 3


def test_compare_with_a_profile_writes_the_report_files(trace, tmp_path, capsys):
    """``calibrate compare --profile P --out DIR`` writes report.json, report.md and the plots."""
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"profile_version": 1, "latency_model": {"kind": "batch_table", "params": TRUTH}}))
    assert main(["calibrate", "compare", str(trace), "--profile", str(profile), "--out", str(tmp_path / "r"), "--resamples", "50"]) == 0
    names = {p.name for p in (tmp_path / "r").iterdir()}
    assert {"report.json", "report.md", "qq_e2e.png", "cdf_ttft.png", "scatter_e2e.png"} <= names
    assert "excellent" in capsys.readouterr().out


def test_compare_tests_a_scenario_of_ones_own_with_overrides(trace, tmp_path, capsys):
    """``--scenario S --set ...``: the scenario's serving system, overridden, predicts the trace;
    a slower model is rated worse and over-predicts."""
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump({
        "workload": {"traces": [{"path": str(trace / "trace.csv")}]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 2, "ctx_per_slot": 1024, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": TRUTH}},
    }))
    assert main(["calibrate", "compare", str(trace), "--scenario", str(s), "--resamples", "50",
                 "--set", "serving.latency_model.params.prefill_token_us=4000"]) == 0
    out = capsys.readouterr().out
    assert "over-predict" in out


def test_calibrate_input_errors_exit_2(trace, tmp_path, capsys):
    """A missing trace, --set without --scenario, and a trace without a latency model to use
    are bad input: exit 2 with the reason on standard error."""
    assert main(["calibrate", "compare", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["calibrate", "compare", str(trace), "--set", "seed=1"]) == 2
    assert "--set needs --scenario" in capsys.readouterr().err
    header = yaml.safe_load((trace / "trace.yaml").read_text())
    header["server"] = {"type": "vllm", "max_num_seqs": 2}
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "trace.yaml").write_text(yaml.safe_dump(header))
    (tmp_path / "t" / "trace.csv").write_text((trace / "trace.csv").read_text())
    assert main(["calibrate", "compare", str(tmp_path / "t")]) == 2
    assert "give a fitted profile" in capsys.readouterr().err
