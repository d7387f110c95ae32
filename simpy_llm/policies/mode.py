"""Execution-mode selectors: run a request's speculative decoding distributed or fused.

In ``speculation.mode: hybrid`` the mechanism asks the scenario's
:class:`ModeSelector` once per request, as its prefill starts on the target the
routers picked (the seed places the selector on the target side), for
``choose(state)``: ``"distributed"`` (the draft device drafts, the target
verifies, bundles cross the network) or ``"fused"`` (the target drafts and
verifies itself; only the prompt and the answer cross). The choice holds for
the whole request (seed 003 §7: "policy decides per request which mode to use").
The :class:`ModeState` is read-only; a selector never touches SimPy.

Built-ins (``kind:`` under ``speculation.mode_selector``):

* ``rtt_load_adaptive`` (seed 003 §4 ``mode_switch``): thresholds on the round
  trip and the target's verify queue wait;
* ``latency``: the mode with the smaller predicted time per output token;
* ``gamma_head``: the request's γ policy decides, γ = 1 meaning fused
  (seed 003 §6.4.1).

A custom selector registers with the same decorator:

>>> import attrs
>>> from simpy_llm.policies.mode import ModeState, mode_selectors
>>> @mode_selectors.register("phones_fused")
... @attrs.define
... class PhonesFused:
...     '''Fused for draft groups whose name starts with "phone".'''
...
...     def choose(self, state):
...         return "fused" if state.draft_group.startswith("phone") else "distributed"
>>> mode_selectors.get("phones_fused")().choose(ModeState(draft_group="phones", rtt_s=0.04))
'fused'
>>> _ = mode_selectors._items.pop("phones_fused")  # keep the doctest from leaving it registered
"""

from __future__ import annotations

from typing import Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, greater_than
from simpy_llm.registry import Registry

__all__ = [
    "MODES",
    "GammaHeadSelector",
    "LatencySelector",
    "ModeSelector",
    "ModeState",
    "RttLoadAdaptive",
    "mode_selectors",
]

MODES = ("distributed", "fused")
"""What a selector may return."""


@attrs.frozen(kw_only=True)
class ModeState:
    """What a mode selector sees when a request starts (read-only; times in seconds).

    The predicted per-token times are the no-queueing expectations for the request's
    prompt length: ``distributed_token_s = (γ·draft_step_s + rtt_s + verify_step_s) / E_d``
    and ``fused_token_s = (γ·fused_draft_step_s + verify_step_s) / E_f``, where ``E`` is
    the acceptance model's expected tokens per round (``docs/speculative.md``).
    """

    draft_group: str = ""
    """Name of the draft group the request's draft device belongs to."""
    rtt_s: float = 0.0
    """Round trip between the draft device and the target (propagation only), s."""
    verify_queue_wait_s: float = 0.0
    """Recent mean wait of a job in the target's verify queue, s."""
    kv_utilization: float = 0.0
    """Share of the target's KV capacity in use, 0..1."""
    distributed_token_s: float = 0.0
    """Predicted time per output token when distributed, s."""
    fused_token_s: float = 0.0
    """Predicted time per output token when fused, s."""
    gamma: int = 0
    """γ the request's γ policy proposes for its first round (``gamma_head`` reads it)."""
    target_cold_s: float = 0.0
    """Load the request's first round would wait for at the target, s: 0 when the target's
    model is loaded, else what is left of its cold start (its whole ``load_s`` when it is
    unloaded)."""
    distributed_ahead_s: float = 0.0
    """Time a distributed first round spends before its bundle reaches the target,
    ``γ·draft_step_s + rtt_s`` (the verdict down, the drafting, the bundle up), s: a cold
    start of the target runs meanwhile."""
    distributed_round_tokens: float = 1.0
    """Expected tokens per distributed round, ``E_d`` (``latency`` spreads a cold start over them)."""
    fused_round_tokens: float = 1.0
    """Expected tokens per fused round, ``E_f``."""


class ModeSelector(Protocol):
    """Chooses a request's execution mode."""

    def choose(self, state: ModeState) -> str:
        """``"distributed"`` or ``"fused"``."""
        ...


mode_selectors: Registry[type] = Registry("mode selector")
"""Mode selectors by name; register your own with ``@mode_selectors.register("name")``."""


