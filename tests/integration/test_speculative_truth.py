"""Speculative decoding against closed forms (``docs/speculative.md``, "What is checked").

Every expectation here is computed by hand from the curve's probabilities and the
latency model's coefficients (or a LUT row read off the CSV in the test), never by
the code under test.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.policies.gamma import gamma_policies
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_S, BETA2_S = 5e-3, 200e-6
"""The default latency model of ``spec_scenario``: 5 ms per step, 200 µs per decode token."""


def _run(data):
    sim = Simulation(scenario_from_dict(data))
    return sim, sim.run(progress=False)


def _closed_form_tokens(p: list[float], gamma: int) -> float:
    """E[tokens per round] = 1 + sum_i prod_{j <= i} p_j."""
    return 1.0 + sum(math.prod(p[: i + 1]) for i in range(gamma))


@pytest.mark.parametrize(
    ("p", "gamma"),
    [((0.9, 0.8, 0.7, 0.6), 4), ((0.5, 0.5, 0.5, 0.5), 3), ((0.95, 0.3, 0.9, 0.9), 2), ((0.7, 0.7, 0.7, 0.7), 1)],
)
def test_mean_tokens_per_round_match_the_closed_form(tmp_path, p, gamma):
    """Over ~20k sampled rounds, the mean tokens a round adds is 1 + sum prod p_j within 1 %.

    Error analysis: tokens per round lie in [1, γ + 1], so their standard deviation is at
    most γ/2 <= 2; over n >= 15,000 uncapped rounds the standard error of the mean is
    below 2/122 = 0.016, under 0.6 % of the smallest expectation here (2.0 at γ = 1... 1.7):
    the 1 % band is more than 1.7 standard errors for the worst case and ~5 for the rest,
    and the seed is fixed.
    """
    curve = flat_curve(tmp_path, list(p))
    data = spec_scenario(
        curve, requests=300, rate=50.0, output=201, devices=30,
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": gamma}}},
    )
    _sim, results = _run(data)
    rounds = results.spec_rounds()
    full = rounds[rounds["gamma"] == gamma]  # the last round of a request may be capped
    assert len(full) > 15_000
    mean = float((full["accepted"] + 1).mean())
    expected = _closed_form_tokens(list(p), gamma)
    assert mean == pytest.approx(expected, rel=0.01)
    # The summary's figure is the same quantity over every round (capped ones included).
    assert results.summary()["speculation"]["rounds"] == len(rounds)


def _lut(tmp_path, verify_ms: float, fanout: int) -> str:
    """A LUT flat in context: prefill 30 ms, decode 8 ms, verify *verify_ms* at *fanout*."""
    header = "phase,model,hardware,tensor_parallel,pipeline_parallel,context_len,microbatch,fanout_k,dtype,latency_ms"
    rows = [header]
    for phase, k, ms in (("prefill", 1, 30.0), ("decode", 1, 8.0), ("verify", fanout, verify_ms)):
        for ctx in (64, 100_000):
            for mb in (1, 64):
                rows.append(f"{phase},m,g,1,1,{ctx},{mb},{k},fp16,{ms}")
    path = tmp_path / "lut.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("rtt_ms", [0.0, 30.0])
def test_an_isolated_requests_time_per_token_is_round_time_over_expected_tokens(tmp_path, rtt_ms):
    """With the LUT's verify row v, drafting d per token, round trip r and no queueing, the
    time per output token is (γ d + r + v) / E[tokens] within 1 % (expected acceptance).

    One device runs one request at a time, so nothing queues; ``acceptance_sampling:
    expected`` makes every round yield exactly E tokens (fractions carried). The only
    departure from the formula is the request's last round, capped at the tokens left:
    one round in ~330 of a 1,001-token answer, well inside 1 %.
    """
    p, gamma, d_ms, v_ms = [0.8, 0.7, 0.6, 0.5], 4, 10.0, 12.0
    curve = flat_curve(tmp_path, p)
    data = spec_scenario(
        curve, requests=3, rate=0.01, output=1001, devices=1, draft_token_ms=d_ms,
        network={"rtt_ms": rtt_ms} if rtt_ms else None,
        latency={"kind": "lut", "params": {"path": _lut(tmp_path, v_ms, gamma), "model": "m", "hardware": "g"}},
        speculation={"acceptance_sampling": "expected", "gamma_policy": {"kind": "static", "params": {"gamma": gamma}}},
    )
    _sim, results = _run(data)
    frame = results.to_dataframe()
    e = _closed_form_tokens(p, gamma)
    expected = (gamma * d_ms + rtt_ms + v_ms) / 1e3 / e
    assert np.allclose(frame["tpot_s"], expected, rtol=0.01)
    # Prefill: the LUT's flat 30 ms row, after the prompt's upload (half the round trip).
    assert np.allclose(frame["ttft_s"], 0.030)
    assert np.allclose(frame["upload_s"], rtt_ms / 2e3)


def test_fused_with_free_drafts_and_full_acceptance_is_decoding_gamma_plus_one_tokens_per_step(tmp_path):
    """Fused, drafting free and every draft accepted: each step makes γ + 1 tokens and costs a
    decode step of γ + 1 tokens, beta0 + beta2 (γ + 1); the last step is capped at the tokens
    left. The decode time matches that sum to 1e-9 for every request."""
    gamma, output = 3, 50
    curve = flat_curve(tmp_path, [1.0, 1.0, 1.0, 1.0])
    data = spec_scenario(
        curve, requests=4, rate=0.01, output=output, devices=1,
        speculation={
            "mode": "fused", "fused": {"draft_token_ms": 0.0, "acceptance": curve},
            "gamma_policy": {"kind": "static", "params": {"gamma": gamma}},
        },
    )
    _sim, results = _run(data)
    left, total = output - 1, 0.0
    while left > 0:
        g = min(gamma, left - 1)
        total += BETA0_S + BETA2_S * (g + 1)
        left -= g + 1
    frame = results.to_dataframe()
    assert (frame["spec_mode"] == "fused").all()
    assert np.allclose(frame["completion_s"] - frame["first_token_s"], total, rtol=0, atol=1e-9)
    assert (frame["drafted_tokens"] == frame["accepted_tokens"]).all()


@pytest.mark.parametrize("selector", [{"kind": "latency"}, {"kind": "rtt_load_adaptive"}])
def test_hybrid_never_runs_distributed_over_a_huge_round_trip(tmp_path, selector):
    """With a 100 s round trip to the drafts and a fused path that meets the SLO, hybrid runs
    every request fused (and every request meets its TPOT target)."""
    curve = flat_curve(tmp_path, [0.8, 0.8, 0.8, 0.8])
    data = spec_scenario(
        curve, requests=40, rate=2.0, output=40, network={"rtt_ms": 100_000.0},
        speculation={"mode": "hybrid", "mode_selector": selector, "fused": {"draft_token_ms": 2.0, "acceptance": curve}},
    )
    data["slo"] = {"default": {"tpot_s": 0.05}}
    _sim, results = _run(data)
    frame = results.to_dataframe()
    assert (frame["spec_mode"] == "fused").all()
    assert results.summary()["goodput"]["fraction"] == 1.0


def test_hybrid_runs_distributed_when_the_drafts_are_near_and_fast(tmp_path):
    """The ``latency`` selector is not a constant: with no round trip, 1 ms drafting on the
    device and a far better device drafter, every request runs distributed."""
    good, poor = flat_curve(tmp_path, [0.9] * 4, "good"), flat_curve(tmp_path, [0.1] * 4, "poor")
    data = spec_scenario(
        good, requests=20, rate=2.0, output=40, draft_token_ms=1.0,
        speculation={"mode": "hybrid", "mode_selector": {"kind": "latency"}, "fused": {"draft_token_ms": 5.0, "acceptance": poor}},
    )
    _sim, results = _run(data)
    assert (results.to_dataframe()["spec_mode"] == "distributed").all()


SCRIPT = (1, 3, 2, 4, 4, 1, 2)


@attrs.define
class _Scripted:
    """Plays :data:`SCRIPT` (test only)."""

    _i: int = 0

    def next_gamma(self, state):
        g = SCRIPT[self._i % len(SCRIPT)]
        self._i += 1
        return g


@pytest.fixture
def scripted_policy():
    """``scripted_test`` registered for one test (the registry is global)."""
    gamma_policies.register("scripted_test")(_Scripted)
    yield
    gamma_policies._items.pop("scripted_test")  # noqa: SLF001 - undo the registration


@pytest.mark.usefixtures("scripted_policy")
def test_each_round_uses_the_gamma_its_policy_chose(tmp_path):
    """A custom registered policy's γ sequence is exactly the rounds' γ (until the cap at the
    end of the answer), one policy object per request."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    data = spec_scenario(curve, requests=3, rate=0.01, output=30, devices=1,
                         speculation={"gamma_policy": {"kind": "scripted_test"}})
    _sim, results = _run(data)
    rounds = results.spec_rounds()
    for _rid, rows in rounds.groupby("request_id"):
        left = 30 - (rows["context_tokens"] - 128)  # tokens still to make before each round
        expected = [min(SCRIPT[i % len(SCRIPT)], n - 1) for i, n in enumerate(left)]
        assert rows["gamma"].tolist() == expected


