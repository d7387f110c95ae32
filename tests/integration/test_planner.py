"""The planner in the simulation: it reaches the pool size (co-located fleet), the
prefill/decode split (disaggregated fleet) and the speculation length (speculative
decoding) that enumeration finds best, and changes only newly routed or started work."""

from __future__ import annotations

import functools

import attrs
import hypothesis
import numpy as np
import pandas as pd

from simpy_llm import Simulation, load_scenario
from simpy_llm.loading import scenario_from_dict, scenario_to_dict
from simpy_llm.serving.planner import metric, objective_value

SCENARIO = "scenarios/planner_pool_split.yaml"


@functools.cache
def planned():
    """The shipped planner scenario, run once."""
    return Simulation(load_scenario(SCENARIO)).run(progress=False)


def enumerated_best() -> int:
    """The pool size a static run at each candidate size scores best by the planner's own
    objective (goodput per GPU) among those meeting its constraints."""
    scenario = load_scenario(SCENARIO)
    cfg = scenario.planner
    best, best_score = None, -np.inf
    for n in cfg.candidates.active_replicas:
        static = load_scenario(SCENARIO, [f"serving.replicas={n}", "planner=null"])
        summary = Simulation(static).run(progress=False).summary()
        ok = all(metric(summary, path) is not None and metric(summary, path) <= bound
                 for path, bound in cfg.constraints.items())
        score = summary["goodput"]["whole_run_requests_per_s"] / (2 * n)  # TP 2: two GPUs per replica
        if ok and score > best_score:
            best, best_score = n, score
    return best


def test_planner_reaches_the_enumerated_optimum_and_stays():
    """Started with all four replicas active, the planner ends at the pool size that
    enumerating static runs finds best, and every tick from its first change on chooses it."""
    results = planned()
    best = enumerated_best()
    assert best == 2  # the scenario is built so: one replica is overloaded, more waste GPUs
    assert results.summary()["planner"]["final"] == {"active_replicas": best}
    chosen = results.planner_decisions().query("chosen")
    assert (chosen["candidate"] == f"active_replicas={best}").all()
    assert results.summary()["planner"]["changes"] == 1


def test_planner_decisions_are_recorded():
    """Each tick has one row per candidate with exactly one chosen; the GPU-seconds lie
    between the optimum's and the whole fleet's over the run."""
    results = planned()
    frame = results.planner_decisions()
    assert len(frame) == results.summary()["planner"]["ticks"] * 4
    assert frame.groupby("tick")["chosen"].sum().eq(1).all()
    assert frame["applied"].sum() == 1
    used = results.summary()["planner"]["gpu_seconds"]
    assert 4 * results.end_s < used < 8 * results.end_s


def test_planner_is_deterministic():
    """The same seed gives identical records and decisions."""
    a = Simulation(load_scenario(SCENARIO, ["workload.num_requests=1200"])).run(progress=False)
    b = Simulation(load_scenario(SCENARIO, ["workload.num_requests=1200"])).run(progress=False)
    pd.testing.assert_frame_equal(a.to_dataframe(), b.to_dataframe())
    pd.testing.assert_frame_equal(a.planner_decisions(), b.planner_decisions())


def test_without_planner_nothing_changes():
    """Removing the planner section gives the records of the same fleet run statically, and
    no planner section in the summary."""
    results = Simulation(load_scenario(SCENARIO, ["planner=null", "workload.num_requests=600"])).run(progress=False)
    assert "planner" not in results.summary()
    assert results.planner_decisions().empty


def test_applied_change_affects_only_newly_routed_work():
    """Requests routed before the change finish on the replica they were routed to, including
    the replicas leaving the pool; after the change only the active replicas receive requests."""
    results = planned()
    frame = results.to_dataframe()
    change_s = float(results.planner_decisions().query("applied")["time_s"].iloc[0])
    before = frame[frame["arrival_s"] <= change_s]
    after = frame[frame["arrival_s"] > change_s]
    assert set(before["replica"]) == {0, 1, 2, 3}
    assert (before["status"] == "completed").all()
    assert set(after["replica"]) == {0, 1}


SPLIT = "scenarios/planner_disaggregated_split.yaml"


@functools.cache
def planned_split():
    """The shipped disaggregated planner scenario, run once."""
    return Simulation(load_scenario(SPLIT)).run(progress=False)


@functools.cache
def enumerated_splits() -> dict[tuple[int, int], float]:
    """The planner's objective (goodput per GPU) of a static run of each candidate split
    (prefill, decode), for the splits meeting the planner's constraints."""
    cfg = load_scenario(SPLIT).planner
    scores = {}
    for p in cfg.candidates.prefill_replicas:
        for d in cfg.candidates.decode_replicas:
            sizes = [f"serving.replicas={p + d}", f"serving.disaggregation.prefill_replicas={p}"]
            static = load_scenario(SPLIT, [*sizes, "planner=null"])
            sim = Simulation(static)
            summary = sim.run(progress=False).summary()
            ok = all(metric(summary, path) is not None and metric(summary, path) <= bound
                     for path, bound in cfg.constraints.items())
            if ok:
                scores[(p, d)] = summary["goodput"]["whole_run_requests_per_s"] / sum(plan.gpus for plan in sim.plans)
    return scores


