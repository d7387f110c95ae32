"""Seed 004's invariants on random valid agentic workflows (hypothesis).

The strategy draws a random DAG of 1-7 steps (one LLM root, LLM and tool steps, fan-out on
some, fan-in where a step has several parents), optionally a loop over a connected convex
part of it (some of its LLM steps accumulating context, an iteration count, a continuation
probability and a think time drawn at random), tools with or without a capacity (one of
them may draw negative latencies, which count as 0), a load, 5-40 sessions or a workload
horizon, optionally a cut by ``simulation.until_s``, and a seed. Each is run on one replica
with the serving section of ``scenarios/agentic_react.yaml`` (a smaller KV cache).

Every test draws the same examples (one hypothesis seed for the module), so a run is
simulated once and its Results reused by the tests that check it. Shrinking is off, which
keeps the file's time bounded when a test fails: a failure reports the first violating
example as drawn, and the assertion names the violating session, step and iteration.

The structure the checks use (parents, loop membership, fan-out) is read from the drawn
workflow data itself, not from the library's compiled workflow.
"""

from __future__ import annotations

import copy
import filecmp
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from simpy_llm import Results, Simulation, scenario_from_dict
from tests.agentic_helpers import REACT_SERVING, const, expo

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure costs one run, not hundreds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FEW = settings(SETTINGS, max_examples=25)
SEED = 20260226
"""One hypothesis seed for every test: they all draw the same examples (and share the runs)."""

TOOL_NAMES = ("search", "sandbox")
ENDED = {"completed", "max_rounds", "user_stopped"}
REASONS = {"completed", "max_rounds", "user_stopped", "horizon", "dropped", "in_progress"}


# --- the strategy ----------------------------------------------------------------------
def descendants(deps: list[list[int]], start: int) -> set[int]:
    """Steps reachable from *start* along depends_on edges (parent -> child), *start* included."""
    out = {start}
    changed = True
    while changed:
        changed = False
        for i, ps in enumerate(deps):
            if i not in out and any(p in out for p in ps):
                out.add(i)
                changed = True
    return out


def ancestors(deps: list[list[int]], start: int) -> set[int]:
    """Steps from which *start* is reachable, *start* included."""
    out = {start}
    todo = [start]
    while todo:
        for p in deps[todo.pop()]:
            if p not in out:
                out.add(p)
                todo.append(p)
    return out


@st.composite
def tool_specs(draw) -> dict[str, Any]:
    kind = draw(st.sampled_from(["exponential", "constant", "uniform_with_negatives"]))
    if kind == "exponential":
        latency = expo(draw(st.floats(0.001, 0.05)))
    elif kind == "constant":
        latency = const(draw(st.floats(0.001, 0.03)))
    else:  # draws below 0 count as 0 (INV-A5)
        latency = {"type": "uniform", "params": {"low": -0.02, "high": draw(st.floats(0.001, 0.04))}}
    spec: dict[str, Any] = {"latency_s": latency, "output_tokens": const(draw(st.integers(1, 20)))}
    capacity = draw(st.one_of(st.none(), st.integers(1, 3)))
    if capacity is not None:
        spec["capacity"] = capacity
    return spec


@st.composite
def agentic_workflows(draw) -> dict[str, Any]:
    """A random valid ``agentic`` block."""
    n = draw(st.integers(1, 7))
    kinds = ["llm_call"] + [draw(st.sampled_from(["llm_call", "tool_call"])) for _ in range(n - 1)]
    deps: list[list[int]] = [[]]
    for i in range(1, n):
        deps.append(sorted(draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=min(3, i), unique=True))))
    body: set[int] = set()
    loop: dict[str, Any] | None = None
    if draw(st.booleans()):
        start = draw(st.integers(0, n - 1))
        end = draw(st.sampled_from(sorted(descendants(deps, start))))
        body = descendants(deps, start) & ancestors(deps, end)  # every step on a path start -> end
        max_it = draw(st.integers(1, 4))
        loop = {"over": [f"s{i}" for i in sorted(body)], "max_iterations": max_it}
        if draw(st.booleans()):
            loop["iterations_distribution"] = {"type": "uniform", "params": {"low": 0.5, "high": max_it + 0.5}}
        if draw(st.booleans()):
            loop["continue_probability"] = draw(st.floats(0.3, 1.0))
        if draw(st.booleans()):
            loop["think_time_s"] = draw(st.sampled_from([const(0.004), expo(0.01)]))
    steps = []
    used_tools: dict[str, dict[str, Any]] = {}
    for i in range(n):
        step: dict[str, Any] = {"id": f"s{i}", "type": kinds[i]}
        if deps[i]:
            step["depends_on"] = [f"s{p}" for p in deps[i]]
        if draw(st.integers(0, 3)) == 0:
            step["fan_out"] = draw(st.integers(2, 3))
        if kinds[i] == "llm_call":
            step["input_distribution"] = draw(st.sampled_from([const(12), expo(24), const(40)]))
            step["output_distribution"] = draw(st.sampled_from([const(1), const(3), expo(4)]))
            if i in body and draw(st.booleans()):
                step["context_growth"] = "accumulate"
        else:
            name = draw(st.sampled_from(TOOL_NAMES))
            step["tool"] = name
            if name not in used_tools:
                used_tools[name] = draw(tool_specs())
        steps.append(step)
    block: dict[str, Any] = {"workflow": "random", "steps": steps, "tools": used_tools}
    if loop is not None:
        block["loop"] = loop
    return block


