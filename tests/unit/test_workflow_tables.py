"""The compiled workflow's per-step tables, and the session rules that read them.

A workflow is compiled once per client: which children a step's end counts toward within
an iteration, how many loop parents each step after the loop has, the streams each step
draws from. The session state machine reads these instead of walking the DAG per call;
these tests pin the tables on a workflow whose after-loop step has one parent outside the
loop and one inside, and drive a session through it by hand.
"""

from __future__ import annotations

import functools
from typing import Any

from simpy_llm import scenario_from_dict
from simpy_llm.workload.sessions import _draws_of, open_session
from simpy_llm.workload.sources import build_sources
from simpy_llm.workload.workflows import Call, StepDraws, Workflow, WorkflowSession
from tests.agentic_helpers import agentic_scenario, const, llm, tool, tool_spec

AGENTIC: dict[str, Any] = {
    "workflow": "plan-loop-answer",
    "loop": {"over": ["think", "search"], "max_iterations": 2},
    "steps": [
        llm("plan"),
        llm("think", "plan", context_growth="accumulate"),
        tool("search", "web", "think"),
        llm("answer", "plan", "search"),
    ],
    "tools": {"web": tool_spec(const(0.5), const(7))},
}


def _workflow_and_session() -> tuple[Workflow, WorkflowSession]:
    scenario = scenario_from_dict(agentic_scenario(AGENTIC))
    source = build_sources(scenario.workload, default_seed=scenario.seed).clients[0]
    session = open_session("agent/0", source, None)
    assert session is not None and source.workflow is not None
    return source.workflow, session


def _names(steps: tuple[Any, ...]) -> list[str]:
    return [s.id for s in steps]


def test_releases_leave_a_loop_steps_after_loop_children_to_the_loop_exit():
    """A step before the loop counts toward all its children; a loop step's child after the
    loop is not among what its end releases (the loop's exit counts it)."""
    wf, _ = _workflow_and_session()
    by_id = {s.id: s for s in wf.steps}
    assert _names(wf.releases[by_id["plan"].index]) == ["think", "answer"]
    assert _names(wf.releases[by_id["think"].index]) == ["search"]
    assert _names(wf.releases[by_id["search"].index]) == []
    assert [(s.id, n) for s, n in wf.after_loop_counts] == [("answer", 1)]
    assert wf.accumulating == (by_id["think"].index,)


def test_steps_name_their_streams_and_tool_once():
    """An LLM step draws from ``step/<id>/input`` and ``.../output``, a tool step from
    ``tool/<tool>/latency`` and ``.../output``, and carries its tool's config."""
    wf, _ = _workflow_and_session()
    by_id = {s.id: s for s in wf.steps}
    assert by_id["think"].draws == ("step/think/input", "step/think/output")
    assert by_id["search"].draws == ("tool/web/latency", "tool/web/output")
    assert by_id["search"].tool_config is wf.tools["web"]
    assert by_id["plan"].tool_config is None


def _finish(session: WorkflowSession, call: Call, now_s: float) -> list[Call]:
    return session.finished(call.key, now_s, output_tokens=call.output_tokens)


def test_fan_in_across_the_loop_waits_for_the_loop_exit():
    """The step after the loop with a parent before it starts only when the loop exits (its
    second parent), released by the last iteration's loop step; the session then completes."""
    _, session = _workflow_and_session()
    assert session.start(0.0, prompt_tokens=8, output_tokens=4, fields={}) == []
    made = _finish(session, session.root_call(), 1.0)
    assert [(c.step.id, c.iteration) for c in made] == [("think", 0)]  # answer waits for the loop
    now = 1.0
    for iteration in (0, 1):
        think = made[0]
        session.arrived(think)
        now += 1.0
        made = _finish(session, think, now)
        assert [(c.step.id, c.iteration) for c in made] == [("search", iteration)]
        search = made[0]
        session.arrived(search)
        now += 1.0
        made = _finish(session, search, now)
        expected = [("think", 1)] if iteration == 0 else [("answer", 0)]
        assert [(c.step.id, c.iteration) for c in made] == expected
    answer = made[0]
    assert answer.delay_s == 0.0
    session.arrived(answer)
    assert _finish(session, answer, 6.0) == []
    assert session.end_reason == "completed"
    assert session.critical_path() == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (1, 1, 0), (2, 1, 0), (3, 0, 0)]


