"""Closed-loop sessions: multi-turn conversations, conversational follow-ups and agentic workflows.

The :class:`SessionRegistry` takes every request leaving a replica from a
completions Wire (as its connected handler) and acts on it when the client has it.
A request that belongs to a session is a step of that session's
:class:`~simpy_llm.workload.workflows.Workflow`; the registry
tells the session's :class:`~simpy_llm.workload.workflows.WorkflowSession` that it
finished and makes the calls the session returns: LLM calls become requests put
into the Wire the workload generator feeds (after their delay), so the router
cannot tell them from fresh arrivals; tool calls wait for their tool and run for
their latency. One mechanism for every kind of session:

* ``multi_turn``: a loop of one LLM step, ``rounds`` iterations (drawn from
  ``rounds_distribution``, clamped to [1, max_rounds], else max_rounds), round k+1
  ``think_time`` after round k completes;
* ``conversational_probability`` p: the same loop, continued after each round with
  probability p (a geometric chain), ``follow_up_think_time`` apart;
* ``agentic``: the client's workflow, with its tools; a tool with a ``capacity`` is a
  :class:`simpy.Resource` whose queue delays the calls that find it busy.

Under ``context_growth: accumulate`` (the default of multi-turn, and always for
conversational follow-ups) a round's prompt is the previous round's prompt plus its
output plus a newly drawn question; under ``fixed`` it is a fresh draw (plus the
client's shared prefix). Every request of a session carries its first request's
priority and streaming flag.

A call never starts before its parents completed. A session ends with one of the
reasons in :data:`END_REASONS`; ``Results.sessions()`` lists every session.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import Event

from simpy_llm.entities import Request
from simpy_llm.kernel import Later, TimerAt
from simpy_llm.workload.distributions import Draws
from simpy_llm.workload.generator import DRAW_CHUNK
from simpy_llm.workload.prefix import content_segments
from simpy_llm.workload.workflows import END_REASONS, Call, StepDraws, WorkflowSession

if TYPE_CHECKING:
    import numpy as np

    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.wire import Wire
    from simpy_llm.workload.generator import ClientSource

__all__ = ["END_REASONS", "ReplayedContexts", "SessionRegistry", "open_session"]


def open_session(session_id: str, source: ClientSource, horizon_s: float | None) -> WorkflowSession | None:
    """A new session of *source*'s client (drawing what it draws when a session starts), or
    None if the client has no sessions."""
    if source.workflow is None:
        return None
    return WorkflowSession(source.workflow, session_id, source, horizon_s)


def _draws_of(source: ClientSource, name: str, distribution: Any, tokens: bool) -> Callable[[], float]:
    """The next-value function of *source*'s stream *name*: what :meth:`ClientSource.draw`
    draws (the same stream, vectors of :data:`DRAW_CHUNK`), called without the look-up by
    name. Only the session registry draws these streams in a simulation, through this."""
    return Draws(distribution, source.stream(name), tokens=tokens, chunk=DRAW_CHUNK).next


class SessionRegistry:
    """Runs the sessions: makes each session's next calls as its calls finish.

    Parameters
    ----------
    env
        The SimPy environment.
    completions
        Wire of requests leaving the replicas (completed or dropped).
    arrivals
        Wire the router reads; a session's LLM calls are put here.
    recorder
        Told of each LLM call's arrival and each session's end.
    ids
        The simulation's request-id counter.
    horizon_s
        No LLM call arrives after this time (None: no limit).
    announce
        Tell the recorder of each LLM call's arrival (False when the consumer of
        *arrivals* does: a client network that delivers it to the router later).
    """

    def __init__(
        self,
        env: simpy.Environment,
        completions: Wire,
        arrivals: Wire,
        recorder: Recorder,
        ids: Iterator[int],
        horizon_s: float | None = None,
        announce: bool = True,
    ) -> None:
        self.env = env
        self.announce = announce
        self.completions = completions
        self.arrivals = arrivals
        self.recorder = recorder
        self.ids = ids
        self.horizon_s = horizon_s
        self.live: dict[str, WorkflowSession] = {}
        self.pending = 0
        """Calls decided and not yet arrived (LLM) or not yet returned (tools), and finished
        LLM calls their client does not have yet."""
        self._calls: dict[int, tuple[WorkflowSession, tuple[int, int, int]]] = {}
        """Per LLM request in flight: its session and call key."""
        self._previous: dict[tuple[str, int], Request] = {}
        """The latest request of each accumulate step of each session (its content goes on)."""
        self._queue_s: dict[str, dict[tuple[int, int, int], float]] = {}
        """Per session, each finished LLM call's wait before its first step (arrival to first scheduled)."""
        self._tools: dict[tuple[str, str], simpy.Resource] = {}
        """Tools with a capacity, per (client, tool)."""
        self._sources: dict[ClientSource, tuple[np.random.Generator, StepDraws]] = {}
        """Each client's ``session`` stream and the draws of its workflow's steps (looked up
        once, not per session)."""
        completions.connect(self._left)

    def open(self, req: Request, source: ClientSource) -> None:
        """Start a session whose root request is *req* (called by the generator, before it arrives)."""
        workflow = source.workflow
        if workflow is None:  # no sessions (as open_session)
            return
        held = self._sources.get(source)
        if held is None:
            held = self._sources[source] = (source.stream("session"), StepDraws(workflow, functools.partial(_draws_of, source)))
        session = WorkflowSession(workflow, f"{source.client.id}/{req.id}", source, self.horizon_s, rng=held[0], draws=held[1])
        req.session_id = session.session_id
        if not session.workflow.multi_turn:
            req.step_id = session.workflow.steps[session.workflow.root].id
        self.live[session.session_id] = session
        root = session.workflow.steps[session.workflow.root]
        self._calls[req.id] = (session, (root.index, 0, 0))  # the root call's key
        if root.accumulate:
            req.continuable = True
            self._previous[(session.session_id, root.index)] = req
        extra = session.start(self.env.now, prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
                              fields={"streaming": req.streaming, "priority": req.priority})
        if extra:
            self._make(session, extra)

    def _left(self, req: Request) -> None:
        """A request left a replica (the completions Wire's handler): its session acts on it
        when its client has it, never inside the replica's step that let it go.

        The client has a response at its completion, which a latency model's per-token
        post-processing puts after the engine let it go, plus the client network's
        ``download_s``: then one exact timer. Otherwise (no post-processing and no network,
        or a drop) one event at this instant, at the priority and in the order a consumer
        process's ``get()`` would have taken it.
        """
        if req.id not in self._calls:
            return
        self.pending += 1
        env = self.env
        seen_s = req.completion_s + req.download_s
        if seen_s > env.now:
            TimerAt(env, seen_s).callbacks.append(functools.partial(self._finished, req))  # timer_at(env, seen_s), without the call
        else:
            # What a succeeded Event is scheduled as (now, NORMAL, the next id), in one object.
            Later(env, 0.0, functools.partial(self._finished, req))

    def _finished(self, req: Request, _event: Event | None = None) -> None:
        """LLM call *req* reached its client: tell its session, make what it returns."""
        self.pending -= 1
        session, key = self._calls.pop(req.id)
        if not session.workflow.multi_turn and req.first_scheduled_s == req.first_scheduled_s:
            queue = self._queue_s.get(session.session_id)
            if queue is None:
                queue = self._queue_s[session.session_id] = {}
            queue[key] = req.first_scheduled_s - req.arrival_s
        calls = session.finished(key, self.env.now, output_tokens=req.output_tokens, dropped=bool(req.dropped_reason))
        if calls:
            self._make(session, calls)
        if session.end_reason and session.session_id in self.live:  # it ended: reported once
            self._end(session)

    def _make(self, session: WorkflowSession, calls: list[Call]) -> None:
        """Make *calls*, each ``call.delay_s`` from now."""
        env = self.env
        self.pending += len(calls)
        for call in calls:
            step = call.step
            if step.llm:
                if call.delay_s > 0.0:
                    Later(env, call.delay_s, functools.partial(self._arrive, session, call))
                else:
                    self._arrive(session, call)
                continue
            tool = step.tool_config
            assert tool is not None  # a tool_call step names its tool (check_workflow)
            if tool.capacity is None:
                # A pure delay: timed callbacks, no process.
                if call.delay_s > 0.0:
                    Later(env, call.delay_s, functools.partial(self._call_tool, session, call))
                else:
                    self._call_tool(session, call)
            else:
                env.process(self._tool(session, call))

    def _call_tool(self, session: WorkflowSession, call: Call, _event: Event | None = None) -> None:
        """Call a tool without a capacity: it returns after its latency."""
        # What session.arrived(call) counts for a tool call, without the call.
        session.tool_calls += 1
        if call.step.in_loop and call.iteration > session.iteration:
            session.iteration = call.iteration
        start = self.env.now
        Later(self.env, call.latency_s, functools.partial(self._tool_done, session, call, start, start))

    def _arrive(self, session: WorkflowSession, call: Call, _event: Event | None = None) -> None:
        self.pending -= 1
        now = self.env.now
        fields = call.fields  # the call's own dict (made for this request)
        step = call.step
        if call.accumulates_from is not None:
            previous = self._previous.get((session.session_id, step.index))
            if previous is not None:
                # The prompt repeats the previous iteration's prompt and answer: prefix caches can find them.
                fields["context"] = tuple(content_segments(previous))
        # What session.arrived(call) counts for an LLM call, without the call.
        session.started += 1
        if step.in_loop and call.iteration > session.iteration:
            session.iteration = call.iteration
        req = Request(id=next(self.ids), prompt_tokens=call.prompt_tokens, output_tokens=call.output_tokens, arrival_s=now, **fields)
        if step.accumulate:
            req.continuable = True
            self._previous[(session.session_id, step.index)] = req
        self._calls[req.id] = (session, (step.index, call.iteration, call.instance))
        if self.announce:
            self.recorder.on_arrival(req, now)
        self.arrivals.send(req)

    def _tool(self, session: WorkflowSession, call: Call) -> Generator[Event, Any, None]:
        """Process: one tool call (after its delay): wait for the tool if it has a capacity, run.

        Yields
        ------
        Timeout, Request
            The delay, the tool's slot, the call's latency.
        """
        env = self.env
        if call.delay_s > 0.0:
            yield env.timeout(call.delay_s)
        session.arrived(call)
        start = env.now
        name = call.step.tool
        assert name is not None  # a tool_call step names its tool (check_workflow)
        tool = session.workflow.tools[name]
        if tool.capacity is None:
            running = start
            yield env.timeout(call.latency_s)
        else:
            key = (session.source.client.id, name)
            resource = self._tools.get(key)
            if resource is None:
                resource = self._tools[key] = simpy.Resource(env, capacity=tool.capacity)
            with resource.request() as slot:
                yield slot
                running = env.now
                yield env.timeout(call.latency_s)
        self._tool_done(session, call, start, running)

    def _tool_done(self, session: WorkflowSession, call: Call, start_s: float, running_s: float, _event: Event | None = None) -> None:
        """Tool call *call* (called at *start_s*, running from *running_s*) returned now."""
        now = self.env.now
        self.pending -= 1
        session.tool_wait_s += now - start_s  # what session.tool_finished_wait counts
        step = call.step
        iteration = call.iteration
        instance = call.instance
        output = call.output_tokens
        self.recorder.on_tool_call(
            (session.session_id, session.source.client.id, step.id, step.tool, iteration, instance,
             start_s, running_s - start_s, now, call.latency_s, output)
        )
        calls = session.finished((step.index, iteration, instance), now, output_tokens=output)
        if calls:
            self._make(session, calls)
        if session.end_reason and session.session_id in self.live:  # it ended: reported once
            self._end(session)

    def _end(self, session: WorkflowSession) -> None:
        sid = session.session_id
        del self.live[sid]
        for index in session.workflow.accumulating:  # only accumulate steps keep their latest request
            self._previous.pop((sid, index), None)
        queue = self._queue_s.pop(sid, {})
        self.recorder.on_session_end(sid, session.source.client.id, session.started, session.end_reason)
        if not session.workflow.multi_turn:
            self.recorder.on_workflow_session(session_record(session, queue))

    def close(self) -> None:
        """Report the sessions still open when the simulation stops."""
        for session in sorted(self.live.values(), key=lambda s: s.session_id):
            session.close()
            self.recorder.on_session_end(session.session_id, session.source.client.id, session.started, "in_progress")
            if not session.workflow.multi_turn:
                self.recorder.on_workflow_session(session_record(session, self._queue_s.get(session.session_id, {})))
        self.live.clear()


