"""Speculation-depth (γ) policies: how many tokens the drafter proposes in the next round.

Before every draft round the speculative-decoding mechanism builds a read-only
:class:`GammaState` (the last γ, its bounds and the telemetry of the moment) and
asks the request's :class:`GammaPolicy` for ``next_gamma(state)``, an integer in
``[k_min, k_max]`` (seed 003 §4 ``adaptive_k``, §6.1 "Adaptive speculation").
A policy never touches SimPy; one that needs memory keeps it in its own fields.

Built-ins (``kind:`` under a scenario's γ policy): ``static``, ``backpressure``,
``acceptance_backoff``, ``specpp``, ``latency_head`` (in :mod:`simpy_llm.policies.latency_head`),
``pid`` and ``bandit``; each class's docstring states its exact rule, and its fields are its
``params:`` (with units and defaults).

A custom policy registers with the same decorator as the built-ins:

>>> import attrs
>>> from simpy_llm.policies.gamma import GammaState, gamma_policies
>>> @gamma_policies.register("rtt_cap")
... @attrs.define
... class RttCap:
...     '''k_max while the round trip is short, k_min once it exceeds ``rtt_high_s`` (s).'''
...
...     rtt_high_s: float = 0.05
...
...     def next_gamma(self, state):
...         return state.k_min if state.rtt_s > self.rtt_high_s else state.k_max
>>> gamma_policies.get("rtt_cap")().next_gamma(GammaState(gamma=3, k_min=1, k_max=6, rtt_s=0.2))
1
>>> _ = gamma_policies._items.pop("rtt_cap")  # keep the doctest from leaving it registered
"""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, greater_than, in_range, optional
from simpy_llm.policies.bandits import ucb1_arm
from simpy_llm.registry import Registry

__all__ = [
    "AcceptanceBackoff",
    "Backpressure",
    "GammaPolicy",
    "GammaState",
    "PidGamma",
    "SpecPlusPlus",
    "StaticGamma",
    "UcbBandit",
    "clamp_gamma",
    "gamma_policies",
]


def _probabilities(_inst: object, attr: attrs.Attribute, value: tuple[float, ...]) -> None:
    for i, p in enumerate(value):
        if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a probability in [0, 1], got {p!r}")


def _k_max_at_least_k_min(inst: GammaState, attr: attrs.Attribute, value: int) -> None:
    if value < inst.k_min:
        raise FieldValueError(attr.name, f"must be >= k_min ({inst.k_min}), got {value}")


