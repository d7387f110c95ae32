"""Identifiability: traces the simulator produced from known coefficients are fitted back to
those coefficients, and compared with their own scenario they give errors of zero."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.calibrate import compare, fit, simulated_observation, write_profile
from simpy_llm.calibrate.fit import _params, _vector, direct_estimate
from simpy_llm.loading import load_scenario, scenario_from_dict
from simpy_llm.serving.batch_table import BatchTableLatency

TRUTH = {
    "decode_step_us": [20000.0, 42000.0, 50000.0, 57000.0],
    "prefill_step_us": 8000.0,
    "prefill_only_step_us": 12000.0,
    "prefill_token_us": 3500.0,
    "alpha0_us": 3000.0,
}


def _scenario(engine: dict, truth: dict, rate: float = 0.35, requests: int = 300, seed: int = 3):
    return scenario_from_dict({
        "seed": seed,
        "workload": {"aggregate_rate": rate, "num_requests": requests, "clients": [{
            "id": "open", "arrival": {"process": "poisson"},
            "input_distribution": {"type": "lognormal", "params": {"mu": 5.0, "sigma": 0.8}},
            "output_distribution": {"type": "uniform", "params": {"low": 8, "high": 96}},
        }]},
        "serving": {"engine": engine, "latency_model": {"kind": "batch_table", "params": truth}},
    })


LLAMACPP = {"preset": "llamacpp", "n_parallel": 4, "ctx_per_slot": 4096, "cache_prompt": False}


def _assert_close(fitted: dict, truth: dict, rel: float) -> None:
    assert fitted["decode_step_us"] == pytest.approx(truth["decode_step_us"], rel=rel)
    for key in ("prefill_step_us", "prefill_only_step_us", "prefill_token_us", "alpha0_us"):
        assert fitted[key] == pytest.approx(truth[key], rel=rel), key


@pytest.fixture(scope="module")
def llamacpp_trace(tmp_path_factory) -> Path:
    """A simulated observation of a llama.cpp-like server (4 slots, 512-token forward passes,
    prompt checkpoints) with known coefficients."""
    out = tmp_path_factory.mktemp("llamacpp") / "trace"
    simulated_observation(_scenario(LLAMACPP, TRUTH), out)
    return out


def test_the_direct_estimate_recovers_known_coefficients(llamacpp_trace):
    """From the trace's structure alone (token gaps against the batch they imply, idle and
    joining requests), every coefficient comes back within 2 %."""
    params, stats = direct_estimate(llamacpp_trace, max_decoders=4, ubatch_tokens=512, prefill_breaks=(516, 4), budget_tokens=2048)
    _assert_close(params, TRUTH, rel=0.02)
    assert min(stats["pure_decode_gaps"].values()) > 100 and stats["mixed_steps"] > 100 and stats["idle_requests"] > 20


def test_fit_recovers_known_coefficients_and_writes_a_usable_profile(llamacpp_trace, tmp_path):
    """The whole fit (scenario from the trace header, direct estimate, refinement) gives the
    coefficients back within 2 %; the profile it writes runs in any scenario."""
    result = fit(llamacpp_trace, max_evaluations=30)
    _assert_close(result.params, TRUTH, rel=0.02)
    assert result.statistics["loss_refined"] <= result.statistics["loss_direct"] < 1e-3
    path = write_profile(result, tmp_path / "profile.yaml")
    data = yaml.safe_load(path.read_text())
    assert data["latency_model"]["kind"] == "batch_table" and data["fit"]["trace"].endswith("trace.csv")
    scenario = load_scenario("scenarios/quickstart.yaml", {"serving.latency_model": {"profile": str(path)}, "workload.num_requests": 50})
    assert Simulation(scenario).run(progress=False).summary()["requests"]["completed"] == 50


def test_a_vllm_style_engine_is_identified_too(tmp_path):
    """One forward pass per step, no prefill breaks, blocks of 16: the same estimator (told
    the engine's settings by the trace header) recovers another set of coefficients."""
    truth = {"decode_step_us": [9000.0, 9500.0, 10200.0, 11000.0, 11800.0, 12500.0, 13300.0, 14000.0],
             "prefill_step_us": 1500.0, "prefill_only_step_us": 6000.0, "prefill_token_us": 60.0, "alpha0_us": 800.0}
    engine = {"max_num_seqs": 8, "max_num_batched_tokens": 4096, "kv_block_size": 16, "kv_num_blocks": 4096, "prefix_caching": False}
    simulated_observation(_scenario(engine, truth, rate=5.0, requests=600), tmp_path / "trace")
    result = fit(tmp_path / "trace", refine=False)
    _assert_close(result.params, truth, rel=0.02)


def test_comparing_a_trace_with_its_own_scenario_gives_zero_error(llamacpp_trace):
    """The scenario the header describes replays the simulated observation exactly: MAPE 0,
    r 1, KS distance 0 on every metric, rated excellent."""
    cal = compare(llamacpp_trace, n_resamples=100)
    for name, m in cal.metrics.items():
        assert m.n > 250, name
        assert m.mape == 0.0 and m.ks_statistic == 0.0 and m.rating == "excellent", (name, m)
    assert cal.report.request_summary["calibrated"] == 300


def test_the_fit_is_deterministic(llamacpp_trace):
    """The same trace gives the same profile, byte for byte (no random start, no clock)."""
    a, b = fit(llamacpp_trace, max_evaluations=10), fit(llamacpp_trace, max_evaluations=10)
    assert yaml.safe_dump(a.profile()) == yaml.safe_dump(b.profile())


def test_a_trace_without_token_times_cannot_be_fitted(tmp_path):
    """Unstreamed requests carry no token gaps: the fit says so instead of guessing."""
    s = _scenario(LLAMACPP, TRUTH, requests=20)
    s = s.replace(**{"workload.clients.0.streaming": False})
    simulated_observation(s, tmp_path / "trace")
    with pytest.raises(ValueError, match="no streamed requests with token times"):
        fit(tmp_path / "trace")


def test_a_candidate_with_no_prompt_cost_keeps_the_per_token_floor():
    """When the direct estimate (or the search) puts both prompt terms at or below their floor,
    the candidate keeps the per-token term at its floor (1 µs) instead of 0, so every candidate
    is a valid model (a short live run once gave both as 0 and the fit raised); with a
    per-step cost the per-token term may be 0."""
    direct = {"decode_step_us": [20_000.0, 25_000.0], "prefill_step_us": 0.0, "prefill_token_us": 0.0,
              "prefill_only_step_us": 0.0, "decode_context_us": 0.0, "prefill_pair_us": 0.0, "alpha0_us": 0.0,
              "cache_restore_us": 0.0}
    names, x = _vector(direct)
    params = _params(names, x, direct)
    assert params["prefill_step_us"] == 0.0 and params["prefill_token_us"] == pytest.approx(1.0)
    BatchTableLatency(**params)
    with_step = x.copy()
    with_step[names.index("prefill_step_us")] = math.log(5_000.0)  # a per-step cost alone is a valid model
    assert _params(names, with_step, direct)["prefill_token_us"] == 0.0
