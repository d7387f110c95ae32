"""The planner in the simulation: it reaches the pool size (co-located fleet) and the
prefill/decode split (disaggregated fleet) that enumeration finds best, and changes only
newly routed work."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from simpy_llm import Simulation, load_scenario
from simpy_llm.serving.planner import metric

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
        score = summary["goodput"]["requests_per_s"] / (2 * n)  # TP 2: two GPUs per replica
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
                scores[(p, d)] = summary["goodput"]["requests_per_s"] / sum(plan.gpus for plan in sim.plans)
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
