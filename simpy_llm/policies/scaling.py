"""Scaling policies: how many replicas the autoscaler recommends (``docs/autoscaling.md``).

A scaling policy implements ``desired(seen, current) -> int``: *seen* is the metric the
autoscaler saw (its samples' mean, each sample averaged over the replicas active then) and
*current* the replicas active now; it returns the replicas it recommends. The autoscaler then
applies its stabilisation windows and its bounds. A policy never yields and never touches the
environment. Register one with ``@scaling_policies.register("name")`` and name it in the
scenario (``autoscaler.policy: {kind: name, params: {...}}``).

Built-in: ``target`` (:class:`TargetValue`, Kubernetes' Horizontal Pod Autoscaler) and
``threshold`` (:class:`Thresholds`, a step at a time).
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import at_least, greater_than, in_range
from simpy_llm.registry import Registry

__all__ = ["ScalingPolicy", "TargetValue", "Thresholds", "scaling_policies"]

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
