"""Scaling policies: how many replicas the autoscaler recommends (``docs/autoscaling.md``).

A scaling policy implements ``desired(seen, current) -> int``: *seen* is the metric the
autoscaler saw (its samples' mean, each sample averaged over the replicas active then) and
*current* the replicas active now; it returns the replicas it recommends. The autoscaler then
applies its stabilisation windows and its bounds. A policy never yields and never touches the
environment. Register one with ``@scaling_policies.register("name")`` and name it in the
scenario (``autoscaler.policy: {kind: name, params: {...}}``).

Built-in: ``target`` (:class:`TargetValue`, Kubernetes' Horizontal Pod Autoscaler),
``threshold`` (:class:`Thresholds`, a step at a time) and ``event`` (:class:`EventDriven`,
KEDA's ScaledObject: a metric total against a target per replica, with activation from and
cooldown to zero replicas). A policy that also has the attributes of :class:`Activating` is
driven as KEDA drives a ScaledObject (``docs/autoscaling.md``).
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_TIME_S, MIN_PERIOD_S, all_of, at_least, at_most, greater_than, in_range
from simpy_llm.registry import Registry

__all__ = ["Activating", "EventDriven", "ScalingPolicy", "TargetValue", "Thresholds", "scaling_policies"]

scaling_policies: Registry = Registry("scaling policy")
"""Registered scaling policies."""


class ScalingPolicy(Protocol):
    """Recommends a number of replicas from the metric seen."""

    def desired(self, seen: float, current: int) -> int:
        """Replicas recommended when the metric seen is *seen* with *current* active."""


@scaling_policies.register("target")
@attrs.frozen(kw_only=True)
class TargetValue:
    """Kubernetes' Horizontal Pod Autoscaler: ``ceil(current x seen / target)``, or *current*
    when ``seen / target`` is within ``tolerance`` of 1.

    >>> p = TargetValue(target=10.0)
    >>> p.desired(45.0, 1), p.desired(10.5, 3), p.desired(2.0, 5)
    (5, 3, 1)
    """

    target: float = attrs.field(validator=greater_than(0))
    """The metric's value per replica to hold."""
    tolerance: float = attrs.field(default=0.1, validator=in_range(0.0, 1.0))
    """No change while ``|seen / target - 1|`` is at most this (Kubernetes' default 0.1)."""

    def desired(self, seen: float, current: int) -> int:
        ratio = seen / self.target
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return math.ceil(current * ratio - 1e-9)  # 3 x (30 / 10) is 9.000000000000002 in floats: still 9


@scaling_policies.register("threshold")
@attrs.frozen(kw_only=True)
class Thresholds:
    """One ``step`` up while the metric is above ``high``, one down while below ``low``.

    >>> p = Thresholds(high=8.0, low=2.0)
    >>> p.desired(9.0, 3), p.desired(5.0, 3), p.desired(1.0, 3)
    (4, 3, 2)
    """

    high: float = attrs.field(validator=at_least(0))
    """Scale up above this value per replica."""
    low: float = attrs.field(validator=at_least(0))
    """Scale down below this value per replica."""
    step: int = attrs.field(default=1, validator=at_least(1))
    """Replicas added or removed per decision."""

    def __attrs_post_init__(self) -> None:
        if self.low > self.high:
            raise FieldValueError("low", f"must be at most high ({self.high}); got {self.low}")

    def desired(self, seen: float, current: int) -> int:
        if seen > self.high:
            return current + self.step
        if seen < self.low:
            return current - self.step
        return current


@runtime_checkable
class Activating(Protocol):
    """A scaling policy driven as KEDA drives a ScaledObject: it sees the metric's *total*
    over the active replicas (plus the requests held while none is active) rather than its
    mean per replica, and a poll every ``polling_interval_s`` activates the fleet from zero
    or, after ``cooldown_s`` without activity, takes it to zero."""

    @property
    def activation(self) -> float:
        """The metric's total above which the fleet is active (scaled from zero, cooldown reset)."""

    @property
    def cooldown_s(self) -> float:
        """Time since the last active poll after which the fleet goes to zero, s."""

    @property
    def polling_interval_s(self) -> float:
        """Time between the activation polls, s."""


@scaling_policies.register("event")
@attrs.frozen(kw_only=True)
class EventDriven:
    """KEDA's ScaledObject on a queue-length trigger: ``ceil(total / target)`` replicas, where
    *seen* is the metric's total over the fleet; ``activation``, ``cooldown_s`` and
    ``polling_interval_s`` drive the moves to and from zero (:class:`Activating`; they need
    ``min_replicas: 0``, as in KEDA they only act on a scale to zero).

    >>> p = EventDriven(target=5.0)
    >>> p.desired(12.0, 1), p.desired(10.0, 7), p.desired(0.0, 3)
    (3, 2, 0)
    >>> p.activation, p.cooldown_s, p.polling_interval_s
    (0.0, 300.0, 30.0)
    """

    target: float = attrs.field(validator=greater_than(0))
    """The metric's value per replica to hold (KEDA's ``value`` of an ``AverageValue`` trigger)."""
    activation: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(1e9)))
    """The total above which the fleet is active (KEDA's ``activationValue``, default 0)."""
    cooldown_s: float = attrs.field(default=300.0, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """Time after the last active poll before scaling to zero, s (KEDA's ``cooldownPeriod``, default 300)."""
    polling_interval_s: float = attrs.field(default=30.0, validator=all_of(at_least(MIN_PERIOD_S), at_most(MAX_TIME_S)))
    """Time between activation polls, s (KEDA's ``pollingInterval``, default 30)."""

    def desired(self, seen: float, current: int) -> int:
        return math.ceil(seen / self.target - 1e-9)  # 30 / 10 in floats may round up past 3
