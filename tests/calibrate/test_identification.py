"""Which coefficients a trace determines: traces the simulator made from known coefficients,
with each step's time scaled by random noise (``noisy_traces``), fitted and checked against
the truth; overloaded traces; a decode table that falls; the priors and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simpy_llm.calibrate import fit, simulated_observation, write_profile
from simpy_llm.calibrate.batch_steps import DEFAULTS_US
from simpy_llm.calibrate.fit import direct_estimate
from simpy_llm.cli import main
from simpy_llm.config import ScenarioError
from simpy_llm.loading import scenario_from_dict
from tests.calibrate.noisy_traces import warp_trace

TRUTH = {
    "decode_step_us": [20000.0, 42000.0, 50000.0, 57000.0],
    "prefill_step_us": 8000.0,
    "prefill_only_step_us": 12000.0,
    "prefill_token_us": 3500.0,
    "alpha0_us": 3000.0,
    "prefill_pair_us": 0.5,
}
"""A llama.cpp-like server on a CPU: 3.5 ms per prompt token and 0.5 µs per attention pair."""

PRIOR = {
    "profile_version": 1,
    "latency_model": {"kind": "batch_table", "params": {
        "decode_step_us": [21000.0, 44000.0, 52000.0, 60000.0], "prefill_step_us": 9000.0, "prefill_token_us": 3400.0,
        "prefill_only_step_us": 11000.0, "alpha0_us": 2500.0, "prefill_pair_us": 0.44}},
    "fit": {"method": "probe", "intervals": {"prefill_pair_us": [0.40, 0.48]}},
}
"""What a probe of the same server gives (single requests of 50 to 1,600 prompt tokens)."""


def _observe(out: Path, *, low: int, high: int, rate: float, cv: float, seed: int = 3, truth: dict = TRUTH,
             requests: int = 300) -> Path:
    """A noisy observation of an open-loop workload with prompts uniform in [low, high] tokens."""
    scenario = scenario_from_dict({
        "seed": seed,
        "workload": {"aggregate_rate": rate, "num_requests": requests, "clients": [{
            "id": "open", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "uniform", "params": {"low": low, "high": high}},
            "output_distribution": {"type": "uniform", "params": {"low": 8, "high": 96}},
        }]},
        "serving": {"engine": {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 4096, "cache_prompt": False},
                    "latency_model": {"kind": "batch_table", "params": truth}},
    })
    simulated_observation(scenario, out / "exact")
    if not cv:
        return out / "exact"
    return warp_trace(out / "exact", out / "trace", cv=cv, seed=seed)


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory) -> Path:
    """Prompts of 20-120 tokens, 5 % noise per step: 120 tokens make 7,260 pairs, 3.6 ms of
    attention against 420 ms of prompt, far below the noise."""
    return _observe(tmp_path_factory.mktemp("short"), low=20, high=120, rate=0.2, cv=0.05)


@pytest.fixture(scope="module")
def wide_trace(tmp_path_factory) -> Path:
    """Prompts of 20-1,600 tokens, 2 % noise per step: 1,600 tokens make 1.28 million pairs,
    0.64 s of attention against 5.6 s of prompt."""
    return _observe(tmp_path_factory.mktemp("wide"), low=20, high=1600, rate=0.12, cv=0.02)


@pytest.fixture(scope="module")
def prior_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "profile.yaml"
    path.write_text(yaml.safe_dump(PRIOR))
    return path


@pytest.fixture(scope="module")
def short_with_prior(short_trace, prior_file):
    """The short trace fitted with the probe's profile as priors (refined briefly)."""
    return fit(short_trace, priors=prior_file, max_evaluations=20)


