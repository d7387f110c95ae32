"""Closed-loop sessions for the load generator: multi-turn chats and agentic workflows against a real server.

A workload whose clients open sessions (``multi_turn``, ``conversational_probability``
or ``agentic``) opens one at each first request that carries a ``session_id``, as the
simulator does. Every kind of session is run by the simulator's own state machine,
:class:`~simpy_llm.workload.workflows.WorkflowSession` (``docs/agentic.md``), told what
the server actually did: :class:`Conversations` reports each call's end (its
response's ``done_s``, the server-reported completion tokens, or the requested output
when the server gave none; a failed request is a dropped call) and turns the calls the
session returns into requests and tool sleeps:

* an LLM call is a :class:`~simpy_llm.observe.loadgen.LoadRequest` whose target is the
  end of the response that released it plus the call's delay (the think time between
  loop iterations): a call is never sent before its parents' answers are in, and the
  calls released together (fan-out, parallel branches) are sent together;
* a tool call is no request: :meth:`Conversations.wait_tool` sleeps its latency
  (waiting first for a slot when the tool has a ``capacity``), then
  :meth:`Conversations.tool_returned` reports it with the tool's drawn output tokens;
* a multi-turn round is iteration k of a one-step loop: round k+1 is sent
  ``think_time`` after round k's response ended; a conversational follow-up is the
  loop continuing with ``conversational_probability``.

Prompts (chat messages; for the completions API the turns are joined into one prompt):

* an LLM call of a step without ``accumulate`` (and any call at iteration 0) sends the
  client's shared prefix as a ``system`` message (the same text for every request of
  its prefix group), if it has one, then a ``user`` message with the call's newly drawn
  part (``new_tokens``) of text from the prompt source;
* an ``accumulate`` step at iteration k > 0 sends its own iteration k-1 messages and
  the server's reply to them, then the other outputs of iteration k-1 in step order
  (LLM replies as ``assistant`` turns, the server's real text; tool outputs as ``user``
  turns ``tool result: ...`` of the tool's output tokens), then a new question.
  Consecutive turns of one role are joined, so roles always alternate. A multi-turn
  conversation is exactly this: system prefix, then user / assistant turns with the
  server's replies;
* its requested input (``requested_input_tokens`` in the trace) is the session's own
  count with the previous iteration's prompt replaced by what the server reported
  for it (``usage.prompt_tokens``, else the requested length): the earlier prompt as
  the server tokenized it (chat template included), plus the outputs and the new part.

A call that would start after the workload's ``horizon_s`` is not made (``horizon``);
a failed request ends its session once the calls under way have finished
(``dropped``). Calls get request ids after the last first request's, in the order
they are made. :meth:`Conversations.ended` lists every session with its LLM calls,
times and end reason (sessions still running when the run stops are
``in_progress``); :meth:`Conversations.calls` lists every call of the agentic sessions
with its step, iteration and instance (the trace has no column for them).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.observe.prompts import PromptSource, SyntheticPrompts
from simpy_llm.workload.sessions import open_session
from simpy_llm.workload.sources import WorkloadSources, build_sources, spec_workload

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario, WorkloadConfig
    from simpy_llm.observe.client import ObservedRequest
    from simpy_llm.workload.generator import ClientSource
    from simpy_llm.workload.sources import WorkloadSources
    from simpy_llm.workload.workflows import Call, WorkflowSession

__all__ = ["TOOL_RESULT", "Conversations", "ToolCall", "has_sessions"]

TOOL_RESULT = "tool result:"
"""The words a tool's output turn starts with (they count toward its output tokens)."""

_Key = tuple[int, int, int]
"""A call's ``(step index, iteration, instance)``."""


def has_sessions(spec: Scenario | WorkloadConfig) -> bool:
    """True when some client of *spec* (a scenario's workload, or a bare workload spec) opens sessions."""

    workload, _seed = spec_workload(spec)
    return any(c.opens_sessions for c in workload.clients)


