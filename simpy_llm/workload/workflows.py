"""Workflows: sessions as DAGs of LLM and tool calls, with fan-out, fan-in and a loop.

A client's sessions run a :class:`Workflow` (``docs/agentic.md``). An agentic client
gives one as data (``agentic``: seed 004); a multi-turn or conversational client is
the special case of one LLM step in a loop (:meth:`Workflow.of_client`): round k+1
is iteration k+1, the think time is the delay between iterations, the number of
rounds the loop's iteration count, and a conversational follow-up the loop's
continuation probability. One state machine, :class:`WorkflowSession`, runs both,
for the simulator (:class:`~simpy_llm.workload.sessions.SessionRegistry`) and for
the observer's closed loop alike. It never touches SimPy or asyncio: its caller
tells it what finished, when, with how many tokens, and gets back the calls to make.

Execution rules (seed 004's edge timing table):

* the root step's first instance is the session's arrival (the generator creates
  it); its other instances (``fan_out``) start at once;
* a step starts when every instance of every parent has completed, at the last
  parent's completion (fan-in); an LLM child of an LLM step starts at once; a tool
  call starts at its parent's completion and its child when the call returns;
* the loop's steps repeat: an iteration ends when all of its steps have completed;
  the next one starts ``think_time_s`` later while the session's iteration count
  (drawn once per session from ``iterations_distribution``, else ``max_iterations``)
  is not reached and the continuation draw (``continue_probability``) says so; the
  steps after the loop start when it exits;
* ``context_growth: accumulate``: a loop step's prompt at iteration k is its prompt
  at iteration k - 1 plus every output of iteration k - 1 (its LLM steps' outputs and
  its tool calls' outputs) plus a newly drawn part; at iteration 0 it is the drawn
  part (plus the client's shared prefix, as every LLM step's prompt);
* an LLM call that would arrive after the workload's ``horizon_s`` is not made, and a
  dropped LLM call stops the session from making more: it ends when the calls
  already under way have finished.

Random draws come from the client's streams: a multi-turn or conversational
client's loop decisions and round lengths from ``workload/<client>/session`` (in the
order the multi-turn rules always drew them); an agentic loop's continuation draws
from ``.../session``, its iteration counts and think times from ``.../loop/iterations``
and ``.../loop/think_time``, an agentic step's lengths from ``.../step/<step id>/input``
and ``.../output``, a tool's from ``.../tool/<tool>/latency`` and ``.../output``, the
last four drawn in vectors and used in the order the sessions and calls need them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_TIME_S
from simpy_llm.workload.distributions import to_tokens

if TYPE_CHECKING:
    import numpy as np

    from simpy_llm.config.schema import AgenticConfig, ClientConfig, ToolConfig
    from simpy_llm.workload.generator import ClientSource

__all__ = [
    "END_REASONS",
    "Call",
    "Step",
    "StepDraws",
    "Workflow",
    "WorkflowSession",
    "check_workflow",
]

END_REASONS = ("completed", "max_rounds", "user_stopped", "horizon", "dropped", "in_progress")
"""Why a session ended: its last steps completed; its loop ran its iteration count (the
loop being its end: every multi-turn session that ran all its rounds); the loop's
continuation draw stopped it (the user did not follow up); its next LLM call would have
arrived after the workload horizon; an LLM call was dropped; or the simulation stopped
first."""


# --- validation (seed 004's nine rules; rule 9 is on the client) ----------------------
def check_workflow(cfg: AgenticConfig) -> None:
    """Check an ``agentic`` block against seed 004's rules 1-8 (and the schema's own).

    Raises
    ------
    FieldValueError
        At the first broken rule, naming its key (``steps[2].depends_on``...) and the rule.
    """
    ids = [s.id for s in cfg.steps]
    index: dict[str, int] = {}
    for i, sid in enumerate(ids):
        if sid in index:
            raise FieldValueError(f"steps[{i}].id", f"step ids must be unique; {sid!r} is also steps[{index[sid]}]")
        index[sid] = i
    for i, step in enumerate(cfg.steps):
        for dep in step.depends_on:
            if dep not in index:
                raise FieldValueError(f"steps[{i}].depends_on", f"unknown step {dep!r}; steps: {', '.join(ids)}")
            if dep == step.id:
                raise FieldValueError(f"steps[{i}].depends_on", "a step cannot depend on itself")
        if len(set(step.depends_on)) != len(step.depends_on):
            raise FieldValueError(f"steps[{i}].depends_on", "names a step twice")
        llm = step.type == "llm_call"
        if llm:  # rule 6
            for name in ("input_distribution", "output_distribution"):
                if getattr(step, name) is None:
                    raise FieldValueError(f"steps[{i}].{name}", "an llm_call step needs input_distribution and output_distribution (rule 6)")
            if step.tool is not None:
                raise FieldValueError(f"steps[{i}].tool", "only a tool_call step names a tool")
        else:
            for name in ("input_distribution", "output_distribution"):  # rule 7
                if getattr(step, name) is not None:
                    raise FieldValueError(
                        f"steps[{i}].{name}",
                        "a tool_call step has no input_distribution or output_distribution; its tool sets its output (rule 7)",
                    )
            if step.tool is None:
                raise FieldValueError(f"steps[{i}].tool", "required for a tool_call step")
            if step.tool not in cfg.tools:  # rule 3
                known = ", ".join(sorted(cfg.tools)) or "none"
                raise FieldValueError(
                    f"steps[{i}].tool",
                    f"unknown tool {step.tool!r}; every tool a step names must be in tools (rule 3); tools: {known}",
                )
    used = {s.tool for s in cfg.steps if s.tool is not None}
    for name in cfg.tools:
        if name not in used:
            raise FieldValueError(f"tools.{name}", "no step calls this tool")
    # Rule 1: acyclic (depends_on edges; the loop's back edge is implicit, never written).
    cycle = _find_cycle(cfg)
    if cycle is not None:
        raise FieldValueError(f"steps[{index[cycle[0]]}].depends_on", f"makes a cycle ({' -> '.join(cycle)}); a workflow must be acyclic (rule 1)")
    # Rule 2: exactly one root, an LLM call (the session's arrival).
    roots = [s for s in cfg.steps if not s.depends_on]
    if len(roots) != 1:
        raise FieldValueError("steps", f"exactly one step has no depends_on (the root; rule 2); found {len(roots)}: {', '.join(s.id for s in roots)}")
    if roots[0].type != "llm_call":
        raise FieldValueError(f"steps[{index[roots[0].id]}].type", "the root step is the session's first request: an llm_call")
    loop = cfg.loop
    body: set[str] = set()
    if loop is not None:
        for j, sid in enumerate(loop.over):
            if sid not in index:
                raise FieldValueError(f"loop.over[{j}]", f"unknown step {sid!r}; steps: {', '.join(ids)}")
        body = set(loop.over)
        if len(body) != len(loop.over):
            raise FieldValueError("loop.over", "names a step twice")
        _check_loop_body(cfg, body)  # rule 5
    for i, step in enumerate(cfg.steps):  # rule 8
        if step.context_growth == "accumulate" and step.id not in body:
            raise FieldValueError(f"steps[{i}].context_growth", "accumulate applies only to steps inside loop.over (rule 8)")


def _find_cycle(cfg: AgenticConfig) -> list[str] | None:
    parents = {s.id: s.depends_on for s in cfg.steps}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(sid: str) -> list[str] | None:
        state[sid] = 1
        path.append(sid)
        for dep in parents[sid]:
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state:
                found = visit(dep)
                if found is not None:
                    return found
        path.pop()
        state[sid] = 2
        return None

    for sid in parents:
        if sid not in state:
            found = visit(sid)
            if found is not None:
                return found
    return None


def _check_loop_body(cfg: AgenticConfig, body: set[str]) -> None:
    """Rule 5: the loop's steps are connected, and every step on a path between two of
    them is one of them (else it would have to run inside the loop too)."""
    parents = {s.id: set(s.depends_on) for s in cfg.steps}
    children: dict[str, set[str]] = {s.id: set() for s in cfg.steps}
    for sid, deps in parents.items():
        for d in deps:
            children[d].add(sid)
    start = next(iter(sorted(body)))
    seen = {start}
    todo = [start]
    while todo:
        sid = todo.pop()
        for n in (parents[sid] | children[sid]) & body:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    if seen != body:
        raise FieldValueError(
            "loop.over",
            f"the loop's steps must form a connected subgraph (rule 5); {', '.join(sorted(body - seen))} not connected to {start}",
        )

    def reach(start_ids: set[str], edges: dict[str, set[str]]) -> set[str]:
        out: set[str] = set()
        todo = list(start_ids)
        while todo:
            sid = todo.pop()
            for n in edges[sid]:
                if n not in out:
                    out.add(n)
                    todo.append(n)
        return out

    between = (reach(body, children) & reach(body, parents)) - body
    if between:
        raise FieldValueError("loop.over", f"steps on a path between loop steps must be in the loop (rule 5): {', '.join(sorted(between))}")


# --- the compiled workflow ----------------------------------------------------------------
@attrs.frozen(eq=False)
class Step:
    """A step of a compiled :class:`Workflow`."""

    index: int
    id: str
    llm: bool
    """An LLM call (else a tool call)."""
    instances: int
    """Parallel instances (``fan_out``, else 1)."""
    parents: tuple[int, ...]
    children: tuple[int, ...]
    in_loop: bool
    accumulate: bool
    loop_parents: int = 0
    """Parents inside the loop (what a loop step waits for after the first iteration)."""
    tool: str | None = None
    input_distribution: Any = None
    """None: the client's own prompt rule (a multi-turn round)."""
    output_distribution: Any = None
    tool_config: ToolConfig | None = None
    """A tool call's tool (None for an LLM call)."""
    draws: tuple[str, str] = ("", "")
    """The client streams its calls draw from: an LLM step's ``step/<id>/input`` and
    ``.../output``, a tool call's ``tool/<tool>/latency`` and ``.../output`` (named once
    here, not per call)."""
    n_parents: int = attrs.field(init=False)
    """``len(parents)`` (read per call)."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "n_parents", len(self.parents))


@attrs.frozen(eq=False)
class Workflow:
    """A workflow ready to run: its steps in order, with the loop's structure resolved."""

    name: str
    steps: tuple[Step, ...]
    root: int
    tools: dict[str, ToolConfig]
    loop_body: frozenset[int]
    """Indexes of the loop's steps (empty: no loop)."""
    loop_entries: tuple[int, ...]
    """Loop steps with no parent inside the loop: where an iteration starts."""
    after_loop: tuple[int, ...]
    """Steps outside the loop with a parent in it: they start when the loop exits."""
    max_iterations: int = 1
    iterations_distribution: Any = None
    continue_probability: float = 1.0
    think_time: Any = None
    multi_turn: bool = False
    """A multi-turn or conversational client's rounds (draws from the ``session`` stream only)."""
    accumulates: bool = False
    """Some step has ``context_growth: accumulate`` (the loop's outputs are counted)."""
    releases: tuple[tuple[Step, ...], ...] = attrs.field(init=False)
    """Per step, the children its end counts toward within an iteration (a loop step's
    children after the loop count when the loop exits instead)."""
    accumulating: tuple[int, ...] = attrs.field(init=False)
    """Indexes of the steps with ``context_growth: accumulate``."""
    after_loop_counts: tuple[tuple[Step, int], ...] = attrs.field(init=False)
    """Per step of :attr:`after_loop`, the step and how many of its parents are in the loop."""

    def __attrs_post_init__(self) -> None:
        # Derived once per workflow, for the per-call rules (attrs' frozen classes set
        # their derived fields through object.__setattr__).
        steps = self.steps
        body = self.loop_body
        releases = tuple(
            tuple(steps[c] for c in s.children if not (s.in_loop and not steps[c].in_loop)) for s in steps
        )
        object.__setattr__(self, "releases", releases)
        object.__setattr__(self, "accumulating", tuple(s.index for s in steps if s.accumulate))
        object.__setattr__(
            self, "after_loop_counts", tuple((steps[a], sum(1 for p in steps[a].parents if p in body)) for a in self.after_loop)
        )

    @classmethod
    def of_agentic(cls, cfg: AgenticConfig) -> Workflow:
        """Compile an ``agentic`` block (already checked by :func:`check_workflow`)."""
        index = {s.id: i for i, s in enumerate(cfg.steps)}
        body = frozenset(index[sid] for sid in cfg.loop.over) if cfg.loop is not None else frozenset()
        kids: list[list[int]] = [[] for _ in cfg.steps]
        for i, s in enumerate(cfg.steps):
            for d in s.depends_on:
                kids[index[d]].append(i)
        steps = tuple(
            Step(
                index=i, id=s.id, llm=s.type == "llm_call", instances=s.fan_out or 1,
                parents=tuple(index[d] for d in s.depends_on), children=tuple(kids[i]), in_loop=i in body,
                accumulate=s.context_growth == "accumulate", tool=s.tool,
                loop_parents=sum(1 for d in s.depends_on if index[d] in body) if i in body else 0,
                input_distribution=s.input_distribution, output_distribution=s.output_distribution,
                tool_config=cfg.tools[s.tool] if s.tool is not None else None,
                draws=(f"step/{s.id}/input", f"step/{s.id}/output") if s.tool is None
                else (f"tool/{s.tool}/latency", f"tool/{s.tool}/output"),
            )
            for i, s in enumerate(cfg.steps)
        )
        loop = cfg.loop
        return cls(
            name=cfg.workflow,
            steps=steps,
            root=index[cfg.root.id],
            tools=dict(cfg.tools),
            loop_body=body,
            loop_entries=tuple(i for i in sorted(body) if not set(steps[i].parents) & body),
            after_loop=tuple(i for i, s in enumerate(steps) if i not in body and set(s.parents) & body),
            max_iterations=loop.max_iterations if loop is not None else 1,
            iterations_distribution=loop.iterations_distribution if loop is not None else None,
            continue_probability=loop.continue_probability if loop is not None else 1.0,
            think_time=loop.think_time_s if loop is not None else None,
            accumulates=any(s.accumulate for s in steps),
        )

    @classmethod
    def of_client(cls, client: ClientConfig) -> Workflow | None:
        """The workflow of *client*'s sessions: its ``agentic`` block, the one-step loop of
        a multi-turn or conversational client, or None (no sessions)."""
        if client.agentic is not None:
            return cls.of_agentic(client.agentic)
        mt = client.multi_turn
        if mt is None and client.conversational_probability <= 0:
            return None
        round_step = Step(
            index=0, id="round", llm=True, instances=1, parents=(), children=(), in_loop=True,
            accumulate=mt is None or mt.context_growth == "accumulate",
        )
        return cls(
            name="multi_turn" if mt is not None else "conversational",
            steps=(round_step,),
            root=0,
            tools={},
            loop_body=frozenset({0}),
            loop_entries=(0,),
            after_loop=(),
            max_iterations=mt.max_rounds if mt is not None else 1 << 62,
            iterations_distribution=mt.rounds_distribution if mt is not None else None,
            continue_probability=1.0 if mt is not None else client.conversational_probability,
            think_time=mt.think_time if mt is not None else client.follow_up_think_time,
            multi_turn=True,
            accumulates=round_step.accumulate,
        )