@st.composite
def agentic_runs(draw) -> dict[str, Any]:
    """A one-replica scenario running a random workflow at a random load."""
    sessions = draw(st.integers(5, 40))
    rate = draw(st.floats(1.0, 200.0))
    workload: dict[str, Any] = {
        "category": "agentic",
        "aggregate_rate": rate,
        "clients": [{"id": "agent", "arrival": {"process": "poisson"}, "agentic": draw(agentic_workflows())}],
    }
    if draw(st.booleans()):
        workload["num_requests"] = sessions
    else:
        workload["horizon_s"] = sessions / rate
    serving = copy.deepcopy(REACT_SERVING)
    serving["engine"]["kv_num_blocks"] = draw(st.sampled_from([256, 512, 2048]))
    serving["engine"]["max_num_seqs"] = draw(st.sampled_from([2, 16, 128]))
    max_len = draw(st.sampled_from([None, None, 64, 160]))  # long accumulated prompts are dropped
    if max_len is not None:
        serving["engine"]["max_model_len"] = max_len
    data: dict[str, Any] = {"seed": draw(st.integers(0, 2**16)), "workload": workload, "serving": serving}
    if draw(st.integers(0, 3)) == 0:
        data["simulation"] = {"until_s": draw(st.floats(0.05, 1.0))}
    return data


# --- running, with one run per distinct scenario -------------------------------------------
_RUNS: dict[str, Results] = {}


def simulate(data: dict[str, Any]) -> Results:
    key = json.dumps(data, sort_keys=True)
    if key not in _RUNS:
        _RUNS[key] = Simulation(scenario_from_dict(copy.deepcopy(data))).run(progress=False)
    return _RUNS[key]


def without_output_overhead(data: dict[str, Any]) -> dict[str, Any]:
    """The same scenario on a server with no per-output-token post-processing (BLIS alpha2 = 0)."""
    data = copy.deepcopy(data)
    data["serving"]["latency_model"]["params"]["alpha2_us"] = 0.0
    return data


# --- reading a run --------------------------------------------------------------------------
class Shape:
    """The drawn workflow's structure, from its data."""

    def __init__(self, data: dict[str, Any]) -> None:
        client = data["workload"]["clients"][0]
        block = client["agentic"]
        self.steps = {s["id"]: s for s in block["steps"]}
        self.llm = {sid for sid, s in self.steps.items() if s["type"] == "llm_call"}
        self.parents = {sid: list(s.get("depends_on", ())) for sid, s in self.steps.items()}
        self.fan_out = {sid: s.get("fan_out") or 1 for sid, s in self.steps.items()}
        loop = block.get("loop")
        self.loop = set(loop["over"]) if loop else set()
        self.max_iterations = loop["max_iterations"] if loop else 1
        self.every_iteration = (
            bool(loop) and "iterations_distribution" not in loop and loop.get("continue_probability", 1.0) == 1.0
        )
        self.capacity = {name: t.get("capacity") for name, t in block["tools"].items()}


class Calls:
    """Every call of a run: LLM request rows and tool-call rows by (session, step, iteration),
    and per session the (step, iteration, start, end) of each call."""

    def __init__(self, results: Results) -> None:
        self.frame = results.to_dataframe()
        self.tools = results.tool_calls()
        self.llm: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
        self.tool: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
        for r in self.frame.itertuples(index=False):
            self.llm[(r.session_id, r.step_id, int(r.loop_iteration))].append(r)
        for t in self.tools.itertuples(index=False):
            self.tool[(t.session_id, t.step_id, int(t.loop_iteration))].append(t)
        self.by_session: dict[str, list[tuple[str, int, float, float]]] = defaultdict(list)
        """Per session: (step, iteration, start, end) of every call (LLM: arrival, completion)."""
        for (sid, step, it), rows in self.llm.items():
            self.by_session[sid] += [(step, it, r.arrival_s, r.completion_s) for r in rows]
        for (sid, step, it), rows in self.tool.items():
            self.by_session[sid] += [(step, it, t.start_s, t.end_s) for t in rows]