@attrs.frozen(kw_only=True)
class GammaState:
    """What a γ policy sees before one draft round of one request (read-only).

    Only ``gamma``, ``k_min`` and ``k_max`` are required; the telemetry fields
    default to "nothing known yet" (zero wait, empty KV, no previous round).

    Examples
    --------
    >>> s = GammaState(gamma=4, k_min=1, k_max=6, accepted_last=3, proposed_last=4)
    >>> s.acceptance_last
    0.75
    >>> GammaState(gamma=4, k_min=3, k_max=2)
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: k_max: must be >= k_min (3), got 2
    """

    gamma: int = attrs.field(validator=at_least(0))
    """γ of the last round, tokens (the starting γ before the first round)."""
    k_min: int = attrs.field(validator=at_least(1))
    """Smallest γ allowed, tokens (>= 1)."""
    k_max: int = attrs.field(validator=_k_max_at_least_k_min)
    """Largest γ allowed, tokens (>= k_min)."""
    rtt_s: float = attrs.field(default=0.0, validator=at_least(0))
    """Round trip between drafter and target (bundle up, verdict back), s."""
    verify_queue_wait_s: float = attrs.field(default=0.0, validator=at_least(0))
    """Recent mean wait of a verify job at the target's verify pool, s."""
    kv_utilization: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """Share of the target's KV cache in use, 0..1."""
    accepted_last: int = attrs.field(default=0, validator=at_least(0))
    """Draft tokens accepted by the target in the last round, tokens."""
    proposed_last: int = attrs.field(default=0, validator=at_least(0))
    """Draft tokens proposed in the last round (its γ), tokens; 0 before the first round."""
    acceptance_ewma: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    """Exponentially smoothed per-token acceptance rate of this request, 0..1."""
    position_probabilities: tuple[float, ...] = attrs.field(default=(), converter=tuple, validator=_probabilities)
    """``(p_1, ..., p_n)``: the acceptance model's probability that the draft token at position
    ``i`` is accepted, for this request's *current* context; computed fresh for this round."""
    draft_step_s: float = attrs.field(default=0.0, validator=at_least(0))
    """Time the drafter takes per draft token, s."""
    verify_step_s: float = attrs.field(default=0.0, validator=at_least(0))
    """Time one verify round takes at the target (excluding queueing), s."""
    slo_tpot_s: float | None = attrs.field(default=None, validator=optional(at_least(0)))
    """Time-per-output-token target of the request, s (None: no target)."""

    @classmethod
    def trusted(cls, **fields: object) -> GammaState:
        """A state built without running the validators, for the mechanism, whose values are
        valid by construction (every field must be given). Use the constructor elsewhere.

        >>> s = GammaState.trusted(gamma=4, k_min=1, k_max=6, rtt_s=0.04, verify_queue_wait_s=0.0,
        ...     kv_utilization=0.1, accepted_last=2, proposed_last=4, acceptance_ewma=0.5,
        ...     position_probabilities=(0.9, 0.8), draft_step_s=0.01, verify_step_s=0.005, slo_tpot_s=None)
        >>> s == GammaState(**{f: getattr(s, f) for f in attrs.fields_dict(GammaState)})
        True
        """
        if fields.keys() != _STATE_SETTERS.keys():
            raise TypeError(f"trusted() needs exactly the fields {sorted(_STATE_SETTERS)}")
        return cls.trusted_values(tuple(fields[name] for name in _STATE_SETTERS))

    @classmethod
    def trusted_values(cls, values: tuple[object, ...]) -> GammaState:
        """:meth:`trusted` with the values in field order (``attrs.fields(GammaState)``)."""
        # Unrolled (it runs once per draft round): the slot setters in field order.
        gamma, k_min, k_max, rtt, wait, kv, accepted, proposed, ewma, probabilities, draft, verify, tpot = values
        state = _new(cls)
        _set_gamma(state, gamma)
        _set_k_min(state, k_min)
        _set_k_max(state, k_max)
        _set_rtt(state, rtt)
        _set_wait(state, wait)
        _set_kv(state, kv)
        _set_accepted(state, accepted)
        _set_proposed(state, proposed)
        _set_ewma(state, ewma)
        _set_probabilities(state, probabilities)
        _set_draft(state, draft)
        _set_verify(state, verify)
        _set_tpot(state, tpot)
        return state

    @property
    def acceptance_last(self) -> float:
        """``accepted_last / proposed_last`` (0 before the first round)."""
        return self.accepted_last / self.proposed_last if self.proposed_last else 0.0


_STATE_SETTERS = {name: GammaState.__dict__[name].__set__ for name in attrs.fields_dict(GammaState)}
"""Each field's slot setter (what a frozen class's ``__init__`` uses), for :meth:`GammaState.trusted`."""
(
    _set_gamma, _set_k_min, _set_k_max, _set_rtt, _set_wait, _set_kv, _set_accepted, _set_proposed, _set_ewma,
    _set_probabilities, _set_draft, _set_verify, _set_tpot,
) = _STATE_SETTERS.values()
assert tuple(_STATE_SETTERS) == (  # the names above, in field order
    "gamma", "k_min", "k_max", "rtt_s", "verify_queue_wait_s", "kv_utilization", "accepted_last", "proposed_last",
    "acceptance_ewma", "position_probabilities", "draft_step_s", "verify_step_s", "slo_tpot_s",
)
_new = object.__new__


