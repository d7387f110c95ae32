"""Operating ranges: what a fitted profile records of its trace, and the warnings when a
workload goes outside them (``compare``'s report, a run's ``outside_fitted_range`` diagnostic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.calibrate import compare, fit, simulated_observation, write_profile
from simpy_llm.calibrate.ranges import range_limits, trace_range_values
from simpy_llm.config import ScenarioError
from simpy_llm.config.profile import FittedLatencySpec, load_profile
from simpy_llm.loading import load_scenario, scenario_from_dict, scenario_to_dict
from simpy_llm.metrics.diagnostics import run_range_values

TRUTH = {"decode_step_us": [20000.0, 42000.0, 50000.0, 57000.0], "prefill_step_us": 8000.0,
         "prefill_only_step_us": 12000.0, "prefill_token_us": 3500.0, "alpha0_us": 3000.0}


def _scenario(low: int, high: int, *, requests: int = 80, seed: int = 5) -> dict:
    return {
        "seed": seed,
        "workload": {"aggregate_rate": 0.3, "num_requests": requests, "clients": [{
            "id": "open", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "uniform", "params": {"low": low, "high": high}},
            "output_distribution": {"type": "uniform", "params": {"low": 8, "high": 64}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 4096, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": TRUTH}},
    }


@pytest.fixture(scope="module")
def short_profile(tmp_path_factory) -> Path:
    """A profile fitted on prompts of 20-120 tokens."""
    out = tmp_path_factory.mktemp("short")
    simulated_observation(scenario_from_dict(_scenario(20, 120)), out / "trace")
    return write_profile(fit(out / "trace", refine=False), out / "profile.yaml")


def test_the_profile_records_the_ranges_of_its_trace(short_profile):
    """fit.ranges hold the prompt, output and uncached lengths, the cached share, the requests in
    flight and the decoders of the trace, as [min, max]."""
    ranges = load_profile(short_profile)["fit"]["ranges"]
    assert set(ranges) == {"prompt_tokens", "uncached_prompt_tokens", "output_tokens", "decoders", "concurrency", "cached_fraction"}
    assert 20 <= ranges["prompt_tokens"][0] < ranges["prompt_tokens"][1] <= 120
    assert ranges["uncached_prompt_tokens"] == ranges["prompt_tokens"] and ranges["cached_fraction"] == [0, 0]
    assert 8 <= ranges["output_tokens"][0] and ranges["output_tokens"][1] <= 64
    assert ranges["decoders"][0] == 1 and ranges["decoders"][1] <= 4 and ranges["concurrency"][0] == 1


def test_compare_warns_of_a_longer_prompt_workload(short_profile, tmp_path):
    """Fitted on prompts up to 120 tokens, predicting prompts of 300-900 tokens: the report's
    warnings name prompt_tokens, the fitted range and the trace's."""
    simulated_observation(scenario_from_dict(_scenario(300, 900, requests=40, seed=6)), tmp_path / "long")
    cal = compare(tmp_path / "long", profile=short_profile, n_resamples=20)
    fitted = load_profile(short_profile)["fit"]["ranges"]["prompt_tokens"]
    prompts = pd.read_csv(tmp_path / "long.csv")["input_tokens"]
    expected = (f"workload outside the profile's fitted range: prompt_tokens {prompts.min()}-{prompts.max()} outside the "
                f"fitted range {fitted[0]}-{fitted[1]} (prompt tokens per request; 40 of 40 values outside)")
    assert expected in cal.report.warnings


def test_compare_within_the_ranges_does_not_warn(short_profile, tmp_path):
    """The trace the profile was fitted on is inside its ranges: no range warning."""
    trace = Path(load_profile(short_profile)["fit"]["trace"])
    cal = compare(trace, profile=short_profile, n_resamples=20)
    assert not [w for w in cal.report.warnings if "fitted range" in w]


def test_a_run_outside_the_fitted_ranges_gets_a_diagnostic(short_profile, tmp_path):
    """A scenario naming the profile (latency_model: {profile: FILE}) runs a workload of longer
    prompts: its summary's outside_fitted_range diagnostic names prompt_tokens and the range."""
    data = _scenario(300, 900, requests=40, seed=6)
    data["serving"]["latency_model"] = {"profile": str(short_profile)}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    scenario = load_scenario(path)
    assert isinstance(scenario.serving.latency_model, FittedLatencySpec)
    results = Simulation(scenario).run(progress=False)
    found = [d for d in results.summary()["diagnostics"] if d["code"] == "outside_fitted_range"]
    assert len(found) == 1 and found[0]["severity"] == "warning" and found[0]["group"] == "default"
    fitted = load_profile(short_profile)["fit"]["ranges"]["prompt_tokens"]
    prompts = results.to_dataframe()["prompt_tokens"]
    assert (f"prompt_tokens {prompts.min()}-{prompts.max()} outside the fitted range {fitted[0]}-{fitted[1]}"
            in found[0]["message"])
    assert found[0]["figures"]["fitted_prompt_tokens_max"] == fitted[1]


def test_a_run_of_the_fitted_workload_gets_none(short_profile, tmp_path):
    """The scenario the trace came from, run with the fitted profile, stays inside every range
    (its lengths, load and batches are the trace's): no diagnostic."""
    data = _scenario(20, 120)
    data["serving"]["latency_model"] = {"profile": str(short_profile)}
    results = Simulation(scenario_from_dict(data)).run(progress=False)
    assert [d for d in results.summary()["diagnostics"] if d["code"] == "outside_fitted_range"] == []