def causality_violations(shape: Shape, calls: Calls) -> list[str]:
    """INV-A1: each call starts no earlier than the end of every call it waits for: each
    parent step's calls (same iteration or earlier when the child is in the loop, any
    iteration otherwise), the previous iteration's loop calls, and, for a step after the
    loop, every loop call. A parent that did not end (NaN) or has no call is a violation."""
    bad = []
    for sid, entries in calls.by_session.items():
        for step, it, start, _end in entries:
            in_loop = step in shape.loop
            for parent in shape.parents[step]:
                waited = [e for s, i, _st, e in entries if s == parent and (not in_loop or i <= it)]
                if not waited:
                    bad.append(f"{sid} {step}[{it}] ran without a call of its parent {parent}")
                for end in waited:
                    if not start >= end:
                        bad.append(f"{sid} {step}[{it}] started {start!r} before parent {parent} ended {end!r}")
            if in_loop and it > 0:
                for s, i, _st, end in entries:
                    if s in shape.loop and i == it - 1 and not start >= end:
                        bad.append(f"{sid} {step}[{it}] started {start!r} before {s}[{i}] (previous iteration) ended {end!r}")
            if not in_loop and any(p in shape.loop for p in shape.parents[step]):
                for s, i, _st, end in entries:
                    if s in shape.loop and not start >= end:
                        bad.append(f"{sid} {step} after the loop started {start!r} before {s}[{i}] ended {end!r}")
    return bad


# --- INV-A1 ---------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a1_no_call_before_its_parents_complete(data):
    """INV-A1: every LLM request arrives (and every tool call starts) no earlier than the
    client-visible completion of each request of its parent steps and the return of each
    tool call of its parent steps, no earlier than the end of every call of the previous
    loop iteration, and a step after the loop no earlier than the end of every loop call."""
    violations = causality_violations(Shape(data), Calls(simulate(data)))
    assert not violations, violations[:5]


@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a1_holds_without_per_token_overhead(data):
    """INV-A1 as above, on the same server with no per-output-token post-processing time, so
    a request's completion is the end of its last engine step (the DAG rules themselves)."""
    data = without_output_overhead(data)
    violations = causality_violations(Shape(data), Calls(simulate(data)))
    assert not violations, violations[:5]


# --- INV-A2 ---------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a2_fan_in_only_after_every_parent_instance(data):
    """INV-A2 (every session): a step never has more than fan_out calls in an iteration, and
    a step that ran in an iteration found every instance of each of its parents finished
    (completed LLM requests, returned tool calls) in the iteration it waits for."""
    shape, calls = Shape(data), Calls(simulate(data))
    last_iteration: dict[str, int] = defaultdict(int)
    for sid, entries in calls.by_session.items():
        for _s, it, _st, _e in entries:
            last_iteration[sid] = max(last_iteration[sid], it)
    for key, rows in list(calls.llm.items()) + list(calls.tool.items()):
        sid, step, it = key
        assert len(rows) <= shape.fan_out[step], (key, len(rows))
        for parent in shape.parents[step]:
            if step in shape.loop and parent in shape.loop:
                p_it = it
            elif parent in shape.loop:  # a step after the loop waits for the loop's last iteration
                p_it = last_iteration[sid]
            else:
                p_it = 0
            if parent in shape.llm:
                done = [r for r in calls.llm.get((sid, parent, p_it), []) if r.status == "completed"]
            else:
                done = calls.tool.get((sid, parent, p_it), [])
            assert len(done) == shape.fan_out[parent], (key, parent, p_it, len(done))