def test_first_token_verification_rolls_back_exactly_the_late_rejections(tmp_path):
    """``partial: first_token`` verifies position 1 only: a round rolls back iff its rejection
    fell on a later position (1 <= accepted < γ); each costs the penalty once."""
    curve = flat_curve(tmp_path, [0.7] * 4)
    data = spec_scenario(
        curve, requests=60, rate=5.0, output=60,
        speculation={"verify": {"partial": "first_token", "rollback_penalty_ms": 3.0},
                     "gamma_policy": {"kind": "static", "params": {"gamma": 4}}},
    )
    _sim, results = _run(data)
    rounds = results.spec_rounds()
    late = (rounds["accepted"] >= 1) & (rounds["accepted"] < rounds["gamma"])
    assert late.sum() > 100
    assert (rounds["rollback"] == late.astype(int)).all()
    spec = results.summary()["speculation"]
    assert spec["rollbacks"] == int(late.sum())
    assert spec["rollback_s"] == pytest.approx(late.sum() * 3e-3)


@pytest.mark.parametrize(
    ("verify", "checked"),
    [
        ({"partial": "first_token"}, lambda g: min(g, 1)),
        ({"partial": "sampled", "sample_rate": 0.0}, lambda g: min(g, 1)),
        ({"partial": "sampled", "sample_rate": 1.0}, lambda g: g),
        ({"partial": "all"}, lambda g: g),
    ],
    ids=["first_token", "sampled_none", "sampled_all", "all"],
)
def test_a_pass_costs_the_positions_it_verifies(tmp_path, verify, checked):
    """With every draft accepted (no rollback), a pass verifying v positions costs a decode
    step of v + 1 tokens: an isolated request's rounds take γ d + beta0 + (v + 1) beta2 each,
    v = 1 for ``first_token`` (and ``sampled`` at rate 0), γ for ``all`` (and rate 1)."""
    gamma, d_ms, output = 4, 10.0, 48
    curve = flat_curve(tmp_path, [1.0] * 4)
    data = spec_scenario(
        curve, requests=2, rate=0.01, output=output, devices=1, draft_token_ms=d_ms,
        speculation={"verify": verify, "gamma_policy": {"kind": "static", "params": {"gamma": gamma}}},
    )
    _sim, results = _run(data)
    left, total = output - 1, 0.0
    while left > 0:
        g = min(gamma, left - 1)  # 47 tokens after the first: the last round is capped at γ = 1
        total += g * d_ms / 1e3 + BETA0_S + BETA2_S * (checked(g) + 1)
        left -= g + 1
    frame = results.to_dataframe()
    assert np.allclose(frame["completion_s"] - frame["first_token_s"], total, rtol=0, atol=1e-9)