def session_record(session: WorkflowSession, queue_s: dict[tuple[int, int, int], float]) -> tuple:
    """One agentic session's figures, as :attr:`Recorder.workflow_sessions` keeps them:
    (session_id, client_id, workflow, start_s, end_s, llm_calls, tool_calls, tool_wait_s,
    iterations, fan_out_planned, fan_out_done, critical_queue_s, end_reason)."""
    chain = session.critical_path()
    # The waits summed root first, as sum() over the chain would (adding a tool call's 0.0 to
    # a sum of non-negative waits changes nothing, so only the LLM calls' are added).
    on_chain: float = 0.0 if chain else 0
    if queue_s:
        for key in chain:
            wait = queue_s.get(key)
            if wait is not None:
                on_chain += wait
    iterations = session.iteration + 1 if session.workflow.loop_body else 0
    return (
        session.session_id, session.source.client.id, session.workflow.name, session.start_s, session.end_s,
        session.started, session.tool_calls, session.tool_wait_s, iterations,
        session.fan_out_planned, session.fan_out_done, on_chain, session.end_reason or "in_progress",
    )


class ReplayedContexts:
    """Session content for requests replayed from a trace.

    A replayed trace has no closed loop (each round arrives at its recorded time), but
    a round's prompt still holds the conversation so far, which a prefix cache can
    find. Called on each replayed request in arrival order, it gives a round the
    content of the same session's previous round (prompt, then output) as its
    ``context`` when the new prompt is at least that long (the trace was recorded with
    ``context_growth: accumulate``; a shorter prompt is a fresh question, as under
    ``fixed``). Rounds are matched by ``session_id`` and increasing ``round_index``.

    Examples
    --------
    >>> contexts = ReplayedContexts()
    >>> first = Request(id=0, client_id="c", prompt_tokens=50, output_tokens=10, arrival_s=0.0, session_id="s")
    >>> second = Request(id=1, client_id="c", prompt_tokens=80, output_tokens=5, arrival_s=2.0, session_id="s", round_index=1)
    >>> contexts(first); contexts(second)
    >>> second.context
    ((-2, 50), (-1, 10))
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, Request] = {}

    def __call__(self, req: Request) -> None:
        sid = req.session_id
        if not sid:
            return
        req.continuable = True  # a later round of its session may carry its content
        previous = self._last.get(sid)
        if (
            previous is not None
            and req.round_index > previous.round_index
            and req.prompt_tokens >= previous.prompt_tokens + previous.output_tokens
        ):
            req.context = tuple(content_segments(previous))
        self._last[sid] = req
