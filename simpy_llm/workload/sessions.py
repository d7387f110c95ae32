"""Closed-loop sessions: multi-turn conversations and conversational follow-ups.

The :class:`SessionRegistry` is a SimPy process that takes every request
leaving a replica from a completions Wire. For a request that belongs to a
session it decides whether the user sends another round and, if so, creates
it after a think time and puts it into the same Wire the workload generator
feeds, so the router cannot tell follow-ups from fresh arrivals.

Rules (per client):

* ``multi_turn``: every arrival opens a session of ``rounds`` rounds (drawn
  from ``rounds_distribution``, clamped to [1, max_rounds], else max_rounds).
  Round k+1 arrives ``think_time`` seconds after round k completes.
* ``conversational_probability`` p (without multi_turn): after each completed
  round the user follows up with probability p (a geometric chain), after
  ``follow_up_think_time`` seconds.
* The next round's prompt under ``context_growth: accumulate`` (the default,
  also for conversational follow-ups) is the previous round's prompt plus its
  output plus a newly drawn question; under ``fixed`` it is a fresh draw
  (plus the client's shared prefix).
* Every round of a session carries its first round's priority (a client whose
  ``priority`` is a distribution draws it once per session, for the first round;
  follow-ups draw nothing from the ``priority`` stream).

A round therefore never arrives before its predecessor completes. A session
ends with one of the reasons in :data:`END_REASONS`; ``Results.sessions()``
lists every session with its rounds and end reason.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import simpy

from simpy_llm.config.validators import MAX_TIME_S
from simpy_llm.entities import Request
from simpy_llm.workload.distributions import to_tokens
from simpy_llm.workload.prefix import content_segments

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.wire import Wire
    from simpy_llm.workload.generator import ClientSource

__all__ = ["END_REASONS", "FollowUp", "ReplayedContexts", "SessionRegistry", "SessionState", "open_session", "plan_follow_up"]

END_REASONS = ("max_rounds", "user_stopped", "horizon", "dropped", "in_progress")
"""Why a session ended: all its rounds ran; the user did not follow up; the next
round would have arrived after the workload horizon; a round was dropped; or the
simulation stopped first."""


@attrs.define(eq=False)
class SessionState:
    """A live session."""

    session_id: str
    source: ClientSource
    rounds: int
    """Rounds planned (multi-turn); 0 for open-ended conversational chains."""
    started: int = 1
    """Rounds created so far."""
    end_reason: str = ""


@attrs.frozen
class FollowUp:
    """The next round of a session, as :func:`plan_follow_up` decides it."""

    think_s: float
    """Seconds after the previous round completes."""
    prompt_tokens: int
    """The round's whole prompt (with the conversation so far under ``accumulate``)."""
    question_tokens: int
    """The newly drawn user turn (the prompt without the client's shared prefix)."""
    output_tokens: int
    """Requested output length."""
    fields: dict[str, Any]
    """Request fields: the client's identity plus ``session_id``, ``round_index``, ``streaming``."""
    accumulates: bool = False
    """Whether the prompt is the previous round's prompt and answer plus the question
    (``context_growth: accumulate``): the new round's content starts with the old one's."""


def open_session(session_id: str, source: ClientSource) -> SessionState | None:
    """A new session for *source*'s client (drawing its planned rounds), or None if the
    client has no sessions."""
    client = source.client
    if client.multi_turn is None and client.conversational_probability <= 0:
        return None
    rounds = 0
    mt = client.multi_turn
    if mt is not None:
        rounds = mt.max_rounds
        if mt.rounds_distribution is not None:
            drawn = int(to_tokens(mt.rounds_distribution.sample(source.stream("session"), 1))[0])
            rounds = min(max(drawn, 1), mt.max_rounds)
    return SessionState(session_id, source, rounds)