def test_trace_ranges_count_as_a_hand_count_does():
    """Concurrency is, at each calibrated request's send, the sent requests not finished (failed
    and warm-up ones included); decoders, at each first token, the requests between their first
    and last token; cached share and uncached tokens from the server's cached counts."""
    obs = pd.DataFrame({
        "request_id": [0, 1, 2, 3],
        "send_s": [0.0, 1.0, 2.0, 2.5],
        "status": ["ok", "ok", "error", "ok"],
        "input_tokens": [100, 200, 50, 400],
        "output_tokens": [10, 20, 0, 30],
        "cached_tokens": [0.0, 50.0, np.nan, 100.0],
        "ttft_s": [0.5, 1.5, np.nan, 0.2],
        "e2e_s": [3.0, 2.0, np.nan, 1.0],
    })
    values = trace_range_values(obs, {"warm_up_requests": 1})
    # calibrated: requests 1 and 3 (0 is warm-up, 2 failed). In flight at t=1: 0 and 1; at t=2.5: 0, 1, 3
    assert values["concurrency"].tolist() == [2, 3]
    # first tokens: 0 at 0.5-3.0, 1 at 2.5-3.0, 3 at 2.7-3.5; at 2.5: 0 and 1; at 2.7: 0, 1 and 3
    assert values["decoders"].tolist() == [2, 3]
    assert range_limits(values) == {"prompt_tokens": [200, 400], "output_tokens": [20, 30], "concurrency": [2, 3],
                                    "uncached_prompt_tokens": [150, 300], "cached_fraction": [0.25, 0.25], "decoders": [2, 3]}


def test_run_ranges_count_as_a_hand_count_does():
    """A run's concurrency and decoders (per replica, at arrivals and first tokens) equal a
    request-by-request count over its records."""
    data = _scenario(20, 400, requests=120)
    data["serving"]["replicas"] = 2
    results = Simulation(scenario_from_dict(data)).run(progress=False)
    values = run_range_values(results)
    r = results.to_dataframe()
    done = r[r["status"] == "completed"]
    concurrency, decoders = [], []
    for replica in sorted(done["replica"].unique()):
        mine = r[r["replica"] == replica]
        for a in done.loc[done["replica"] == replica, "arrival_s"]:
            concurrency.append(int(((mine["arrival_s"] <= a) & ~(mine["completion_s"] <= a)).sum()))
        for row in done[(done["replica"] == replica) & (done["output_tokens"] >= 2)].itertuples():
            t = row.first_token_s
            decoders.append(int(((mine["first_token_s"] <= t) & (mine["completion_s"] > t)).sum()))
    assert values["concurrency"].tolist() == concurrency and values["decoders"].tolist() == decoders
    assert values["prompt_tokens"].tolist() == done["prompt_tokens"].tolist()


def test_fitted_ranges_are_part_of_the_scenario():
    """``fitted_ranges`` beside kind and params is kept by scenario_to_dict and loads back equal;
    a scenario without them is unchanged (a plain latency model)."""
    data = _scenario(20, 120)
    data["serving"]["latency_model"]["fitted_ranges"] = {"prompt_tokens": [20, 120], "decoders": [1, 4]}
    scenario = scenario_from_dict(data)
    assert scenario.serving.latency_model.fitted_ranges == {"prompt_tokens": (20.0, 120.0), "decoders": (1.0, 4.0)}
    again = scenario_to_dict(scenario)
    assert again["serving"]["latency_model"]["fitted_ranges"] == {"prompt_tokens": [20.0, 120.0], "decoders": [1.0, 4.0]}
    assert scenario_from_dict(again) == scenario
    plain = scenario_from_dict(_scenario(20, 120))
    assert "fitted_ranges" not in scenario_to_dict(plain)["serving"]["latency_model"]


def test_bad_fitted_ranges_name_their_key_path():
    """An unknown quantity or a range that is not [min, max] is an error at its key path."""
    data = _scenario(20, 120)
    data["serving"]["latency_model"]["fitted_ranges"] = {"prompt": [1, 2], "decoders": [4, 1]}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert err.value.paths == ["serving.latency_model.fitted_ranges.prompt", "serving.latency_model.fitted_ranges.decoders"]
    assert "unknown quantity; allowed: prompt_tokens" in str(err.value)


def test_a_profile_with_malformed_fit_keys_is_rejected(tmp_path):
    """A profile whose fit.ranges, fit.intervals or fit.sources are malformed is an error naming
    the file and each key path; one without them (an older profile) loads."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"latency_model": {"kind": "batch_table", "params": TRUTH}, "fit": {
        "ranges": {"prompt_tokens": [900, 20]},
        "intervals": {"decode_step_us": [[1, 2], "x"], "prefill_pair": [0, 1]},
        "sources": {"alpha0_us": 3},
    }}))
    with pytest.raises(ScenarioError) as err:
        load_profile(path)
    assert err.value.source == str(path)
    assert err.value.paths == ["fit.ranges.prompt_tokens", "fit.intervals.decode_step_us[1]", "fit.intervals.prefill_pair",
                               "fit.sources.alpha0_us"]
    data = _scenario(20, 120)
    data["serving"]["latency_model"] = {"profile": str(path)}
    with pytest.raises(ScenarioError, match=r"serving.latency_model.profile: .*p.yaml: fit.ranges.prompt_tokens: must be \[min, max\]"):
        scenario_from_dict(data)
    path.write_text(yaml.safe_dump({"profile_version": 1, "latency_model": {"kind": "batch_table", "params": TRUTH}}))
    data["serving"]["latency_model"] = {"profile": str(path)}
    assert type(scenario_from_dict(data).serving.latency_model).__name__ == "PolicySpec"