@mode_selectors.register("rtt_load_adaptive")
@attrs.define
class RttLoadAdaptive:
    """Thresholds on the round trip, then on the verify queue (seed 003 §4 ``mode_switch``).

    ``rtt <= distributed_threshold_ms``: distributed; ``rtt >= fused_threshold_ms``:
    fused; in between, fused when the target's verify queue wait exceeds
    ``queue_wait_ms`` (the verify pool is the bottleneck, so keep the round trip off it),
    else distributed.

    >>> s = RttLoadAdaptive(distributed_threshold_ms=60, fused_threshold_ms=120)
    >>> s.choose(ModeState(rtt_s=0.03)), s.choose(ModeState(rtt_s=0.2)), s.choose(ModeState(rtt_s=0.09))
    ('distributed', 'fused', 'distributed')
    >>> s.choose(ModeState(rtt_s=0.09, verify_queue_wait_s=0.05))
    'fused'
    """

    distributed_threshold_ms: float = attrs.field(default=60.0, validator=at_least(0))
    """Round trip at or below which a request runs distributed, ms."""
    fused_threshold_ms: float = attrs.field(default=120.0, validator=at_least(0))
    """Round trip at or above which a request runs fused, ms (>= distributed_threshold_ms)."""
    queue_wait_ms: float = attrs.field(default=20.0, validator=at_least(0))
    """Between the thresholds: verify queue wait above which the request runs fused, ms."""

    @fused_threshold_ms.validator
    def _not_below(self, attr: attrs.Attribute, value: float) -> None:
        if value < self.distributed_threshold_ms:
            raise FieldValueError(attr.name, f"must be >= distributed_threshold_ms ({self.distributed_threshold_ms}), got {value}")

    def choose(self, state: ModeState) -> str:
        rtt_ms = state.rtt_s * 1e3
        if rtt_ms <= self.distributed_threshold_ms:
            return "distributed"
        if rtt_ms >= self.fused_threshold_ms:
            return "fused"
        return "fused" if state.verify_queue_wait_s * 1e3 > self.queue_wait_ms else "distributed"


@mode_selectors.register("latency")
@attrs.define
class LatencySelector:
    """The mode with the smaller predicted time per output token; ties go to fused
    (it needs no network). ``margin`` scales the distributed prediction: above 1 it
    favours fused (distributed must be faster by that factor), below 1 distributed (the
    predictions ignore queueing, which a loaded target's fused passes feel more).

    A cold target (``target_cold_s`` above 0) delays the first round, and the selector
    compares the first round's time per token: a fused round waits for the whole load,
    ``fused_token_s + target_cold_s / E_f``; a distributed round drafts meanwhile and waits
    only for what is left of the load when its bundle arrives,
    ``distributed_token_s + max(0, target_cold_s - distributed_ahead_s) / E_d``. A short
    load thus favours distributed (its drafting hides it); a long one favours the mode
    with more tokens per round.

    >>> LatencySelector().choose(ModeState(distributed_token_s=0.010, fused_token_s=0.012))
    'distributed'
    >>> LatencySelector(margin=1.5).choose(ModeState(distributed_token_s=0.010, fused_token_s=0.012))
    'fused'
    >>> warm = ModeState(distributed_token_s=0.010, fused_token_s=0.012, distributed_ahead_s=0.05,
    ...                  distributed_round_tokens=3.0, fused_round_tokens=4.0)
    >>> LatencySelector().choose(attrs.evolve(warm, target_cold_s=0.2))  # 0.010 + 0.15 / 3 = 0.060 < 0.012 + 0.2 / 4 = 0.062
    'distributed'
    >>> LatencySelector().choose(attrs.evolve(warm, target_cold_s=1.0))  # 0.010 + 0.95 / 3 = 0.327 > 0.012 + 1 / 4 = 0.262
    'fused'
    """

    margin: float = attrs.field(default=1.0, validator=greater_than(0))
    """Distributed is chosen only when ``distributed_token_s * margin < fused_token_s``."""

    def choose(self, state: ModeState) -> str:
        distributed, fused = state.distributed_token_s, state.fused_token_s
        cold = state.target_cold_s
        if cold > 0.0:  # the first round waits for the target's load (class docstring)
            distributed += max(0.0, cold - state.distributed_ahead_s) / state.distributed_round_tokens
            fused += cold / state.fused_round_tokens
        return "distributed" if distributed * self.margin < fused else "fused"


@mode_selectors.register("gamma_head")
@attrs.define
class GammaHeadSelector:
    """The γ policy decides (seed 003 §6.4.1): γ = 1 means fused, larger γ distributed.
    Use it with ``gamma_policy: {kind: latency_head}``, whose fused hysteresis returns 1.

    The selector reads the request's policy's *first* answer, before any round of that
    request: a ``latency_head`` whose ``min_samples`` or ``fused_rounds`` exceed 1 answers
    its ``default_gamma`` then, so it never picks fused; give it ``min_samples: 1`` and
    ``fused_rounds: 1`` to let the head decide from the telemetry at the start.

    >>> GammaHeadSelector().choose(ModeState(gamma=1)), GammaHeadSelector().choose(ModeState(gamma=3))
    ('fused', 'distributed')
    """

    def choose(self, state: ModeState) -> str:
        return "fused" if state.gamma <= 1 else "distributed"
