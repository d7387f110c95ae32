"""Draft-side batching (seed 003 §6.1): one draft device's draft steps, shared by the rounds
of the requests it runs.

A :class:`DraftSteps` runs one draft step at a time. A step drafts one token for each round
in it and lasts the drafter's step time at that batch size; a round of γ drafts is in γ
steps and is done at the end of its last. Rounds join and leave at step boundaries: a
round that becomes ready during a step joins the next. As a step ends, the next starts at
once with every round then ready (after the other events of that instant when a round
left with it, so a round coming back in the same instant joins). On an idle device the
first ready round opens a batch, whose first step starts when ``max_batch`` rounds are
ready or ``max_wait_s`` after it opened, whichever comes first. A step runs one drafter:
that of the round ready longest, with the ready rounds of that drafter, oldest first, up
to ``max_batch``.

The device (:class:`~simpy_llm.speculative.draft.BatchingDraftDevice`) owns one, decides
when a round is ready and what a step costs, and sends a round's bundle when it is done
(``docs/speculative.md``, "Draft-side batching").
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from simpy_llm.kernel import timer_at

if TYPE_CHECKING:
    from collections.abc import Callable

    import simpy
    from simpy.events import Event

    from simpy_llm.entities import Request
    from simpy_llm.speculative.draft import SpecState
    from simpy_llm.speculative.drafter import Drafter

__all__ = ["DraftSteps"]


class _Round:
    """A round waiting for a draft step, or in one."""

    __slots__ = ("left", "req", "spec")

    def __init__(self, req: Request, spec: SpecState, left: int) -> None:
        self.req = req
        self.spec = spec
        self.left = left
        """Tokens it has still to draft."""


class DraftSteps:
    """The draft steps of one batching device (module docstring).

    Parameters
    ----------
    env
        The SimPy environment.
    max_batch
        Most rounds a step holds (a batching device runs no more requests than this, so
        every ready round of the step's drafter fits).
    max_wait_s
        How long a batch opened on an idle device waits for more rounds, s.
    step_s
        ``step_s(drafter, n, now)``: the time of a step of *n* rounds of *drafter* starting
        at *now*, s (the device applies its throttling and counts its busy time there).
    back_at
        ``back_at(t)``: the first time at or after *t* the device is in service; None:
        always in service. A step due while it is out of service starts when it is back.
    done
        ``done(req, spec)``: *req*'s round has drafted all its tokens, now.

    Examples
    --------
    Two rounds ready together share the first step (two requests: 3 ms); the one drafting a
    single token is done at its end and the other drafts its second alone (2 ms):

    >>> import simpy, types
    >>> env = simpy.Environment()
    >>> tiny = types.SimpleNamespace(name="tiny")
    >>> done = []
    >>> steps = DraftSteps(env, max_batch=2, max_wait_s=0.0, step_s=lambda drafter, n, now: 0.001 * (1 + n),
    ...                    back_at=None, done=lambda req, spec: done.append((req, round(env.now, 9))))
    >>> steps.add("a", types.SimpleNamespace(drafter=tiny), 2)
    >>> steps.add("b", types.SimpleNamespace(drafter=tiny), 1)
    >>> env.run()
    >>> done
    [('b', 0.003), ('a', 0.005)]
    """

    def __init__(
        self,
        env: simpy.Environment,
        max_batch: int,
        max_wait_s: float,
        *,
        step_s: Callable[[Drafter, int, float], float],
        back_at: Callable[[float], float] | None,
        done: Callable[[Request, SpecState], None],
    ) -> None:
        self.env = env
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._step_s = step_s
        self._back_at = back_at
        self._done = done
        self._ready: list[_Round] = []  # rounds waiting for a step, ready longest first
        self._stepping = False
        self._start_at: float | None = None  # when a scheduled step start fires (None: none scheduled)
        self._start_gen = 0  # a scheduled start fires only if no later one replaced it

    def add(self, req: Request, spec: SpecState, gamma: int) -> None:
        """*req*'s round, of *gamma* tokens (at least 1), is ready now: it joins the next step;
        on an idle device it opens a batch."""
        ready = self._ready
        ready.append(_Round(req, spec, gamma))
        if self._stepping:
            return  # it joins the step after the running one
        now = self.env.now
        full = len(ready) >= self.max_batch
        at = self._start_at
        if at is None:
            self._schedule_start(now if full else now + self.max_wait_s)
        elif full and at > now:
            self._schedule_start(now)

    def _schedule_start(self, at_s: float) -> None:
        """The next step starts at *at_s*, after the NORMAL events of that instant (so every
        round ready by then joins it), replacing a start scheduled before."""
        self._start_gen += 1
        self._start_at = at_s
        timer_at(self.env, at_s).callbacks.append(functools.partial(self._start_step, self._start_gen))

    def _start_step(self, gen: int, _event: Event) -> None:
        if gen != self._start_gen:
            return  # replaced by a later schedule
        if self._back_at is not None:
            now = self.env.now
            back = self._back_at(now)
            if back > now:
                self._schedule_start(back)
                return
        self._start_at = None
        self._begin_step()

    def _begin_step(self) -> None:
        """Run one step now for the ready rounds of the drafter of the round ready longest,
        oldest first, up to ``max_batch`` (a step runs one model; the other rounds wait for a
        later step)."""
        ready = self._ready
        drafter = ready[0].spec.drafter
        room = self.max_batch
        members: list[_Round] = []
        waiting: list[_Round] = []
        for r in ready:
            if r.spec.drafter is drafter and len(members) < room:
                members.append(r)
            else:
                waiting.append(r)
        self._ready = waiting
        now = self.env.now
        self._stepping = True
        end = now + self._step_s(drafter, len(members), now)
        timer_at(self.env, end).callbacks.append(functools.partial(self._end_step, members))

    def _end_step(self, members: list[_Round], _event: Event) -> None:
        """A step ended: each of its rounds drafted a token; a round with all its tokens is
        done, the others wait for the next step, which starts at once, or, when a round
        left, after this instant's NORMAL events (so a round coming back in the same instant
        joins it)."""
        self._stepping = False
        ready = self._ready
        left_one = False
        for r in members:
            r.left -= 1
            if r.left:
                ready.append(r)
            else:
                left_one = True
                self._done(r.req, r.spec)
        if ready:
            if left_one:
                self._schedule_start(self.env.now)
            else:
                self._begin_step()