def plan_follow_up(
    state: SessionState,
    *,
    prompt_tokens: int,
    output_tokens: int,
    round_index: int,
    streaming: bool,
    dropped: bool,
    now_s: float,
    horizon_s: float | None,
    priority: int | None = None,
) -> FollowUp | str:
    """The session's next round after a round with these lengths finished at *now_s*,
    or the reason the session ends (one of :data:`END_REASONS`).

    The rules of the module docstring, shared by the simulator's
    :class:`SessionRegistry` and the observer's closed loop (which passes the
    server-reported token counts). Draws from the client's ``session`` stream
    and counts the new round in ``state.started``. *priority* is the finished
    round's, carried on to the next one (None: the client's constant priority,
    as it stands in ``source.base``).
    """
    client = state.source.client
    rng = state.source.stream("session")
    if dropped:
        return "dropped"
    mt = client.multi_turn
    if mt is not None:
        if state.started >= state.rounds:
            return "max_rounds"
        think_dist = mt.think_time
        growth = mt.context_growth
    else:
        if rng.random() >= client.conversational_probability:
            return "user_stopped"
        think_dist = client.follow_up_think_time
        growth = "accumulate"
    # Clamped like every time in a scenario (a heavy tail can draw an absurd think time).
    think = min(max(float(think_dist.sample(rng, 1)[0]), 0.0), MAX_TIME_S)
    if horizon_s is not None and now_s + think > horizon_s:
        return "horizon"
    source = state.source
    new_prompt, extras = source.prompts(rng, 1)
    drawn = int(new_prompt[0])
    question = drawn - source.prefix_tokens
    prompt = prompt_tokens + output_tokens + question if growth == "accumulate" else drawn
    output = int(to_tokens(client.output_distribution.sample(rng, 1))[0])
    fields = {
        **source.base,
        **(extras[0] if extras else {}),
        "streaming": streaming,
        "session_id": state.session_id,
        "round_index": round_index + 1,
    }
    if priority is not None:
        fields["priority"] = priority
    state.started += 1
    return FollowUp(think, prompt, question, output, fields, accumulates=growth == "accumulate")


class SessionRegistry:
    """Issues the follow-up rounds of sessions.

    Parameters
    ----------
    env
        The SimPy environment.
    completions
        Wire of requests leaving the replicas (completed or dropped).
    arrivals
        Wire the router reads; follow-ups are put here.
    recorder
        Told of each follow-up arrival and each session's end.
    ids
        The simulation's request-id counter.
    horizon_s
        No round arrives after this time (None: no limit).
    """

    def __init__(
        self,
        env: simpy.Environment,
        completions: Wire,
        arrivals: Wire,
        recorder: Recorder,
        ids: Iterator[int],
        horizon_s: float | None = None,
    ) -> None:
        self.env = env
        self.completions = completions
        self.arrivals = arrivals
        self.recorder = recorder
        self.ids = ids
        self.horizon_s = horizon_s
        self.live: dict[str, SessionState] = {}
        self.pending = 0
        """Follow-ups created and waiting for their think time to pass."""
        self.process = env.process(self._run())

    def open(self, req: Request, source: ClientSource) -> None:
        """Start a session whose first round is *req* (called by the generator)."""
        state = open_session(f"{source.client.id}/{req.id}", source)
        if state is not None:
            req.session_id = state.session_id
            self.live[state.session_id] = state

    def _run(self) -> Generator[Event, Request, None]:
        """Decide each finished round's follow-up.

        Yields
        ------
        WireGet
            The next request that left a replica.
        """
        get = self.completions.get
        while True:
            req = yield get()
            state = self.live.get(req.session_id)
            if state is not None:
                self._after(req, state)

    def _after(self, req: Request, state: SessionState) -> None:
        plan = plan_follow_up(
            state,
            prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens,
            round_index=req.round_index,
            streaming=req.streaming,
            dropped=bool(req.dropped_reason),
            now_s=self.env.now,
            horizon_s=self.horizon_s,
            priority=req.priority,
        )
        if isinstance(plan, str):
            return self._end(state, plan)
        self.pending += 1
        fields = plan.fields
        if plan.accumulates:
            # The next prompt repeats this round's prompt and answer: prefix caches can find them.
            fields = {**fields, "context": tuple(content_segments(req))}
        self.env.timeout(plan.think_s).callbacks.append(
            lambda _ev: self._arrive(plan.prompt_tokens, plan.output_tokens, fields)
        )
        return None

    def _arrive(self, prompt: int, output: int, fields: dict) -> None:
        self.pending -= 1
        now = self.env.now
        req = Request(id=next(self.ids), prompt_tokens=prompt, output_tokens=output, arrival_s=now, **fields)
        self.recorder.on_arrival(req, now)
        self.arrivals.put(req)

    def _end(self, state: SessionState, reason: str) -> None:
        state.end_reason = reason
        del self.live[state.session_id]
        self.recorder.on_session_end(state.session_id, state.source.client.id, state.started, reason)

    def close(self) -> None:
        """Report the sessions still open when the simulation stops."""
        for state in sorted(self.live.values(), key=lambda s: s.session_id):
            self.recorder.on_session_end(state.session_id, state.source.client.id, state.started, "in_progress")
        self.live.clear()


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
        previous = self._last.get(sid)
        if (
            previous is not None
            and req.round_index > previous.round_index
            and req.prompt_tokens >= previous.prompt_tokens + previous.output_tokens
        ):
            req.context = tuple(content_segments(previous))
        self._last[sid] = req
