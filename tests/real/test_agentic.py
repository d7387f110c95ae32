"""An agentic workflow run closed loop against the real llama.cpp server, through `observe()`.

A fork-join agent with a loop: plan -> [search (a tool), two drafts] -> merge (accumulating), twice,
then an answer. Every check is causal or server-reported, none depends on the machine's speed:
children are sent after the responses and tool calls they depend on ended, a tool's sleep holds its
child back by at least its drawn latency, every session ends, and the merge's prompt as the server
counted it grows from one iteration to the next by at least what the server answered before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simpy_llm.observe.llamacpp import LlamaCppServer
from simpy_llm.observe.run import observe
from simpy_llm.workload.traces import read_trace_v2

pytestmark = pytest.mark.real_server

SESSIONS, ITERATIONS, FAN = 3, 2, 2
LLM_CALLS = 1 + ITERATIONS * (FAN + 1) + 1
"""Per session: the plan, each iteration's drafts and merge, the answer."""


def _uniform(low: int | float, high: int | float) -> dict[str, Any]:
    return {"type": "uniform", "params": {"low": low, "high": high}}


def _workload(tmp_path: Path) -> Path:
    data: dict[str, Any] = {
        "seed": 9,
        "workload": {
            "category": "agentic",
            "aggregate_rate": 1.0,
            "num_requests": SESSIONS,
            "clients": [{
                "id": "agent",
                "arrival": {"process": "poisson"},
                "prefix_group": "system",
                "prefix_length": 20,
                "agentic": {
                    "workflow": "fork-join-loop",
                    "steps": [
                        {"id": "plan", "type": "llm_call",
                         "input_distribution": _uniform(16, 32), "output_distribution": _uniform(16, 32)},
                        {"id": "search", "type": "tool_call", "tool": "web", "depends_on": ["plan"]},
                        {"id": "draft", "type": "llm_call", "fan_out": FAN, "depends_on": ["plan"],
                         "input_distribution": _uniform(16, 32), "output_distribution": _uniform(16, 32)},
                        {"id": "merge", "type": "llm_call", "depends_on": ["search", "draft"], "context_growth": "accumulate",
                         "input_distribution": _uniform(16, 32), "output_distribution": _uniform(16, 32)},
                        {"id": "answer", "type": "llm_call", "depends_on": ["merge"], "input_distribution": _uniform(16, 32),
                         "output_distribution": _uniform(16, 32)},
                    ],
                    "tools": {"web": {"latency_s": _uniform(0.05, 0.2), "output_tokens": _uniform(16, 32)}},
                    "loop": {"over": ["search", "draft", "merge"], "max_iterations": ITERATIONS},
                },
            }],
        },
        # The serving section is not used by the observer; it keeps the file a valid scenario.
        "serving": {"latency_model": {"kind": "blis_linear", "params": {"beta0_us": 1000.0}}},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory, llamacpp_server: LlamaCppServer) -> Path:
    """The output directory of one closed-loop agentic run against the shared server."""
    assert llamacpp_server.returncode is None and llamacpp_server.url is not None
    out = tmp_path_factory.mktemp("agent") / "run"
    observe(_workload(out.parent), llamacpp_server.url, out, api="chat", timeout_s=120.0)
    return out


def _parents(step: str, iteration: int) -> list[tuple[str, int]]:
    """The (step, iteration) groups a call of *step* at *iteration* waits for (seed 004's edges)."""
    if step == "plan":
        return []
    if step in ("search", "draft"):
        if iteration == 0:
            return [("plan", 0)]
        return [("search", iteration - 1), ("draft", iteration - 1), ("merge", iteration - 1)]
    if step == "merge":
        return [("search", iteration), ("draft", iteration)]
    return [("merge", ITERATIONS - 1)]


