"""A fit on several traces of one server at once: one loss over all their requests, the steps
of all of them in the direct estimate; traces of different servers refused; the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simpy_llm.calibrate import fit, simulated_observation, write_profile
from simpy_llm.cli import main
from simpy_llm.config.profile import load_profile
from simpy_llm.loading import scenario_from_dict
from tests.calibrate.test_identification import PRIOR, TRUTH, _observe

SMALL = {"decode_step_us": [12000.0, 30000.0], "prefill_step_us": 4000.0, "prefill_token_us": 2000.0, "alpha0_us": 1000.0}
"""A 2-slot llama.cpp-like server, for the cheap traces of the command line."""


def _small(out: Path, *, rate: float, seed: int, n_parallel: int = 2) -> Path:
    """A 60-request simulated observation of the small server (2 slots, or 4 with a longer table)."""
    params = SMALL if n_parallel == 2 else {**SMALL, "decode_step_us": [12000.0, 30000.0, 40000.0, 48000.0]}
    scenario = scenario_from_dict({
        "seed": seed,
        "workload": {"aggregate_rate": rate, "num_requests": 60, "clients": [{
            "id": "a", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "uniform", "params": {"low": 20, "high": 200}},
            "output_distribution": {"type": "uniform", "params": {"low": 5, "high": 40}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": n_parallel, "ctx_per_slot": 1024, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": params}},
    })
    simulated_observation(scenario, out / "trace")
    return out


@pytest.fixture(scope="module")
def prior_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "profile.yaml"
    path.write_text(yaml.safe_dump(PRIOR))
    return path


@pytest.fixture(scope="module")
def quiet_trace(tmp_path_factory) -> Path:
    """Prompts of 20-120 tokens at 0.2 requests/s (most requests find the server idle), 5 % noise."""
    return _observe(tmp_path_factory.mktemp("quiet"), low=20, high=120, rate=0.2, cv=0.05)


@pytest.fixture(scope="module")
def busy_trace(tmp_path_factory) -> Path:
    """The same server at 0.6 requests/s (requests batched with others), other noise."""
    return _observe(tmp_path_factory.mktemp("busy"), low=20, high=120, rate=0.6, cv=0.05, seed=5)


@pytest.fixture(scope="module")
def fits(quiet_trace, busy_trace, prior_file):
    """Each trace fitted alone, and both together, with the probe's profile as priors."""
    return {name: fit(trace, priors=prior_file, max_evaluations=20)
            for name, trace in (("quiet", quiet_trace), ("busy", busy_trace), ("joint", [quiet_trace, busy_trace]))}


def test_a_joint_fit_recovers_the_truth_within_its_intervals(fits):
    """Fitted on both traces, every coefficient either trace determines is determined, and the
    true value lies in its 95 % interval."""
    joint = fits["joint"]
    determined = 0
    for i, interval in enumerate(joint.intervals["decode_step_us"]):
        assert joint.sources["decode_step_us"][i] == "trace"
        assert interval[0] <= TRUTH["decode_step_us"][i] <= interval[1]
        determined += 1
    for name in ("prefill_step_us", "prefill_token_us", "prefill_only_step_us"):
        assert "trace" in (fits["quiet"].sources[name], fits["busy"].sources[name])
        assert joint.sources[name] == "trace"
        low, high = joint.intervals[name]
        assert low <= TRUTH[name] <= high, name
        determined += 1
    assert determined == 7


def test_a_joint_fit_knows_the_prompt_cost_better_than_either_trace(fits):
    """The per-token prompt cost, which each trace determines, has a 95 % interval from both
    traces no wider than from either alone."""
    width = {name: result.intervals["prefill_token_us"][1] - result.intervals["prefill_token_us"][0]
             for name, result in fits.items()}
    assert all(result.sources["prefill_token_us"] == "trace" for result in fits.values())
    assert width["joint"] <= width["quiet"] and width["joint"] <= width["busy"]


def test_a_joint_fit_counts_every_request_and_records_every_trace(fits, quiet_trace, busy_trace, tmp_path):
    """The joint profile's fit block lists both traces under ``traces``, counts the requests of
    both, and loads as a profile."""
    joint = fits["joint"]
    assert joint.statistics["requests"] == 600 and joint.statistics["requests_per_trace"] == [300, 300]
    path = write_profile(joint, tmp_path / "joint.yaml")
    block = load_profile(path)["fit"]
    assert block["traces"] == [f"{quiet_trace}.csv", f"{busy_trace}.csv"]
    assert "trace" not in block


def test_one_trace_in_a_list_fits_as_the_path(tmp_path):
    """A one-element list of traces gives the very profile the path gives."""
    trace = _small(tmp_path, rate=0.8, seed=9) / "trace"
    alone = write_profile(fit(trace, max_evaluations=5), tmp_path / "alone.yaml")
    listed = write_profile(fit([trace], max_evaluations=5), tmp_path / "listed.yaml")
    assert alone.read_bytes() == listed.read_bytes()
    assert yaml.safe_load(alone.read_text())["fit"]["trace"] == str(trace) + ".csv"


def test_traces_of_different_servers_are_refused(tmp_path):
    """Traces whose headers describe different servers are refused, naming both traces and the
    key that differs."""
    two = _small(tmp_path / "two", rate=0.8, seed=9) / "trace"
    four = _small(tmp_path / "four", rate=0.8, seed=9, n_parallel=4) / "trace"
    with pytest.raises(ValueError, match="different serving systems") as err:
        fit([two, four], max_evaluations=5)
    message = str(err.value)
    assert f"{two}.csv" in message and f"{four}.csv" in message and "server.max_num_seqs differ (2 and 4)" in message


def test_calibrate_fit_takes_several_traces(tmp_path, capsys):
    """``calibrate fit A B`` fits both traces in one profile that lists them, and writes the
    fitted model's comparison with each trace under ``--report``."""
    slow = _small(tmp_path / "slow", rate=0.5, seed=9)
    fast = _small(tmp_path / "fast", rate=1.2, seed=11)
    profile = tmp_path / "profile.yaml"
    assert main(["calibrate", "fit", str(slow), str(fast), "--out", str(profile), "--max-evaluations", "5",
                 "--report", str(tmp_path / "rep"), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert f"compared with {slow}" in out and f"compared with {fast}" in out
    data = yaml.safe_load(profile.read_text())
    assert data["fit"]["traces"] == [str(slow / "trace.csv"), str(fast / "trace.csv")]
    assert data["latency_model"]["params"]["decode_step_us"] == pytest.approx(SMALL["decode_step_us"], rel=0.02)
    for k in (1, 2):
        report = json.loads((tmp_path / "rep" / f"trace{k}" / "report.json").read_text())
        assert report["fit"]["traces"] == data["fit"]["traces"]


def test_calibrate_fit_refuses_traces_of_different_servers(tmp_path, capsys):
    """``calibrate fit A B`` of two different servers exits with status 2 and says why."""
    two = _small(tmp_path / "two", rate=0.8, seed=9)
    four = _small(tmp_path / "four", rate=0.8, seed=9, n_parallel=4)
    assert main(["calibrate", "fit", str(two), str(four), "--out", str(tmp_path / "p.yaml")]) == 2
    assert "describe different serving systems" in capsys.readouterr().err
