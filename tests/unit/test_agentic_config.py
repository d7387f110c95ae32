"""Validation of ``agentic`` blocks: seed 004's nine rules and the schema's own, each a
:class:`ScenarioError` naming the exact key path and saying the rule; and seed 004's three
example workflows load (tool latencies converted from microseconds to seconds)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from simpy_llm import ScenarioError, scenario_from_dict
from tests.agentic_helpers import agentic_scenario, const, llm, tool, tool_spec

CLIENT = "workload.clients[0]"
AGENTIC = f"{CLIENT}.agentic"


def base_agentic() -> dict[str, Any]:
    """A valid workflow: plan -> act (tool) -> observe, act and observe in a loop, then answer.

    Step indexes: 0 plan, 1 act, 2 observe, 3 answer."""
    return {
        "workflow": "base",
        "loop": {"over": ["act", "observe"], "max_iterations": 3},
        "steps": [
            llm("plan"),
            tool("act", "web", "plan"),
            llm("observe", "act", context_growth="accumulate"),
            llm("answer", "observe"),
        ],
        "tools": {"web": tool_spec({"type": "exponential", "params": {"mean": 0.05}})},
    }


def load(agentic: dict[str, Any], **client_keys: Any):
    data = agentic_scenario(agentic)
    data["workload"]["clients"][0].update(client_keys)
    return scenario_from_dict(data)


def problems_of(agentic: dict[str, Any], **client_keys: Any) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        load(agentic, **client_keys)
    return info.value.problems


def assert_one_problem(problems: list[tuple[str, str]], path: str, words: str) -> None:
    """Exactly one problem, at *path*, whose message matches the regex *words*."""
    assert [p for p, _ in problems] == [path], problems
    assert re.search(words, problems[0][1], re.IGNORECASE), problems[0][1]


def test_base_workflow_is_valid():
    """The base workflow the mutations start from loads (so each failure below is its mutation's)."""
    scenario = load(base_agentic())
    agentic = scenario.workload.clients[0].agentic
    assert [s.id for s in agentic.steps] == ["plan", "act", "observe", "answer"]
    assert agentic.loop.over == ("act", "observe")


# --- rule 1: acyclic -------------------------------------------------------------------
def test_rule1_cycle_is_rejected_at_a_depends_on_of_the_cycle():
    """A depends_on cycle (act <-> observe) fails at the depends_on of a step on the cycle,
    and the message says it is a cycle."""
    wf = base_agentic()
    wf["steps"][1]["depends_on"] = ["plan", "observe"]
    problems = problems_of(wf)
    assert len(problems) == 1, problems
    path, message = problems[0]
    assert path in (f"{AGENTIC}.steps[1].depends_on", f"{AGENTIC}.steps[2].depends_on")
    assert re.search(r"cycle", message, re.IGNORECASE)
    assert re.search(r"acyclic", message, re.IGNORECASE)


def test_rule1_longer_cycle_through_three_steps_is_rejected():
    """A three-step cycle (a -> b -> c -> a) hanging off the root is a cycle error too."""
    wf = {
        "workflow": "cyc",
        "steps": [llm("root"), llm("a", "root", "c"), llm("b", "a"), llm("c", "b")],
    }
    problems = problems_of(wf)
    assert len(problems) == 1, problems
    path, message = problems[0]
    assert path in {f"{AGENTIC}.steps[{i}].depends_on" for i in (1, 2, 3)}
    assert "cycle" in message


def test_self_dependency_is_rejected():
    """A step that depends on itself fails at its depends_on."""
    wf = base_agentic()
    wf["steps"][3]["depends_on"] = ["observe", "answer"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[3].depends_on", r"itself")


# --- rule 2: exactly one root, an LLM call -----------------------------------------------
def test_rule2_two_roots_are_rejected():
    """Two steps without depends_on fail at ``steps``, saying exactly one root is allowed."""
    wf = base_agentic()
    del wf["steps"][3]["depends_on"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps", r"exactly one .*depends_on|exactly one root")


def test_rule2_root_must_be_an_llm_call():
    """A tool call as the root fails at the root step's type."""
    wf = base_agentic()
    wf["steps"][0] = tool("plan", "web")
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[0].type", r"llm_call")


# --- rule 3: tools exist ---------------------------------------------------------------
def test_rule3_unknown_tool_is_rejected():
    """A tool_call naming a tool not in ``tools`` fails at its ``tool`` key, naming the known tools."""
    wf = base_agentic()
    wf["steps"][1]["tool"] = "calculator"
    problems = problems_of(wf)
    assert_one_problem(problems, f"{AGENTIC}.steps[1].tool", r"unknown tool")
    assert "web" in problems[0][1]


def test_tool_call_without_tool_is_rejected():
    """A tool_call step without ``tool`` fails at that key: it is required."""
    wf = base_agentic()
    del wf["steps"][1]["tool"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[1].tool", r"required")


def test_llm_call_with_a_tool_is_rejected():
    """An llm_call naming a tool fails at its ``tool`` key."""
    wf = base_agentic()
    wf["steps"][2]["tool"] = "web"
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[2].tool", r"tool_call")


def test_unused_tool_is_rejected():
    """A tool no step calls fails at ``tools.<name>``."""
    wf = base_agentic()
    wf["tools"]["spare"] = tool_spec(const(1))
    assert_one_problem(problems_of(wf), f"{AGENTIC}.tools.spare", r"no step calls")


# --- rule 4: fan_out >= 2 --------------------------------------------------------------
@pytest.mark.parametrize("fan_out", [1, 0, -2])
def test_rule4_fan_out_below_two_is_rejected(fan_out):
    """``fan_out`` below 2 fails at that key, saying it must be at least 2."""
    wf = base_agentic()
    wf["steps"][2]["fan_out"] = fan_out
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[2].fan_out", r">= ?2")


def test_rule4_fan_out_of_two_is_accepted():
    """``fan_out: 2`` (the smallest allowed) loads."""
    wf = base_agentic()
    wf["steps"][2]["fan_out"] = 2
    assert load(wf).workload.clients[0].agentic.steps[2].fan_out == 2


# --- rule 5: the loop is a connected, convex part ------------------------------------
def test_rule5_disconnected_loop_is_rejected():
    """Loop steps that do not form a connected subgraph (plan and observe, with act left
    out) fail at ``loop.over``, saying they must be connected."""
    wf = base_agentic()
    wf["loop"]["over"] = ["plan", "observe"]
    wf["steps"][2].pop("context_growth")
    assert_one_problem(problems_of(wf), f"{AGENTIC}.loop.over", r"connected")


def test_rule5_loop_skipping_a_step_on_a_path_between_its_steps_is_rejected():
    """A connected loop over a and c where a -> b -> c also runs, b outside the loop, fails at
    ``loop.over``: b lies on a path between loop steps."""
    wf = {
        "workflow": "skip",
        "loop": {"over": ["a", "c"], "max_iterations": 2},
        "steps": [llm("a"), llm("b", "a"), llm("c", "a", "b")],
    }
    problems = problems_of(wf)
    assert_one_problem(problems, f"{AGENTIC}.loop.over", r"path between")
    assert "b" in problems[0][1]


def test_loop_over_unknown_step_is_rejected():
    """A loop naming a step that does not exist fails at that entry of ``loop.over``."""
    wf = base_agentic()
    wf["loop"]["over"] = ["act", "ghost"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.loop.over[1]", r"unknown step")


@pytest.mark.parametrize("iterations", [0, -1])
def test_loop_needs_at_least_one_iteration(iterations):
    """``loop.max_iterations`` below 1 fails at that key."""
    wf = base_agentic()
    wf["loop"]["max_iterations"] = iterations
    assert_one_problem(problems_of(wf), f"{AGENTIC}.loop.max_iterations", r">= ?1")


def test_loop_continue_probability_above_one_is_rejected():
    """``loop.continue_probability`` outside [0, 1] fails at that key."""
    wf = base_agentic()
    wf["loop"]["continue_probability"] = 1.5
    problems = problems_of(wf)
    assert [p for p, _ in problems] == [f"{AGENTIC}.loop.continue_probability"]


# --- rule 6: an llm_call has both distributions ---------------------------------------
@pytest.mark.parametrize("key", ["input_distribution", "output_distribution"])
def test_rule6_llm_call_without_a_distribution_is_rejected(key):
    """An llm_call missing its input or output distribution fails at that key."""
    wf = base_agentic()
    del wf["steps"][3][key]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[3].{key}", r"input_distribution and output_distribution")


# --- rule 7: a tool_call has neither --------------------------------------------------
@pytest.mark.parametrize("key", ["input_distribution", "output_distribution"])
def test_rule7_tool_call_with_a_distribution_is_rejected(key):
    """A tool_call giving an input or output distribution fails at that key."""
    wf = base_agentic()
    wf["steps"][1][key] = const(10)
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[1].{key}", r"tool_call .*no input_distribution")


# --- rule 8: accumulate only inside the loop ------------------------------------------
@pytest.mark.parametrize("index", [0, 3])
def test_rule8_accumulate_outside_the_loop_is_rejected(index):
    """``context_growth: accumulate`` on a step outside ``loop.over`` (before or after the
    loop) fails at that step's context_growth."""
    wf = base_agentic()
    wf["steps"][index]["context_growth"] = "accumulate"
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[{index}].context_growth", r"only .*loop")


def test_rule8_accumulate_without_any_loop_is_rejected():
    """Without a loop, no step may accumulate."""
    wf = base_agentic()
    del wf["loop"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[2].context_growth", r"loop")


# --- rule 9: agentic excludes the other request kinds ---------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("reasoning", {"reason_ratio_distribution": {"type": "uniform", "params": {"low": 0.1, "high": 0.9}}}),
        ("multimodal", {"text_distribution": const(10)}),
    ],
)
def test_rule9_agentic_with_reasoning_or_multimodal_is_rejected(key, value):
    """A client with both ``agentic`` and ``reasoning`` / ``multimodal`` fails at the latter's key."""
    assert_one_problem(problems_of(base_agentic(), **{key: value}), f"{CLIENT}.{key}", r"not allowed with agentic")


@pytest.mark.parametrize(
    ("keys", "path"),
    [
        ({"multi_turn": {"max_rounds": 2, "think_time": const(1)}}, "multi_turn"),
        ({"conversational_probability": 0.5, "follow_up_think_time": const(1)}, "conversational_probability"),
        ({"input_distribution": const(10)}, "input_distribution"),
        ({"output_distribution": const(10)}, "output_distribution"),
    ],
)
def test_agentic_excludes_other_sessions_and_client_lengths(keys, path):
    """The schema extends rule 9: an agentic client has no multi-turn or conversational
    sessions and no lengths of its own (its steps have them)."""
    assert_one_problem(problems_of(base_agentic(), **keys), f"{CLIENT}.{path}", r"not allowed with agentic")


# --- the schema's own rules -------------------------------------------------------------
def test_duplicate_step_id_is_rejected():
    """Two steps with the same id fail at the second one's ``id``."""
    wf = base_agentic()
    wf["steps"][2]["id"] = "act"
    wf["steps"][3]["depends_on"] = ["act"]
    wf["loop"]["over"] = ["act"]
    wf["steps"][2].pop("context_growth")
    problems = problems_of(wf)
    assert_one_problem(problems, f"{AGENTIC}.steps[2].id", r"unique")


def test_unknown_depends_on_is_rejected():
    """A depends_on naming no step fails at that step's depends_on, listing the steps."""
    wf = base_agentic()
    wf["steps"][3]["depends_on"] = ["observe", "ghost"]
    problems = problems_of(wf)
    assert_one_problem(problems, f"{AGENTIC}.steps[3].depends_on", r"unknown step 'ghost'")
    assert "plan" in problems[0][1]


def test_repeated_parent_is_rejected():
    """A depends_on naming the same parent twice fails at that key."""
    wf = base_agentic()
    wf["steps"][3]["depends_on"] = ["observe", "observe"]
    assert_one_problem(problems_of(wf), f"{AGENTIC}.steps[3].depends_on", r"twice")


def test_seed_microsecond_latency_key_is_an_unknown_key():
    """The seed's ``latency`` key (microseconds) is not accepted: the tool's key is ``latency_s``."""
    wf = base_agentic()
    wf["tools"]["web"] = {"latency": {"type": "exponential", "params": {"mean": 50000}}, "output_tokens": const(5)}
    paths = [p for p, _ in problems_of(wf)]
    assert f"{AGENTIC}.tools.web.latency" in paths


@pytest.mark.parametrize("capacity", [0, -1])
def test_tool_capacity_below_one_is_rejected(capacity):
    """A tool ``capacity`` below 1 fails at that key."""
    wf = base_agentic()
    wf["tools"]["web"]["capacity"] = capacity
    assert [p for p, _ in problems_of(wf)] == [f"{AGENTIC}.tools.web.capacity"]


def test_unknown_step_key_is_rejected():
    """A misspelt step key fails at its path."""
    wf = base_agentic()
    wf["steps"][2]["fanout"] = 3
    assert f"{AGENTIC}.steps[2].fanout" in [p for p, _ in problems_of(wf)]


# --- seed 004's example workflows -----------------------------------------------------
def us_to_s(dist: dict[str, Any]) -> dict[str, Any]:
    """A latency distribution given in microseconds, in seconds. The seed's ``gaussian``
    latencies become ``normal`` ones (mean and standard deviation kept; the clamp dropped):
    ``gaussian`` is clamped to whole-token bounds and refused as a time."""
    out = copy.deepcopy(dist)
    if out["type"] == "gaussian":
        out = {"type": "normal", "params": {k: out["params"][k] for k in ("mean", "std_dev")}}
    out["params"] = {k: v / 1e6 if k in ("mean", "std_dev", "min", "max", "value") else v for k, v in out["params"].items()}
    return out


def test_a_gaussian_tool_latency_is_refused():
    """A tool latency given as ``gaussian`` (clamped to token bounds, never below 1 s) is a
    scenario error at the tool's ``latency_s`` that names the distributions to use instead."""
    wf = {"workflow": "w", "steps": [llm("a"), tool("t", "svc", "a")], "tools": {"svc": tool_spec(gauss(0.02, 0.005, 1, 2))}}
    (problem,) = problems_of(wf)
    assert problem[0] == f"{AGENTIC}.tools.svc.latency_s" and "normal" in problem[1]


def gauss(mean: float, std: float, lo: float, hi: float) -> dict[str, Any]:
    return {"type": "gaussian", "params": {"mean": mean, "std_dev": std, "min": lo, "max": hi}}


SEED_REACT = {
    "workflow": "react-search",
    "loop": {"over": ["reason", "act", "observe"], "max_iterations": 5},
    "steps": [
        llm("reason", prompt=gauss(256, 50, 32, 1024), output={"type": "exponential", "params": {"mean": 128}}),
        tool("act", "web_search", "reason"),
        llm("observe", "act", context_growth="accumulate", prompt=gauss(200, 50, 32, 2048),
            output={"type": "exponential", "params": {"mean": 64}}),
        llm("final-answer", "observe", prompt=gauss(512, 100, 64, 2048), output={"type": "exponential", "params": {"mean": 256}}),
    ],
    "tools": {
        "web_search": {"latency_s": us_to_s({"type": "exponential", "params": {"mean": 50000}}),
                       "output_tokens": gauss(200, 50, 10, 1000)},
    },
}

SEED_MCTS = {
    "workflow": "mcts-code",
    "steps": [
        llm("decompose", prompt=gauss(500, 100, 64, 2048), output={"type": "exponential", "params": {"mean": 200}}),
        llm("generate", "decompose", fan_out=4, prompt=gauss(300, 80, 32, 1024),
            output={"type": "exponential", "params": {"mean": 512}}),
        llm("evaluate", "generate", prompt=gauss(2048, 200, 256, 4096), output={"type": "exponential", "params": {"mean": 64}}),
        tool("verify", "code_exec", "evaluate"),
        llm("refine", "verify", prompt=gauss(1024, 150, 128, 4096), output={"type": "exponential", "params": {"mean": 256}}),
    ],
    "tools": {
        "code_exec": {"latency_s": us_to_s(gauss(100000, 20000, 10000, 500000)), "output_tokens": const(150)},
    },
}

SEED_FORK_JOIN = {
    "workflow": "fork-join-research",
    "steps": [
        llm("plan", prompt=gauss(300, 50, 32, 1024), output={"type": "exponential", "params": {"mean": 100}}),
        tool("search-web", "web_search", "plan"),
        tool("query-db", "db_query", "plan"),
        tool("fetch-docs", "doc_retrieval", "plan"),
        llm("synthesize", "search-web", "query-db", "fetch-docs", prompt=gauss(1500, 200, 256, 4096),
            output={"type": "exponential", "params": {"mean": 512}}),
    ],
    "tools": {
        "web_search": {"latency_s": us_to_s({"type": "exponential", "params": {"mean": 80000}}),
                       "output_tokens": gauss(300, 80, 20, 1000)},
        "db_query": {"latency_s": us_to_s(gauss(20000, 5000, 1000, 100000)), "output_tokens": const(100)},
        "doc_retrieval": {"latency_s": us_to_s({"type": "exponential", "params": {"mean": 30000}}),
                          "output_tokens": gauss(500, 100, 50, 2000)},
    },
}


def test_seed_react_example_loads():
    """Seed 004's ReAct workflow (latencies in seconds) loads with its loop and accumulate step."""
    agentic = load(copy.deepcopy(SEED_REACT)).workload.clients[0].agentic
    assert agentic.workflow == "react-search"
    assert agentic.loop.over == ("reason", "act", "observe") and agentic.loop.max_iterations == 5
    assert agentic.root.id == "reason"
    assert agentic.steps[2].context_growth == "accumulate"
    assert agentic.tools["web_search"].latency_s.mean == pytest.approx(0.05)


def test_seed_mcts_example_loads():
    """Seed 004's MCTS workflow loads: 4 parallel candidates, a fan-in, a tool, a refinement."""
    agentic = load(copy.deepcopy(SEED_MCTS)).workload.clients[0].agentic
    assert [s.id for s in agentic.steps] == ["decompose", "generate", "evaluate", "verify", "refine"]
    assert agentic.steps[1].fan_out == 4
    assert agentic.loop is None
    assert agentic.tools["code_exec"].capacity is None


def test_seed_fork_join_example_loads():
    """Seed 004's fork-join workflow loads: three tools in parallel, one synthesising fan-in."""
    agentic = load(copy.deepcopy(SEED_FORK_JOIN)).workload.clients[0].agentic
    assert agentic.steps[4].depends_on == ("search-web", "query-db", "fetch-docs")
    assert sorted(agentic.tools) == ["db_query", "doc_retrieval", "web_search"]