def test_split_optimum_is_unique_and_not_the_start():
    """The scenario is built so: 3 prefill replicas carry the prompts and 2 fewer do not, 2
    decode replicas hold the KV and 1 does not; the best split beats every other feasible one
    by over 10 %, and the fleet's starting split (every replica active) is not it."""
    scores = enumerated_splits()
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert ranked[0] == (3, 2)
    assert scores[ranked[0]] > 1.1 * scores[ranked[1]]
    assert all(p >= 3 and d >= 2 for p, d in scores)  # every smaller pool misses an SLO
    start = load_scenario(SPLIT).serving
    assert (start.disaggregation.prefill_replicas, start.replicas - start.disaggregation.prefill_replicas) != ranked[0]


def test_planner_reaches_the_enumerated_split_and_stays():
    """Started with 4 prefill and 3 decode replicas active, the planner ends at the split
    enumeration finds best, and every tick from its first change on chooses it."""
    results = planned_split()
    scores = enumerated_splits()
    p, d = max(scores, key=scores.get)
    assert results.summary()["planner"]["final"] == {"prefill_replicas": p, "decode_replicas": d}
    decisions = results.planner_decisions()
    first = decisions.query("applied")["tick"].min()
    chosen = decisions.query("chosen")
    after = chosen[chosen["tick"] >= first]
    assert len(after) == results.summary()["planner"]["ticks"] - first
    assert (after["candidate"] == f"prefill_replicas={p},decode_replicas={d}").all()
    assert results.summary()["planner"]["changes"] == 1


def test_split_change_affects_only_newly_routed_work():
    """Before the change every prefill and decode replica receives work; after it arrivals
    go only to the first 3 prefill replicas (fleet indices 0-2) and hand-offs only to the
    first 2 decode replicas (indices 4-5: the fleet lists the prefill pool first)."""
    results = planned_split()
    frame = results.to_dataframe()
    change_s = float(results.planner_decisions().query("applied")["time_s"].iloc[0])
    # a one-token answer completes on its prefill replica (no hand-off, prefill_replica -1)
    entry = frame["prefill_replica"].where(frame["prefill_replica"] >= 0, frame["replica"])
    assert set(entry[frame["arrival_s"] <= change_s]) == {0, 1, 2, 3}
    assert set(entry[frame["arrival_s"] > change_s]) == {0, 1, 2}
    assert (frame["status"] == "completed").all()
    transfers = results.kv_transfers()
    assert set(transfers[transfers["start_s"] <= change_s]["decode_replica"]) == {4, 5, 6}
    assert set(transfers[transfers["start_s"] > change_s]["decode_replica"]) == {4, 5}


def test_the_cli_shows_the_planners_row(capsys):
    """``simpy-llm run`` prints the planner's ticks, changes and final configuration."""
    from simpy_llm.cli import main

    assert main(["run", SCENARIO, "--set", "workload.num_requests=1200"]) == 0
    out = capsys.readouterr().out
    assert "planner" in out and "ending at active_replicas=2" in out


SPEC = "scenarios/planner_speculative.yaml"


@functools.cache
def planned_spec():
    """The shipped speculative planner scenario, run once."""
    return Simulation(load_scenario(SPEC)).run(progress=False)


@functools.cache
def enumerated_gammas() -> dict[int, float]:
    """The planner's objective (minus the mean end-to-end latency) of a static run at each
    candidate γ (``speculation.gamma_policy`` static at that γ, no planner)."""
    cfg = load_scenario(SPEC).planner
    scores = {}
    for g in cfg.candidates.gamma:
        static = load_scenario(SPEC, ["planner=null", f"speculation.gamma_policy.params.gamma={g}"])
        summary = Simulation(static).run(progress=False).summary()
        assert summary["requests"]["completed"] == 600
        scores[g] = objective_value(cfg.objective, summary, 1)
    return scores


def test_gamma_optimum_is_unique_and_not_the_start():
    """The scenario is built so: γ = 1 pays the 40 ms round trip for under two tokens a round,
    γ = 6 drafts tokens the falling acceptance curve mostly rejects; γ = 3 beats both by over
    5 % of the mean end-to-end latency, and the run starts at γ = 6."""
    scores = enumerated_gammas()
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert ranked[0] == 3
    assert -scores[ranked[1]] > 1.05 * -scores[ranked[0]]
    assert load_scenario(SPEC).speculation.gamma_policy.params["gamma"] != ranked[0]


def test_planner_reaches_the_enumerated_gamma_and_stays():
    """Started at γ = 6, the planner ends at the γ enumeration finds best, choosing it at
    every tick, and every request completes."""
    results = planned_spec()
    scores = enumerated_gammas()
    best = max(scores, key=scores.get)
    summary = results.summary()
    assert summary["planner"]["final"] == {"gamma": best}
    assert summary["planner"]["changes"] == 1
    chosen = results.planner_decisions().query("chosen")
    assert (chosen["candidate"] == f"gamma={best}").all()
    assert summary["requests"]["completed"] == 600