# --- a running session ------------------------------------------------------------------
DrawFactory = Callable[[str, Any, bool], Callable[[], float]]
"""``make(stream name, distribution, tokens)``: a function giving the next value of that
client stream (whole tokens when ``tokens``)."""


class StepDraws:
    """Where the sessions of one client running one :class:`Workflow` take their random values
    from: each step's two draw functions, the loop's iteration count and think time.

    One table per client serves all its sessions (the streams go on from session to session).
    A step's functions come from *make* called with its stream names (:attr:`Step.draws`);
    two steps calling the same tool share that tool's functions, as they share its streams.

    Parameters
    ----------
    workflow
        The workflow (of an agentic client: a multi-turn client's draws are from its
        ``session`` stream, not from here).
    make
        Makes the draw function of a stream: :meth:`of_source` uses
        :meth:`ClientSource.draw <simpy_llm.workload.generator.ClientSource.draw>`; the
        simulation's session registry makes each stream's vector draws once and calls them
        directly.
    """

    __slots__ = ("iterations", "steps", "think_time")

    def __init__(self, workflow: Workflow, make: DrawFactory) -> None:
        made: dict[str, Callable[[], float]] = {}

        def fn(name: str, distribution: Any, tokens: bool) -> Callable[[], float]:
            f = made.get(name)
            if f is None:
                f = made[name] = make(name, distribution, tokens)
            return f

        steps: list[tuple[Callable[[], float], Callable[[], float]] | None] = []
        for step in workflow.steps:
            first, second = step.draws
            if step.llm:
                # None: a multi-turn round, drawn by the client's own prompt rule.
                steps.append(None if step.input_distribution is None else
                             (fn(first, step.input_distribution, True), fn(second, step.output_distribution, True)))
            else:
                tool = step.tool_config
                assert tool is not None  # a tool_call step names its tool (check_workflow)
                steps.append((fn(first, tool.latency_s, False), fn(second, tool.output_tokens, True)))
        self.steps = tuple(steps)
        """Per step (by index): an LLM step's prompt and output draws, a tool call's latency
        and output draws (None: a multi-turn round)."""
        agentic = not workflow.multi_turn
        dist = workflow.iterations_distribution
        self.iterations = fn("loop/iterations", dist, True) if agentic and dist is not None else None
        """The loop's iteration count per session (None: not drawn from here)."""
        think = workflow.think_time
        self.think_time = fn("loop/think_time", think, False) if agentic and think is not None else None
        """The think time between iterations (None: not drawn from here)."""

    @classmethod
    def of_source(cls, workflow: Workflow, source: ClientSource) -> StepDraws:
        """The table drawing through *source*'s own :meth:`~ClientSource.draw`."""
        return cls(workflow, lambda name, dist, tokens: functools.partial(source.draw, name, dist, tokens=tokens))