def test_an_undetermined_attention_term_comes_from_the_prior(short_with_prior, prior_file):
    """Over short prompts the per-pair term is undetermined: it takes the prior's value exactly
    (the refinement does not move it) and the prior's interval, and the profile says where it
    came from and which priors were used."""
    result = short_with_prior
    assert result.params["prefill_pair_us"] == PRIOR["latency_model"]["params"]["prefill_pair_us"]
    assert result.sources["prefill_pair_us"] == "prior" and list(result.intervals["prefill_pair_us"]) == [0.40, 0.48]
    fit_block = result.profile()["fit"]
    assert fit_block["sources"]["prefill_pair_us"] == "prior"
    assert fit_block["priors"] == {"source": str(prior_file), "method": "probe"}
    # the per-token term is pinned, the truth inside its interval
    low, high = result.intervals["prefill_token_us"]
    assert result.sources["prefill_token_us"] == "trace" and low <= TRUTH["prefill_token_us"] <= high


def test_without_priors_an_undetermined_term_takes_its_documented_default(short_trace):
    """With no priors the same term is held at its documented default, 0 (source default),
    instead of wherever the estimate put it."""
    direct, _ = direct_estimate(short_trace, max_decoders=4, ubatch_tokens=512, prefill_breaks=(516, 4), budget_tokens=2048)
    assert direct["prefill_pair_us"] > 0  # the estimate finds some attention cost in the noise
    result = fit(short_trace, refine=False)
    assert result.params["prefill_pair_us"] == DEFAULTS_US["prefill_pair_us"] == 0.0
    assert result.sources["prefill_pair_us"] == "default" and result.intervals["prefill_pair_us"] is None


def test_a_chained_fit_still_warns_of_the_first_priors_evidence(short_trace, wide_trace, tmp_path):
    """A coefficient held at its prior's value keeps the prior's interval in the profile, so a
    second fit that takes that profile as its priors still warns when its own trace contradicts
    the first priors' evidence: a probe's attention term of 0.20-0.25 µs carried by a fit of short
    prompts, then contradicted by the wide prompts (truth 0.5 µs)."""
    probe = {**PRIOR, "latency_model": {"kind": "batch_table", "params": {
        **PRIOR["latency_model"]["params"], "prefill_pair_us": 0.22}}, "fit": {"method": "probe", "intervals": {
        "prefill_pair_us": [0.20, 0.25]}}}
    first = fit(short_trace, priors=probe, refine=False)
    assert first.sources["prefill_pair_us"] == "prior" and list(first.intervals["prefill_pair_us"]) == [0.20, 0.25]
    write_profile(first, tmp_path / "first.yaml")
    second = fit(wide_trace, priors=tmp_path / "first.yaml", refine=False)
    assert second.sources["prefill_pair_us"] == "trace"
    assert [w for w in second.warnings if w.startswith("prior disagrees with the trace: prefill_pair_us is")
            and "0.2-0.25 µs in the prior" in w]


def test_a_wide_prompt_range_determines_the_attention_term(wide_trace, prior_file):
    """Over prompts up to 1,600 tokens the same term is determined: it comes from the trace,
    whatever the priors say, and its 95 % interval holds the truth."""
    result = fit(wide_trace, priors=prior_file, refine=False)
    assert result.sources["prefill_pair_us"] == "trace"
    low, high = result.intervals["prefill_pair_us"]
    assert low <= TRUTH["prefill_pair_us"] <= high and high <= 4 * low
    assert result.params["prefill_pair_us"] != PRIOR["latency_model"]["params"]["prefill_pair_us"]


def test_the_fit_report_lists_where_each_coefficient_came_from(short_trace, prior_file, tmp_path, capsys):
    """``calibrate fit --priors P --report DIR`` prints each coefficient's value, interval and
    source, and the report it writes says the attention term came from the prior."""
    profile = tmp_path / "profile.yaml"
    assert main(["calibrate", "fit", str(short_trace), "--out", str(profile), "--priors", str(prior_file), "--no-refine",
                 "--report", str(tmp_path / "rep"), "--resamples", "20"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("prefill_pair_us"))
    assert row.split()[1] == "0.44" and row.split()[-1] == "prior"
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["fit"]["sources"]["prefill_pair_us"] == "prior"
    assert report["fit"]["priors"]["source"] == str(prior_file)
    assert yaml.safe_load(profile.read_text())["fit"]["sources"]["prefill_pair_us"] == "prior"


def test_priors_must_be_a_batch_table_profile(short_trace, tmp_path):
    """A priors file of another kind, or one that does not exist, is an error naming the file
    and the key, before any fitting."""
    other = tmp_path / "blis.yaml"
    other.write_text(yaml.safe_dump({"latency_model": {"kind": "blis_linear", "params": {}}}))
    with pytest.raises(ScenarioError, match=r"blis.yaml.*\n.*latency_model.kind: priors must be a batch_table profile"):
        fit(short_trace, priors=other)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"latency_model": {"kind": "batch_table", "params": {"prefill_pair_us": -1}}}))
    with pytest.raises(ScenarioError, match=r"latency_model.params.prefill_pair_us: must be a number >= 0"):
        fit(short_trace, priors=bad)
    with pytest.raises(ScenarioError, match="cannot read profile"):
        fit(short_trace, priors=tmp_path / "missing.yaml")


