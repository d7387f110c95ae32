"""Drafter selection policies (``docs/speculative.md``, "Choosing a drafter").

Every expectation is computed here from the curves' numbers and the drafters' speeds
(closed forms, or a few-line UCB1), never by the code under test.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.policies.drafter_selection import AcceptancePortfolio, DrafterBandit, DrafterState
from simpy_llm.speculative.curves import acceptance_model
from tests.spec_helpers import flat_curve, spec_scenario

GAMMA = 4
SHORT_P = (0.9, 0.5)
"""The declining curve: ``p = 0.9`` at context 16 and 0.5 at 4,096, the same at every position,
linear in ``log(context)`` between, so it is 0.7 at ``sqrt(16 x 4096) = 256``."""
FLAT_P = 0.7
"""The flat curve: ``p = 0.7`` everywhere; the two cross at context 256."""


def declining_curve(path: Path) -> str:
    """Write the declining curve file (:data:`SHORT_P`) and return its path."""
    data = {
        "name": "declining", "drafter": "test drafter", "verifier": "test verifier", "method": "standard",
        "illustrative": True, "source": "hand-written for a test",
        "curves": [{"temperature": 0.0, "context_len": [16, 4096],
                    "acceptance": [[SHORT_P[0]] * GAMMA, [SHORT_P[1]] * GAMMA]}],
    }
    file = path / "declining.yaml"
    file.write_text(yaml.safe_dump(data))
    return str(file)


def declining_p(context: float) -> float:
    """The declining curve's probability at *context*, by hand."""
    share = min(max(math.log(context / 16) / math.log(4096 / 16), 0.0), 1.0)
    return SHORT_P[0] + share * (SHORT_P[1] - SHORT_P[0])


def expected_tokens(p: float, gamma: int) -> float:
    """``1 + p + ... + p^gamma``: a flat chain's expected tokens per round."""
    return sum(p**i for i in range(gamma + 1))


class _Drafter:
    def __init__(self, name: str, draft_token_s: float, acceptance: object) -> None:
        self.name, self.draft_token_s, self.acceptance = name, draft_token_s, acceptance


def _run(data):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def _two_drafters(tmp_path: Path, policy: dict, *, speeds=(5.0, 5.0)) -> list[dict]:
    short, flat = declining_curve(tmp_path), flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat")
    return [{"name": "short", "acceptance": short, "draft_token_ms": speeds[0]},
            {"name": "long", "acceptance": flat, "draft_token_ms": speeds[1]}]


