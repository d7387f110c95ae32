"""Agentic workflows run closed loop by the observer: calls wait for their parents' answers, tools
are real sleeps, accumulate prompts carry the server's replies, and against the emulated server the
sessions take what the simulator predicts.

The causal checks compare stamps on the load generator's one clock (whole microseconds in the
trace): a request's send with the end of the responses and tool calls that released it. The parent
rule used here is written from seed 004 for the test's workflow, not taken from the state machine.
"""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from aiohttp import web

from simpy_llm import Scenario, Simulation, scenario_from_dict
from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.emulate import EmulatedServer
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, load_requests, prefix_text
from simpy_llm.observe.sessions import TOOL_RESULT, Conversations
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.helpers import tiny_scenario
from tests.observe.fake_server import PROMPT_TOKENS, FakeServer, serve_instance

PREFIX = 8
PLAN_OUT, DRAFT_OUT, MERGE_OUT, ANSWER_OUT = 5, 4, 15, 16
"""Output lengths; the fake server answers each of them normally (see its MODES)."""
MERGE_NEW, TOOL_OUT, FAN, ITERATIONS = 6, 7, 3, 3
QUIET = 1e9  # the load generator's lag warning is not what these tests check


def _const(value: float) -> dict[str, Any]:
    return {"type": "constant", "params": {"value": value}}


def _uniform(low: float, high: float) -> dict[str, Any]:
    return {"type": "uniform", "params": {"low": low, "high": high}}


def _fork_join(draft_out: int = DRAFT_OUT, latency_s: Any = None, capacity: int | None = None) -> dict[str, Any]:
    """plan (2 instances) -> [search (a tool), draft (3 instances)] -> merge (accumulate), looped 3
    times over search, draft and merge -> answer."""
    web_tool: dict[str, Any] = {
        "latency_s": latency_s or _uniform(0.02, 0.08),
        "output_tokens": _const(TOOL_OUT),
    }
    if capacity is not None:
        web_tool["capacity"] = capacity
    return {
        "workflow": "fork-join",
        "steps": [
            {"id": "plan", "type": "llm_call", "fan_out": 2,
             "input_distribution": _const(12), "output_distribution": _const(PLAN_OUT)},
            {"id": "search", "type": "tool_call", "tool": "web", "depends_on": ["plan"]},
            {"id": "draft", "type": "llm_call", "fan_out": FAN, "depends_on": ["plan"],
             "input_distribution": _const(10), "output_distribution": _const(draft_out)},
            {"id": "merge", "type": "llm_call", "depends_on": ["search", "draft"], "context_growth": "accumulate",
             "input_distribution": _const(MERGE_NEW), "output_distribution": _const(MERGE_OUT)},
            {"id": "answer", "type": "llm_call", "depends_on": ["merge"], "input_distribution": _const(8),
             "output_distribution": _const(ANSWER_OUT)},
        ],
        "tools": {"web": web_tool},
        "loop": {"over": ["search", "draft", "merge"], "max_iterations": ITERATIONS},
    }


def _scenario(agentic: dict[str, Any], sessions: int = 3, rate: float = 20.0) -> Scenario:
    data = tiny_scenario()
    data["workload"] = {
        "category": "agentic",
        "aggregate_rate": rate,
        "num_requests": sessions,
        "clients": [{"id": "agent", "arrival": {"process": "poisson"}, "prefix_group": "sys", "prefix_length": PREFIX,
                     "agentic": agentic}],
    }
    return scenario_from_dict(data)


