"""Chained (multi-level) speculation, tiny -> mid -> target (``docs/speculative.md``,
"Chained speculation").

Expectations are computed here from flat curves and the latency model's coefficients,
never by :mod:`simpy_llm.speculative.chain`.
"""

from __future__ import annotations

import math

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_S, BETA2_S = 5e-3, 200e-6
"""The target's latency model here: 5 ms per step, 200 µs per decode token."""
P_TINY, P_MID = 0.6, 0.8
"""Flat curves: the tiny drafter against the mid one, the mid one against the target."""


def _chained(tmp_path, *, tiny_ms=1.0, mid_ms=4.0, **kwargs):
    data = spec_scenario("unused", **kwargs)
    data["speculation"]["drafts"][0]["drafters"] = [
        {"name": "tiny", "acceptance": flat_curve(tmp_path, [P_TINY] * 4, "tiny"), "draft_token_ms": tiny_ms},
        {"name": "mid", "acceptance": flat_curve(tmp_path, [P_MID] * 4, "mid"), "draft_token_ms": mid_ms},
    ]
    data["speculation"]["drafts"][0]["chain"] = ["tiny", "mid"]
    return data


def _run(data):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def _mid_steps(gamma: int) -> float:
    """E[max(γ - M1 - 1, 0)], P(M1 = m) = P_TINY^m (1 - P_TINY) for m < γ, written out."""
    return sum(P_TINY**m * (1 - P_TINY) * (gamma - m - 1) for m in range(gamma))


def test_mean_tokens_per_chained_round_match_the_two_level_law(tmp_path):
    """Over ~20k rounds of γ 4: the mean tokens per target round is the mid drafter's chain
    law 1 + sum_i P_MID^i, the mid level accepts sum_i P_TINY^i tiny drafts and drafts
    E[max(γ - M1 - 1, 0)] itself on average, each within 4 standard errors (fixed seed)."""
    data = _chained(tmp_path, requests=300, rate=50.0, output=251, devices=30,
                    speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 4}}})
    rounds = _run(data).spec_rounds()
    full = rounds[rounds["gamma"] == 4]  # a request's last rounds may be capped
    assert len(full) > 15_000
    assert (full["drafter"] == "mid").all()
    for column, expected in (
        (full["accepted"] + 1, 1 + sum(P_MID**i for i in range(1, 5))),
        (full["mid_accepted"], sum(P_TINY**i for i in range(1, 5))),
        (full["mid_steps"], _mid_steps(4)),
    ):
        values = column.to_numpy(dtype=float)
        se = values.std(ddof=1) / math.sqrt(len(values))
        assert abs(values.mean() - expected) < 4 * se, (column.name, values.mean(), expected)


def test_under_expected_sampling_each_round_has_the_expected_mid_steps(tmp_path):
    """With ``acceptance_sampling: expected`` every chained round's mid steps and accepted
    tiny drafts are their expectations at its γ, to 1e-12."""
    data = _chained(tmp_path, requests=20, output=40, speculation={
        "acceptance_sampling": "expected", "gamma_policy": {"kind": "static", "params": {"gamma": 3}}})
    rounds = _run(data).spec_rounds()
    assert set(rounds["gamma"]) >= {3}
    for gamma, accepted, steps in rounds[["gamma", "mid_accepted", "mid_steps"]].itertuples(index=False):
        assert steps == pytest.approx(_mid_steps(gamma), abs=1e-12)
        assert accepted == pytest.approx(sum(P_TINY**i for i in range(1, gamma + 1)), abs=1e-12)


def test_a_chained_round_costs_the_sum_of_its_parts(tmp_path):
    """One request alone over a 20 ms round trip: consecutive rounds end tiny steps (γ t_tiny)
    + the mid verify pass (one mid token's time) + mid steps x t_mid + the round trip + the
    target's verify pass (beta0 + beta2 (γ + 1)) apart, to 1e-12 s."""
    data = _chained(tmp_path, requests=1, output=80, devices=1, tiny_ms=1.5, mid_ms=6.0, network={"rtt_ms": 20.0},
                    latency={"kind": "blis_linear", "params": {"beta0_us": 5000.0, "beta1_us": 0.0, "beta2_us": 200.0}})
    rounds = _run(data).spec_rounds()
    assert len(rounds) > 5 and rounds["mid_steps"].max() > 0
    ends = rounds["time_s"].to_numpy()
    later = rounds.iloc[1:]
    for prev_end, end, gamma, steps in zip(ends[:-1], ends[1:], later["gamma"], later["mid_steps"], strict=True):
        parts = gamma * 1.5e-3 + (6e-3 if gamma else 0.0) + steps * 6e-3 + 20e-3 + BETA0_S + BETA2_S * (gamma + 1)
        assert end - prev_end == pytest.approx(parts, abs=1e-12)


def test_without_a_chain_the_round_table_has_no_chain_columns(tmp_path):
    """No chain: the round table has no mid-level columns."""
    rounds = _run(spec_scenario(flat_curve(tmp_path, [0.8] * 4), requests=5)).spec_rounds()
    assert "mid_steps" not in rounds.columns and "mid_accepted" not in rounds.columns


@pytest.mark.parametrize(
    ("chain", "group", "tree", "path"),
    [
        (["tiny"], {}, None, "speculation.drafts[0].chain"),
        (["tiny", "tiny"], {}, None, "speculation.drafts[0].chain"),
        (["tiny", "large"], {}, None, "speculation.drafts[0].chain"),
        (["tiny", "mid"], {"escalate_below": 0.5}, None, "speculation.drafts[0].escalate_below"),
        (["tiny", "mid"], {"max_batch": 2}, None, "speculation.drafts[0].chain"),
        (["tiny", "mid"], {}, {"depth": 2, "width": 2}, "speculation.drafts[0].drafters[1].tree"),
    ],
)
def test_bad_chains_are_refused_by_key_path(tmp_path, chain, group, tree, path):
    """Each bad chain setting is refused with its key path."""
    data = _chained(tmp_path)
    data["speculation"]["drafts"][0].update({"chain": chain, **group})
    if tree is not None:
        data["speculation"]["drafts"][0]["drafters"][1]["tree"] = tree
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert f"{path}:" in str(err.value)
