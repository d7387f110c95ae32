"""Tree drafting (EAGLE) and load control (``docs/speculative.md``, "Tree drafting (EAGLE)
and load control").

Expectations are computed here from the curve's probabilities and the latency model's
coefficients, never by :mod:`simpy_llm.speculative.tree`.
"""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.speculation import LoadControlConfig, TreeConfig
from simpy_llm.speculative.curves import acceptance_model
from simpy_llm.speculative.drafter import Drafter
from simpy_llm.speculative.tree import TreeDrafting, queued_verify_tokens, tree_expected_tokens
from tests.spec_helpers import flat_curve, spec_scenario

BETA0_S, BETA2_S = 5e-3, 200e-6
"""The default latency model of ``spec_scenario``: 5 ms per step, 200 µs per decode token."""
DIST = {"speculation.mode": "distributed", "speculation.mode_selector": None, "speculation.fused": None}
"""``speculative_modes.yaml`` run distributed (at its 20 ms round trip hybrid runs everything fused)."""


def _run(data):
    return Simulation(scenario_from_dict(data)).run(progress=False)


def _tree_tokens(p: list[float], width: int) -> float:
    """1 + sum_i prod_{j<=i} (1 - (1 - p_j)^width), written out."""
    total = 1.0
    for i in range(len(p)):
        total += math.prod(1.0 - (1.0 - pj) ** width for pj in p[: i + 1])
    return total


def test_the_tree_law_at_width_one_is_the_chain_law():
    """At width 1 the tree's expected tokens are the chain curve's, exactly, at every depth."""
    model = acceptance_model("illustrative-mobile")
    for context in (128, 700, 4096):
        for k in range(model.k_max + 1):
            p = model.position_probabilities(context, k, 0.0)
            assert tree_expected_tokens(p, 1) == model.expected_tokens(context, k, 0.0)


@pytest.mark.parametrize(("p", "width"), [((0.75,) * 4, 2), ((0.9, 0.6, 0.5, 0.4), 3)])
def test_mean_tokens_per_tree_round_match_the_closed_form(tmp_path, p, width):
    """Over ~20k simulated rounds of a depth-4 tree, the mean tokens per round is
    1 + sum_i prod_{j<=i} (1 - (1 - p_j)^width) within 4 standard errors of the mean
    (the sample's own; fixed seed)."""
    data = spec_scenario(
        flat_curve(tmp_path, list(p)), requests=400, rate=50.0, output=251, devices=30,
        speculation={"gamma_policy": {"kind": "static", "params": {"gamma": 4}}},
    )
    data["speculation"]["drafts"][0]["drafters"][0]["tree"] = {"depth": 4, "width": width}
    rounds = _run(data).spec_rounds()
    full = rounds[rounds["tree_depth"] == 4]  # a request's last round may be capped
    assert len(full) > 15_000
    assert (full["tree_width"] == width).all()
    tokens = (full["accepted"] + 1).to_numpy()
    se = tokens.std(ddof=1) / math.sqrt(len(tokens))
    assert abs(tokens.mean() - _tree_tokens(list(p), width)) < 4 * se
    # and the chain law is far outside that band: the tree's extra candidates are counted
    assert abs(tokens.mean() - _tree_tokens(list(p), 1)) > 20 * se


def test_a_width_one_tree_runs_exactly_as_the_chain():
    """``tree: {depth: k_max, width: 1}`` gives the same records and rounds as no tree, byte
    for byte; its rounds show depth γ and width 1."""
    from simpy_llm.loading import load_scenario

    plain = Simulation(load_scenario("scenarios/speculative_modes.yaml", dict(DIST))).run(progress=False)
    tree = Simulation(load_scenario(
        "scenarios/speculative_modes.yaml", {**DIST, "speculation.drafts.0.drafters.0.tree": {"depth": 6, "width": 1}},
    )).run(progress=False)
    assert tree.to_dataframe().to_csv() == plain.to_dataframe().to_csv()
    rounds = tree.spec_rounds()
    assert rounds.drop(columns=["tree_depth", "tree_width"]).to_csv() == plain.spec_rounds().to_csv()
    assert (rounds["tree_depth"] == rounds["gamma"]).all() and (rounds["tree_width"] == 1).all()


def test_without_a_tree_the_round_table_has_no_tree_columns(tmp_path):
    """No tree block: no tree record is kept and the round table keeps its columns."""
    results = _run(spec_scenario(flat_curve(tmp_path, [0.8] * 4), requests=5))
    assert list(results.spec_rounds().columns) == [
        "time_s", "request_id", "replica", "draft_group", "draft_device", "mode", "drafter", "gamma", "accepted",
        "tokens", "context_tokens", "tvt_s", "rollback",
    ]