@pytest.fixture(scope="module")
def overloaded_trace(tmp_path_factory) -> Path:
    """2 requests/s on 4 slots that serve about one: from the second request on, every request
    is sent while others are in flight."""
    truth = {k: v for k, v in TRUTH.items() if k != "prefill_pair_us"}
    return _observe(tmp_path_factory.mktemp("overloaded"), low=20, high=300, rate=2.0, cv=0.0, truth=truth, requests=150)


def test_an_overloaded_trace_cannot_give_the_base_costs(overloaded_trace):
    """No request found an idle server: the direct estimate takes alpha0 from the smallest
    queue wait (seconds, not the 3 ms of the truth); the fit says first that the base costs
    cannot be determined and holds both at their defaults."""
    direct, stats = direct_estimate(overloaded_trace, max_decoders=4, ubatch_tokens=512, prefill_breaks=(516, 4), budget_tokens=2048)
    assert stats["idle_requests"] == 0 and direct["alpha0_us"] > 100 * TRUTH["alpha0_us"]
    result = fit(overloaded_trace, refine=False)
    assert result.warnings[0].startswith("overloaded trace: no request found an idle server")
    assert "alpha0_us and prefill_only_step_us cannot be determined" in result.warnings[0]
    assert (result.params["alpha0_us"], result.params["prefill_only_step_us"]) == (0.0, 0.0)
    assert result.sources["alpha0_us"] == result.sources["prefill_only_step_us"] == "default"