@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a2_ended_sessions_ran_every_step_fully(data):
    """INV-A2 (sessions that ended ``completed`` / ``max_rounds`` / ``user_stopped``): each
    step outside the loop ran once, each loop step in every iteration the session counts,
    each with exactly fan_out LLM requests (all completed) or tool calls (instances 0..N-1);
    its fan-out instances planned and done both equal those of its fan-out steps."""
    shape, results = Shape(data), simulate(data)
    calls = Calls(results)
    ws = results.workflow_sessions()
    for row in ws[ws.end_reason.isin(list(ENDED))].itertuples(index=False):
        sid = row.session_id
        iterations = range(row.iterations) if shape.loop else range(1)
        expected = {(step, it) for step in shape.steps for it in (iterations if step in shape.loop else (0,))}
        seen = {(s, i) for (q, s, i) in list(calls.llm) + list(calls.tool) if q == sid}
        assert seen == expected, (sid, sorted(seen ^ expected))
        for step, it in expected:
            if step in shape.llm:
                rows = calls.llm[(sid, step, it)]
                assert len(rows) == shape.fan_out[step], (sid, step, it, len(rows))
                assert all(r.status == "completed" for r in rows)
            else:
                rows = calls.tool[(sid, step, it)]
                assert sorted(int(t.instance) for t in rows) == list(range(shape.fan_out[step])), (sid, step, it)
        fanned = sum(shape.fan_out[step] for step, _it in expected if shape.fan_out[step] > 1)
        assert row.fan_out_planned == row.fan_out_done == fanned, (sid, row.fan_out_planned, row.fan_out_done, fanned)


# --- INV-A3 ---------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a3_loops_stay_within_max_iterations(data):
    """INV-A3: every session's iteration count is at most max_iterations (0 without a loop),
    no call carries an iteration beyond it, steps outside the loop run at iteration 0, and a
    loop with neither an iteration distribution nor a continuation draw runs max_iterations
    times in every session that ended normally."""
    shape, results = Shape(data), simulate(data)
    ws = results.workflow_sessions()
    calls = Calls(results)
    if not shape.loop:
        assert (ws.iterations == 0).all()
    else:
        assert ws.iterations.between(1, shape.max_iterations).all(), ws.iterations.tolist()
    count = dict(zip(ws.session_id, ws.iterations, strict=True))
    for sid, entries in calls.by_session.items():
        for step, it, _st, _e in entries:
            if step in shape.loop:
                assert 0 <= it < count[sid], (sid, step, it, count[sid])
            else:
                assert it == 0, (sid, step, it)
    if shape.every_iteration:
        done = ws[ws.end_reason.isin(list(ENDED))]
        assert (done.iterations == shape.max_iterations).all()


# --- INV-A4 ---------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a4_every_session_ends_with_a_reason(data):
    """INV-A4: every session (each root request's session) has one row in
    ``workflow_sessions()`` and one in ``sessions()`` with the same end reason, from the
    allowed set; ``in_progress`` only when the run was cut by ``until_s``, ``horizon`` only
    with a workload horizon, and ``dropped`` only for a session with a dropped request (a
    session with a dropped request never ends normally)."""
    results = simulate(data)
    ws = results.workflow_sessions()
    frame = results.to_dataframe()
    cut = data.get("simulation", {}).get("until_s") is not None
    assert ws.session_id.is_unique
    assert set(ws.session_id) == set(frame.session_id)
    assert set(ws.end_reason) <= REASONS
    if not cut:
        assert "in_progress" not in set(ws.end_reason)
    if "horizon_s" not in data["workload"]:
        assert "horizon" not in set(ws.end_reason)
    dropped_sessions = set(frame.session_id[frame.status == "dropped"])
    for row in ws.itertuples(index=False):
        if row.end_reason == "dropped":
            assert row.session_id in dropped_sessions
        if row.session_id in dropped_sessions:
            assert row.end_reason in {"dropped", "horizon", "in_progress"}, (row.session_id, row.end_reason)
    sessions = results.sessions().set_index("session_id").sort_index()
    w = ws.set_index("session_id").sort_index()
    assert list(sessions.index) == list(w.index)
    assert (sessions.end_reason == w.end_reason).all()
    assert (sessions.rounds == w.llm_calls).all()


# --- INV-A5 ---------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_a5_tool_times_are_non_negative_and_add_up(data):
    """INV-A5: every tool call has latency_s >= 0 and wait_s >= 0 (0 for a tool without a
    capacity), ends at start + wait + latency, and each session's tool_wait_s is the sum of
    its tool calls' end - start."""
    shape, results = Shape(data), simulate(data)
    tc = results.tool_calls()
    assert (tc.latency_s >= 0).all() and (tc.wait_s >= 0).all() and (tc.end_s >= tc.start_s).all()
    assert ((tc.start_s + tc.wait_s + tc.latency_s - tc.end_s).abs() <= 1e-9).all()
    unlimited = [name for name, cap in shape.capacity.items() if cap is None]
    assert (tc.wait_s[tc.tool.isin(unlimited)] == 0).all()
    per_session = (tc.end_s - tc.start_s).groupby(tc.session_id).sum()
    for row in results.workflow_sessions().itertuples(index=False):
        assert math.isclose(row.tool_wait_s, float(per_session.get(row.session_id, 0.0)), rel_tol=1e-12, abs_tol=1e-12)