def _frames(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple[str, str, int], int]]:
    """The LLM calls joined with their trace rows, the tool calls, and per (session, step,
    iteration) the last end of its calls (whole microseconds)."""
    trace = read_trace_v2(out / "trace").frame
    calls = pd.read_csv(out / "calls.csv", keep_default_na=False, na_values=[""])
    tools = calls[calls.tool.notna()]
    llm = calls[calls.tool.isna()].astype({"request_id": "int64"}).merge(trace, on="request_id", suffixes=("", "_trace"))
    ends: dict[tuple[str, str, int], int] = {}
    for r in llm.itertuples():
        key = (r.session_id, r.step_id, r.loop_iteration)
        ends[key] = max(ends.get(key, 0), int(r.done_time_us))
    for r in tools.itertuples():
        key = (r.session_id, r.step_id, r.loop_iteration)
        ends[key] = max(ends.get(key, 0), round(r.end_s * 1e6))
    return llm, tools, ends


def test_every_session_runs_its_workflow(agent_run: Path) -> None:
    """Every request ends ok with the server's usage counts and exactly the requested output;
    every session completes with all its LLM and tool calls."""
    trace = read_trace_v2(agent_run / "trace").frame
    assert len(trace) == SESSIONS * LLM_CALLS
    assert (trace.status == "ok").all(), trace[trace.status != "ok"][["request_id", "status", "error_message"]]
    assert (trace.prompt_tokens_source == "usage").all() and (trace.output_tokens == trace.requested_output_tokens).all()
    sessions = pd.read_csv(agent_run / "sessions.csv")
    assert len(sessions) == SESSIONS and (sessions.end_reason == "completed").all()
    assert (sessions.rounds == LLM_CALLS).all() and (sessions.tool_calls == ITERATIONS).all()


def test_children_follow_their_parents_and_tools_their_latency(agent_run: Path) -> None:
    """Each call is sent (a tool: called) no earlier than every call it depends on ended; a merge
    is sent no earlier than its search's release plus the search's drawn latency; the calls of a
    fan-out share one target."""
    llm, tools, ends = _frames(agent_run)
    for r in llm.itertuples():
        for parent in _parents(r.step_id, r.loop_iteration):
            assert r.send_time_us >= ends[(r.session_id, *parent)], (r.request_id, parent)
    assert len(tools) == SESSIONS * ITERATIONS
    for t in tools.itertuples():
        released = max(ends[(t.session_id, *p)] for p in _parents("search", t.loop_iteration))
        assert round(t.start_s * 1e6) >= released
        assert t.end_s - t.start_s >= t.latency_s
        merge = llm[(llm.session_id == t.session_id) & (llm.step_id == "merge") & (llm.loop_iteration == t.loop_iteration)]
        assert int(merge.send_time_us.iloc[0]) >= released + t.latency_s * 1e6 - 1  # whole microseconds
    drafts = llm[llm.step_id == "draft"].groupby(["session_id", "loop_iteration"])
    assert (drafts.size() == FAN).all() and (drafts.arrival_time_us.nunique() == 1).all()


def test_accumulated_prompts_grow(agent_run: Path) -> None:
    """The server counts a later merge's prompt as longer than the earlier merge's prompt plus its
    answer plus the drafts' answers (they are all sent back), and the requested length (the earlier
    reported prompt plus the outputs and the new question) is within the chat template's few tokens
    per turn of what the server counted."""
    llm, _, _ = _frames(agent_run)
    for sid, merges in llm[llm.step_id == "merge"].groupby("session_id"):
        first, later = (merges[merges.loop_iteration == k].iloc[0] for k in (0, 1))
        drafts = llm[(llm.session_id == sid) & (llm.step_id == "draft") & (llm.loop_iteration == 0)]
        assert later.input_tokens > first.input_tokens + first.output_tokens + drafts.output_tokens.sum()
        requested = later.requested_input_tokens
        assert 0.9 * requested - 20 <= later.input_tokens <= 1.1 * requested + 20, (sid, requested, later.input_tokens)
