"""The ``autoscaler`` section of a scenario: a metric-driven autoscaler in the manner of
Kubernetes' Horizontal Pod Autoscaler (``docs/autoscaling.md``,
:mod:`simpy_llm.serving.autoscaler`)::

    autoscaler:
      metric: queue_depth            # per active replica: queue_depth, running, in_system, kv_usage, arrival_rate;
                                     # or the window's TTFTs: ttft_p90, ttft_mean
      policy: {kind: target, params: {target: 4}}   # or {kind: threshold, params: {high: 8, low: 2}},
                                     # or KEDA's {kind: event, params: {target: 4, activation: 0, cooldown_s: 300, polling_interval_s: 30}}
      sample_interval_s: 5           # the metric is sampled this often
      lag_s: 10                      # and seen this late (scrape and adapter delay)
      window_s: 30                   # averaged over this many seconds of samples
      sync_period_s: 15              # a scaling decision this often
      min_replicas: 1                # 0: scale to zero (policy event, metric queue_depth or in_system)
      max_replicas: 8                # default: every replica of the fleet
      initial_replicas: 2            # default: min_replicas
      scale_down_stabilization_s: 300
      scale_up_stabilization_s: 0

The autoscaler sizes a co-located fleet's active pool (the first *n* replicas receive newly
routed requests), as the planner's ``active_replicas`` knob does; a replica it adds pays its
cold start (a device's ``cold_start``, ``weights_from``) when work first reaches it, and one it
removes finishes what it holds. With ``min_replicas: 0`` the fleet may go to zero replicas;
requests arriving then wait in front of the router until a poll activates the fleet. Every
key changes what is simulated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NewType, TypeAlias

import attrs

from simpy_llm.config.common import PolicySpec
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import MAX_REPLICAS, MAX_TIME_S, MIN_PERIOD_S, all_of, at_least, at_most, one_of, optional

__all__ = ["AUTOSCALER_METRICS", "TTFT_METRICS", "ZERO_METRICS", "ZERO_PARAMS", "ZERO_POLICY", "AutoscalerConfig", "ScalingSpec", "check_autoscaler"]

if TYPE_CHECKING:
    ScalingSpec: TypeAlias = PolicySpec
else:
    ScalingSpec = NewType("ScalingSpec", PolicySpec)
    """A :class:`PolicySpec` naming a scaling policy (:mod:`simpy_llm.policies.scaling`)."""

AUTOSCALER_METRICS = ("queue_depth", "running", "in_system", "kv_usage", "arrival_rate", "ttft_p90", "ttft_mean")
"""What the autoscaler can watch. The first five are averaged over the active replicas at the
sample: requests waiting, requests in the running batch, both, the share of KV blocks in use,
and requests routed per second since the previous sample. ``ttft_p90`` and ``ttft_mean`` are
the 90th percentile and the mean of the time to first token, s, of the requests whose first
token came in a decision's window (:data:`TTFT_METRICS`)."""

TTFT_METRICS = ("ttft_p90", "ttft_mean")
"""The metrics read from first-token times rather than from the replicas' state."""

ZERO_METRICS = ("queue_depth", "in_system")
"""The metrics that can activate a fleet at zero replicas: they count the requests held
while none is active (the others read replicas or first tokens there are none of)."""

ZERO_POLICY = "event"
"""The scaling policy that can take the fleet to zero and back (KEDA's activation)."""

ZERO_PARAMS = ("activation", "cooldown_s", "polling_interval_s")
"""The ``event`` policy's parameters that act only on moves to and from zero."""