def test_pruning_stops_at_the_last_level_whose_score_reaches_the_threshold():
    """Each round's depth is the number of leading levels whose cumulative product of the
    curve's p (at the round's context) is >= the threshold, at least 1, and at most γ."""
    from simpy_llm.loading import load_scenario

    threshold = 0.45
    results = Simulation(load_scenario("scenarios/speculative_modes.yaml", {
        **DIST, "workload.num_requests": 60,
        "speculation.drafts.0.drafters.0.tree": {"depth": 6, "width": 2, "prune_score_threshold": threshold},
    })).run(progress=False)
    rounds = results.spec_rounds()
    requests = results.to_dataframe().set_index("request_id")
    model = acceptance_model("illustrative-laptop")
    depths = set()
    for rid, context, depth in rounds[["request_id", "context_tokens", "tree_depth"]].itertuples(index=False):
        prompt, output = requests.loc[rid, ["prompt_tokens", "output_tokens"]]
        gamma = min(4, max(0, output - (context - prompt) - 1))  # static γ 4, capped at the tokens left - 1
        p = np.array(model.position_probabilities(context, 4, 0.0))
        kept = max(1, int((np.cumprod(p) >= threshold).cumprod().sum()))
        assert depth == min(kept, gamma)
        depths.add(depth)
    assert len(depths) >= 2  # the threshold binds at some contexts and not at others


def test_load_control_shrinks_the_tree_monotonically_with_load():
    """Driving the queued-token signal up from 0: depth and width never grow, the full tree
    at or below tokens_low, the smallest (min_depth_scale x depth, min_beam_width) at or
    above tokens_high."""
    drafter = Drafter("d", 0.001, acceptance_model("t5-small_t5-xxl_ende"))
    control = LoadControlConfig(tokens_low=40, tokens_high=140, min_depth_scale=0.25, min_beam_width=2)
    tree = TreeDrafting(TreeConfig(depth=8, width=6, load_control=control), drafter, batched=False)
    shapes = [tree.plan(8, 512, 0.0, load) for load in range(0, 300, 3)]
    depths = [r.depth for r in shapes]
    widths = [r.width for r in shapes]
    assert all(a >= b for a, b in itertools.pairwise(depths))
    assert all(a >= b for a, b in itertools.pairwise(widths))
    assert (depths[0], widths[0]) == (8, 6) and (tree.plan(8, 512, 0.0, 40).depth, tree.plan(8, 512, 0.0, 40).width) == (8, 6)
    assert (depths[-1], widths[-1]) == (2, 2) and (tree.plan(8, 512, 0.0, 140).depth, tree.plan(8, 512, 0.0, 140).width) == (2, 2)
    assert len(set(depths)) > 3 and len(set(widths)) > 2  # it scales in steps between the two
    mid = tree.plan(8, 512, 0.0, 90)  # halfway: depth 8 (1 - 0.5 x 0.75) = 5, width 6 - 0.5 x 4 = 4
    assert (mid.depth, mid.width, mid.nodes) == (5, 4, 20)


def test_the_load_signal_counts_the_tokens_waiting_for_verification():
    """The queued-token signal is sum(v + 1) over the target's waiting rounds: γ for a chain
    round, depth x width for a tree round."""
    def job(gamma, tree=None):
        return (0.0, 0, types.SimpleNamespace(gamma=gamma, req=types.SimpleNamespace(spec=types.SimpleNamespace(plan=tree))))

    rounds = [job(4), job(3, types.SimpleNamespace(nodes=12)), job(0)]
    assert queued_verify_tokens(rounds) == (4 + 1) + (12 + 1) + (0 + 1)
    assert queued_verify_tokens([]) == 0


def test_load_control_in_a_run_shrinks_trees_at_busy_targets(tmp_path):
    """In a loaded run with load control, rounds planned while more tokens waited got smaller
    trees; with tokens_low above any possible backlog every round gets the full tree."""
    curve = flat_curve(tmp_path, [0.8] * 4)
    tree = {"depth": 4, "width": 4, "load_control": {"tokens_low": 0, "tokens_high": 40, "min_depth_scale": 0.5}}
    data = spec_scenario(curve, requests=200, rate=100.0, output=40, devices=40, draft_token_ms=1.0)
    data["speculation"]["drafts"][0]["drafters"][0]["tree"] = tree
    rounds = _run(data).spec_rounds()
    assert rounds["tree_width"].min() == 1 and rounds["tree_width"].max() == 4
    assert rounds.loc[rounds["tree_width"] == 1, "tree_depth"].max() == 2  # the smallest tree: depth 4 x 0.5
    data["speculation"]["drafts"][0]["drafters"][0]["tree"] = {**tree, "load_control": {"tokens_low": 10**9, "tokens_high": 10**9 + 1}}
    rounds = _run(data).spec_rounds()
    capped = rounds["gamma"] < 4  # a request's last rounds
    assert (rounds.loc[~capped, "tree_width"] == 4).all() and (rounds.loc[~capped, "tree_depth"] == 4).all()


