"""The ``pid`` and ``bandit`` γ controllers in whole runs, against closed forms of the curve.

One device runs its requests one at a time against one target whose verify pass takes
``beta0`` whatever its size (``beta2 = 0``), so nothing queues and a round of γ drafts takes
exactly ``γ d + rtt + beta0``. Every expectation is computed here from the curve's
probabilities and those figures; the runs' rounds are read from the spec-round table.
"""

from __future__ import annotations

import math

import pytest

from simpy_llm import Simulation, scenario_from_dict
from tests.spec_helpers import flat_curve, spec_scenario

VERIFY_MS = 5.0
"""The verify pass, ms (``beta0``; no per-token term)."""


def _rounds(tmp_path, p, policy, *, requests, output, draft_token_ms=10.0, rtt_ms=0.0, seed=1):
    curve = flat_curve(tmp_path, list(p))
    data = spec_scenario(
        curve, requests=requests, rate=100.0, output=output, devices=1, draft_token_ms=draft_token_ms,
        network={"rtt_ms": rtt_ms} if rtt_ms else None,
        latency={"kind": "blis_linear", "params": {"beta0_us": VERIFY_MS * 1e3, "beta1_us": 50.0}},
        speculation={"k_max": len(p), "gamma_policy": policy}, seed=seed,
    )
    results = Simulation(scenario_from_dict(data)).run(progress=False)
    return results.spec_rounds()


def _expected_accepted(p, gamma: int) -> float:
    """E[accepted drafts] of a round of *gamma* drafts: sum_i prod_{j <= i} p_j."""
    return sum(math.prod(p[: i + 1]) for i in range(gamma))


def test_pid_comes_to_rest_where_the_acceptance_ratio_meets_the_setpoint(tmp_path):
    """Drafts accepted up to γ = 3 and never beyond: the ratio is 1 up to 3 and 3/γ above, so the
    setpoint 0.6 is met at γ = 5 alone. Starting at γ = 2, every request's rounds settle there: the
    last 40 rounds before the end of the answer all run γ = 5 and accept 3 drafts."""
    p = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    setpoint = 0.6
    (rest,) = [g for g in range(1, 7) if _expected_accepted(p, g) / g == setpoint]
    policy = {"kind": "pid", "params": {"setpoint": setpoint, "kp": 1.0, "ki": 1.0, "default_gamma": 2}}
    rounds = _rounds(tmp_path, p, policy, requests=3, output=400)
    for _rid, rows in rounds.groupby("request_id"):
        assert rows["gamma"].iloc[0] == 2
        settled = rows.iloc[-41:-1]  # the last round is capped at the tokens left
        assert (settled["gamma"] == rest).all()
        assert (settled["accepted"] == 3).all()


def test_pid_holds_the_mean_acceptance_ratio_at_the_setpoint(tmp_path):
    """With drawn acceptance (p falling 0.9 .. 0.55), integral action holds the mean ratio at the
    setpoint: over the rounds the controller saw (all but each request's last), the summed error
    a/γ - setpoint is the controller's error sum, within ±integral_limit while it never saturates,
    so the mean ratio is the setpoint within integral_limit / rounds (under 1 % here).

    Without the integral term (ki = 0) the same run leaves a steady offset: its summed error
    exceeds the limit, which the second half checks, so the bound is not met by chance."""
    p = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55]
    setpoint, limit = 0.6, 8.0

    def summed_errors(ki):
        policy = {"kind": "pid", "params": {"setpoint": setpoint, "ki": ki, "integral_limit": limit, "default_gamma": 5}}
        rounds = _rounds(tmp_path, p, policy, requests=3, output=4001)
        sums = []
        for _rid, rows in rounds.groupby("request_id"):
            seen = rows.iloc[:-1]
            seen = seen[seen["gamma"] > 0]
            assert len(seen) > 900
            sums.append(float((seen["accepted"] / seen["gamma"] - setpoint).sum()))
        return sums

    assert all(abs(s) <= limit for s in summed_errors(0.5))
    assert all(abs(s) > limit for s in summed_errors(0.0))


@pytest.mark.parametrize(
    ("p", "rtt_ms"),
    [((0.95, 0.95, 0.95, 0.1, 0.1, 0.1), 20.0), ((0.98,) * 6, 80.0)],
)
def test_bandit_settles_on_the_gamma_of_most_tokens_per_second(tmp_path, p, rtt_ms):
    """The arm of largest E[tokens] / T(γ), with E = 1 + sum_i prod_{j <= i} p_j and T = γ d + rtt +
    verify, is the arm each request's bandit pulls most over the second half of its rounds (more
    than 60 % of them; 1,300 to 2,300 rounds a request, seed fixed). The first curve has its
    optimum inside (γ = 3: 67.5 tokens/s against 63.4 at γ = 2), the second at k_max (γ = 6:
    45.5 against 42.3; a long round trip favours long drafts)."""
    d_ms = 10.0
    rate = {g: (1.0 + _expected_accepted(p, g)) / (g * d_ms + rtt_ms + VERIFY_MS) for g in range(1, 7)}
    best = max(rate, key=rate.get)
    assert best == (3 if rtt_ms == 20.0 else 6)
    policy = {"kind": "bandit", "params": {"exploration": 0.5}}
    rounds = _rounds(tmp_path, p, policy, requests=3, output=8001, draft_token_ms=d_ms, rtt_ms=rtt_ms)
    for _rid, rows in rounds.groupby("request_id"):
        late = rows["gamma"].iloc[len(rows) // 2 : -1]
        counts = late.value_counts()
        assert counts.idxmax() == best
        assert counts[best] > 0.6 * len(late)


@pytest.mark.parametrize(
    "policy",
    [{"kind": "pid", "params": {"setpoint": 0.6}}, {"kind": "bandit", "params": {"exploration": 0.5}}],
)
def test_controller_runs_repeat_exactly(tmp_path, policy):
    """The same seed and scenario give identical rounds; another seed gives other rounds."""
    p = [0.9, 0.85, 0.8, 0.75]
    first = _rounds(tmp_path, p, policy, requests=4, output=300)
    assert first.equals(_rounds(tmp_path, p, policy, requests=4, output=300))
    assert not first.equals(_rounds(tmp_path, p, policy, requests=4, output=300, seed=2))