class _Gate(FakeServer):
    """The fake server, holding every request whose ``max_tokens`` is a key of *widths* until that
    many such requests are in flight at once (then all of them go on): a fan-out that is not sent
    concurrently waits out *timeout_s* and is counted in :attr:`timeouts`."""

    def __init__(self, widths: dict[int, int], timeout_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.widths = widths
        self.timeout_s = timeout_s
        self.waiting: dict[int, list[asyncio.Future[None]]] = {n: [] for n in widths}
        self.opened: dict[int, int] = dict.fromkeys(widths, 0)
        self.timeouts = 0

    async def complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        n = int((await request.json()).get("max_tokens", 0))
        if n in self.widths:
            here = asyncio.get_running_loop().create_future()
            group = self.waiting[n]
            group.append(here)
            if len(group) == self.widths[n]:
                for f in group:
                    f.set_result(None)
                self.waiting[n] = []
                self.opened[n] += 1
            try:
                await asyncio.wait_for(asyncio.shield(here), self.timeout_s)
            except TimeoutError:
                self.timeouts += 1
        return await super().complete(request, endpoint)


class _Run:
    """One observed run: the server, the sessions, the load generator and the trace."""

    def __init__(self, fake: FakeServer, conversations: Conversations, gen: LoadGenerator, trace: pd.DataFrame) -> None:
        self.fake = fake
        self.conversations = conversations
        self.gen = gen
        self.trace = trace
        calls = pd.DataFrame(conversations.calls())
        self.calls = calls
        llm = calls[calls.tool == ""].astype({"request_id": "int64"})
        self.llm = llm.merge(trace, on="request_id", suffixes=("", "_trace"))
        self.tools = calls[calls.tool != ""]


def _run(scenario: Scenario, path: Path, fake: FakeServer | None = None, endpoint: str = "chat") -> _Run:
    requests = load_requests(generate_requests(scenario))
    conversations = Conversations(scenario, requests)
    fake = fake if fake is not None else FakeServer(token_delay_s=0.002)

    async def go() -> LoadGenerator:
        async with serve_instance(fake), OpenAIClient(fake.url, timeout_s=20.0) as client:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(
                    client, requests, writer, endpoint=endpoint, conversations=conversations, lag_threshold_s=QUIET
                )
                await gen.run()
        return gen

    gen = asyncio.run(go())
    return _Run(fake, conversations, gen, read_trace_v2(path).frame)


def _parents(step: str, iteration: int, last: int) -> list[tuple[str, int]]:
    """The (step, iteration) groups whose every call must have ended before a call of *step* at
    *iteration* starts, for :func:`_fork_join` (seed 004's edge table; *last*: the last iteration)."""
    if step == "plan":
        return []
    if step in ("search", "draft"):
        if iteration == 0:
            return [("plan", 0)]
        return [("search", iteration - 1), ("draft", iteration - 1), ("merge", iteration - 1)]
    if step == "merge":
        return [("search", iteration), ("draft", iteration)]
    return [("merge", last)]  # answer: after the loop


def _ends_us(run: _Run) -> dict[tuple[str, str, int], list[int]]:
    """Per (session, step, iteration): the end of each of its calls, whole microseconds."""
    ends: dict[tuple[str, str, int], list[int]] = {}
    for r in run.llm.itertuples():
        ends.setdefault((r.session_id, r.step_id, r.loop_iteration), []).append(int(r.done_time_us))
    for r in run.tools.itertuples():
        ends.setdefault((r.session_id, r.step_id, r.loop_iteration), []).append(round(r.end_s * 1e6))
    return ends


def test_children_are_sent_after_their_parents_ended(tmp_path: Path) -> None:
    """Every LLM call (the roots apart) is sent no earlier than the end of every response and tool
    call it depends on, and every tool call starts no earlier than its parents' ends; each call
    group has all its instances, and every request ends ok."""
    run = _run(_scenario(_fork_join()), tmp_path / "t")
    assert (run.trace.status == "ok").all() and len(run.trace) == 3 * (2 + ITERATIONS * (FAN + 1) + 1)
    ends = _ends_us(run)
    per_group = {"plan": 2, "draft": FAN, "search": 1, "merge": 1, "answer": 1}
    for (sid, step, it), group in ends.items():
        assert len(group) == per_group[step], (sid, step, it)
    checked = 0
    for r in run.llm.itertuples():
        for parent in _parents(r.step_id, r.loop_iteration, ITERATIONS - 1):
            assert r.send_time_us >= max(ends[(r.session_id, *parent)]), (r.request_id, parent)
            checked += 1
    for r in run.tools.itertuples():
        for parent in _parents(r.step_id, r.loop_iteration, ITERATIONS - 1):
            assert round(r.start_s * 1e6) >= max(ends[(r.session_id, *parent)]), (r.session_id, r.step_id, parent)
            checked += 1
    assert checked > 0
    # Calls released together have one target: the end of the last call that released them.
    for (_sid, _it), drafts in run.llm[run.llm.step_id == "draft"].groupby(["session_id", "loop_iteration"]):
        assert drafts.arrival_time_us.nunique() == 1


def test_fan_out_instances_are_in_flight_together(tmp_path: Path) -> None:
    """The server holds each plan request until both plan instances are in flight, and each draft
    until all three of its iteration are: every group opened, none timed out, so the root's two
    instances and each iteration's three drafts were sent concurrently (one session)."""
    gate = _Gate({PLAN_OUT: 2, DRAFT_OUT: FAN})
    run = _run(_scenario(_fork_join(), sessions=1), tmp_path / "t", fake=gate)
    assert gate.timeouts == 0
    assert gate.opened == {PLAN_OUT: 1, DRAFT_OUT: ITERATIONS}
    assert (run.trace.status == "ok").all()


def test_a_tool_sleep_separates_the_parent_end_from_the_child_send(tmp_path: Path) -> None:
    """Each search call is called when the last response releasing it ended, runs at least its
    drawn latency, and the merge it feeds is sent no earlier than that end plus the latency."""
    run = _run(_scenario(_fork_join()), tmp_path / "t")
    ends = _ends_us(run)
    assert len(run.tools) == 3 * ITERATIONS and (run.tools.wait_s == 0).all()
    assert run.tools.latency_s.nunique() > 1  # drawn, not constant
    for t in run.tools.itertuples():
        released = max(max(ends[(t.session_id, *p)]) for p in _parents("search", t.loop_iteration, ITERATIONS - 1))
        assert round(t.start_s * 1e6) == released
        assert t.end_s - t.start_s >= t.latency_s
        llm = run.llm
        merge = llm[(llm.session_id == t.session_id) & (llm.step_id == "merge") & (llm.loop_iteration == t.loop_iteration)]
        assert len(merge) == 1
        assert int(merge.send_time_us.iloc[0]) >= released + t.latency_s * 1e6 - 1  # whole microseconds


def test_a_tool_with_a_capacity_runs_its_calls_in_turn(tmp_path: Path) -> None:
    """With a capacity of one, the three sessions' search calls never overlap: each starts running
    no earlier than the previous one returned, and its wait is counted."""
    run = _run(_scenario(_fork_join(latency_s=_const(0.05), capacity=1), rate=1000.0), tmp_path / "t")
    tools = run.tools.assign(running_s=run.tools.start_s + run.tools.wait_s).sort_values("running_s")
    running, end = tools.running_s.to_numpy(), tools.end_s.to_numpy()
    assert (running[1:] >= end[:-1]).all()
    assert (tools.wait_s > 0).any()
    waits = {s["session_id"]: s["tool_wait_s"] for s in run.conversations.ended()}
    for sid, mine in tools.groupby("session_id"):
        assert math.isclose(waits[sid], float((mine.end_s - mine.start_s).sum()))


def test_accumulate_prompts_carry_the_earlier_replies(tmp_path: Path) -> None:
    """A merge at iteration k > 0 sends its iteration k-1 messages, the server's reply to them,
    the tool's result and the three drafts' replies, then a new question, roles alternating; its
    requested input is the server-reported prompt of the previous merge plus those outputs plus
    the new part."""
    run = _run(_scenario(_fork_join(), sessions=2), tmp_path / "t")
    reply = {n: "".join(f" t{i}" for i in range(n)) for n in (DRAFT_OUT, MERGE_OUT)}
    merges = [b["messages"] for b in run.fake.bodies if b["max_tokens"] == MERGE_OUT]
    assert len(merges) == 2 * ITERATIONS
    by_length = sorted(merges, key=len)
    for k, messages in enumerate(by_length[::2]):  # one per iteration (the two sessions' are alike)
        roles = [m["role"] for m in messages]
        assert roles == ["system", "user", *(["assistant", "user", "assistant", "user"] * k)]
        assert messages[0]["content"] == prefix_text("sys", PREFIX)
        for j in range(k):
            said, tool, drafts, question = messages[2 + 4 * j : 6 + 4 * j]
            assert said["content"] == reply[MERGE_OUT]
            assert tool["content"].startswith(TOOL_RESULT) and len(tool["content"].split()) == TOOL_OUT
            assert drafts["content"].split("\n\n") == [reply[DRAFT_OUT]] * FAN
            assert len(question["content"].split()) == MERGE_NEW
    merge_rows = run.llm[run.llm.step_id == "merge"]
    later = merge_rows[merge_rows.loop_iteration > 0]
    assert (later.requested_input_tokens == PROMPT_TOKENS + MERGE_OUT + TOOL_OUT + FAN * DRAFT_OUT + MERGE_NEW).all()
    assert (merge_rows[merge_rows.loop_iteration == 0].requested_input_tokens == PREFIX + MERGE_NEW).all()


def test_completions_api_joins_an_accumulated_prompt(tmp_path: Path) -> None:
    """With the completions API the last merge's prompt is the conversation's text in order: prefix,
    questions, replies and tool results, as many words as the session counted."""
    run = _run(_scenario(_fork_join(), sessions=1), tmp_path / "t", endpoint="completions")
    prompts = [b["prompt"] for b in run.fake.bodies if b["max_tokens"] == MERGE_OUT]
    last = max(prompts, key=len)
    assert last.startswith(prefix_text("sys", PREFIX))
    per_iteration = MERGE_OUT + TOOL_OUT + FAN * DRAFT_OUT + MERGE_NEW
    assert len(last.split()) == PREFIX + MERGE_NEW + (ITERATIONS - 1) * per_iteration


def test_every_session_ends_with_a_reason(tmp_path: Path) -> None:
    """Every session runs its whole workflow and ends completed, with its LLM calls, tool calls,
    start (its first request's target) and end (its last answer's end)."""
    run = _run(_scenario(_fork_join()), tmp_path / "t")
    ended = run.conversations.ended()
    assert [s["end_reason"] for s in ended] == ["completed"] * 3
    assert all(s["rounds"] == 2 + ITERATIONS * (FAN + 1) + 1 and s["tool_calls"] == ITERATIONS for s in ended)
    for s in ended:
        mine = run.llm[run.llm.session_id == s["session_id"]]
        assert round(s["start_s"] * 1e6) == mine.arrival_time_us.min()
        assert round(s["end_s"] * 1e6) == mine.done_time_us.max() == int(mine[mine.step_id == "answer"].done_time_us.iloc[0])
    assert (run.calls.status == "ok").all() and run.calls.end_s.notna().all()


def test_a_failed_call_drops_its_session(tmp_path: Path) -> None:
    """Drafts whose streams break are errors: no merge follows, the tool call under way still
    returns, and each session ends dropped with its plan and draft calls only."""
    run = _run(_scenario(_fork_join(draft_out=7)), tmp_path / "t")  # 7 tokens: the fake server truncates
    assert set(run.llm.step_id) == {"plan", "draft"}
    assert (run.llm[run.llm.step_id == "draft"].status == "error").all()
    assert len(run.tools) == 3 and run.tools.end_s.notna().all()
    assert [(s["end_reason"], s["rounds"]) for s in run.conversations.ended()] == [("dropped", 2 + FAN)] * 3


def test_stop_during_a_tool_call_cancels_it(tmp_path: Path) -> None:
    """Stopping while the tools sleep (30 s) ends the run at once: the tool tasks are cancelled,
    every request sent so far is written, nothing is sent after, and the sessions are in progress."""
    scenario = _scenario(_fork_join(latency_s=_const(30.0)), sessions=2)
    requests = load_requests(generate_requests(scenario))
    conversations = Conversations(scenario, requests)

    async def go() -> LoadGenerator:
        async with serve_instance(FakeServer()) as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            with TraceV2Writer(tmp_path / "t", extra_columns=OBSERVER_COLUMNS) as writer:
                gen = LoadGenerator(client, requests, writer, conversations=conversations, lag_threshold_s=QUIET)
                task = asyncio.create_task(gen.run())
                # Both sessions' plans and drafts answered: only the tools are left.
                while sum(c["end_s"] is not None for c in conversations.calls() if not c["tool"]) < 2 * (2 + FAN):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                assert not task.done()  # the run waits for its tool calls
                gen.stop()
                await task
        return gen

    gen = asyncio.run(go())
    f = read_trace_v2(tmp_path / "t").frame
    assert len(f) == 2 * (2 + FAN) and (f.status == "ok").all()
    assert gen.summary is not None and gen.summary.stopped
    assert [s["end_reason"] for s in conversations.ended()] == ["in_progress"] * 2
    assert all(c["end_s"] is None for c in conversations.calls() if c["tool"])


# --- the emulated server against the simulator -------------------------------------------
EMULATED: dict[str, Any] = {
    "name": "agentic-emulated",
    "seed": 5,
    "workload": {
        "category": "agentic",
        "aggregate_rate": 5.0,
        "num_requests": 40,
        "clients": [{
            "id": "agent",
            "arrival": {"process": "poisson"},
            "prefix_group": "sys",
            "prefix_length": 16,
            "agentic": {
                "workflow": "research",
                "steps": [
                    {"id": "plan", "type": "llm_call",
                     "input_distribution": _uniform(40, 120), "output_distribution": _uniform(8, 24)},
                    {"id": "search", "type": "tool_call", "tool": "web", "depends_on": ["plan"]},
                    {"id": "draft", "type": "llm_call", "fan_out": 2, "depends_on": ["plan"],
                     "input_distribution": _uniform(20, 60), "output_distribution": _uniform(8, 24)},
                    {"id": "merge", "type": "llm_call", "depends_on": ["search", "draft"], "context_growth": "accumulate",
                     "input_distribution": _const(20), "output_distribution": _uniform(8, 24)},
                    {"id": "answer", "type": "llm_call", "depends_on": ["merge"], "input_distribution": _const(30),
                     "output_distribution": _uniform(16, 40)},
                ],
                "tools": {"web": {"latency_s": _uniform(0.02, 0.06), "output_tokens": _uniform(20, 60)}},
                "loop": {"over": ["search", "draft", "merge"], "max_iterations": 3, "iterations_distribution": _uniform(1, 3)},
            },
        }],
    },
    "serving": {
        "replicas": 1,
        # No prefix caching: the emulated server's requests carry no content, so it could not
        # find a session's earlier turns in a prefix cache as the simulator does.
        "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 512, "kv_block_size": 16, "kv_num_blocks": 2048,
                   "prefix_caching": False},
        # Steps of 8-13 ms: a session of 4-10 LLM calls takes about 0.6-2 s.
        "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 8000.0, "beta1_us": 20.0, "beta2_us": 300.0}},
    },
}
"""A fork-join research agent with 1-3 loop iterations and fast tools, at a low load (about two
sessions at once on a replica of 16 sequences)."""