# --- INV-1 ----------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_inv_1_requests_and_calls_are_conserved(data):
    """INV-1: arrived = completed + dropped + in_flight = records; each session's LLM
    requests in the records number its ``llm_calls``; its tool-call rows number its
    ``tool_calls`` (at most that for a session cut in progress, whose calls may be out)."""
    results = simulate(data)
    req = results.summary()["requests"]
    frame = results.to_dataframe()
    assert req["arrived"] == req["completed"] + req["dropped"] + req["in_flight"] == len(frame)
    status = frame.status.value_counts()
    assert int(status.get("completed", 0)) == req["completed"]
    ws = results.workflow_sessions().set_index("session_id")
    llm_rows = frame.groupby("session_id").size().reindex(ws.index, fill_value=0)
    off = ws.index[llm_rows != ws.llm_calls]
    assert off.empty, {sid: (f"llm_calls {ws.llm_calls[sid]}", f"records {llm_rows[sid]}", ws.end_reason[sid]) for sid in off[:5]}
    tool_rows = results.tool_calls().groupby("session_id").size().reindex(ws.index, fill_value=0)
    cut = ws.end_reason == "in_progress"
    assert (tool_rows[~cut] == ws.tool_calls[~cut]).all()
    assert (tool_rows[cut] <= ws.tool_calls[cut]).all()


# --- the summary ------------------------------------------------------------------------------
@SETTINGS
@seed(SEED)
@given(agentic_runs())
def test_workflow_summary_agrees_with_the_session_rows(data):
    """``summary()["workflows"]`` counts the sessions, the normally ended ones, the end
    reasons, the iteration histogram and the fan-out utilisation of ``workflow_sessions()``."""
    results = simulate(data)
    ws = results.workflow_sessions()
    if ws.empty:
        assert "workflows" not in results.summary()
        return
    got = results.summary()["workflows"]["random"]
    assert got["sessions"] == len(ws)
    assert got["completed"] == int(ws.end_reason.isin(list(ENDED)).sum())
    assert got["end_reasons"] == {k: int(v) for k, v in ws.end_reason.value_counts().items()}
    assert got["iterations"]["histogram"] == {str(k): int(v) for k, v in ws.iterations.value_counts().items()}
    planned = int(ws.fan_out_planned.sum())
    if planned:
        assert math.isclose(got["fan_out_utilization"], ws.fan_out_done.sum() / planned)
    else:
        assert got["fan_out_utilization"] is None


# --- determinism ------------------------------------------------------------------------------
@FEW
@seed(SEED)
@given(agentic_runs())
def test_same_seed_gives_byte_identical_files(data):
    """The same scenario and seed, simulated twice and saved, give byte-identical records,
    sessions, workflow sessions and tool calls."""
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp, "a"), Path(tmp, "b")
        simulate(data).save(first)
        Simulation(scenario_from_dict(copy.deepcopy(data))).run(progress=False).save(second)
        for name in ("records.csv", "sessions.csv", "workflow_sessions.csv", "tool_calls.csv"):
            assert (first / name).exists() == (second / name).exists(), name
            if (first / name).exists():
                assert filecmp.cmp(first / name, second / name, shallow=False), name
        sessions = len(simulate(data).workflow_sessions())
        assert (first / "workflow_sessions.csv").exists() == (sessions > 0)


def test_strategy_covers_the_features():
    """The examples the strategy draws (the same ones every test above sees) include fan-out,
    fan-in, loops, accumulate, tools with and without capacity, horizons and cuts."""
    seen: dict[str, int] = defaultdict(int)

    @SETTINGS
    @seed(SEED)
    @given(agentic_runs())
    def collect(data):
        block = data["workload"]["clients"][0]["agentic"]
        steps = block["steps"]
        seen["fan_out"] += any("fan_out" in s for s in steps)
        seen["fan_in"] += any(len(s.get("depends_on", ())) > 1 for s in steps)
        seen["loop"] += "loop" in block
        seen["accumulate"] += any(s.get("context_growth") == "accumulate" for s in steps)
        seen["capacity"] += any("capacity" in t for t in block["tools"].values())
        seen["unlimited_tool"] += any("capacity" not in t for t in block["tools"].values())
        seen["horizon"] += "horizon_s" in data["workload"]
        seen["until"] += "simulation" in data

    collect()
    assert all(seen[k] > 0 for k in
               ("fan_out", "fan_in", "loop", "accumulate", "capacity", "unlimited_tool", "horizon", "until")), dict(seen)
