"""Drafter selection policies: which of a draft group's drafters runs a request's next round.

A draft group may list several drafters (a portfolio: tiny, mid, large; seed 003 §4
"portfolios of draft models", §5.5 "Drafter selection"). With
``speculation.drafts[i].drafter_policy`` the mechanism asks the request's own
:class:`DrafterPolicy` object (one per request) for ``choose(state)``, the index of the
drafter to use, once when the request starts on its device and again after each of its
distributed rounds that did not finish it. The :class:`DrafterState` is read-only; a
policy never touches SimPy, and keeps any memory in its own fields.

Built-ins (``kind:`` under ``drafter_policy``), each class's docstring states its rule:

* ``fixed``: the first drafter, always (the behaviour without ``drafter_policy``);
* ``acceptance_portfolio``: the drafter of highest predicted tokens per second at the
  request's context, with ``escalation_slack_ms`` of hysteresis;
* ``bandit``: UCB1 over the drafters, rewarded by tokens per second of round time.

A custom policy registers with the same decorator:

>>> import attrs
>>> from simpy_llm.policies.drafter_selection import DrafterState, drafter_policies
>>> @drafter_policies.register("long_prompts_large")
... @attrs.define
... class LongPromptsLarge:
...     '''The last (largest) drafter for contexts of ``tokens`` or more, else the first.'''
...
...     tokens: int = 2048
...
...     def choose(self, state):
...         return len(state.drafters) - 1 if state.context_tokens >= self.tokens else 0
>>> drafter_policies.get("long_prompts_large")().choose(DrafterState(drafters=(None, None), context_tokens=4096))
1
>>> _ = drafter_policies._items.pop("long_prompts_large")  # keep the doctest from leaving it registered
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs

from simpy_llm.config.validators import at_least
from simpy_llm.policies.bandits import ucb1_arm
from simpy_llm.registry import Registry

__all__ = [
    "AcceptancePortfolio",
    "DrafterBandit",
    "DrafterPolicy",
    "DrafterState",
    "DrafterView",
    "ExpectedTokens",
    "FixedDrafter",
    "drafter_policies",
    "round_time_s",
]


class ExpectedTokens(Protocol):
    """What a drafter selection policy reads of an acceptance model."""

    def expected_tokens(self, context_len: float, k: int, temperature: float | None = None) -> float:
        """Mean tokens a verification round of *k* drafts emits at *context_len*
        (``1 + sum_{i<=k} prod_{j<=i} p_j``)."""
        ...


class DrafterView(Protocol):
    """One drafter of the group as a policy sees it (read-only)."""

    @property
    def name(self) -> str:
        """Its name (records, drafter switches)."""
        ...

    @property
    def draft_token_s(self) -> float:
        """Its time to draft one token, unthrottled, s."""
        ...

    @property
    def acceptance(self) -> ExpectedTokens:
        """Its acceptance model against the target."""
        ...


@attrs.frozen(kw_only=True)
class DrafterState:
    """What a drafter selection policy sees (read-only; times in seconds).

    Built by the mechanism when a request starts (``rounds = 0``: no target chosen yet, so
    the target's figures are 0) and after each distributed round that did not finish it.
    """

    drafters: tuple[DrafterView, ...]
    """The group's drafters, in the scenario's order (an answer indexes them)."""
    current: int = 0
    """Index of the drafter of the last round (the first drafter before any round)."""
    rounds: int = 0
    """Rounds the request has run (0 when it starts)."""
    context_tokens: int = 0
    """The request's context now: prompt plus tokens made, tokens."""
    gamma: int = 0
    """γ of the last round (the starting γ before any round), tokens."""
    temperature: float | None = None
    """Temperature the acceptance curves are read at (``speculation.temperature``)."""
    rtt_s: float = 0.0
    """The device's nominal round trip to the target, s."""
    verify_queue_wait_s: float = 0.0
    """The target's smoothed wait of a round job, s (0 before any round)."""
    verify_step_s: float = 0.0
    """The target's smoothed verify pass, s (0 before any round)."""
    accepted_last: int = 0
    """Drafts the target accepted in the last round, tokens."""
    proposed_last: int = 0
    """Drafts proposed in the last round (its γ), tokens; 0 before any round."""
    acceptance_ewma: float = 0.0
    """The request's smoothed acceptance rate, 0..1 (started at the current drafter's ``p_1``)."""


def round_time_s(state: DrafterState, index: int, gamma: int) -> float:
    """Predicted time of a round of *gamma* drafts with drafter *index*:
    ``gamma x draft_token_s + rtt_s + verify_queue_wait_s + verify_step_s``.

    >>> class D:
    ...     name, draft_token_s, acceptance = "d", 0.004, None
    >>> round(round_time_s(DrafterState(drafters=(D(),), rtt_s=0.02, verify_step_s=0.006), 0, 4), 6)
    0.042
    """
    return gamma * state.drafters[index].draft_token_s + state.rtt_s + state.verify_queue_wait_s + state.verify_step_s


class DrafterPolicy(Protocol):
    """Chooses the drafter of a request's next round."""

    def choose(self, state: DrafterState) -> int:
        """Index into ``state.drafters``."""
        ...


drafter_policies: Registry[type] = Registry("drafter policy")
"""Drafter selection policies by name; register your own with ``@drafter_policies.register("name")``."""


@drafter_policies.register("fixed")
@attrs.define
class FixedDrafter:
    """The first drafter, always: what a group without ``drafter_policy`` does.

    >>> FixedDrafter().choose(DrafterState(drafters=(None, None), current=1, rounds=3))
    0
    """

    def choose(self, state: DrafterState) -> int:
        return 0


@drafter_policies.register("acceptance_portfolio")
@attrs.define
class AcceptancePortfolio:
    """The drafter of highest predicted tokens per second (seed 003 §5.5 ``acceptance_portfolio``).

    For each drafter ``j``, at the request's context ``c`` and γ (the last round's, or the
    starting γ)::

        E_j = 1 + sum_{i<=γ} prod_{m<=i} p_m        (drafter j's curve at c)
        T_j = γ x draft_token_s_j + rtt_s + verify_queue_wait_s + verify_step_s
        t_j = T_j / E_j                             (predicted seconds per output token)

    When the request starts the drafter of least ``t_j`` is chosen (ties: the larger
    ``E_j``, then the earlier drafter). After each round the request keeps its drafter
    ``c`` unless the best drafter ``b`` saves more than ``escalation_slack_ms`` per output
    token: ``t_c - t_b > escalation_slack_ms / 1000``. The slack is hysteresis, so
    predictions that differ by little do not make a request flap between drafters; 0
    follows the best prediction every round. It applies both ways (a request may move to
    a smaller drafter when the context makes it the faster one).

    Examples
    --------
    Two drafters of the same speed, one better than the other at this context: the better
    one is chosen, and a slack larger than the gain keeps the current one:

    >>> class Flat:
    ...     def __init__(self, p): self.p = p
    ...     def expected_tokens(self, context_len, k, temperature=None):
    ...         return sum(self.p ** i for i in range(k + 1))
    >>> class D:
    ...     def __init__(self, p, s): self.name, self.draft_token_s, self.acceptance = "d", s, Flat(p)
    >>> state = DrafterState(drafters=(D(0.5, 0.002), D(0.8, 0.002)), gamma=4, rtt_s=0.02, rounds=3)
    >>> AcceptancePortfolio().choose(state)
    1
    >>> AcceptancePortfolio(escalation_slack_ms=7.0).choose(state)   # it saves about 6.1 ms a token
    0
    >>> AcceptancePortfolio(escalation_slack_ms=6.0).choose(state)
    1
    """

    escalation_slack_ms: float = attrs.field(default=0.0, validator=at_least(0))
    """Least predicted saving per output token that moves a started request to another
    drafter, ms (>= 0)."""

    def choose(self, state: DrafterState) -> int:
        gamma, context, temperature = state.gamma, state.context_tokens, state.temperature
        fixed = state.rtt_s + state.verify_queue_wait_s + state.verify_step_s
        per_token = []
        best, best_key = 0, (math.inf, 0.0)
        for j, drafter in enumerate(state.drafters):
            expected = drafter.acceptance.expected_tokens(max(context, 1), gamma, temperature)
            t = (gamma * drafter.draft_token_s + fixed) / expected
            per_token.append(t)
            key = (t, -expected)
            if key < best_key:
                best, best_key = j, key
        if state.rounds == 0 or best == state.current:
            return best
        return best if per_token[state.current] - per_token[best] > self.escalation_slack_ms / 1e3 else state.current


@drafter_policies.register("bandit")
@attrs.define
class DrafterBandit:
    """UCB1 over the group's drafters, rewarded by tokens per second of round time.

    Each call after a round first credits that round to the drafter that ran it
    (``state.current``), then picks the next. With ``γ = proposed_last``, ``F = rtt_s +
    verify_queue_wait_s + verify_step_s`` and ``d_j`` drafter ``j``'s time per token, the
    round took (by the telemetry's model) ``T_j = γ d_j + F`` and added
    ``accepted_last + 1`` tokens; its reward is that rate as a share of the best any
    drafter could reach at this γ, every draft accepted with the fastest drafter::

        reward = (accepted_last + 1) / T_current / ((γ + 1) / (γ min_j d_j + F))

    so it lies in [0, 1], as UCB1 assumes. A round with ``γ = 0`` or no time is not credited.

    **Choice** (Auer, Cesa-Bianchi and Fischer, 2002), as the γ bandit's: every drafter not
    yet credited, in the scenario's order; then the one of largest ``mean_j + exploration x
    sqrt(2 ln n / n_j)`` (``n_j`` its credited rounds, ``n`` all of them; ties to the
    earlier drafter). No random draw: the same rounds give the same choices. One object per
    request, so a request learns from its own rounds.

    Examples
    --------
    Two drafters, the second twice as slow but accepting every draft; the first accepts
    none. With 10 ms of round trip and γ = 2 the rates are 1/14 and 3/18 tokens per ms, so
    after one round each the greedy bandit keeps to the second:

    >>> class D:
    ...     def __init__(self, s): self.name, self.draft_token_s, self.acceptance = "d", s, None
    >>> drafters, bandit, current, chosen = (D(0.002), D(0.004)), DrafterBandit(exploration=0.0), 0, []
    >>> for rounds in range(5):
    ...     current = bandit.choose(DrafterState(drafters=drafters, current=current, rounds=rounds, rtt_s=0.01,
    ...         accepted_last=2 * current, proposed_last=2 if rounds else 0))
    ...     chosen.append(current)
    >>> chosen, bandit.pulls
    ([0, 1, 1, 1, 1], (1, 3))
    """

    exploration: float = attrs.field(default=1.0, validator=at_least(0))
    """Weight ``c`` of the confidence term ``c sqrt(2 ln n / n_j)`` (>= 0; 1: UCB1 as published)."""
    _counts: list[int] = attrs.field(factory=list, init=False, repr=False)
    _sums: list[float] = attrs.field(factory=list, init=False, repr=False)
    _credited: int = attrs.field(default=0, init=False, repr=False)

    @property
    def pulls(self) -> tuple[int, ...]:
        """Credited rounds per drafter (empty before the first call)."""
        return tuple(self._counts)

    @property
    def mean_rewards(self) -> tuple[float, ...]:
        """Mean reward per drafter (NaN for one never credited)."""
        return tuple(s / n if n else math.nan for s, n in zip(self._sums, self._counts, strict=True))

    def choose(self, state: DrafterState) -> int:
        drafters = state.drafters
        if len(self._counts) != len(drafters):
            self._counts = [0] * len(drafters)
            self._sums = [0.0] * len(drafters)
            self._credited = 0
        counts, sums = self._counts, self._sums
        gamma = state.proposed_last
        if state.rounds and gamma:
            fixed = state.rtt_s + state.verify_queue_wait_s + state.verify_step_s
            round_s = gamma * drafters[state.current].draft_token_s + fixed
            ceiling_s = gamma * min(d.draft_token_s for d in drafters) + fixed
            if round_s > 0.0 and ceiling_s > 0.0:
                counts[state.current] += 1
                sums[state.current] += (state.accepted_last + 1) / round_s / ((gamma + 1) / ceiling_s)
                self._credited += 1
        return ucb1_arm(counts, sums, self._credited, self.exploration)