E2E_TOLERANCE = 0.10
"""Allowed relative difference of the median session E2E, observed vs simulated.

The emulated server is the simulator run in real time, so the two differ only by what the observer
adds to each session's serial chain of calls: a request is sent a few event-loop turns after its
target and its last token reaches the client a few turns after its simulated time; a tool call
returns when its timer fires. That is 0.2-1 ms per call on an idle machine (the truth tests of
the emulated server bound it per request), so 4-10 chained calls add 1-10 ms to a median E2E of
about 1.3 s: under 1 %. Measured: +0.4 % on an idle machine. Under load a turn can take tens of
milliseconds; 10 % (130 ms) allows about 13 ms of extra lag on every call of a long session. The
lags also shift which requests share an engine step, and the sessions' lengths are drawn in the
order their calls are made, which the lags can permute among overlapping sessions: both move
single sessions both ways and the median little."""


def test_emulated_server_session_e2e_matches_the_simulator(tmp_path: Path) -> None:
    """40 sessions of a fork-join agent with a loop, observed against the emulated server (the
    simulator in real time): every session completes with the LLM and tool calls the simulator
    makes for it, every request's prompt is as long as the session counted (the server counts
    words), and the median session E2E is within :data:`E2E_TOLERANCE` of the simulator's."""
    scenario = scenario_from_dict(copy.deepcopy(EMULATED))
    simulated = Simulation(scenario).run().workflow_sessions()
    requests = load_requests(generate_requests(scenario))
    conversations = Conversations(scenario, requests)

    async def go() -> LoadGenerator:
        async with EmulatedServer(scenario) as server, OpenAIClient(server.url, timeout_s=60.0) as client:
            gen = LoadGenerator(client, requests, None, conversations=conversations, lag_threshold_s=QUIET)
            await gen.run()
        return gen

    gen = asyncio.run(go())
    observed = pd.DataFrame(conversations.ended())
    assert len(observed) == len(simulated) == 40
    assert (observed.end_reason == "completed").all() and (simulated.end_reason == "completed").all()
    # Sessions matched by their start (the root's arrival, the same draw in both).
    sim = simulated.assign(key=(simulated.start_s * 1e6).round()).set_index("key").sort_index()
    obs = observed.assign(key=(observed.start_s * 1e6).round()).set_index("key").sort_index()
    assert (sim.index == obs.index).all()
    assert (sim.llm_calls.to_numpy() == obs.rounds.to_numpy()).all()
    assert (sim.tool_calls.to_numpy() == obs.tool_calls.to_numpy()).all()
    assert sim.llm_calls.nunique() > 1  # the loop ran 1-3 times
    records = [gen.records[r.request_id] for r in gen.requests]
    assert all(rec.status == "ok" for rec in records)
    assert all(rec.prompt_tokens == r.input_tokens for r, rec in zip(gen.requests, records, strict=True))
    e2e_obs = float(np.median(obs.end_s - obs.start_s))
    e2e_sim = float(simulated.e2e_s.median())
    assert abs(e2e_obs / e2e_sim - 1) <= E2E_TOLERANCE, (e2e_obs, e2e_sim)
