"""Agentic sessions against references written here, independent of the library's workflow code.

* An infinitely fast server: each completed session's E2E is the longest path through its
  executed DAG, LLM calls weighing 0 and tool calls their latency.
* A single-slot server running a chain workflow: every request's arrival and completion
  equal an event-driven single FIFO server written in the test.
* A tool with a capacity: calls never overlap beyond the capacity, and a capacity-1 tool
  is a FIFO single server (a Lindley recursion over its calls).
* Seed 004's edge timing measured on the records a user reads, on a server with a
  per-output-token overhead: a child call (after one parent, or a fan-in of several)
  starts no earlier than its parents' recorded completions, and a session ends at its
  last call's completion.
* A session cut by ``until_s`` counts only the LLM requests that arrived.
* A tool's drawn latencies have its ``latency_s`` distribution's mean, in seconds.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simpy_llm import Results, Simulation, scenario_from_dict
from tests.agentic_helpers import (
    REACT_SERVING,
    PrefillDecodeLatency,
    ZeroTimeLatency,
    agentic_scenario,
    const,
    expo,
    llm,
    tool,
    tool_spec,
    zero_time_serving,
)

ENDED = ("completed", "max_rounds", "user_stopped")


def run(data: dict[str, Any], latency_model: object = None) -> Results:
    return Simulation(scenario_from_dict(copy.deepcopy(data)), latency_model=latency_model).run(progress=False)


# --- an infinitely fast server: E2E is the longest path --------------------------------------
def longest_path_end(
    block: Mapping[str, Any], start_s: float, iterations: int, tool_latency: Mapping[tuple[str, int, int], float]
) -> float:
    """When a session that started at *start_s* ends if LLM calls take no time and tool call
    ``(step, iteration, instance)`` takes ``tool_latency[...]``: the longest path through the
    workflow unrolled over *iterations* loop iterations (seed 004's edge table: a step waits
    for every instance of each parent; a loop iteration for every call of the previous one;
    a step after the loop for the loop's end). Written from the seed, sharing nothing with
    the library's workflow code."""
    steps = {s["id"]: s for s in block["steps"]}
    loop = set(block["loop"]["over"]) if block.get("loop") else set()
    last = max(iterations, 1) - 1
    done: dict[tuple[str, int], float] = {}

    def loop_done(k: int) -> float:
        return max(step_done(s, k) for s in loop)

    def ready(sid: str, k: int) -> float:
        step = steps[sid]
        parents = step.get("depends_on", [])
        times = [start_s] if not parents else []
        for p in parents:
            if sid in loop and p in loop:
                times.append(step_done(p, k))
            elif p in loop:  # after the loop: its last iteration
                times.append(loop_done(last))
            else:
                times.append(step_done(p, 0))
        if sid in loop and k > 0:
            times.append(loop_done(k - 1))
        return max(times)

    def step_done(sid: str, k: int) -> float:
        if (sid, k) not in done:
            step = steps[sid]
            begin = ready(sid, k)
            if step["type"] == "llm_call":
                done[(sid, k)] = begin
            else:
                n = step.get("fan_out") or 1
                done[(sid, k)] = max(begin + tool_latency[(sid, k, j)] for j in range(n))
        return done[(sid, k)]

    ends = [step_done(sid, k) for sid in steps for k in (range(last + 1) if sid in loop else (0,))]
    return max(ends)


FORK_LOOP_JOIN = {
    # plan -> {search x3 (tool), lookup (tool)} -> think (fan-in) -> loop[act (tool) -> observe x2]
    # -> answer (fan-in of the loop's end and lookup)
    "workflow": "fork-loop-join",
    "loop": {
        "over": ["act", "observe"],
        "max_iterations": 3,
        "iterations_distribution": {"type": "uniform", "params": {"low": 0.5, "high": 3.5}},
    },
    "steps": [
        llm("plan", prompt=expo(30), output=expo(5)),
        tool("search", "web", "plan", fan_out=3),
        tool("lookup", "db", "plan"),
        llm("think", "search", "lookup", prompt=expo(30), output=expo(5)),
        tool("act", "web", "think"),
        llm("observe", "act", fan_out=2, context_growth="accumulate", prompt=expo(20), output=expo(4)),
        llm("answer", "observe", "lookup", prompt=expo(40), output=expo(8)),
    ],
    "tools": {
        "web": tool_spec(expo(0.05)),
        "db": tool_spec({"type": "uniform", "params": {"low": -0.01, "high": 0.03}}),  # some draws clamp to 0
    },
}

ROOT_IN_LOOP = {
    # loop[sample x3 (root) -> run x2 (tool) -> judge], continued with probability 0.7
    "workflow": "root-in-loop",
    "loop": {"over": ["sample", "run", "judge"], "max_iterations": 4, "continue_probability": 0.7},
    "steps": [
        llm("sample", fan_out=3, prompt=expo(20), output=expo(6)),
        tool("run", "sandbox", "sample", fan_out=2),
        llm("judge", "run", context_growth="accumulate", prompt=expo(20), output=expo(3)),
    ],
    "tools": {"sandbox": tool_spec(expo(0.02))},
}


def tool_latencies(results: Results) -> dict[str, dict[tuple[str, int, int], float]]:
    out: dict[str, dict[tuple[str, int, int], float]] = defaultdict(dict)
    for t in results.tool_calls().itertuples(index=False):
        out[t.session_id][(t.step_id, int(t.loop_iteration), int(t.instance))] = float(t.latency_s)
    return out


@pytest.mark.parametrize("block", [FORK_LOOP_JOIN, ROOT_IN_LOOP], ids=["fork-loop-join", "root-in-loop"])
def test_zero_time_server_e2e_is_the_longest_path(block):
    """On a server whose steps take no time, each completed session's E2E equals the longest
    path through its executed DAG (LLM calls 0, tool calls their drawn latency), computed
    here from the workflow and the tool-call rows; exact to 1e-9."""
    data = agentic_scenario(block, sessions=40, rate=20.0, seed=11, serving=zero_time_serving())
    results = run(data, ZeroTimeLatency())
    ws = results.workflow_sessions()
    done = ws[ws.end_reason.isin(ENDED)]
    assert len(done) == 40
    latencies = tool_latencies(results)
    for row in done.itertuples(index=False):
        end = longest_path_end(block, row.start_s, int(row.iterations), latencies[row.session_id])
        assert abs(row.e2e_s - (end - row.start_s)) <= 1e-9, (row.session_id, row.e2e_s, end - row.start_s)


@pytest.mark.parametrize("block", [FORK_LOOP_JOIN, ROOT_IN_LOOP], ids=["fork-loop-join", "root-in-loop"])
def test_zero_time_server_requests_take_no_time(block):
    """The premise of the longest-path test: on the zero-time server every LLM request
    completes at its arrival, and the sessions do iterate (more than one iteration somewhere)."""
    data = agentic_scenario(block, sessions=40, rate=20.0, seed=11, serving=zero_time_serving())
    results = run(data, ZeroTimeLatency())
    frame = results.to_dataframe()
    assert (frame.status == "completed").all()
    assert (frame.completion_s == frame.arrival_s).all()
    assert results.workflow_sessions().iterations.max() > 1


# --- one slot, a chain: an event-driven FIFO reference -----------------------------------------
A_S, B_S, C_S = 0.004, 2e-5, 0.003
"""Single-slot server: a prompt's step takes A_S + B_S * prompt tokens, a decode step C_S."""


def prompt_gauss(mean: float, sd: float, hi: float) -> dict[str, Any]:
    """A prompt length clamped to [10, hi] tokens."""
    return {"type": "gaussian", "params": {"mean": mean, "std_dev": sd, "min": 10, "max": hi}}


CHAIN = {
    "workflow": "chain",
    "steps": [
        llm("s0", prompt=prompt_gauss(100, 40, 400), output=expo(20)),
        tool("t1", "search", "s0"),
        llm("s2", "t1", prompt=prompt_gauss(200, 60, 600), output=expo(15)),
        tool("t3", "fetch", "s2"),
        llm("s4", "t3", prompt=prompt_gauss(300, 80, 800), output=expo(25)),
    ],
    "tools": {"search": tool_spec(expo(0.05)), "fetch": tool_spec(expo(0.1))},
}
CHAIN_LLM = ("s0", "s2", "s4")
CHAIN_TOOL_AFTER = {"s0": "t1", "s2": "t3"}


def single_slot_serving() -> dict[str, Any]:
    return {
        "replicas": 1,
        "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 16384, "kv_num_blocks": 2048, "prefix_caching": False},
        "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1.0}},  # replaced by PrefillDecodeLatency
    }


def fifo_chain_reference(frame: pd.DataFrame, tools: pd.DataFrame) -> dict[tuple[str, str], tuple[float, float]]:
    """``(arrival_s, completion_s)`` of every request of the chain, from an event-driven single
    FIFO server: requests are served one at a time in order of arrival (ties by request id),
    each taking A_S + B_S * prompt + (output - 1) * C_S; a session's root arrives when the
    records say, and each later call at its parent's completion plus the tool latency."""
    lengths = {(r.session_id, r.step_id): (int(r.prompt_tokens), int(r.output_tokens), int(r.request_id))
               for r in frame.itertuples(index=False)}
    latency = {(t.session_id, t.step_id): float(t.latency_s) for t in tools.itertuples(index=False)}
    pending: list[tuple[float, int, str, str]] = []  # (arrival, request id, session, step)
    for r in frame[frame.step_id == "s0"].itertuples(index=False):
        pending.append((float(r.arrival_s), int(r.request_id), r.session_id, "s0"))
    out: dict[tuple[str, str], tuple[float, float]] = {}
    free_s = 0.0
    while pending:
        pending.sort()
        arrival, _rid, sid, step = pending.pop(0)
        prompt, output, _ = lengths[(sid, step)]
        begin = max(free_s, arrival)
        prefill_end = begin + (A_S + B_S * prompt)
        completion = prefill_end + (output - 1) * C_S
        free_s = completion
        out[(sid, step)] = (arrival, completion)
        nxt = CHAIN_LLM.index(step) + 1
        if nxt < len(CHAIN_LLM):
            child = CHAIN_LLM[nxt]
            pending.append((completion + latency[(sid, CHAIN_TOOL_AFTER[step])], lengths[(sid, child)][2], sid, child))
    return out


def test_single_slot_chain_matches_an_event_driven_fifo_reference():
    """With ``max_num_seqs: 1``, every request's arrival and completion equal an independent
    event-driven single FIFO server; exact to 1e-9.

    The engine's order of service (``docs/model.md``, "A replica, precisely"): with the
    ``fcfs`` scheduler the waiting queue is ordered by the order requests entered it (entries
    at the same time by request id), a request enters it at its arrival plus the latency
    model's queueing time (0 here), and a step is planned at the previous step's end seeing
    every entry up to that instant. One slot therefore makes the replica a work-conserving
    FIFO single server over arrival times, each request alone in its steps: one prefill step
    (the token budget holds any prompt, no prefix cache) then output - 1 decode steps. That
    is what the reference simulates, with the session's follow-ups arriving as they are
    released (parent completion + the tool call's drawn latency, read from ``tool_calls()``).
    """
    data = agentic_scenario(CHAIN, sessions=40, rate=5.0, seed=3, serving=single_slot_serving())
    results = run(data, PrefillDecodeLatency(A_S, B_S, C_S))
    frame = results.to_dataframe()
    assert len(frame) == 120 and (frame.status == "completed").all()
    expected = fifo_chain_reference(frame, results.tool_calls())
    for r in frame.itertuples(index=False):
        arrival, completion = expected[(r.session_id, r.step_id)]
        assert abs(r.arrival_s - arrival) <= 1e-9, (r.session_id, r.step_id, r.arrival_s, arrival)
        assert abs(r.completion_s - completion) <= 1e-9, (r.session_id, r.step_id, r.completion_s, completion)


def test_single_slot_chain_load_makes_requests_queue():
    """The premise of the FIFO comparison: at this load many requests wait behind others
    (the order of service matters), and every session completes."""
    data = agentic_scenario(CHAIN, sessions=40, rate=5.0, seed=3, serving=single_slot_serving())
    results = run(data, PrefillDecodeLatency(A_S, B_S, C_S))
    frame = results.to_dataframe()
    waited = (frame.first_scheduled_s - frame.arrival_s) > 1e-6
    assert waited.sum() >= 30
    assert (results.workflow_sessions().end_reason == "completed").all()


# --- tools with a capacity ---------------------------------------------------------------
def capacity_block(capacity: int) -> dict[str, Any]:
    return {
        "workflow": "shared-tool",
        "steps": [llm("ask"), tool("probe", "gpu_box", "ask", fan_out=2), llm("sum", "probe")],
        "tools": {"gpu_box": tool_spec(expo(0.05), capacity=capacity)},
    }


def test_capacity_one_tool_queues_and_never_overlaps():
    """A ``capacity: 1`` tool shared by many sessions: some calls wait (wait_s > 0), and no
    two calls run at once: their intervals [start_s + wait_s, end_s) are disjoint."""
    results = run(agentic_scenario(capacity_block(1), sessions=60, rate=20.0, seed=5))
    tc = results.tool_calls()
    assert len(tc) == 120
    assert (tc.wait_s > 0).sum() >= 10
    running = sorted(zip(tc.start_s + tc.wait_s, tc.end_s, strict=True))
    for (_s0, e0), (s1, _e1) in itertools.pairwise(running):
        assert s1 >= e0 - 1e-12, (e0, s1)


def test_capacity_one_tool_is_a_fifo_single_server():
    """A ``capacity: 1`` tool serves its calls in the order they were made, without idling
    while one waits: each runs from max(its call, the previous call's end) for its drawn
    latency (a Lindley recursion over the tool-call rows); exact to 1e-9."""
    results = run(agentic_scenario(capacity_block(1), sessions=60, rate=20.0, seed=5))
    tc = results.tool_calls().sort_values(["start_s", "session_id", "instance"], kind="stable")
    free_s = -math.inf
    for t in tc.itertuples(index=False):
        begin = max(t.start_s, free_s)
        free_s = begin + t.latency_s
        assert abs((t.start_s + t.wait_s) - begin) <= 1e-9, (t.session_id, t.start_s, t.wait_s, begin)
        assert abs(t.end_s - free_s) <= 1e-9


def test_capacity_three_tool_runs_at_most_three_calls_at_once():
    """A ``capacity: 3`` tool under load runs at most three calls at any instant, reaches
    three, and makes some calls wait."""
    results = run(agentic_scenario(capacity_block(3), sessions=80, rate=60.0, seed=9))
    tc = results.tool_calls()
    running = (tc.start_s + tc.wait_s).to_numpy()
    ends = tc.end_s.to_numpy()
    # Calls running just after each call begins (start + wait recomputes the slot's grant time
    # to within an ulp, so the instant is taken 1 ns later).
    peak = max(int(((running <= t + 1e-9) & (ends > t + 1e-9)).sum()) for t in running)
    assert peak == 3
    assert (tc.wait_s > 0).any()


# --- edge timing measured on the records ------------------------------------------------------
OVERHEAD_PAIR = {"workflow": "pair", "steps": [llm("first", output=const(8)), llm("second", "first")]}
OVERHEAD_TOOL = {
    "workflow": "with-tool",
    "steps": [llm("first", output=const(8)), tool("call", "web", "first"), llm("second", "call")],
    "tools": {"web": tool_spec(const(0.005))},
}


def test_llm_child_arrives_after_parent_recorded_completion_with_token_overhead():
    """Seed 004's edge table (LLM -> LLM child at the parent's completion) on a server with
    a per-output-token overhead (the BLIS H100 profile of ``agentic_react.yaml``, alpha2 =
    1.8055 ms): the child's arrival is no earlier than the parent's recorded
    ``completion_s``, the time its client has the whole output."""
    frame = run(agentic_scenario(OVERHEAD_PAIR, sessions=1, serving=REACT_SERVING)).to_dataframe().set_index("step_id")
    assert frame.loc["second", "arrival_s"] >= frame.loc["first", "completion_s"], (
        frame.loc["second", "arrival_s"], frame.loc["first", "completion_s"])


def test_tool_call_starts_after_parent_recorded_completion_with_token_overhead():
    """LLM -> tool edge on the same server: the tool call starts no earlier than the parent
    request's recorded ``completion_s``."""
    results = run(agentic_scenario(OVERHEAD_TOOL, sessions=1, serving=REACT_SERVING))
    first = results.to_dataframe().set_index("step_id").loc["first"]
    call = results.tool_calls().iloc[0]
    assert call.start_s >= first.completion_s, (call.start_s, first.completion_s)


def test_session_ends_at_its_last_recorded_completion_with_token_overhead():
    """A completed session's ``end_s`` is its last call's end: the largest ``completion_s``
    of its requests (and ``end_s`` of its tool calls), so ``e2e_s`` covers the whole answer."""
    results = run(agentic_scenario(OVERHEAD_TOOL, sessions=5, serving=REACT_SERVING))
    frame = results.to_dataframe()
    tc = results.tool_calls()
    for row in results.workflow_sessions().itertuples(index=False):
        last = max(frame.completion_s[frame.session_id == row.session_id].max(), tc.end_s[tc.session_id == row.session_id].max())
        assert abs(row.end_s - last) <= 1e-9, (row.session_id, row.end_s, last)


def test_fan_in_waits_for_the_latest_parent_completion_with_token_overhead():
    """Fan-in on a server with per-token overhead: ``c`` waits for ``x`` (16 output tokens)
    and ``y`` (1 token); on one slot ``x`` leaves the engine first but its client has its
    output last. ``c`` arrives no earlier than the later of the two recorded completions."""
    serving = copy.deepcopy(REACT_SERVING)
    serving["engine"]["max_num_seqs"] = 1
    block = {
        "workflow": "join",
        "steps": [llm("a", output=const(1)), llm("x", "a", output=const(16)), llm("y", "a", output=const(1)), llm("c", "x", "y")],
    }
    frame = run(agentic_scenario(block, sessions=1, serving=serving)).to_dataframe().set_index("step_id")
    latest = max(frame.loc["x", "completion_s"], frame.loc["y", "completion_s"])
    assert frame.loc["c", "arrival_s"] >= latest, (frame.loc["c", "arrival_s"], latest)


def test_session_cut_during_think_time_counts_only_requests_that_arrived():
    """A session cut by ``until_s`` while its next iteration is still in its think time has
    made one LLM request: ``llm_calls`` (and ``sessions().rounds``) equal the requests in the
    records, as INV-1 counts them."""
    block = {"workflow": "think", "loop": {"over": ["a"], "max_iterations": 2, "think_time_s": const(1.0)}, "steps": [llm("a")]}
    results = run(agentic_scenario(block, sessions=1, until_s=1.0))
    frame = results.to_dataframe()
    assert len(frame) == 1 and frame.completion_s.iloc[0] < 1.0  # the root ran; its follow-up was due at ~1.26 s
    row = results.workflow_sessions().iloc[0]
    assert row.end_reason == "in_progress"
    assert row.llm_calls == len(frame), (row.llm_calls, len(frame))
    assert results.sessions().rounds.iloc[0] == len(frame)


def test_edges_are_exact_without_token_overhead():
    """Without per-token overhead (alpha2 = 0) the same workflow follows the edge table
    exactly: the tool call starts at the parent's completion and the child arrives when the
    tool returns; the session ends at the child's completion."""
    serving = copy.deepcopy(REACT_SERVING)
    serving["latency_model"]["params"]["alpha2_us"] = 0.0
    results = run(agentic_scenario(OVERHEAD_TOOL, sessions=5, serving=serving))
    frame = results.to_dataframe()
    tc = results.tool_calls().set_index("session_id")
    ws = results.workflow_sessions().set_index("session_id")
    for sid, group in frame.groupby("session_id"):
        g = group.set_index("step_id")
        assert tc.loc[sid, "start_s"] == g.loc["first", "completion_s"]
        assert g.loc["second", "arrival_s"] == tc.loc[sid, "end_s"]
        assert ws.loc[sid, "end_s"] == g.loc["second", "completion_s"]


# --- tool latencies are seconds ------------------------------------------------------------
@pytest.mark.parametrize(
    ("dist", "mean_s", "sd_s"),
    [
        ({"type": "exponential", "params": {"mean": 0.02}}, 0.02, 0.02),
        ({"type": "gamma", "params": {"shape": 16.0, "scale": 0.00125}}, 0.02, 0.005),
        ({"type": "normal", "params": {"mean": 0.02, "std_dev": 0.005}}, 0.02, 0.005),
    ],
    ids=["exponential", "gamma", "normal"],
)
def test_tool_latency_draws_have_the_distribution_mean_in_seconds(dist, mean_s, sd_s):
    """A tool's drawn latencies (``tool_calls().latency_s``) have the mean of its
    ``latency_s`` distribution, in seconds, within 5 standard errors (400 calls)."""
    block = {"workflow": "lat", "steps": [llm("a"), tool("t", "svc", "a"), llm("b", "t")], "tools": {"svc": tool_spec(dist)}}
    lat = run(agentic_scenario(block, sessions=400, rate=50.0, seed=2)).tool_calls().latency_s.to_numpy()
    assert len(lat) == 400
    assert abs(lat.mean() - mean_s) <= 5 * sd_s / np.sqrt(len(lat)), lat.mean()
