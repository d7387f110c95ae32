"""The ``pid`` and ``bandit`` γ controllers: scripted signals against independent references.

Each reference below is a few lines written from the law as published (the discrete PID
law; UCB1 of Auer, Cesa-Bianchi and Fischer, 2002) and shares no code with
``simpy_llm.policies.gamma``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpy_llm import scenario_from_dict
from simpy_llm.config import PolicySpec, ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.structure import build_policy
from simpy_llm.policies.gamma import GammaState, PidGamma, UcbBandit, gamma_policies
from tests.spec_helpers import flat_curve, spec_scenario

# --- pid -------------------------------------------------------------------------------------


def pid_reference(signal, *, setpoint, kp, ki, kd, limit, u0, k_min, k_max):
    """γ after each measured ratio in *signal*, by the positional discrete PID law (one round per step)."""
    out, integral, previous = [], 0.0, None
    for r in signal:
        e = r - setpoint
        integral = min(max(integral + e, -limit), limit)
        d = 0.0 if previous is None else e - previous
        previous = e
        u = u0 + kp * e + ki * integral + kd * d
        out.append(min(max(math.floor(u + 0.5), k_min), k_max))
    return out


def feed(policy, rounds, k_min=1, k_max=8):
    """Ask *policy* once per ``(accepted, proposed)`` round; returns its answers."""
    return [
        policy.next_gamma(GammaState(gamma=4, k_min=k_min, k_max=k_max, accepted_last=a, proposed_last=p))
        for a, p in rounds
    ]


def test_pid_trajectory_matches_the_hand_computed_law() -> None:
    """A short scripted signal gives the γ worked out by hand from u = 4 + 2e + 0.5 I + 1 D, setpoint 0.5.

    round (a/p)   e      I      D      u      γ
    4/4           0.5    0.5    0      5.25   5
    5/5           0.5    1.0    0      5.5    6 (half up)
    1/6          -1/3    2/3   -5/6   ~2.83   3
    0/3          -0.5    1/6   -1/6   ~2.92   3
    2/4           0      1/6    0.5   ~4.58   5
    """
    pid = PidGamma(setpoint=0.5, kp=2.0, ki=0.5, kd=1.0, integral_limit=10.0, default_gamma=4)
    assert feed(pid, [(4, 4), (5, 5), (1, 6), (0, 3), (2, 4)]) == [5, 6, 3, 3, 5]


@pytest.mark.parametrize(
    ("gains", "limit"),
    [((2.0, 0.5, 1.0), 10.0), ((1.0, 2.0, 0.0), 0.75), ((0.0, 1.0, 3.0), 2.0), ((6.0, 0.0, 0.0), 1.0)],
)
def test_pid_follows_the_discrete_law_on_a_scripted_signal(gains, limit) -> None:
    """Over 60 scripted rounds (runs of high and low acceptance, γ at both bounds), the answers equal
    the independent discrete PID reference, anti-windup clamp included."""
    kp, ki, kd = gains
    proposed = [3, 5, 8, 2, 6, 4, 1, 7, 8, 5]
    accepted_share = [1.0] * 15 + [0.0] * 15 + [0.5, 0.25, 0.75] * 5 + [0.9] * 15
    rounds = [(math.floor(s * proposed[i % 10]), proposed[i % 10]) for i, s in enumerate(accepted_share)]
    pid = PidGamma(setpoint=0.6, kp=kp, ki=ki, kd=kd, integral_limit=limit, default_gamma=3)
    expected = pid_reference(
        [a / p for a, p in rounds], setpoint=0.6, kp=kp, ki=ki, kd=kd, limit=limit, u0=3, k_min=1, k_max=8
    )
    assert feed(pid, rounds) == expected
    assert len(set(expected)) > 3  # the script moves γ, not just pins it


def test_pid_integral_is_clamped_so_gamma_leaves_the_bound_when_the_error_turns() -> None:
    """Anti-windup: after 50 rounds of full acceptance the error sum is held at integral_limit, so one
    round of full rejection brings γ off k_max at once (an unclamped sum of 25 would hold it there)."""
    pid = PidGamma(setpoint=0.5, kp=1.0, ki=1.0, integral_limit=2.0, default_gamma=6)
    assert feed(pid, [(4, 4)] * 50)[-1] == 8  # u = 6 + 0.5 + 2 = 8.5, at k_max
    assert pid.integral == 2.0
    # e = -0.5: I = 1.5, u = 6 - 0.5 + 1.5 = 7 (unclamped: I = 24.5, u = 30, still k_max).
    assert feed(pid, [(0, 4)]) == [7]


def test_pid_answers_default_gamma_before_the_first_round_and_repeats_without_a_round() -> None:
    """A state with no round behind it (proposed_last = 0) is no step: default_gamma first, then the
    last step's γ; clamped to [k_min, k_max]."""
    pid = PidGamma(setpoint=0.5, kp=2.0, ki=0.0, default_gamma=7)
    assert feed(pid, [(0, 0)], k_max=5) == [5]
    assert feed(pid, [(0, 0)]) == [7]
    # One step (e = 0.5: u = 7 + 2 x 0.5 = 8), then two calls without a round keep it.
    assert feed(pid, [(4, 4), (0, 0), (0, 0)]) == [8, 8, 8]
    assert pid.integral == 0.5  # one step summed