@attrs.frozen(kw_only=True)
class AutoscalerConfig:
    """A metric-driven autoscaler of a co-located fleet's active replicas (module docstring)."""

    policy: ScalingSpec
    """The scaling policy (:mod:`simpy_llm.policies.scaling`): ``target`` (desired =
    ceil(current x seen / target), Kubernetes' formula) or ``threshold`` (one step up above
    ``high``, one down below ``low``), ``event`` (KEDA: desired = ceil(total / target), and
    the moves to and from zero), or a registered one."""
    metric: str = attrs.field(default="queue_depth", validator=one_of(AUTOSCALER_METRICS))
    """The metric the policy sees (:data:`AUTOSCALER_METRICS`)."""
    sample_interval_s: float = attrs.field(default=5.0, validator=all_of(at_least(MIN_PERIOD_S), at_most(MAX_TIME_S)))
    """Time between samples of the metric, s (a TTFT metric: between collections of the
    first tokens that came since the previous one)."""
    lag_s: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """How late a sample is seen, s: a decision at ``t`` sees the samples taken up to ``t - lag_s``."""
    window_s: float = attrs.field(default=30.0, validator=all_of(at_least(MIN_PERIOD_S), at_most(MAX_TIME_S)))
    """A decision averages the samples taken in ``(t - lag_s - window_s, t - lag_s]``, s."""
    sync_period_s: float = attrs.field(default=15.0, validator=all_of(at_least(MIN_PERIOD_S), at_most(MAX_TIME_S)))
    """Time between scaling decisions, s."""
    first_sync_s: float | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_TIME_S))))
    """The first decision's time, s (default: ``sync_period_s``)."""
    min_replicas: int = attrs.field(default=1, validator=all_of(at_least(0), at_most(MAX_REPLICAS)))
    """Fewest active replicas (0: scale to zero, with the ``event`` policy)."""
    max_replicas: int | None = attrs.field(default=None, validator=optional(all_of(at_least(1), at_most(MAX_REPLICAS))))
    """Most active replicas (default: every replica of the fleet)."""
    initial_replicas: int | None = attrs.field(default=None, validator=optional(all_of(at_least(0), at_most(MAX_REPLICAS))))
    """Active replicas at time 0 (default: ``min_replicas``)."""
    scale_down_stabilization_s: float = attrs.field(default=300.0, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """A scale-down goes no lower than the highest recommendation of this many seconds (Kubernetes' default 300)."""
    scale_up_stabilization_s: float = attrs.field(default=0.0, validator=all_of(at_least(0), at_most(MAX_TIME_S)))
    """A scale-up goes no higher than the lowest recommendation of this many seconds (Kubernetes' default 0)."""

    def __attrs_post_init__(self) -> None:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise FieldValueError("max_replicas", f"must be >= min_replicas ({self.min_replicas}); got {self.max_replicas}")
        if self.initial_replicas is not None:
            top = self.max_replicas if self.max_replicas is not None else MAX_REPLICAS
            if not self.min_replicas <= self.initial_replicas <= top:
                bounds = f"[min_replicas, max_replicas] = [{self.min_replicas}, {top}]"
                raise FieldValueError("initial_replicas", f"must lie in {bounds}; got {self.initial_replicas}")
        params = self.policy.params
        if self.policy.kind == ZERO_POLICY and self.metric in TTFT_METRICS:
            raise FieldValueError("metric", f"policy {ZERO_POLICY!r} scales on a total over the replicas, a latency is none; got {self.metric!r}")
        if self.min_replicas == 0:
            if self.policy.kind != ZERO_POLICY:
                why = "whose activation brings the fleet back"
                raise FieldValueError("min_replicas", f"0 (scale to zero) needs policy kind {ZERO_POLICY!r}, {why}; got {self.policy.kind!r}")
            if self.metric not in ZERO_METRICS:
                allowed = ", ".join(ZERO_METRICS)
                raise FieldValueError("metric", f"with min_replicas 0 must be one of {allowed} (they count the requests held); got {self.metric!r}")
            activation = params.get("activation", 0.0)
            if isinstance(activation, (int, float)) and activation >= 1:
                why = "a request held at zero always activates the fleet"
                raise FieldValueError("policy.params.activation", f"with min_replicas 0 must be below 1 ({why}); got {activation}")
        elif self.policy.kind == ZERO_POLICY:
            for key in ZERO_PARAMS:
                if key in params:
                    raise FieldValueError(f"policy.params.{key}", "acts only on scaling to zero: set min_replicas 0, or drop it")


def check_autoscaler(scenario: object) -> None:
    """What the autoscaler needs of the scenario (called by :class:`~simpy_llm.config.schema.Scenario`):
    a single co-located fleet of enough replicas, and no planner resizing it too.

    Raises
    ------
    FieldValueError
        Naming the ``autoscaler`` key the scenario cannot honour.
    """
    config: AutoscalerConfig = scenario.autoscaler  # type: ignore[attr-defined]  # called only by Scenario, which has one
    serving = scenario.serving  # type: ignore[attr-defined]  # as above
    if scenario.planner is not None:  # type: ignore[attr-defined]  # as above
        raise FieldValueError("autoscaler", "and a planner would both resize the fleet: give one or the other")
    if serving.clusters:
        raise FieldValueError("autoscaler", "not supported yet with serving.clusters: give a single fleet")
    if serving.disaggregation is not None:
        raise FieldValueError("autoscaler", "sizes a co-located fleet; a disaggregated one is not supported yet")
    if config.min_replicas == 0 and serving.gateway is not None:
        why = "the gateway dispatches to live replicas"
        raise FieldValueError("autoscaler.min_replicas", f"0 (scale to zero) is not modelled with serving.gateway yet: {why}")
    replicas = sum(group.count for group in serving.groups())
    for key in ("min_replicas", "max_replicas", "initial_replicas"):
        value = getattr(config, key)
        if value is not None and value > replicas:
            raise FieldValueError(f"autoscaler.{key}", f"must be at most the fleet's {replicas} replica(s); got {value}")