def test_gamma_change_affects_only_newly_started_requests():
    """Requests that started on their draft device after the change draft at most the new γ;
    requests started before it keep γ = 6 (some of their rounds draft more than 3)."""
    results = planned_spec()
    frame = results.to_dataframe()
    change_s = float(results.planner_decisions().query("applied")["time_s"].iloc[0])
    started = (frame["arrival_s"] - frame["upload_s"]).set_axis(frame["request_id"])
    rounds = results.spec_rounds()
    rounds = rounds.assign(started_s=started.loc[rounds["request_id"]].to_numpy())
    assert rounds.loc[rounds["started_s"] > change_s, "gamma"].max() == 3
    assert rounds.loc[rounds["started_s"] < change_s, "gamma"].max() == 6


def _hybrid(planner: dict, requests: int = 400):
    """scenarios/speculative_modes.yaml (hybrid: a latency selector picks each request's mode)
    with *planner*."""
    data = scenario_to_dict(load_scenario(MODES, [f"workload.num_requests={requests}"]))
    data["planner"] = planner
    return scenario_from_dict(data, "hybrid_planned.yaml")


MODES = "scenarios/speculative_modes.yaml"


def test_fused_fraction_sets_the_share_of_fused_admissions():
    """Under a planned fused fraction of 0.25, of the requests admitted after the change one in
    four runs fused (to within one), whatever the mode selector would have chosen."""
    scenario = _hybrid({"interval_s": 5, "candidates": {"fused_fraction": [0.25]}})
    results = Simulation(scenario).run(progress=False)
    change_s = float(results.planner_decisions().query("applied")["time_s"].iloc[0])
    frame = results.to_dataframe()
    after = frame[frame["first_scheduled_s"] > change_s]
    fused = int((after["spec_mode"] == "fused").sum())
    assert len(after) > 300
    assert abs(fused - 0.25 * len(after)) <= 1


def test_speculation_pool_and_batch_knobs_apply():
    """With speculation, active_replicas routes new prompts to the first verify servers only,
    and max_num_seqs caps each server's admitted requests; nothing is lost."""
    scenario = _hybrid({"interval_s": 5, "candidates": {"active_replicas": [1], "max_num_seqs": [4]}})
    results = Simulation(scenario).run(progress=False)
    change_s = float(results.planner_decisions().query("applied")["time_s"].iloc[0])
    frame = results.to_dataframe()
    assert set(frame.loc[frame["arrival_s"] > change_s + 1.0, "replica"]) == {0}
    assert (frame["status"] == "completed").all() and len(frame) == 400
    # once the requests admitted before the change have left, at most 4 are admitted at a time
    calm_s = frame.loc[frame["first_scheduled_s"] <= change_s, "completion_s"].max()
    later = frame[frame["first_scheduled_s"] > calm_s]
    assert len(later) > 100
    for t in later["first_scheduled_s"]:
        held = (frame["first_scheduled_s"] <= t) & (frame["completion_s"] > t) & (frame["replica"] == 0)
        assert held.sum() <= 4


class Scripted:
    """A planner choice that applies a given sequence of candidate positions, one per tick."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = list(picks)
        self.tick = 0

    def choose(self, evaluations, current):  # noqa: ANN001, ANN201 - the PlannerChoice protocol
        pick = self.picks[self.tick % len(self.picks)] % len(evaluations)
        self.tick += 1
        return pick


def _scripted_run(picks: list[int], seed: int):
    planner = {"interval_s": 2, "candidates": {"gamma": [1, 4], "fused_fraction": [0.0, 0.5, 1.0]}}
    scenario = attrs.evolve(_hybrid(planner, requests=120), seed=seed)
    return Simulation(scenario, planner_policy=Scripted(picks)).run(progress=False)


@hypothesis.settings(max_examples=6, deadline=None, derandomize=True)
@hypothesis.given(
    picks=hypothesis.strategies.lists(hypothesis.strategies.integers(0, 5), min_size=1, max_size=6),
    seed=hypothesis.strategies.integers(0, 1000),
)
def test_changing_gamma_and_fused_fraction_loses_and_duplicates_nothing(picks, seed):
    """Whatever sequence of γ and fused fractions the planner applies, every request appears
    once and completes with all its tokens, each request's rounds run in one mode and add up
    to its output, and the same seed and choices give identical records."""
    results = _scripted_run(picks, seed)
    frame = results.to_dataframe()
    assert len(frame) == 120 and frame["request_id"].is_unique
    assert (frame["status"] == "completed").all()
    assert (frame["generated_tokens"] == frame["output_tokens"]).all()
    rounds = results.spec_rounds()
    per_request = rounds.groupby("request_id").agg(tokens=("tokens", "sum"), modes=("mode", "nunique"))
    outputs = frame.set_index("request_id")["output_tokens"]
    assert (per_request["modes"] == 1).all()
    assert (per_request["tokens"] == outputs.loc[per_request.index] - 1).all()
    again = _scripted_run(picks, seed)
    pd.testing.assert_frame_equal(frame, again.to_dataframe())
    pd.testing.assert_frame_equal(rounds, again.spec_rounds())