@attrs.define(eq=False)
class Call:
    """One step instance to start: an LLM request or a tool call."""

    step: Step
    iteration: int
    instance: int
    delay_s: float
    """Seconds after the moment it was decided (think time; 0 otherwise)."""
    prompt_tokens: int = 0
    """LLM: the whole prompt (shared prefix and accumulated context included)."""
    new_tokens: int = 0
    """LLM: the newly drawn part of the prompt (without prefix and context)."""
    output_tokens: int = 0
    """LLM: requested output; tool: tokens it returns."""
    latency_s: float = 0.0
    """Tool: how long the call takes (without waiting for the tool)."""
    fields: dict[str, Any] = attrs.Factory(dict)
    """LLM: request fields (identity, session, step, iteration, priority, streaming)."""
    accumulates_from: tuple[int, int] | None = None
    """LLM with ``accumulate`` at iteration k > 0: (step, k - 1), whose prompt it extends."""

    @property
    def key(self) -> tuple[int, int, int]:
        """``(step index, iteration, instance)``."""
        return (self.step.index, self.iteration, self.instance)


class WorkflowSession:
    """The state of one session running a :class:`Workflow` (no SimPy, no asyncio).

    Parameters
    ----------
    workflow
        What it runs.
    session_id
        Its id (carried by its requests).
    source
        Its client (streams, request fields, prompt rule).
    horizon_s
        No LLM call arrives after this time (None: no limit).
    rng
        The client's ``session`` stream, if the caller holds it (else looked up in *source*).
    draws
        The client's :class:`StepDraws` for *workflow*, if the caller holds one (all the
        client's sessions must then draw from it); else the session draws through *source*.

    The caller registers the root request (:meth:`start`), then reports each finished
    call (:meth:`finished`) and makes the calls it returns; :attr:`end_reason` is set
    once nothing is left to run.
    """

    def __init__(
        self, workflow: Workflow, session_id: str, source: ClientSource, horizon_s: float | None,
        *, rng: np.random.Generator | None = None, draws: StepDraws | None = None,
    ) -> None:
        self.workflow = workflow
        self.session_id = session_id
        self.source = source
        self.horizon_s = horizon_s
        self.rng = rng if rng is not None else source.stream("session")
        self._draws = draws if draws is not None else StepDraws.of_source(workflow, source)
        self.iterations = workflow.max_iterations
        dist = workflow.iterations_distribution
        if dist is not None:
            if workflow.multi_turn:
                drawn = int(to_tokens(dist.sample(self.rng, 1))[0])
            else:
                assert self._draws.iterations is not None  # an agentic loop's count is drawn there
                drawn = int(self._draws.iterations())
            self.iterations = min(max(drawn, 1), workflow.max_iterations)
        self.started = 0
        """LLM calls made (the root included; a call counts when it is made: :meth:`arrived`)."""
        self.tool_calls = 0
        self.tool_wait_s = 0.0
        """Summed time of its tool calls (waiting for the tool and running), s."""
        self.iteration = 0
        """The loop iteration running (the last one, once the loop exited)."""
        self.end_reason = ""
        self.start_s = math.nan
        self.end_s = math.nan
        self.pending = 0
        """Calls started and not finished (or scheduled and not started)."""
        self.fan_out_planned = 0
        self.fan_out_done = 0
        self._stop: str = ""
        """Why no more calls are made ("" while they are)."""
        self._loop_reason = ""
        self._done: dict[tuple[int, int], int] = {}
        """Finished instances per (step, iteration)."""
        self._waiting: dict[tuple[int, int], list[Any]] = {}
        """Per (step, iteration) whose parents are being counted (fan-in): ``[parents still to
        finish, latest parent end, the call that ended then]`` (the first of equal ends)."""
        self._iteration_output: dict[int, int] = {}
        """Output tokens (LLM and tool) of each iteration's loop steps."""
        self._prompt: dict[tuple[int, int], int] = {}
        """Prompt of instance 0 per (step, iteration) of accumulate steps."""
        self._step_end: dict[tuple[int, int], tuple[float, tuple[int, int, int]]] = {}
        """Latest end and its instance, per (step, iteration) whose instances are finishing."""
        self._iteration_end: dict[int, list[Any]] = {}
        """Per iteration whose loop steps are finishing: ``[loop steps fully finished, latest
        end of one, the call that ended then]`` (the first of equal ends)."""
        self._last_parent: dict[tuple[int, int], tuple[int, int, int]] = {}
        """For each started (step, iteration), the parent instance whose end released it."""
        self._base = {**source.base, "session_id": session_id}
        self._last_key: tuple[int, int, int] | None = None
        """The call that ended last (the largest key among equal ends): the critical path's end."""

    # --- the caller's side --------------------------------------------------------
    def start(self, now_s: float, *, prompt_tokens: int, output_tokens: int, fields: dict[str, Any]) -> list[Call]:
        """The session's root request (made by the generator) arrived at *now_s*: returns
        the other instances of the root to make now. *fields* are the root's own request
        fields (streaming, priority...), carried to every later call."""
        wf = self.workflow
        self.start_s = now_s
        root = wf.steps[wf.root]
        base = self._base  # this session's own dict: updated in place
        if "streaming" in fields:
            base["streaming"] = fields["streaming"]
        if "priority" in fields:
            base["priority"] = fields["priority"]
        self.started = 1
        if root.accumulate:
            self._prompt[(root.index, 0)] = prompt_tokens
        if root.instances == 1:
            self.pending = 1
            return []
        self.fan_out_planned += root.instances
        calls = [c for i in range(1, root.instances) if (c := self._llm_call(root, 0, i, 0.0, now_s)) is not None]
        self.pending = 1 + len(calls)
        return calls

    def root_call(self) -> Call:
        """The :class:`Call` the root request is (instance 0 of the root step at iteration 0)."""
        return Call(self.workflow.steps[self.workflow.root], 0, 0, 0.0)

    def finished(
        self, call_key: tuple[int, int, int], now_s: float, *, output_tokens: int, dropped: bool = False
    ) -> list[Call]:
        """The call *call_key* finished at *now_s* with *output_tokens* (for an LLM call,
        what it generated; for a tool, what it returned); returns the calls to make next
        (each after its ``delay_s``)."""
        s_idx, it, _inst = call_key
        wf = self.workflow
        step = wf.steps[s_idx]
        self.pending -= 1
        if not now_s <= self.end_s:  # also when end_s is still NaN
            self.end_s = now_s
            self._last_key = call_key
        elif now_s == self.end_s and self._last_key is not None and call_key > self._last_key:  # set with end_s
            self._last_key = call_key
        if dropped and not self._stop:
            self._stop = "dropped"
        in_loop = step.in_loop
        if in_loop and wf.accumulates:
            outputs = self._iteration_output
            outputs[it] = outputs.get(it, 0) + output_tokens
        instances = step.instances
        if instances > 1:
            self.fan_out_done += 1
            key = (s_idx, it)
            self._done[key] = done = self._done.get(key, 0) + 1
            step_end = self._step_end
            held = step_end.get(key)
            if held is None or now_s > held[0]:  # keep the latest end (the first of equal ends)
                step_end[key] = (now_s, call_key)
            if done != instances or self._stop:
                if self.pending == 0 and not self.end_reason:  # nothing to make now: ended if nothing is under way
                    self.end_reason = self._stop or self._loop_reason or "completed"
                return []
            end, by = step_end.pop(key)  # the step is done for this iteration
        elif self._stop:
            if self.pending == 0 and not self.end_reason:  # nothing to make now: ended if nothing is under way
                self.end_reason = self._stop or self._loop_reason or "completed"
            return []
        else:
            end, by = now_s, call_key
        releases = wf.releases[s_idx]
        if len(releases) == 1:  # one child: its calls (a new list) start the answer
            calls = self._count_parent(releases[0], it, by, end, now_s)
        else:
            calls = []
            for child in releases:
                calls += self._count_parent(child, it, by, end, now_s)
        if in_loop:
            iteration_end = self._iteration_end
            slot = iteration_end.get(it)
            if slot is None:
                slot = iteration_end[it] = [1, end, by]
            else:
                slot[0] += 1
                if end > slot[1]:  # keep the latest end (the first of equal ends)
                    slot[1] = end
                    slot[2] = by
            if slot[0] == len(wf.loop_body):
                calls += self._end_iteration(it, now_s)
        self.pending += len(calls)
        if self.pending == 0 and not self.end_reason:
            self.end_reason = self._stop or self._loop_reason or "completed"
        return calls

    def arrived(self, call: Call) -> None:
        """*call* is being made now (an LLM request sent, a tool called): counted in
        :attr:`started` or :attr:`tool_calls` and :attr:`iteration` only then, so a call
        decided but cut off by the end of the run is not."""
        if call.step.llm:
            self.started += 1
        else:
            self.tool_calls += 1
        if call.step.in_loop and call.iteration > self.iteration:
            self.iteration = call.iteration

    def tool_finished_wait(self, seconds: float) -> None:
        """Count *seconds* of tool time (waiting and running) toward the session's tool wait."""
        self.tool_wait_s += seconds

    def close(self) -> str:
        """The session is cut off by the end of the run: its end reason (``in_progress`` if it had not ended)."""
        if not self.end_reason:
            self.end_reason = "in_progress"
        return self.end_reason

    def critical_path(self) -> list[tuple[int, int, int]]:
        """The chain of call keys that ended last, root first: each call's releasing parent."""
        key = self._last_key
        if key is None:
            return []
        chain = [key]
        while True:
            parent = self._last_parent.get(key[:2])
            if parent is None:
                break
            chain.append(parent)
            key = parent
        return chain[::-1]

    # --- the rules ---------------------------------------------------------------
    def _count_parent(
        self, child: Step, it: int, by: tuple[int, int, int], end: float, now: float, count: int = 1
    ) -> list[Call]:
        """*count* parents of *child* (iteration *it*) ended, the last at *end*; start it
        when none is left, at its latest parent's end (fan-in)."""
        needed = child.loop_parents if child.in_loop and it > 0 else child.n_parents
        key = (child.index, it)
        if needed == count:  # its only parent(s): no fan-in to wait for (so never counted in _waiting)
            self._last_parent[key] = by
            delay = end - now
        else:
            waiting = self._waiting
            slot = waiting.get(key)
            if slot is None:
                slot = waiting[key] = [needed - count, end, by]
            else:
                slot[0] -= count
                if end > slot[1]:  # keep the latest end (the first of equal ends)
                    slot[1] = end
                    slot[2] = by
            if slot[0] > 0:
                return []
            self._last_parent[key] = slot[2]
            delay = slot[1] - now
        if child.instances == 1:  # one instance: _start_step's first case, without the call
            if not child.llm:
                return [self._tool_call(child, it, 0, delay)]
            call = self._llm_call(child, it, 0, delay, now)
            return [call] if call is not None else []
        return self._start_step(child, it, delay, now)

    def _end_iteration(self, it: int, now: float) -> list[Call]:
        """Every loop step of iteration *it* ended: start the next iteration, or exit the loop."""
        wf = self.workflow
        if it + 1 < self.iterations:
            if wf.continue_probability < 1.0 and self.rng.random() >= wf.continue_probability:
                self._loop_reason = "user_stopped"
                return self._exit_loop(it, now)
            _, end, by = self._iteration_end.pop(it)
            delay = end - now
            if wf.think_time is not None:
                if wf.multi_turn:
                    think = float(wf.think_time.sample(self.rng, 1)[0])
                else:
                    assert self._draws.think_time is not None  # an agentic loop's think time is drawn there
                    think = self._draws.think_time()
                # Clamped like every time in a scenario (a heavy tail can draw an absurd think time).
                delay += min(max(think, 0.0), MAX_TIME_S)
            calls: list[Call] = []
            for e in wf.loop_entries:
                self._last_parent[(e, it + 1)] = by
                calls += self._start_step(wf.steps[e], it + 1, delay, now)
            return calls
        self._loop_reason = "max_rounds"
        return self._exit_loop(it, now)

    def _exit_loop(self, it: int, now: float) -> list[Call]:
        """The loop exits after iteration *it*: count it toward the steps after the loop."""
        wf = self.workflow
        _, end, by = self._iteration_end.pop(it)
        calls: list[Call] = []
        for child, inside in wf.after_loop_counts:
            calls += self._count_parent(child, 0, by, end, now, count=inside)
        waiting = self._waiting
        if calls or any((slot := waiting.get((a, 0))) is None or slot[0] > 0 for a in wf.after_loop):
            self._loop_reason = ""  # the session goes on (or waits) after its loop
        return calls

    def _start_step(self, step: Step, it: int, delay: float, now: float) -> list[Call]:
        instances = step.instances
        if instances == 1:
            if not step.llm:
                return [self._tool_call(step, it, 0, delay)]
            call = self._llm_call(step, it, 0, delay, now)
            return [call] if call is not None else []
        self.fan_out_planned += instances
        if step.llm:
            return [c for i in range(instances) if (c := self._llm_call(step, it, i, delay, now)) is not None]
        return [self._tool_call(step, it, i, delay) for i in range(instances)]

    def _llm_call(self, step: Step, it: int, instance: int, delay: float, now: float) -> Call | None:
        if self._stop:
            return None
        horizon = self.horizon_s
        if horizon is not None and now + delay > horizon:
            self._stop = "horizon"
            return None
        source = self.source
        if step.input_distribution is None:  # a multi-turn round: the client's own prompt rule
            drawn_arr, extra_list = source.prompts(self.rng, 1)
            drawn = int(drawn_arr[0]) - source.prefix_tokens
            output = int(to_tokens(source.output_distribution.sample(self.rng, 1))[0])
            extras = extra_list[0] if extra_list else {}
            fields = {**self._base, **extras, "round_index": it, "step_id": "", "loop_iteration": it}
        else:
            draws = self._draws.steps[step.index]
            assert draws is not None  # an agentic LLM step has its draws
            drawn = int(draws[0]())
            output = int(draws[1]())
            fields = {**self._base, "round_index": it, "step_id": step.id, "loop_iteration": it}
        prompt = drawn + source.prefix_tokens
        accumulates_from = None
        if step.accumulate:
            if it > 0:
                previous = self._prompt.get((step.index, it - 1))
                if previous is not None:
                    prompt = previous + self._iteration_output.get(it - 1, 0) + drawn
                    accumulates_from = (step.index, it - 1)
            if instance == 0:
                self._prompt[(step.index, it)] = prompt
        return Call(step, it, instance, delay, prompt_tokens=prompt, new_tokens=drawn, output_tokens=output,
                    fields=fields, accumulates_from=accumulates_from)

    def _tool_call(self, step: Step, it: int, instance: int, delay: float) -> Call:
        draws = self._draws.steps[step.index]
        assert draws is not None  # a tool call has its draws
        latency = draws[0]()
        if latency < 0.0:  # clamped to [0, MAX_TIME_S] like every time in a scenario
            latency = 0.0
        elif latency > MAX_TIME_S:
            latency = MAX_TIME_S
        output = int(draws[1]())
        return Call(step, it, instance, delay, output_tokens=output, latency_s=latency)