@pytest.mark.parametrize("batched", [False, True])
def test_drafting_time_is_depth_times_a_level_of_width_candidates(tmp_path, batched):
    """A device's drafting time is the sum over its rounds of depth x (width x the time per
    token), or, with a latency model, depth x its decode step of width tokens (beta0 + beta2 w)."""
    drafter = {"name": "d0", "acceptance": flat_curve(tmp_path, [0.7] * 4)}
    if batched:
        drafter["latency_model"] = {"kind": "blis_linear", "params": {"beta0_us": 3000.0, "beta2_us": 500.0}}
    else:
        drafter["draft_token_ms"] = 2.0
    data = spec_scenario("unused", requests=40, rate=20.0, output=60, devices=4)
    data["speculation"]["drafts"][0]["drafters"] = [{**drafter, "tree": {"depth": 3, "width": 5}}]
    results = _run(data)
    rounds = results.spec_rounds()
    depth, width = rounds["tree_depth"].to_numpy(), rounds["tree_width"].to_numpy()
    level_s = 3e-3 + 500e-6 * width if batched else width * 2e-3
    assert (width == 5).all() and set(depth) <= {0, 1, 2, 3}
    drafting = results.summary()["speculation"]["drafts"]["phones"]["drafting_s"]
    assert drafting == pytest.approx(float((depth * level_s).sum()), rel=1e-12)


def test_a_tree_round_costs_its_drafting_and_a_verify_pass_over_its_nodes(tmp_path):
    """One request alone, no network: consecutive rounds end depth x width x d + beta0 +
    beta2 (depth x width + 1) apart (the verify pass over the tree's nodes), to 1e-12 s."""
    data = spec_scenario(flat_curve(tmp_path, [0.9] * 4), requests=1, output=60, devices=1, draft_token_ms=3.0,
                         latency={"kind": "blis_linear", "params": {"beta0_us": 5000.0, "beta1_us": 0.0, "beta2_us": 200.0}})
    data["speculation"]["drafts"][0]["drafters"][0]["tree"] = {"depth": 3, "width": 4}
    rounds = _run(data).spec_rounds()
    assert len(rounds) > 5
    ends = rounds["time_s"].to_numpy()
    for prev_end, end, depth, width in zip(ends, ends[1:], rounds["tree_depth"][1:], rounds["tree_width"][1:], strict=False):
        nodes = depth * width
        assert end - prev_end == pytest.approx(nodes * 3e-3 + BETA0_S + BETA2_S * (nodes + 1), abs=1e-12)


@pytest.mark.parametrize(
    ("tree", "speculation", "group", "path"),
    [
        ({"depth": 4, "width": 2, "load_control": {"tokens_low": 50, "tokens_high": 50}}, {}, {},
         "speculation.drafts[0].drafters[0].tree.load_control.tokens_high"),
        ({"depth": 4, "width": 2, "load_control": {"tokens_low": 5, "tokens_high": 50, "min_beam_width": 3}}, {}, {},
         "speculation.drafts[0].drafters[0].tree.load_control.min_beam_width"),
        ({"depth": 4, "width": 2, "load_control": {"tokens_low": 5, "tokens_high": 50, "min_depth_scale": 0}}, {}, {},
         "speculation.drafts[0].drafters[0].tree.load_control.min_depth_scale"),
        ({"depth": 5, "width": 2}, {}, {}, "speculation.drafts[0].drafters[0].tree.depth"),
        ({"depth": 4, "width": 0}, {}, {}, "speculation.drafts[0].drafters[0].tree.width"),
        ({"depth": 4, "width": 2, "prune_score_threshold": 1.5}, {}, {}, "speculation.drafts[0].drafters[0].tree.prune_score_threshold"),
        ({"depth": 4, "width": 2, "beam": 3}, {}, {}, "speculation.drafts[0].drafters[0].tree.beam"),
        ({"depth": 4, "width": 2}, {"verify": {"partial": "first_token"}}, {}, "speculation.verify.partial"),
        ({"depth": 4, "width": 2}, {}, {"max_batch": 4}, "speculation.drafts[0].drafters[0].tree"),
    ],
)
def test_bad_tree_settings_are_refused_by_key_path(tmp_path, tree, speculation, group, path):
    """Each bad tree setting is refused with its key path (k_max is 4 here)."""
    data = spec_scenario(flat_curve(tmp_path, [0.8] * 4), speculation=speculation, group=group)
    data["speculation"]["drafts"][0]["drafters"][0]["tree"] = tree
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert f"{path}:" in str(err.value)