def test_accumulating_step_extends_the_previous_iterations_prompt():
    """A loop step under ``accumulate`` at iteration 1 asks for its iteration-0 prompt plus
    every output of iteration 0 plus a new draw, and names what it extends."""
    _, session = _workflow_and_session()
    session.start(0.0, prompt_tokens=8, output_tokens=4, fields={})
    think0 = _finish(session, session.root_call(), 1.0)[0]
    search0 = _finish(session, think0, 2.0)[0]
    think1 = _finish(session, search0, 3.0)[0]
    assert think1.accumulates_from == (think0.step.index, 0)
    assert think1.prompt_tokens == think0.prompt_tokens + think0.output_tokens + search0.output_tokens + think1.new_tokens
    assert think1.fields["step_id"] == "think" and think1.fields["loop_iteration"] == 1


SHARED_TOOL: dict[str, Any] = {
    "workflow": "two-searches",
    "steps": [
        llm("plan", prompt={"type": "exponential", "params": {"mean": 40}}, output={"type": "exponential", "params": {"mean": 9}}),
        tool("search-a", "web", "plan"),
        tool("search-b", "web", "plan"),
        llm("answer", "search-a", "search-b"),
    ],
    "tools": {"web": tool_spec({"type": "exponential", "params": {"mean": 0.5}},
                               {"type": "gaussian", "params": {"mean": 50, "std_dev": 20, "min": 1, "max": 200}})},
}


def _drawn_calls(registry_draws: bool, sessions: int = 300) -> tuple[list[tuple[str, float, int, int]], Any]:
    """Every call the sessions of one fresh client make, in order, each session run to its end
    by hand: (step, tool latency, prompt, output). Drawn through the client's own ``draw`` (as
    the observer does), or through one :class:`StepDraws` of the client's vectors (as the
    simulation's session registry does)."""
    scenario = scenario_from_dict(agentic_scenario(SHARED_TOOL))
    source = build_sources(scenario.workload, default_seed=scenario.seed).clients[0]
    assert source.workflow is not None
    table = StepDraws(source.workflow, functools.partial(_draws_of, source)) if registry_draws else None
    made: list[tuple[str, float, int, int]] = []
    for k in range(sessions):
        if table is None:
            session = open_session(f"agent/{k}", source, None)
        else:
            session = WorkflowSession(source.workflow, f"agent/{k}", source, None, draws=table)
        assert session is not None
        session.start(0.0, prompt_tokens=8, output_tokens=4, fields={})
        todo = [session.root_call()]
        while todo:
            call = todo.pop(0)
            made.append((call.step.id, call.latency_s, call.prompt_tokens, call.output_tokens))
            todo += _finish(session, call, 1.0)
        assert session.end_reason == "completed"
    return made, source


def test_steps_calling_one_tool_share_its_streams_whichever_way_they_are_drawn():
    """Two steps calling one tool take its latencies and outputs from the tool's streams in
    turn, call after call and session after session: the values are those of the streams in
    order, and drawing through the client's ``draw`` or through a table of its vectors made
    once (the simulation's way) gives the same calls."""
    through_client, _ = _drawn_calls(registry_draws=False)
    through_table, source = _drawn_calls(registry_draws=True)
    assert through_table == through_client
    # The tool's latencies, in call order, are its one stream's values in order (a fresh
    # client's stream, drawn in the same vectors).
    scenario = scenario_from_dict(agentic_scenario(SHARED_TOOL))
    fresh = build_sources(scenario.workload, default_seed=scenario.seed).clients[0]
    latency = _draws_of(fresh, "tool/web/latency", source.workflow.tools["web"].latency_s, False)
    latencies = [lat for step, lat, _p, _o in through_table if step.startswith("search")]
    assert len(latencies) == 600 and [s for s, *_ in through_table[:4]] == ["plan", "search-a", "search-b", "answer"]
    assert latencies == [latency() for _ in latencies]
    assert len(set(latencies)) == len(latencies)  # an exponential: no value drawn twice