@pytest.mark.parametrize(
    ("params", "field"),
    [({"kp": -1.0}, "kp"), ({"ki": -0.1}, "ki"), ({"kd": math.inf}, "kd"), ({"setpoint": 1.5}, "setpoint"),
     ({"integral_limit": 0.0}, "integral_limit"), ({"default_gamma": 0}, "default_gamma")],
)
def test_pid_rejects_bad_params_by_name(params, field) -> None:
    """A negative or non-finite gain, a setpoint outside [0, 1], a non-positive limit or a γ below 1 is
    refused at its field."""
    with pytest.raises(FieldValueError) as info:
        PidGamma(**params)
    assert info.value.field == field


# --- bandit ----------------------------------------------------------------------------------

D_S, FIXED_S = 0.010, 0.025
"""Telemetry of the scripted bandit rounds: drafting 10 ms a token; round trip 15 ms, verify 10 ms."""


def scripted_tokens(gamma: int) -> int:
    """Deterministic tokens a round adds at *gamma*: drafts accepted up to 3, none beyond, plus one."""
    return min(gamma, 3) + 1


def ucb1_reference(rounds: int, k_min: int, k_max: int, c: float):
    """Arms chosen by UCB1 (each arm once, smallest first; then the largest mean + c sqrt(2 ln n / n_a),
    ties to the smaller) on the normalised tokens-per-second reward; returns (choices, pulls per arm)."""
    time = {g: g * D_S + FIXED_S for g in range(k_min, k_max + 1)}
    ceiling = max((g + 1) / time[g] for g in (k_min, k_max))
    reward = {g: scripted_tokens(g) / time[g] / ceiling for g in time}
    pulls = dict.fromkeys(time, 0)
    total = dict.fromkeys(time, 0.0)
    choices = []
    for t in range(rounds):
        untried = [g for g in time if pulls[g] == 0]
        if untried:
            arm = untried[0]
        else:
            arm = max(time, key=lambda g: (total[g] / pulls[g] + c * math.sqrt(2 * math.log(t) / pulls[g]), -g))
        choices.append(arm)
        pulls[arm] += 1
        total[arm] += reward[arm]
    return choices, pulls


def play(bandit, rounds: int, k_min: int = 1, k_max: int = 6, tokens=scripted_tokens) -> list[int]:
    """Close the loop: each state reports the round the bandit's previous answer ran."""
    gamma, chosen = 0, []
    for _ in range(rounds + 1):
        gamma = bandit.next_gamma(GammaState(
            gamma=gamma, k_min=k_min, k_max=k_max, accepted_last=tokens(gamma) - 1 if gamma else 0,
            proposed_last=gamma, draft_step_s=D_S, rtt_s=0.015, verify_step_s=0.010,
        ))
        chosen.append(gamma)
    return chosen[:-1]  # the last answer's round never ran


@pytest.mark.parametrize("c", [1.0, 0.5, 0.2, 0.05])
def test_bandit_choices_and_pulls_follow_ucb1(c) -> None:
    """Over 400 rounds of deterministic rewards, the choices and the pulls per arm equal UCB1's,
    computed independently; the best arm (γ = 3: 4 tokens in 55 ms) is pulled most."""
    bandit = UcbBandit(exploration=c)
    chosen = play(bandit, 400)
    expected, pulls = ucb1_reference(400, 1, 6, c)
    assert chosen == expected
    assert bandit.pulls == tuple(pulls[g] for g in range(1, 7))
    assert max(pulls, key=pulls.get) == 3


def test_greedy_bandit_keeps_the_best_arm_after_exploring() -> None:
    """With exploration 0, after one round per arm (γ = 1..6 in order) every choice is the best arm."""
    chosen = play(UcbBandit(exploration=0.0), 50)
    assert chosen[:6] == [1, 2, 3, 4, 5, 6]
    assert set(chosen[6:]) == {3}


def test_bandit_mean_rewards_are_tokens_per_second_over_the_ceiling() -> None:
    """Each arm's mean reward is its tokens / T(γ) divided by max((k_min+1)/T(k_min), (k_max+1)/T(k_max)),
    every one in [0, 1]."""
    bandit = UcbBandit()
    play(bandit, 6, k_min=2, k_max=5)
    time = {g: g * D_S + FIXED_S for g in range(2, 6)}
    ceiling = max(3 / time[2], 6 / time[5])
    assert bandit.mean_rewards == pytest.approx([scripted_tokens(g) / time[g] / ceiling for g in range(2, 6)], rel=1e-12)
    assert all(0.0 <= r <= 1.0 for r in bandit.mean_rewards)


