"""The compiled workflow's per-step tables, and the session rules that read them.

A workflow is compiled once per client: which children a step's end counts toward within
an iteration, how many loop parents each step after the loop has, the streams each step
draws from. The session state machine reads these instead of walking the DAG per call;
these tests pin the tables on a workflow whose after-loop step has one parent outside the
loop and one inside, and drive a session through it by hand.
"""

from __future__ import annotations

from typing import Any

from simpy_llm import scenario_from_dict
from simpy_llm.workload.sessions import open_session
from simpy_llm.workload.sources import build_sources
from simpy_llm.workload.workflows import Call, Workflow, WorkflowSession
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