def test_portfolio_picks_the_drafter_of_highest_closed_form_tokens_per_second(tmp_path):
    """On two curves that cross at context 256, with drafters of different speeds, the portfolio
    picks at every context the drafter whose ``E[tokens] / (γ d + rtt)`` is highest, and the
    answer changes side where the closed forms say."""
    d_short, d_long, rtt = 0.002, 0.004, 0.02
    drafters = (_Drafter("short", d_short, acceptance_model(declining_curve(tmp_path))),
                _Drafter("long", d_long, acceptance_model(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"))))
    rate_long = expected_tokens(FLAT_P, GAMMA) / (GAMMA * d_long + rtt)

    def rate_short(context: float) -> float:
        return expected_tokens(declining_p(context), GAMMA) / (GAMMA * d_short + rtt)

    low, high = 16.0, 4096.0  # the closed forms' crossing, by bisection on log(context)
    for _ in range(60):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if rate_short(mid) > rate_long else (low, mid)
    crossing = low
    assert 256 < crossing < 4096  # the faster drafter keeps its lead past the curves' crossing

    def choice(context: int) -> int:
        state = DrafterState(drafters=drafters, context_tokens=context, gamma=GAMMA, temperature=0.0, rtt_s=rtt)
        return AcceptancePortfolio().choose(state)

    contexts = [20, 64, 128, 256, 512, 1024, 2048, 4000, math.floor(crossing / 1.01), math.ceil(crossing * 1.01)]
    assert [choice(c) for c in contexts] == [0 if rate_short(c) > rate_long else 1 for c in contexts]
    assert choice(math.floor(crossing / 1.01)) == 0 and choice(math.ceil(crossing * 1.01)) == 1


def test_portfolio_slack_keeps_the_current_drafter_unless_the_saving_exceeds_it(tmp_path):
    """A started request moves to the best drafter only when it saves more than
    ``escalation_slack_ms`` per output token (by the closed forms); a starting one takes the best."""
    rtt = 0.02
    drafters = (_Drafter("short", 0.002, acceptance_model(declining_curve(tmp_path))),
                _Drafter("long", 0.002, acceptance_model(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"))))
    context = 4096
    t_short = (GAMMA * 0.002 + rtt) / expected_tokens(declining_p(context), GAMMA)
    t_long = (GAMMA * 0.002 + rtt) / expected_tokens(FLAT_P, GAMMA)
    saving_ms = (t_short - t_long) * 1e3
    state = DrafterState(drafters=drafters, current=0, rounds=5, context_tokens=context, gamma=GAMMA, temperature=0.0, rtt_s=rtt)
    assert AcceptancePortfolio(escalation_slack_ms=saving_ms * 0.99).choose(state) == 1
    assert AcceptancePortfolio(escalation_slack_ms=saving_ms * 1.01).choose(state) == 0
    starting = DrafterState(drafters=drafters, current=0, rounds=0, context_tokens=context, gamma=GAMMA, temperature=0.0, rtt_s=rtt)
    assert AcceptancePortfolio(escalation_slack_ms=saving_ms * 1.01).choose(starting) == 1


def test_portfolio_in_a_run_drafts_each_round_with_the_better_curve_at_its_context(tmp_path):
    """In a run with two drafters of the same speed (so the ranking is by the curves alone),
    every round at a context below the crossing (256) is drafted by the declining curve's
    drafter and every round above it by the flat one's."""
    data = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), requests=20, rate=2.0, prompt=128, output=400,
                         devices=4, speculation={"gamma_policy": {"kind": "static", "params": {"gamma": GAMMA}}},
                         group={"drafters": _two_drafters(tmp_path, {}),
                                "drafter_policy": {"kind": "acceptance_portfolio"}})
    rounds = _run(data).spec_rounds()
    rounds = rounds[rounds["gamma"] > 0]
    contexts = rounds["context_tokens"].to_numpy()
    better = np.where([expected_tokens(declining_p(c), GAMMA) > expected_tokens(FLAT_P, GAMMA) for c in contexts], "short", "long")
    away = np.abs(contexts - 256) > 2  # the curves are equal at 256: leave its neighbours out
    assert away.sum() > 2000
    assert (rounds["drafter"].to_numpy()[away] == better[away]).all()
    assert {"short", "long"} <= set(rounds["drafter"])


def _ucb1(rewards_of, arms: int, steps: int, exploration: float) -> tuple[list[int], list[int]]:
    """Textbook UCB1: try each arm once in order, then the largest mean + c sqrt(2 ln n / n_a)."""
    counts, sums, chosen = [0] * arms, [0.0] * arms, []
    for t in range(steps):
        if t < arms:
            arm = t
        else:
            n = sum(counts)
            scores = [sums[a] / counts[a] + exploration * math.sqrt(2 * math.log(n) / counts[a]) for a in range(arms)]
            arm = scores.index(max(scores))
        chosen.append(arm)
        counts[arm] += 1
        sums[arm] += rewards_of(t, arm)
    return chosen, counts


@pytest.mark.parametrize("exploration", [0.0, 0.3, 1.0, 2.0])
def test_bandit_matches_an_independent_ucb1(exploration):
    """Fed rounds with scripted accepted counts, the drafter bandit makes the choices and pulls
    of a textbook UCB1 whose reward is each round's tokens per second over the fastest
    drafter's all-accepted rate, ``(a + 1) / (γ d_j + F) / ((γ + 1) / (γ d_min + F))``."""
    speeds, fixed, gamma = (0.001, 0.003, 0.006), 0.012, 4
    drafters = tuple(_Drafter(f"d{j}", s, None) for j, s in enumerate(speeds))
    accepted = np.random.default_rng(7).integers(0, gamma + 1, size=(300, len(speeds)))

    def reward(t: int, arm: int) -> float:
        rate = (accepted[t, arm] + 1) / (gamma * speeds[arm] + fixed)
        return rate / ((gamma + 1) / (gamma * min(speeds) + fixed))

    want_chosen, want_counts = _ucb1(reward, len(speeds), 300, exploration)
    bandit, chosen, current = DrafterBandit(exploration=exploration), [], 0
    for t in range(301):
        state = DrafterState(drafters=drafters, current=current, rounds=t, rtt_s=fixed,
                             accepted_last=int(accepted[t - 1, current]) if t else 0, proposed_last=gamma if t else 0)
        current = bandit.choose(state)
        chosen.append(current)
    assert chosen[:300] == want_chosen
    assert list(bandit.pulls) == want_counts


def test_every_round_is_attributed_to_exactly_one_drafter(tmp_path):
    """Under the bandit (which switches drafters often), each distributed round names one of the
    group's drafters; per request, the drafter changes between consecutive rounds exactly where
    a switch is recorded (same count, same from and to), and the record's drafter is its last
    round's."""
    data = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), requests=30, rate=2.0, prompt=128, output=200,
                         devices=4, group={"drafters": _two_drafters(tmp_path, {}, speeds=(3.0, 6.0)),
                                           "drafter_policy": {"kind": "bandit", "params": {"exploration": 0.5}}})
    results = _run(data)
    rounds, switches = results.spec_rounds(), results.drafter_switches()
    assert set(rounds["drafter"]) == {"short", "long"}
    assert rounds.groupby("drafter").size().sum() == len(rounds)
    assert len(switches) > 30
    records = results.to_dataframe().set_index("request_id")
    for rid, own in rounds.groupby("request_id", sort=False):
        names = own.sort_values("time_s", kind="stable")["drafter"].tolist()
        changes = [(a, b) for a, b in itertools.pairwise(names) if a != b]
        recorded = switches[switches["request_id"] == rid].sort_values("time_s", kind="stable")
        assert changes == list(zip(recorded["from_drafter"], recorded["to_drafter"], strict=True))
        assert records.loc[rid, "drafter"] == names[-1]


def test_fixed_policy_runs_as_a_group_without_one(tmp_path):
    """``drafter_policy: {kind: fixed}`` gives the records and rounds of the same group without
    a drafter policy, byte for byte: the first drafter throughout."""
    base = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), requests=15, rate=2.0, output=80,
                         group={"drafters": _two_drafters(tmp_path, {})})
    fixed = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), requests=15, rate=2.0, output=80,
                          group={"drafters": _two_drafters(tmp_path, {}), "drafter_policy": {"kind": "fixed"}})
    a, b = _run(base), _run(fixed)
    assert a.to_dataframe().to_csv() == b.to_dataframe().to_csv()
    assert a.spec_rounds().to_csv() == b.spec_rounds().to_csv()
    assert (b.spec_rounds()["drafter"] == "short").all()