def test_bandit_does_not_credit_a_round_cut_short() -> None:
    """A round whose γ differs from the arm chosen (the mechanism capped it at the end of the answer)
    credits no arm, and the arm is tried again."""
    bandit = UcbBandit()
    first = bandit.next_gamma(GammaState(gamma=1, k_min=1, k_max=4, draft_step_s=D_S))
    assert first == 1
    again = bandit.next_gamma(GammaState(gamma=1, k_min=1, k_max=4, accepted_last=0, proposed_last=0, draft_step_s=D_S))
    assert (again, bandit.pulls) == (1, (0, 0, 0, 0))
    bandit.next_gamma(GammaState(gamma=1, k_min=2, k_max=4, accepted_last=1, proposed_last=1, draft_step_s=D_S))
    assert bandit.pulls == (0, 0, 0)  # other bounds: fresh arms, and nothing pending to credit


def test_bandit_does_not_credit_a_round_that_took_no_time() -> None:
    """With every modelled time zero (no drafting, round trip, wait or verify) the reward is undefined:
    no arm is credited."""
    bandit = UcbBandit()
    assert bandit.next_gamma(GammaState(gamma=1, k_min=1, k_max=3)) == 1
    assert bandit.next_gamma(GammaState(gamma=1, k_min=1, k_max=3, accepted_last=1, proposed_last=1)) == 1
    assert bandit.pulls == (0, 0, 0)


def test_bandit_rejects_negative_exploration_by_name() -> None:
    """exploration must be a finite number >= 0."""
    for bad in (-0.1, math.nan):
        with pytest.raises(FieldValueError) as info:
            UcbBandit(exploration=bad)
        assert info.value.field == "exploration"


# --- both ------------------------------------------------------------------------------------


@st.composite
def round_reports(draw):
    """A state as the mechanism could send it (bounds may change between calls here; they never do in a run)."""
    k_min = draw(st.integers(1, 6))
    proposed = draw(st.integers(0, 12))
    small = st.floats(0.0, 0.5)
    return GammaState(
        gamma=draw(st.integers(0, 12)), k_min=k_min, k_max=draw(st.integers(k_min, k_min + 8)),
        accepted_last=draw(st.integers(0, proposed)), proposed_last=proposed,
        rtt_s=draw(small), verify_queue_wait_s=draw(small), verify_step_s=draw(small), draft_step_s=draw(small),
    )


@st.composite
def controllers(draw):
    if draw(st.booleans()):
        return UcbBandit(exploration=draw(st.floats(0.0, 5.0)))
    return PidGamma(
        setpoint=draw(st.floats(0.0, 1.0)), kp=draw(st.floats(0.0, 50.0)), ki=draw(st.floats(0.0, 50.0)),
        kd=draw(st.floats(0.0, 50.0)), integral_limit=draw(st.floats(1e-3, 100.0)), default_gamma=draw(st.integers(1, 30)),
    )


@settings(max_examples=200, deadline=None)
@given(policy=controllers(), states=st.lists(round_reports(), min_size=1, max_size=12))
def test_controllers_answer_an_int_within_bounds(policy, states) -> None:
    """pid and bandit, with any valid params and any sequence of states, answer an int in [k_min, k_max]."""
    for s in states:
        gamma = policy.next_gamma(s)
        assert type(gamma) is int
        assert s.k_min <= gamma <= s.k_max


@pytest.mark.parametrize(
    ("kind", "params", "cls"),
    [("pid", {"setpoint": 0.6, "kp": 1.5, "ki": 0.25, "kd": 0.5, "integral_limit": 3.0, "default_gamma": 3}, PidGamma),
     ("bandit", {"exploration": 0.3}, UcbBandit)],
)
def test_registry_builds_the_controller_from_kind_and_params(kind, params, cls) -> None:
    """``{kind: pid | bandit, params}`` builds the registered class with exactly those params."""
    policy = build_policy(PolicySpec(kind=kind, params=params), gamma_policies)
    assert type(policy) is cls
    assert {name: getattr(policy, name) for name in params} == params


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [("pid", {"ki": -1}, "speculation.gamma_policy.params.ki: must be >= 0"),
     ("pid", {"setpoint": 2}, "speculation.gamma_policy.params.setpoint: must be in [0.0, 1.0]"),
     ("pid", {"gain": 1}, "speculation.gamma_policy.params.gain: unknown key"),
     ("bandit", {"exploration": -1}, "speculation.gamma_policy.params.exploration: must be >= 0")],
)
def test_a_scenario_with_a_bad_controller_param_names_its_key_path(tmp_path, kind, params, message) -> None:
    """A bad ``params`` value in a scenario is a ScenarioError naming the key path and what is allowed."""
    data = spec_scenario(flat_curve(tmp_path, [0.8] * 4), speculation={"gamma_policy": {"kind": kind, "params": params}})
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    assert message in str(info.value)