def test_an_overloaded_trace_takes_the_base_costs_from_the_priors(overloaded_trace, prior_file, tmp_path, capsys):
    """With priors the base costs come from them, the warning says so, and the report of
    ``calibrate fit --report`` opens with it, on the terminal and in report.md."""
    result = fit(overloaded_trace, priors=prior_file, refine=False)
    params = PRIOR["latency_model"]["params"]
    assert (result.params["alpha0_us"], result.params["prefill_only_step_us"]) == (params["alpha0_us"], params["prefill_only_step_us"])
    assert result.sources["alpha0_us"] == "prior" and result.warnings[0].endswith("they come from the priors")
    assert main(["calibrate", "fit", str(overloaded_trace), "--out", str(tmp_path / "p.yaml"), "--no-refine",
                 "--report", str(tmp_path / "rep"), "--resamples", "20"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if line.startswith("fit warning:"))
    assert lines[first - 1].startswith("prefill_pair_us")  # the coefficients' last row: the report begins here
    assert lines[first].startswith("fit warning: overloaded trace: no request found an idle server")
    lines = (tmp_path / "rep" / "report.md").read_text().splitlines()
    assert lines[0] == "# Calibration report"
    assert lines[2].startswith("> **Fit warning:** overloaded trace: no request found an idle server")


def test_a_decode_step_that_falls_with_more_decoders_is_warned_of(tmp_path):
    """A server whose step of 4 decoders takes less than its step of 3 (40 against 50 ms) gives
    a table the fit reports as it is, with a warning naming both entries."""
    truth = {**{k: v for k, v in TRUTH.items() if k != "prefill_pair_us"}, "decode_step_us": [20000.0, 42000.0, 50000.0, 40000.0]}
    trace = _observe(tmp_path, low=20, high=300, rate=0.35, cv=0.0, truth=truth, requests=200)
    result = fit(trace, refine=False)
    d3, d4 = result.intervals["decode_step_us"][2:]
    assert d4[1] < d3[0]
    warning = next(w for w in result.warnings if w.startswith("decode step not increasing"))
    assert "D(4) = 40.0 ms" in warning and "below D(3) = 50.0 ms" in warning


def test_a_written_profile_keeps_intervals_sources_and_ranges(short_with_prior, tmp_path):
    """The profile file holds the contract's keys (method, intervals, sources, priors, ranges,
    warnings) and loads back; its decode entries have one interval and one source each."""
    from simpy_llm.config.profile import load_profile

    data = load_profile(write_profile(short_with_prior, tmp_path / "p.yaml"))
    block = data["fit"]
    assert block["method"] == "direct+nelder-mead"
    assert set(block["intervals"]) == set(block["sources"]) == {
        "decode_step_us", "prefill_step_us", "prefill_token_us", "prefill_only_step_us", "alpha0_us", "cache_restore_us",
        "decode_context_us", "prefill_pair_us"}
    assert len(block["intervals"]["decode_step_us"]) == len(block["sources"]["decode_step_us"]) == 4
    assert block["ranges"]["prompt_tokens"][0] >= 20 and block["ranges"]["prompt_tokens"][1] <= 120
    assert block["ranges"]["decoders"] == [1, 4] and isinstance(block["warnings"], list)


def test_a_prior_the_trace_rules_out_is_moved_and_warned_of(short_trace, tmp_path):
    """A prior from another server: its alpha0 (2 s) lies above every value the trace allows,
    so alpha0 is held at the largest it allows instead (source trace) with a warning; its
    per-token cost's interval (100-200 µs) misses the trace's, which is used, with a warning."""
    prior = {"profile_version": 1, "latency_model": {"kind": "batch_table", "params": {
        "decode_step_us": [21000.0], "prefill_token_us": 150.0, "alpha0_us": 2_000_000.0, "prefill_pair_us": 0.44}},
        "fit": {"method": "probe", "intervals": {"prefill_token_us": [100.0, 200.0]}}}
    path = tmp_path / "other_server.yaml"
    path.write_text(yaml.safe_dump(prior))
    result = fit(short_trace, priors=path, refine=False)
    assert result.sources["alpha0_us"] == "trace" and result.intervals["alpha0_us"] is None
    assert 0 < result.params["alpha0_us"] < 100_000
    held = next(w for w in result.warnings if w.startswith("alpha0_us is not determined by this trace"))
    assert f"held at {result.params['alpha0_us']:.6g} µs" in held and "rather than the prior 2e+06 µs, which it rules out" in held
    low, high = result.intervals["prefill_token_us"]
    assert result.sources["prefill_token_us"] == "trace" and low <= TRUTH["prefill_token_us"] <= high
    assert (f"prior disagrees with the trace: prefill_token_us is {low:.6g}-{high:.6g} µs here (95 % interval), "
            "100-200 µs in the prior") in result.warnings[-1]
    assert result.params["prefill_pair_us"] == 0.44 and result.sources["prefill_pair_us"] == "prior"


def test_without_identification_the_profile_has_no_intervals_or_sources(short_trace):
    """identify=False fits every coefficient as the estimate gives it (the attention term too,
    undetermined as it is) and leaves intervals and sources out of the profile (unknown)."""
    result = fit(short_trace, refine=False, identify=False)
    direct, _ = direct_estimate(short_trace, max_decoders=4, ubatch_tokens=512, prefill_breaks=(516, 4), budget_tokens=2048)
    assert result.params == direct
    assert result.intervals is None and result.sources is None
    assert "intervals" not in result.profile()["fit"] and "sources" not in result.profile()["fit"]
    assert result.statistics["identification_replays"] == 0


def test_calibrate_fit_with_a_missing_priors_file_fails_cleanly(short_trace, tmp_path, capsys):
    """``--priors`` naming no file: exit status 2, the file named, no profile written."""
    assert main(["calibrate", "fit", str(short_trace), "--out", str(tmp_path / "p.yaml"), "--priors",
                 str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err and not (tmp_path / "p.yaml").exists()