class GammaPolicy(Protocol):
    """Chooses the speculation depth γ of the next draft round.

    The mechanism asks once per round, at the target: for a distributed round as the target
    sends the verdict before it (seed 003 §6.4.1 places the γ controller there, where the
    verify queue and KV use are seen as they are; γ travels with the verdict), for a fused
    round as the previous pass ends.

    A policy class may set ``reads_position_probabilities = False`` to say its rule never
    reads ``state.position_probabilities``; the mechanism then passes ``()`` there and
    saves the curve lookup. Absent, the probabilities are always filled in.

    A policy object may also define ``bind_request(request, scope)``: the mechanism calls it
    once, as the request the object serves starts, with that request (its ``replica`` is its
    target once routed) and an object that lives as long as the simulation (its draft
    fleet), for memory kept beyond one request (``latency_head``'s ``history_scope: target``).
    """

    def next_gamma(self, state: GammaState) -> int:
        """γ for the next round, always within ``[state.k_min, state.k_max]``."""
        ...


gamma_policies: Registry[type] = Registry("gamma policy")
"""γ policies by name; register your own with ``@gamma_policies.register("name")``."""


def clamp_gamma(gamma: int, state: GammaState) -> int:
    """*gamma* clamped to ``[state.k_min, state.k_max]``.

    >>> clamp_gamma(9, GammaState(gamma=4, k_min=1, k_max=6))
    6
    """
    k_min, k_max = state.k_min, state.k_max
    return (gamma if gamma < k_max else k_max) if gamma > k_min else k_min


def _not_above(other: str):  # returns an attrs validator
    """Validator: this field must be <= the field *other* (a hysteresis band's low end)."""

    def check(inst: object, attr: attrs.Attribute, value: float) -> None:
        high = getattr(inst, other)
        if value > high:
            raise FieldValueError(attr.name, f"must be <= {other} ({high}), got {value}")

    return check


@gamma_policies.register("static")
@attrs.define
class StaticGamma:
    """Always the same γ (clamped to ``[k_min, k_max]``).

    >>> StaticGamma(gamma=8).next_gamma(GammaState(gamma=2, k_min=1, k_max=6))
    6
    """

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    gamma: int = attrs.field(default=4, validator=at_least(1))
    """The γ to use, tokens."""

    def next_gamma(self, state: GammaState) -> int:
        return clamp_gamma(self.gamma, state)


@gamma_policies.register("backpressure")
@attrs.define
class Backpressure:
    """Load-aware controller (seed 003 §4 ``controller: backpressure``, §6.1).

    Starting from the last γ: shrink by ``step`` when the verify queue wait is
    above ``wait_high_s`` *or* the KV utilisation is above ``kv_high``; grow by
    ``step`` when the wait is below ``wait_low_s`` *and* the KV utilisation is
    below ``kv_low``; otherwise (the hysteresis band) keep it. Clamped to
    ``[k_min, k_max]``.

    >>> p = Backpressure()
    >>> p.next_gamma(GammaState(gamma=4, k_min=1, k_max=6, verify_queue_wait_s=0.2))
    3
    >>> p.next_gamma(GammaState(gamma=4, k_min=1, k_max=6, verify_queue_wait_s=0.02, kv_utilization=0.5))
    4
    """

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    wait_high_s: float = attrs.field(default=0.05, validator=at_least(0))
    """Verify queue wait above which γ shrinks, s."""
    wait_low_s: float = attrs.field(default=0.01, validator=[at_least(0), _not_above("wait_high_s")])
    """Verify queue wait below which γ may grow, s (<= wait_high_s)."""
    kv_high: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))
    """KV utilisation above which γ shrinks, 0..1."""
    kv_low: float = attrs.field(default=0.7, validator=[in_range(0.0, 1.0), _not_above("kv_high")])
    """KV utilisation below which γ may grow, 0..1 (<= kv_high)."""
    step: int = attrs.field(default=1, validator=at_least(1))
    """Change of γ per round, tokens."""

    def next_gamma(self, state: GammaState) -> int:
        gamma = state.gamma
        if state.verify_queue_wait_s > self.wait_high_s or state.kv_utilization > self.kv_high:
            gamma -= self.step
        elif state.verify_queue_wait_s < self.wait_low_s and state.kv_utilization < self.kv_low:
            gamma += self.step
        return clamp_gamma(gamma, state)


