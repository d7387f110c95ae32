"""Closed-loop sessions for the load generator: multi-turn chats against a real server.

A workload whose clients have ``multi_turn`` (or ``conversational_probability``)
opens a session at each first round, as the simulator does. :class:`Conversations`
applies the simulator's own rules (:func:`simpy_llm.workload.sessions.plan_follow_up`)
to what the server actually did:

* round k+1 is scheduled ``think_time`` after round k's response ended (its
  ``done_s``), so a round never starts before the previous answer is in;
* its input grows by the server-reported ``prompt_tokens`` and
  ``completion_tokens`` of round k (the requested lengths when the server gave
  no ``usage``) plus a newly drawn question (``context_growth: accumulate``);
  ``fixed`` sends a fresh prompt each round;
* chat messages alternate roles: an optional ``system`` message (the client's
  shared prefix, identical for every request of its prefix group), then
  ``user`` / ``assistant`` turns, the assistant turns being the server's own
  replies (for the completions API the turns are joined into one prompt); the
  prefix and each question come from the prompt source (synthetic words, or a
  dataset's prompts fitted to the drawn length: :mod:`simpy_llm.observe.prompts`);
* a round that fails ends its session (reason ``dropped``), as does a next
  round that would start after the workload's ``horizon_s``.

Follow-up rounds get request ids after the last first round's, in the order
they are created. :meth:`Conversations.ended` lists every session with its
rounds and end reason (sessions still running when the run stops are
``in_progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.observe.prompts import PromptSource, SyntheticPrompts
from simpy_llm.workload.sessions import SessionState, open_session, plan_follow_up

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario, WorkloadConfig
    from simpy_llm.observe.client import RequestRecord
    from simpy_llm.workload.generator import ClientSource
    from simpy_llm.workload.sources import WorkloadSources

__all__ = ["Conversations", "has_sessions"]


def has_sessions(spec: Scenario | WorkloadConfig) -> bool:
    """True when some client of *spec* (a scenario's workload, or a bare workload spec) opens sessions."""
    from simpy_llm.workload.sources import spec_workload

    workload, _seed = spec_workload(spec)
    return any(c.opens_sessions for c in workload.clients)


class Conversations:
    """Session state of a closed-loop run: prompts of every round and the follow-ups.

    Parameters
    ----------
    spec
        A scenario or a bare workload spec (its clients' session rules), or the
        :class:`~simpy_llm.workload.sources.WorkloadSources` already built from one;
        the clients' sources (and their random streams) are built as the simulation
        builds them, by :func:`~simpy_llm.workload.sources.build_sources`.
    requests
        The first rounds (open-loop requests); rows with a ``session_id`` whose
        client has sessions open one when first prompted.
    prompts
        Where the shared prefixes and the questions come from (default: synthetic words);
        give the load generator the same source.
    """

    def __init__(
        self, spec: Scenario | WorkloadConfig | WorkloadSources, requests: list[LoadRequest], prompts: PromptSource | None = None
    ) -> None:
        from simpy_llm.workload.sources import WorkloadSources, build_sources, spec_workload

        if isinstance(spec, WorkloadSources):
            sources = spec
        else:
            workload, seed = spec_workload(spec)
            sources = build_sources(workload, default_seed=seed, key_prefix="" if workload is spec else "workload.", stacklevel=2)
        self.sources: dict[str, ClientSource] = sources.by_client_id
        self.horizon_s = sources.workload.horizon_s
        self.prompts: PromptSource = prompts if prompts is not None else SyntheticPrompts()
        self.next_id = max((r.request_id for r in requests), default=-1) + 1
        self.states: dict[str, SessionState] = {}
        self.turns: dict[str, list[dict[str, str]]] = {}
        """Messages so far per live session (system, user, assistant, ...)."""
        self._pending_question: dict[int, str] = {}
        self._ended: dict[str, tuple[str, int, str]] = {}

    # ----------------------------------------------------------------- prompts
    def _source(self, req: LoadRequest) -> ClientSource | None:
        src = self.sources.get(str(req.fields.get("client_id", "")))
        if src is None or (src.client.multi_turn is None and src.client.conversational_probability <= 0):
            return None
        return src

    def messages(self, req: LoadRequest) -> list[dict[str, str]] | None:
        """The chat messages to send for *req*, or None if it is not part of a session.

        A first round opens its session: system prefix (if the client has one) and the
        user question; a follow-up is the conversation so far plus its new question.
        """
        sid = str(req.fields.get("session_id", ""))
        if not sid:
            return None
        if sid not in self.states:
            src = self._source(req)
            state = open_session(sid, src) if src is not None else None
            if state is None:
                return None
            self.states[sid] = state
            turns: list[dict[str, str]] = []
            question_tokens = req.input_tokens
            if src.prefix_tokens:
                turns.append({"role": "system", "content": self.prompts.prefix(src.client.prefix_group, src.prefix_tokens)})
                question_tokens = max(req.input_tokens - src.prefix_tokens, 1)
            self.turns[sid] = turns
            self._pending_question[req.request_id] = self.prompts.text(question_tokens, req.request_id)
        question = self._pending_question.get(req.request_id)
        if question is None:
            return None
        return [*self.turns[sid], {"role": "user", "content": question}]

    # ------------------------------------------------------------- follow-ups
    def after(self, req: LoadRequest, rec: RequestRecord, reply: str) -> LoadRequest | None:
        """The next round of *req*'s session now that *req* ended as *rec* (with text *reply*),
        or None when the session ends (or *req* is not part of one)."""
        sid = str(req.fields.get("session_id", ""))
        state = self.states.get(sid)
        question = self._pending_question.pop(req.request_id, None)
        if state is None or question is None:
            return None
        ok = rec.status == "ok"
        prompt = rec.prompt_tokens if rec.prompt_tokens_source == "usage" and rec.prompt_tokens else req.input_tokens
        output = (
            rec.completion_tokens if rec.completion_tokens_source != "none" and rec.completion_tokens else req.output_tokens
        )
        plan = plan_follow_up(
            state,
            prompt_tokens=prompt,
            output_tokens=output,
            round_index=int(req.fields.get("round_index", 0)),
            streaming=req.streaming,
            dropped=not ok,
            now_s=rec.done_s if rec.done_s is not None else 0.0,
            horizon_s=self.horizon_s,
        )
        if isinstance(plan, str):
            self._end(state, plan)
            return None
        src = state.source
        if src.client.multi_turn is not None and src.client.multi_turn.context_growth == "fixed":
            turns = [t for t in self.turns[sid] if t["role"] == "system"]
        else:
            turns = [*self.turns[sid], {"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        self.turns[sid] = turns
        nxt = LoadRequest(
            request_id=self.next_id,
            arrival_s=(rec.done_s or 0.0) + plan.think_s,
            input_tokens=plan.prompt_tokens,
            output_tokens=plan.output_tokens,
            streaming=req.streaming,
            fields={**req.fields, "round_index": plan.fields["round_index"]},
        )
        self.next_id += 1
        self._pending_question[nxt.request_id] = self.prompts.text(max(plan.question_tokens, 1), nxt.request_id)
        return nxt

    def _end(self, state: SessionState, reason: str) -> None:
        self._ended[state.session_id] = (state.source.client.id, state.started, reason)
        self.states.pop(state.session_id, None)
        self.turns.pop(state.session_id, None)

    def ended(self) -> list[dict[str, Any]]:
        """Every session opened so far: ``session_id``, ``client_id``, ``rounds`` (started) and
        ``end_reason`` (``in_progress`` for the live ones), sorted by session id."""
        rows = {sid: (cid, n, why) for sid, (cid, n, why) in self._ended.items()}
        for sid, state in self.states.items():
            rows[sid] = (state.source.client.id, state.started, "in_progress")
        return [
            {"session_id": sid, "client_id": cid, "rounds": n, "end_reason": why} for sid, (cid, n, why) in sorted(rows.items())
        ]