def test_a_device_runs_its_requests_closed_loop_with_think_time(tmp_path):
    """Two devices, four simultaneous requests: device k runs requests k and k + 2 (round
    robin), the second starting exactly its device's first one's end plus the 1.5 s think
    time; ``draft_wait_s`` is that wait."""
    curve = flat_curve(tmp_path, [0.5] * 4)
    data = spec_scenario(curve, requests=4, rate=1e6, output=20, devices=2,
                         group={"think_time": {"type": "constant", "params": {"value": 1.5}}})
    _sim, results = _run(data)
    f = results.to_dataframe().set_index("request_id")
    assert f["draft_device"].tolist() == [0, 1, 0, 1]
    for first, second in ((0, 2), (1, 3)):
        sent = f.loc[second, "arrival_s"] - f.loc[second, "upload_s"]
        assert sent == pytest.approx(f.loc[first, "completion_s"] + 1.5, abs=1e-12)
        assert f.loc[second, "draft_wait_s"] == pytest.approx(sent, abs=1e-4)  # it arrived within µs of 0
    assert (f.loc[[0, 1], "draft_wait_s"] == 0).all()


def test_a_session_stays_on_its_device(tmp_path):
    """Every round of a multi-turn session runs on the device its first round was bound to."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    data = spec_scenario(curve, requests=30, rate=5.0, output=10, devices=3)
    client = data["workload"]["clients"][0]
    client["multi_turn"] = {"max_rounds": 3, "think_time": {"type": "constant", "params": {"value": 0.5}}}
    _sim, results = _run(data)
    f = results.to_dataframe()
    sessions = f[f["session_id"] != ""].groupby("session_id")["draft_device"].nunique()
    assert len(sessions) > 5
    assert (sessions == 1).all()


def test_a_failing_drafter_escalates_to_the_next(tmp_path):
    """A drafter whose acceptance (0.05) drags the smoothed rate under ``escalate_below``
    hands the request to the next drafter; later rounds use it, and the switch is recorded."""
    poor, good = flat_curve(tmp_path, [0.05] * 4, "poor"), flat_curve(tmp_path, [0.9] * 4, "good")
    data = spec_scenario(poor, requests=10, rate=1.0, output=60, group={
        "escalate_below": 0.3,
        "drafters": [{"name": "tiny", "acceptance": poor, "draft_token_ms": 2.0},
                     {"name": "large", "acceptance": good, "draft_token_ms": 8.0}],
    })
    _sim, results = _run(data)
    switches = results.drafter_switches()
    assert len(switches) == 10
    assert (switches["from_drafter"] == "tiny").all() and (switches["to_drafter"] == "large").all()
    rounds = results.spec_rounds().merge(switches[["request_id", "time_s"]], on="request_id", suffixes=("", "_switch"))
    after = rounds[rounds["time_s"] > rounds["time_s_switch"]]
    assert (after["drafter"] == "large").all() and len(after) > 0
    assert (results.to_dataframe()["drafter"] == "large").all()


def test_the_kv_guard_admits_a_request_only_when_its_tokens_fit(tmp_path):
    """A target whose KV holds one request's prompt and output runs them one after another:
    each request's prefill starts no earlier than the previous request's completion."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    data = spec_scenario(curve, requests=5, rate=1e6, prompt=128, output=64, devices=5,
                         engine={"max_num_seqs": 64, "max_num_batched_tokens": 192, "kv_block_size": 16, "kv_num_blocks": 12})
    _sim, results = _run(data)
    f = results.to_dataframe().sort_values("first_scheduled_s")
    assert (f["first_scheduled_s"].to_numpy()[1:] >= f["completion_s"].to_numpy()[:-1] - 1e-12).all()
    assert (f["status"] == "completed").all()