@gamma_policies.register("acceptance_backoff")
@attrs.define
class AcceptanceBackoff:
    """Multiplicative decrease, additive increase on the last round's acceptance ratio.

    With ``r = accepted_last / proposed_last``: ``r < low`` halves γ
    (``gamma // 2``, at least ``k_min``); ``r >= high`` adds 1; otherwise γ
    is kept. Before the first round (``proposed_last == 0``) γ is kept.
    Clamped to ``[k_min, k_max]``.

    >>> AcceptanceBackoff().next_gamma(GammaState(gamma=5, k_min=1, k_max=6, accepted_last=1, proposed_last=5))
    2
    """

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    low: float = attrs.field(default=0.5, validator=in_range(0.0, 1.0))
    """Acceptance ratio below which γ is halved, 0..1."""
    high: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))
    """Acceptance ratio at or above which γ grows by 1, 0..1 (>= low)."""

    @high.validator
    def _high_not_below_low(self, attr: attrs.Attribute, value: float) -> None:
        if value < self.low:
            raise FieldValueError(attr.name, f"must be >= low ({self.low}), got {value}")

    def next_gamma(self, state: GammaState) -> int:
        gamma = state.gamma
        if state.proposed_last:
            ratio = state.acceptance_last
            if ratio < self.low:
                gamma //= 2
            elif ratio >= self.high:
                gamma += 1
        return clamp_gamma(gamma, state)


@gamma_policies.register("specpp")
@attrs.define
class SpecPlusPlus:
    """Spec++-style stopping rule on this round's acceptance probabilities.

    γ is the largest ``i <= k_max`` such that the predicted rejection
    probability ``1 - p_j`` stays ``<= threshold`` for every position
    ``j <= i``; at least ``k_min``. Positions beyond the probabilities given
    count as rejected (no probabilities at all: ``k_min``).

    Both Spec++ bugs of seed 003 Appendix B are avoided by construction: the
    position at which the rejection crosses the threshold is *not* taken
    (the off-by-one), and the probabilities are read from the state of this
    round only; the policy holds no state, so no estimate from an earlier
    round (or another context) can stand in for them.

    >>> p = SpecPlusPlus(threshold=0.3)
    >>> p.next_gamma(GammaState(gamma=4, k_min=1, k_max=6, position_probabilities=(0.9, 0.8, 0.6, 0.95)))
    2
    """

    threshold: float = attrs.field(default=0.3, validator=in_range(0.0, 1.0))
    """Largest tolerated rejection probability of a drafted position, 0..1."""

    def next_gamma(self, state: GammaState) -> int:
        selected = 0
        for p in state.position_probabilities[: state.k_max]:
            if 1.0 - p > self.threshold:
                break
            selected += 1
        return clamp_gamma(selected, state)