def test_the_bandit_repeats_exactly_under_the_same_seed(tmp_path):
    """Two runs of the same scenario with the drafter bandit give identical records and rounds."""
    data = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), requests=15, rate=2.0, output=80,
                         group={"drafters": _two_drafters(tmp_path, {}, speeds=(3.0, 6.0)), "drafter_policy": {"kind": "bandit"}})
    a, b = _run(data), _run(data)
    assert a.to_dataframe().to_csv() == b.to_dataframe().to_csv()
    assert a.spec_rounds().to_csv() == b.spec_rounds().to_csv()


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"drafter_policy": {"kind": "oracle"}}, "speculation.drafts[0].drafter_policy.kind", r"unknown drafter policy 'oracle'"),
        ({"drafter_policy": {"kind": "acceptance_portfolio", "params": {"escalation_slack_ms": -1}}},
         "speculation.drafts[0].drafter_policy.params.escalation_slack_ms", r">= 0"),
        ({"drafter_policy": {"kind": "bandit"}, "escalate_below": 0.5}, "speculation.drafts[0].drafter_policy", r"not both"),
    ],
)
def test_bad_drafter_policies_are_refused_at_their_key_path(tmp_path, change, path, words):
    """An unknown kind, a bad parameter and a policy beside ``escalate_below`` are each refused,
    naming the key path and what is allowed."""
    data = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), group={"drafters": _two_drafters(tmp_path, {}), **change})
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    assert info.value.paths == [path], info.value.problems
    assert re.search(words, info.value.problems[0][1]), info.value.problems[0][1]


def test_a_drafter_policy_needs_two_drafters(tmp_path):
    """A group of one drafter has nothing to choose: its ``drafter_policy`` is refused by name."""
    data = spec_scenario(flat_curve(tmp_path, [FLAT_P] * GAMMA, "flat"), group={"drafter_policy": {"kind": "fixed"}})
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, source="s.yaml")
    assert info.value.paths == ["speculation.drafts[0].drafter_policy"]
    assert "at least two drafters" in info.value.problems[0][1]