def test_a_rejected_prompt_frees_its_draft_device(tmp_path):
    """An admission policy's rejection is a drop the device hears of at once: it goes on to
    its next request, and every request ends completed or dropped (none stays in flight)."""
    curve = flat_curve(tmp_path, [0.6] * 4)
    data = spec_scenario(curve, requests=60, rate=1e6, output=40, devices=10)
    data["serving"]["admission"] = {"kind": "max_queue", "params": {"max_waiting": 1}}
    _sim, results = _run(data)
    f = results.to_dataframe()
    assert set(f["status"]) <= {"completed", "dropped"}
    assert (f["status"] == "dropped").sum() > 0
    assert (f.loc[f["status"] == "dropped", "dropped_reason"] != "").all()


def test_a_rounds_tokens_reach_the_client_together(tmp_path):
    """A streaming request's inter-token gaps come round by round: each round's first token
    follows the previous round's by a positive gap, its other tokens by zero; so the ITL
    tally holds one positive gap per round and (tokens - 1) zero gaps per round, in all
    output - 1 gaps per request."""
    data = spec_scenario(flat_curve(tmp_path, [0.9, 0.8, 0.7, 0.6]), requests=40, rate=10.0, output=50)
    sim, results = _run(data)
    rounds = results.spec_rounds()
    values, weights = sim.recorder.itl.arrays()
    assert int(weights[values > 0].sum()) == len(rounds)
    assert int(weights[values == 0].sum()) == int((rounds["tokens"] - 1).sum()) > 0
    assert int(weights.sum()) == int((results.to_dataframe()["output_tokens"] - 1).sum())