@gamma_policies.register("pid")
@attrs.define
class PidGamma:
    """Discrete PID controller driving the rounds' acceptance ratio to a setpoint (seed 003 §4
    ``controller: pid``, §5.5 "Adaptive k & depth").

    The measured signal is the last round's acceptance ratio ``r = accepted_last /
    proposed_last``, the quantity :class:`AcceptanceBackoff` reads. A ratio above the
    setpoint says drafts are cheap to extend, so γ grows; one below says they are being
    wasted, so it shrinks. Since later draft positions are accepted less often, a longer γ
    lowers the ratio: the loop is a negative feedback.

    Each call that follows a round (``proposed_last > 0``) is one step ``t = 1, 2, ...`` of
    the controller, with one round as its time unit::

        e_t = r_t - setpoint
        I_t = clamp(I_{t-1} + e_t, -integral_limit, integral_limit)     I_0 = 0
        D_t = e_t - e_{t-1}                                              D_1 = 0
        u_t = default_gamma + kp e_t + ki I_t + kd D_t
        γ_t = floor(u_t + 0.5), clamped to [k_min, k_max]

    The clamp on ``I`` is the anti-windup: while γ sits at a bound the error keeps one sign,
    and an unclamped sum would hold γ there long after the error turned. A call without a
    round (``proposed_last == 0``: before the first) is not a step and answers the last
    step's γ (``default_gamma`` before any). The policy keeps per-instance state (one
    instance per request, as the mechanism builds them).

    Examples
    --------
    Every draft accepted up to γ = 3, none beyond (ratio 1 up to 3, then ``3 / γ``); the
    setpoint 0.6 is met at γ = 5 only, where the controller comes to rest:

    >>> pid = PidGamma(setpoint=0.6, kp=1.0, ki=1.0, default_gamma=2)
    >>> gamma, chosen = 2, []
    >>> for _ in range(16):
    ...     gamma = pid.next_gamma(GammaState(gamma=gamma, k_min=1, k_max=6, accepted_last=min(gamma, 3), proposed_last=gamma))
    ...     chosen.append(gamma)
    >>> chosen
    [3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5, 4, 5, 5, 5, 5]
    >>> round(pid.integral, 2)  # 3 x 0.4 + 9 x 0.15: at zero error, u = 2 + 2.55 rounds to 5
    2.55
    """

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    setpoint: float = attrs.field(default=0.7, validator=in_range(0.0, 1.0))
    """Acceptance ratio the controller drives the rounds to, 0..1."""
    kp: float = attrs.field(default=2.0, validator=at_least(0))
    """Proportional gain, tokens per unit of acceptance-ratio error (>= 0)."""
    ki: float = attrs.field(default=0.5, validator=at_least(0))
    """Integral gain, tokens per unit of error summed over rounds (>= 0)."""
    kd: float = attrs.field(default=0.0, validator=at_least(0))
    """Derivative gain, tokens per unit of change of the error from one round to the next (>= 0)."""
    integral_limit: float = attrs.field(default=8.0, validator=greater_than(0.0))
    """Bound on the magnitude of the error sum ``I`` (anti-windup), error x rounds (> 0)."""
    default_gamma: int = attrs.field(default=4, validator=at_least(1))
    """γ before the first round, and the controller's operating point (``u`` at zero error and
    zero integral), tokens."""
    _integral: float = attrs.field(default=0.0, init=False, repr=False)
    _error: float | None = attrs.field(default=None, init=False, repr=False)
    _output: float = attrs.field(default=0.0, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._output = float(self.default_gamma)

    @property
    def integral(self) -> float:
        """The error sum ``I`` after the last step (0 before the first)."""
        return self._integral

    def next_gamma(self, state: GammaState) -> int:
        proposed = state.proposed_last
        if proposed:
            error = state.accepted_last / proposed - self.setpoint
            limit = self.integral_limit
            integral = self._integral + error
            integral = (integral if integral < limit else limit) if integral > -limit else -limit
            previous = self._error
            derivative = 0.0 if previous is None else error - previous
            self._integral, self._error = integral, error
            self._output = self.default_gamma + self.kp * error + self.ki * integral + self.kd * derivative
        return clamp_gamma(math.floor(self._output + 0.5), state)


@gamma_policies.register("bandit")
@attrs.define
class UcbBandit:
    """UCB1 bandit over the γ arms ``k_min .. k_max`` (seed 003 §4 ``controller: bandit``).

    Each call first credits the round just ended to the arm that chose it, then picks the
    next arm. **Reward**: the round's tokens per second of round time, as a share of the
    highest rate any arm could reach at the same telemetry. With ``d = draft_step_s`` and
    ``c = rtt_s + verify_queue_wait_s + verify_step_s`` (the state's figures when the round
    is credited), a round of γ drafts takes ``T(γ) = γ d + c``, adds ``accepted_last + 1``
    tokens, and has reward::

        reward = (accepted_last + 1) / T(γ) / max((k_min + 1) / T(k_min), (k_max + 1) / T(k_max))

    ``(γ + 1) / T(γ)`` is monotone in γ, so the denominator bounds every arm's rate and the
    reward lies in [0, 1], as UCB1 assumes; at fixed telemetry, ordering arms by mean
    reward orders them by tokens per second. A round is credited only when it ran the γ
    chosen (``proposed_last`` equal to it: a round the mechanism cut short at the end of
    the answer is no pull of that arm) and took time (``T(γ) > 0``).

    **Choice** (Auer, Cesa-Bianchi and Fischer, 2002): every arm not yet credited, smallest
    γ first; then the arm of largest ``mean_a + exploration x sqrt(2 ln n / n_a)``, with
    ``n_a`` the arm's credited rounds, ``mean_a`` their mean reward and ``n`` all credited
    rounds; ties go to the smaller γ. ``exploration = 1`` is UCB1 as published; smaller
    values settle sooner (0: greedy once each arm was tried). No random draw: the same
    rounds give the same choices.

    The arms are those of the first state seen; a state with other bounds starts them
    afresh. The policy keeps per-instance state (one instance per request, as the mechanism
    builds them, so a request learns from its own rounds only).

    Examples
    --------
    Drafting 10 ms a token, 20 ms of round trip and verify, drafts accepted up to γ = 2
    and none beyond: rates 2/30, 3/40 and 3/50 tokens per ms, so γ = 2 is best. After one
    round of each arm (1, 2, 3) the greedy bandit keeps to it:

    >>> bandit = UcbBandit(exploration=0.0)
    >>> gamma, chosen = 0, []
    >>> for _ in range(6):
    ...     gamma = bandit.next_gamma(GammaState(gamma=gamma, k_min=1, k_max=3, accepted_last=min(gamma, 2),
    ...         proposed_last=gamma, draft_step_s=0.01, rtt_s=0.015, verify_step_s=0.005))
    ...     chosen.append(gamma)
    >>> chosen, bandit.pulls
    ([1, 2, 3, 2, 2, 2], (1, 3, 1))
    """

    reads_position_probabilities: ClassVar[bool] = False
    """The rule never reads ``state.position_probabilities`` (the mechanism may leave it empty)."""

    exploration: float = attrs.field(default=1.0, validator=at_least(0))
    """Weight ``c`` of the confidence term ``c sqrt(2 ln n / n_a)`` (>= 0; 1: UCB1 as published)."""
    _k_min: int = attrs.field(default=0, init=False, repr=False)
    _k_max: int = attrs.field(default=0, init=False, repr=False)
    _counts: list[int] = attrs.field(factory=list, init=False, repr=False)
    _sums: list[float] = attrs.field(factory=list, init=False, repr=False)
    _credited: int = attrs.field(default=0, init=False, repr=False)
    _pending: int = attrs.field(default=0, init=False, repr=False)

    @property
    def pulls(self) -> tuple[int, ...]:
        """Credited rounds per arm, γ = k_min first (empty before the first call)."""
        return tuple(self._counts)

    @property
    def mean_rewards(self) -> tuple[float, ...]:
        """Mean reward per arm, γ = k_min first (NaN for an arm never credited)."""
        return tuple(s / n if n else math.nan for s, n in zip(self._sums, self._counts, strict=True))

    def next_gamma(self, state: GammaState) -> int:
        k_min, k_max = state.k_min, state.k_max
        if k_min != self._k_min or k_max != self._k_max:  # the first call (or other bounds): fresh arms
            self._k_min, self._k_max = k_min, k_max
            self._counts = [0] * (k_max - k_min + 1)
            self._sums = [0.0] * (k_max - k_min + 1)
            self._credited = self._pending = 0
        counts, sums = self._counts, self._sums
        pending = self._pending
        if pending and state.proposed_last == pending:
            step = state.draft_step_s
            fixed = state.rtt_s + state.verify_queue_wait_s + state.verify_step_s
            round_s = pending * step + fixed
            if round_s > 0.0:  # then T(k_min) > 0 too (k_min >= 1): the ceiling is finite
                low, high = (k_min + 1) / (k_min * step + fixed), (k_max + 1) / (k_max * step + fixed)
                arm = pending - k_min
                counts[arm] += 1
                sums[arm] += (state.accepted_last + 1) / round_s / (low if low > high else high)
                self._credited += 1
        self._pending = k_min + ucb1_arm(counts, sums, self._credited, self.exploration)
        return self._pending