@attrs.frozen(eq=False)
class ToolCall:
    """A session's tool call for the load generator to sleep through (:meth:`Conversations.wait_tool`)."""

    session_id: str
    call: Call
    """The session's call (its ``latency_s``, ``output_tokens`` and ``delay_s``)."""
    decided_s: float
    """When the session made it (the end of what released it), run-clock seconds;
    it is called ``call.delay_s`` later."""


@attrs.define(eq=False)
class _Live:
    """A running session and the content its later prompts repeat."""

    session: WorkflowSession
    fields: dict[str, Any]
    """The first request's trace identity fields (client, session id...), carried to every call."""
    streaming: bool
    system: list[dict[str, str]]
    """The shared-prefix message ([] without a prefix)."""
    keeps_outputs: bool
    """Some step accumulates: the loop steps' outputs are kept for the next iteration."""
    conversations: dict[tuple[int, int], tuple[list[dict[str, str]], int, int]] = attrs.Factory(dict)
    """Per (accumulate step, iteration): its instance 0's messages with the reply, the prompt
    the session counted for it and the prompt the server reported (else the requested one)."""
    outputs: dict[int, dict[_Key, dict[str, str]]] = attrs.Factory(dict)
    """Per iteration: the loop steps' outputs as turns, by call key."""


class Conversations:
    """Session state of a closed-loop run: the prompts of every call and what follows each.

    Parameters
    ----------
    spec
        A scenario or a bare workload spec (its clients' session rules), or the
        :class:`~simpy_llm.workload.sources.WorkloadSources` already built from one;
        the clients' sources (and their random streams) are built as the simulation
        builds them, by :func:`~simpy_llm.workload.sources.build_sources`.
    requests
        The first requests (open-loop); rows with a ``session_id`` whose client has
        sessions open one when first prompted.
    prompts
        Where the shared prefixes, the questions and the tool outputs' text come from
        (default: synthetic words); give the load generator the same source.
    """

    def __init__(
        self, spec: Scenario | WorkloadConfig | WorkloadSources, requests: list[LoadRequest], prompts: PromptSource | None = None
    ) -> None:

        if isinstance(spec, WorkloadSources):
            sources = spec
        else:
            workload, seed = spec_workload(spec)
            sources = build_sources(workload, default_seed=seed, key_prefix="" if workload is spec else "workload.", stacklevel=2)
        self.sources: dict[str, ClientSource] = sources.by_client_id
        self.horizon_s = sources.workload.horizon_s
        self.prompts: PromptSource = prompts if prompts is not None else SyntheticPrompts()
        self.next_id = max((r.request_id for r in requests), default=-1) + 1
        self.live: dict[str, _Live] = {}
        """The running sessions, by id."""
        self.agentic = any(src.workflow is not None and not src.workflow.multi_turn for src in self.sources.values())
        """Some client runs agentic workflows."""
        self._requests: dict[int, tuple[str, _Key, int]] = {}
        """Per LLM request not finished: its session, call key and the prompt the session counted."""
        self._messages: dict[int, list[dict[str, str]]] = {}
        """Per LLM request not finished: the messages it sends."""
        self._siblings: dict[int, list[LoadRequest]] = {}
        """Per first request: the other instances of its session's root (a root with ``fan_out``)."""
        self._ended: dict[str, dict[str, Any]] = {}
        self._calls: dict[tuple[str, _Key], dict[str, Any]] = {}
        """Per agentic call: its row of :meth:`calls`."""
        self._slots: dict[tuple[str, str], asyncio.Semaphore] = {}
        """Tools with a capacity, per (client, tool)."""
        self._tool_texts = 0

    # ----------------------------------------------------------------- prompts
    def _source(self, req: LoadRequest) -> ClientSource | None:
        src = self.sources.get(str(req.fields.get("client_id", "")))
        if src is None or src.workflow is None:
            return None
        return src

    def messages(self, req: LoadRequest) -> list[dict[str, str]] | None:
        """The chat messages to send for *req*, or None if it is not part of a session.

        A first request opens its session (its root call: the system prefix, if the client
        has one, and the question); any later call's messages were made with it.
        """
        messages = self._messages.get(req.request_id)
        if messages is not None:
            return messages
        sid = str(req.fields.get("session_id", ""))
        if not sid or sid in self.live or sid in self._ended:
            return None
        src = self._source(req)
        if src is None:
            return None
        self._open(sid, src, req)
        return self._messages.get(req.request_id)

    def siblings(self, req: LoadRequest) -> list[LoadRequest]:
        """The other instances of the root call that first request *req* opened (its step's
        ``fan_out``), to send with it; given once (empty for any other request)."""
        return self._siblings.pop(req.request_id, [])

    def _open(self, sid: str, src: ClientSource, req: LoadRequest) -> None:
        session = open_session(sid, src, self.horizon_s)
        assert session is not None  # the client has a workflow
        system = []
        question_tokens = req.input_tokens
        if src.prefix_tokens:
            system = [{"role": "system", "content": self.prompts.prefix(src.client.prefix_group, src.prefix_tokens)}]
            question_tokens = max(req.input_tokens - src.prefix_tokens, 1)
        workflow = session.workflow
        live = self.live[sid] = _Live(
            session, dict(req.fields), req.streaming, system, keeps_outputs=any(s.accumulate for s in workflow.steps)
        )
        root = session.root_call()
        others = session.start(req.arrival_s, prompt_tokens=req.input_tokens, output_tokens=req.output_tokens,
                               fields={"streaming": req.streaming})
        question = {"role": "user", "content": self.prompts.text(question_tokens, req.request_id)}
        self._register(live, root, req, [*system, question], req.input_tokens)
        if others:
            for c in others:
                session.arrived(c)
            self._siblings[req.request_id] = [self._request(live, c, req.arrival_s) for c in others]

    def _register(self, live: _Live, call: Call, req: LoadRequest, messages: list[dict[str, str]], counted: int) -> None:
        sid = live.session.session_id
        self._requests[req.request_id] = (sid, call.key, counted)
        self._messages[req.request_id] = messages
        self._row(live, call, request_id=req.request_id, start_s=req.arrival_s)

    def _request(self, live: _Live, call: Call, now_s: float) -> LoadRequest:
        """The request of LLM call *call*, decided at *now_s*."""
        rid = self.next_id
        self.next_id += 1
        it = call.iteration
        for old in [i for i in live.outputs if i < it - 1]:  # only iteration k-1 is repeated at k
            del live.outputs[old]
        for old_key in [k for k in live.conversations if k[1] < it - 1]:
            del live.conversations[old_key]
        question = {"role": "user", "content": self.prompts.text(max(call.new_tokens, 1), rid)}
        input_tokens = call.prompt_tokens
        source = call.accumulates_from
        if source is not None and (before := live.conversations.get(source)) is not None:
            turns, counted, reported = before
            own = (*source, 0)
            others = [turn for key, turn in sorted(live.outputs.get(it - 1, {}).items()) if key != own]
            messages = _alternate([*turns, *others, question])
            input_tokens = call.prompt_tokens - counted + reported
        else:
            messages = [*live.system, question]
        req = LoadRequest(
            request_id=rid,
            arrival_s=now_s + call.delay_s,
            input_tokens=max(input_tokens, 1),
            output_tokens=call.output_tokens,
            streaming=bool(call.fields.get("streaming", live.streaming)),
            fields={**live.fields, "round_index": it},
        )
        self._register(live, call, req, messages, call.prompt_tokens)
        return req

    # ------------------------------------------------------------- follow-ups
    def after(self, req: LoadRequest, rec: ObservedRequest, reply: str) -> list[LoadRequest | ToolCall]:
        """What *req*'s session makes next now that *req* ended as *rec* (with text *reply*):
        requests to send and tool calls to sleep through (empty when it made nothing, or
        when *req* is not part of a session)."""
        entry = self._requests.pop(req.request_id, None)
        messages = self._messages.pop(req.request_id, None)
        if entry is None:
            return []
        sid, key, counted = entry
        live = self.live.get(sid)
        if live is None:
            return []
        session = live.session
        step = session.workflow.steps[key[0]]
        ok = rec.status == "ok"
        output = rec.completion_tokens if rec.completion_tokens_source != "none" and rec.completion_tokens else req.output_tokens
        now = rec.done_s if rec.done_s is not None else req.arrival_s
        if ok:
            said = {"role": "assistant", "content": reply}
            if step.accumulate and key[2] == 0:
                reported = rec.prompt_tokens if rec.prompt_tokens_source == "usage" and rec.prompt_tokens else req.input_tokens
                live.conversations[key[:2]] = ([*(messages or live.system), said], counted, reported)
            if step.in_loop and live.keeps_outputs:
                live.outputs.setdefault(key[1], {})[key] = said
        self._update(sid, key, end_s=now, output_tokens=output, status=rec.status)
        calls = session.finished(key, now, output_tokens=output, dropped=not ok)
        return self._make(live, calls, now)

    async def wait_tool(self, tool: ToolCall, clock: Callable[[], float]) -> tuple[float, float]:
        """Sleep through *tool*: its delay, a free slot of the tool if it has a ``capacity``,
        then its latency (never less, on any event loop). Returns when it was called (the end
        of what released it plus its delay) and when it started running (later only if it
        waited for a slot), on *clock* (the run clock)."""
        call = tool.call
        start = tool.decided_s + call.delay_s  # called when what released it ended (plus the delay)
        await _sleep_until(start, clock)
        name = call.step.tool
        assert name is not None  # a tool call's step names its tool
        live = self.live.get(tool.session_id)
        capacity = live.session.workflow.tools[name].capacity if live is not None else None
        if live is None or capacity is None:
            await _sleep_until(start + call.latency_s, clock)
            return start, start
        slot = (live.session.source.client.id, name)
        semaphore = self._slots.get(slot)
        if semaphore is None:
            semaphore = self._slots[slot] = asyncio.Semaphore(capacity)
        queued = semaphore.locked()
        async with semaphore:
            running = max(clock(), start) if queued else start
            await _sleep_until(running + call.latency_s, clock)
        return start, running

    def tool_returned(self, tool: ToolCall, start_s: float, running_s: float, now_s: float) -> list[LoadRequest | ToolCall]:
        """Tool call *tool* (called at *start_s*, running from *running_s*) returned at *now_s*:
        what its session makes next."""
        live = self.live.get(tool.session_id)
        if live is None:
            return []
        call = tool.call
        session = live.session
        session.tool_finished_wait(now_s - start_s)
        if call.step.in_loop and live.keeps_outputs:
            self._tool_texts += 1
            body = self.prompts.text(max(call.output_tokens - self.prompts.count(TOOL_RESULT), 1), -self._tool_texts)
            live.outputs.setdefault(call.iteration, {})[call.key] = {"role": "user", "content": f"{TOOL_RESULT} {body}"}
        self._update(
            tool.session_id, call.key, start_s=start_s, wait_s=running_s - start_s, end_s=now_s,
            output_tokens=call.output_tokens, status="ok",
        )
        calls = session.finished(call.key, now_s, output_tokens=call.output_tokens)
        return self._make(live, calls, now_s)

    def _make(self, live: _Live, calls: list[Call], now_s: float) -> list[LoadRequest | ToolCall]:
        sid = live.session.session_id
        made: list[LoadRequest | ToolCall] = []
        for call in calls:
            # Counted when decided: the trace keeps a row for every request it decided (one the
            # run cuts off before it is sent is written as cancelled).
            live.session.arrived(call)
            if call.step.llm:
                made.append(self._request(live, call, now_s))
            else:
                made.append(ToolCall(sid, call, now_s))
                self._row(live, call, latency_s=call.latency_s)
        if live.session.end_reason:
            self._ended[sid] = self._session_row(live.session)
            del self.live[sid]
        return made

    # ------------------------------------------------------------------ records
    def _row(self, live: _Live, call: Call, **values: Any) -> None:
        session = live.session
        if session.workflow.multi_turn:
            return  # the trace has a multi-turn session's every call (a row per round)
        _step, iteration, instance = call.key
        self._calls[(session.session_id, call.key)] = {
            "session_id": session.session_id,
            "client_id": session.source.client.id,
            "step_id": call.step.id,
            "tool": call.step.tool or "",
            "loop_iteration": iteration,
            "instance": instance,
            "request_id": None,
            "start_s": None,
            "wait_s": None,
            "end_s": None,
            "latency_s": None,
            "output_tokens": None,
            "status": "",
            **values,
        }

    def _update(self, sid: str, key: _Key, **values: Any) -> None:
        row = self._calls.get((sid, key))
        if row is not None:
            row.update(values)

    @staticmethod
    def _session_row(session: WorkflowSession, reason: str | None = None) -> dict[str, Any]:
        def t(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "session_id": session.session_id,
            "client_id": session.source.client.id,
            "workflow": session.workflow.name,
            "rounds": session.started,
            "end_reason": reason or session.end_reason,
            "start_s": t(session.start_s),
            "end_s": t(session.end_s),
            "tool_calls": session.tool_calls,
            "tool_wait_s": session.tool_wait_s,
        }

    def ended(self) -> list[dict[str, Any]]:
        """Every session opened so far, sorted by session id: ``session_id``, ``client_id``,
        ``workflow``, ``rounds`` (LLM calls made, the first included), ``end_reason``
        (``in_progress`` for the live ones), ``start_s`` (its first request's target time),
        ``end_s`` (its last call's end so far), ``tool_calls`` and ``tool_wait_s`` (seconds
        in tool calls, waiting for a slot included). Times are run-clock seconds."""
        rows = dict(self._ended)
        for sid, live in self.live.items():
            rows[sid] = self._session_row(live.session, "in_progress")
        return [rows[sid] for sid in sorted(rows)]

    def calls(self) -> list[dict[str, Any]]:
        """Every call the agentic sessions made, in (session, start) order: ``session_id``,
        ``client_id``, ``step_id``, ``tool`` (empty for an LLM call), ``loop_iteration``,
        ``instance``, ``request_id`` (LLM calls), ``start_s`` (an LLM call's target time, a
        tool's call), ``wait_s`` (for a tool's slot), ``end_s`` (the response's or the tool's
        end; None if it did not end), ``latency_s`` (a tool's drawn latency), ``output_tokens``
        (the reported or the tool's) and ``status`` (``ok``, the request's failure, or empty)."""
        return sorted(
            (dict(row) for row in self._calls.values()),
            key=lambda r: (r["session_id"], math.inf if r["start_s"] is None else r["start_s"], r["step_id"], r["instance"]),
        )


def _alternate(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """*turns* with consecutive turns of one role joined (a blank line between them)."""
    out: list[dict[str, str]] = []
    for turn in turns:
        if out and out[-1]["role"] == turn["role"] and turn["role"] != "system":
            out[-1] = {"role": turn["role"], "content": out[-1]["content"] + "\n\n" + turn["content"]}
        else:
            out.append(turn)
    return out


async def _sleep_until(t_s: float, clock: Callable[[], float]) -> None:
    """Sleep until *clock* reads at least *t_s* (an event loop may wake a timer a little early)."""
    while (left := t_s - clock()) > 0:
        await asyncio.sleep(left)
