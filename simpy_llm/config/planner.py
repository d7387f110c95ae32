"""The ``planner`` section of a scenario: a periodic goodput maximiser (seed 003 §6.3).

Every ``interval_s`` the planner takes the requests that arrived in the last
``window_s``, replays them through a short what-if simulation of each candidate
configuration, and applies the best feasible one to newly routed work
(``docs/planner.md``, :mod:`simpy_llm.serving.planner`)::

    planner:
      interval_s: 20
      window_s: 20
      objective: goodput_per_gpu     # or goodput, or a summary path: -latency_s.ttft.p99
      constraints: {latency_s.ttft.p95: 0.5}
      candidates:
        active_replicas: [1, 2, 3, 4]
        max_num_seqs: [64, 256]

With a ``speculation`` section the planner also tunes speculative decoding for newly
started requests: ``gamma`` (a static speculation length) and ``fused_fraction`` (the
share of requests running fused). ``parallelism`` lets it choose the replicas'
tensor-parallel degree within the fleet's GPUs, and ``ticks`` adds ticks when a trigger
condition becomes true between the cadence's. Every key changes what is simulated; a
knob the scenario's fleet cannot honour is rejected, naming it.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.validators import (
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_TIME_S,
    MIN_PERIOD_S,
    all_of,
    at_least,
    at_most,
    in_range,
    optional,
)

__all__ = ["NAMED_OBJECTIVES", "Parallelism", "PlannerCandidates", "PlannerConfig", "PlannerTicks", "TickTriggers", "check_planner"]

NAMED_OBJECTIVES = ("goodput_per_gpu", "goodput")
"""``planner.objective`` values besides a summary path: requests meeting their SLO per second
per GPU in use, and per second."""
MAX_CANDIDATES = 256
"""Most candidate configurations a tick may evaluate (each one is a what-if simulation)."""
KNOBS = ("active_replicas", "prefill_replicas", "decode_replicas", "parallelism", "max_num_seqs", "gamma", "fused_fraction")
"""The knobs the planner can turn at run time, in the order a configuration lists them
(``parallelism`` by its tensor-parallel degree)."""
MAX_TP = 64
"""Largest tensor-parallel degree a parallelism candidate may name."""


def _int_list(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _values(low: int, high: int) -> Any:
    """Validator: a non-empty list of distinct integers in [low, high], or None."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, tuple) or not value:
            raise FieldValueError(attr.name, "must be a non-empty list of values to evaluate")
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise FieldValueError(f"{attr.name}[{i}]", f"must be an integer in [{low}, {high}], got {v!r}")
        if len(set(value)) != len(value):
            raise FieldValueError(attr.name, f"lists a value twice: {list(value)}")

    return check


def _fractions(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """Validator: a non-empty list of distinct numbers in [0, 1], or None."""
    if value is None:
        return
    if not isinstance(value, tuple) or not value:
        raise FieldValueError(attr.name, "must be a non-empty list of values to evaluate")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a number in [0, 1], got {v!r}")
    if len(set(value)) != len(value):
        raise FieldValueError(attr.name, f"lists a value twice: {list(value)}")


def _float_list(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value)
    return value


@attrs.frozen(kw_only=True)
class Parallelism:
    """One parallelism candidate: the tensor-parallel degree of every replica (``{tp: 2}``).

    Only tensor parallelism is offered: the planner rebuilds a replica's latency model at each
    candidate's TP degree (``roofline``, ``profile``, ``blis_linear`` with a profile); pipeline
    stages (``roofline``'s ``pp``) are not a planner knob, so a ``pp`` key is refused as unknown.

    >>> Parallelism(tp=2)
    Parallelism(tp=2)
    """

    tp: int = attrs.field(validator=all_of(at_least(1), at_most(MAX_TP)))
    """Tensor-parallel degree: GPUs per replica."""


def _parallelism_list(value: Any) -> Any:
    """A list of ``{tp: n}`` mappings (from Python; YAML's are structured already) as a tuple."""
    if isinstance(value, list):
        return tuple(Parallelism(**v) if isinstance(v, dict) else v for v in value)
    return value


def _parallelisms(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """Validator: a non-empty list of distinct :class:`Parallelism`, or None."""
    if value is None:
        return
    if not isinstance(value, tuple) or not value:
        raise FieldValueError(attr.name, "must be a non-empty list of parallelism plans such as {tp: 2}")
    for i, v in enumerate(value):
        if not isinstance(v, Parallelism):
            raise FieldValueError(f"{attr.name}[{i}]", f"must be a mapping such as {{tp: 2}}, got {v!r}")
    tps = [v.tp for v in value]
    if len(set(tps)) != len(tps):
        raise FieldValueError(attr.name, f"lists a tp twice: {tps}")


@attrs.frozen(kw_only=True)
class PlannerCandidates:
    """The values each knob may take; the candidates are every combination of them.

    A knob left out keeps the scenario's setting.
    """

    active_replicas: tuple[int, ...] | None = attrs.field(
        default=None, converter=_int_list, validator=_values(1, MAX_REPLICAS)
    )
    """Replicas the router may send new requests to (the first *n* of a co-located fleet,
    in fleet order); at most ``serving.replicas``."""
    prefill_replicas: tuple[int, ...] | None = attrs.field(
        default=None, converter=_int_list, validator=_values(1, MAX_REPLICAS)
    )
    """Prefill replicas the entry router may use (the first *n* of a disaggregated fleet's
    prefill pool); at most the pool's size."""
    decode_replicas: tuple[int, ...] | None = attrs.field(
        default=None, converter=_int_list, validator=_values(1, MAX_REPLICAS)
    )
    """Decode replicas hand-offs may go to (the first *n* of the decode pool)."""
    parallelism: tuple[Parallelism, ...] | None = attrs.field(
        default=None, converter=_parallelism_list, validator=_parallelisms
    )
    """Tensor-parallel degrees of a co-located fleet's replicas (``[{tp: 1}, {tp: 2}]``):
    every group's latency model is rebuilt at the degree and its GPUs kept, so a group of
    *n* replicas at tp *t0* runs ``n t0 / tp`` replicas (``docs/planner.md``). Excludes
    ``active_replicas`` (the GPU budget sets the replicas)."""
    max_num_seqs: tuple[int, ...] | None = attrs.field(
        default=None, converter=_int_list, validator=_values(1, 2**20)
    )
    """Batch limit of every replica: requests it may hold running (newly admitted ones wait
    while it holds that many)."""
    gamma: tuple[int, ...] | None = attrs.field(default=None, converter=_int_list, validator=_values(1, 64))
    """Speculation length, tokens: a request starting on its draft device runs a static γ of
    this value (``StaticGamma``) in place of ``speculation.gamma_policy``; within
    ``[speculation.k_min, speculation.k_max]``. Needs ``speculation``."""
    fused_fraction: tuple[float, ...] | None = attrs.field(default=None, converter=_float_list, validator=_fractions)
    """Share of newly admitted requests that run fused (the rest distributed), in [0, 1],
    in place of the mode selector's choice; spread evenly over the admissions
    (``docs/planner.md``). Needs ``speculation.fused``."""

    def __attrs_post_init__(self) -> None:
        if not self.knobs():
            raise FieldValueError("", f"name at least one knob: {', '.join(KNOBS)}")
        if self.parallelism is not None and self.active_replicas is not None:
            raise FieldValueError(
                "parallelism", "excludes active_replicas: a parallelism plan sets the replicas (GPUs / tp); drop one of the two"
            )
        if self.count() > MAX_CANDIDATES:
            raise FieldValueError("", f"{self.count()} combinations; at most {MAX_CANDIDATES} (each is a what-if simulation per tick)")

    def knobs(self) -> tuple[str, ...]:
        """The knobs given, in :data:`KNOBS` order."""
        return tuple(k for k in KNOBS if getattr(self, k) is not None)

    def count(self) -> int:
        """Number of combinations."""
        n = 1
        for k in self.knobs():
            n *= len(getattr(self, k))
        return n

    def values(self, knob: str) -> tuple[float, ...]:
        """The values *knob* may take, as numbers (a parallelism plan by its ``tp``).

        >>> PlannerCandidates(parallelism=[{"tp": 1}, {"tp": 2}]).values("parallelism")
        (1, 2)
        """
        if knob == "parallelism":
            return tuple(p.tp for p in self.parallelism or ())
        return tuple(getattr(self, knob))

    def combinations(self) -> list[dict[str, float]]:
        """Every combination, as ``{knob: value}``, in the lists' order (last knob fastest).

        >>> PlannerCandidates(active_replicas=[1, 2], max_num_seqs=[8]).combinations()
        [{'active_replicas': 1, 'max_num_seqs': 8}, {'active_replicas': 2, 'max_num_seqs': 8}]
        """
        knobs = self.knobs()
        return [dict(zip(knobs, values, strict=True)) for values in itertools.product(*(self.values(k) for k in knobs))]


def _objective(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise FieldValueError(attr.name, f"must be one of {', '.join(NAMED_OBJECTIVES)} or a summary path (prefix '-' to minimise)")


def _constraints(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    for path, bound in value.items():
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound != bound:
            raise FieldValueError(f"{attr.name}.{path}", f"must be a number (the metric's upper bound), got {bound!r}")


def _count(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REQUESTS):
        raise FieldValueError(attr.name, f"must be an integer in [1, {MAX_REQUESTS}] (requests), got {value!r}")


@attrs.frozen(kw_only=True)
class TickTriggers:
    """Conditions that fire a tick when they become true (``planner.ticks.on``).

    >>> TickTriggers(queue_over=64).names()
    ('queue_over',)
    """

    queue_over: int | None = attrs.field(default=None, validator=_count)
    """A replica's waiting requests reach this many (checked as each request reaches a
    replica; it fires again only after that replica has been seen below it)."""
    arrival_burst: int | None = attrs.field(default=None, validator=_count)
    """This many requests have reached the fleet's entry replicas since the last tick."""

    def __attrs_post_init__(self) -> None:
        if not self.names():
            raise FieldValueError("", "name at least one trigger: queue_over, arrival_burst")

    def names(self) -> tuple[str, ...]:
        """The triggers given."""
        return tuple(n for n in ("queue_over", "arrival_burst") if getattr(self, n) is not None)


@attrs.frozen(kw_only=True)
class PlannerTicks:
    """Ticks on events as well as on the cadence (``planner.ticks``).

    >>> PlannerTicks(on=TickTriggers(queue_over=64), min_gap_s=2).min_gap_s
    2.0
    """

    on: TickTriggers
    """The trigger conditions."""
    min_gap_s: float = attrs.field(default=1.0, converter=float, validator=in_range(MIN_PERIOD_S, MAX_TIME_S))
    """Least time between two ticks, s: a condition that becomes true sooner after the last
    tick fires its tick this long after it."""


@attrs.frozen(kw_only=True)
class PlannerConfig:
    """A periodic planner: what-if simulations of candidate configurations, the best applied.

    Examples
    --------
    >>> p = PlannerConfig(interval_s=10, candidates=PlannerCandidates(active_replicas=[1, 2]))
    >>> p.window_s, p.objective, p.candidates.count()
    (10.0, 'goodput_per_gpu', 2)
    """

    interval_s: float = attrs.field(converter=float, validator=in_range(MIN_PERIOD_S, MAX_TIME_S))
    """Time between ticks, s."""
    candidates: PlannerCandidates
    """The knobs and the values they may take."""
    window_s: float | None = attrs.field(default=None, validator=optional(in_range(MIN_PERIOD_S, MAX_TIME_S)))
    """Recent arrivals each what-if replays, s (default: ``interval_s``)."""
    first_tick_s: float | None = attrs.field(default=None, validator=optional(in_range(0.0, MAX_TIME_S)))
    """Time of the first tick, s (default: ``interval_s``)."""
    min_requests: int = attrs.field(default=1, validator=all_of(at_least(1), at_most(MAX_REQUESTS)))
    """A tick with fewer arrivals in its window evaluates nothing and changes nothing."""
    objective: str = attrs.field(default="goodput_per_gpu", validator=_objective)
    """Maximised over the feasible candidates: ``goodput_per_gpu`` (requests meeting their
    SLO per second per GPU the candidate uses), ``goodput`` (per second), or a numeric
    path into the what-if's :class:`~simpy_llm.metrics.summary.Summary` (``throughput.requests_per_s``;
    ``-latency_s.ttft.p99`` to minimise)."""
    constraints: dict[str, float] = attrs.field(factory=dict, validator=_constraints)
    """Upper bounds on what-if summary metrics (``latency_s.ttft.p95: 0.5``); a candidate
    that exceeds one, or whose metric is undefined (no completed request), is infeasible."""
    ticks: PlannerTicks | None = None
    """Ticks also when a condition becomes true (queue over a bound, a burst of arrivals),
    at most one per ``ticks.min_gap_s``; the cadence then counts from the last tick
    (``docs/planner.md``). None: ticks on the cadence only."""

    def __attrs_post_init__(self) -> None:
        if self.ticks is not None and self.ticks.min_gap_s > self.interval_s:
            raise FieldValueError("ticks.min_gap_s", f"{self.ticks.min_gap_s:g} exceeds interval_s ({self.interval_s:g}): a trigger could never fire")
        if self.window_s is None:
            object.__setattr__(self, "window_s", self.interval_s)
        if self.first_tick_s is None:
            object.__setattr__(self, "first_tick_s", self.interval_s)


def check_planner(scenario: Any) -> None:
    """What the planner's knobs need of the fleet (called by :class:`~simpy_llm.config.schema.Scenario`).

    Raises
    ------
    FieldValueError
        Naming the ``planner`` key the scenario cannot honour.
    """
    planner: PlannerConfig = scenario.planner
    serving = scenario.serving
    cand = planner.candidates
    spec = scenario.speculation
    _check_speculation_knobs(cand, spec)
    if serving.clusters:
        raise FieldValueError("planner", "not supported yet with serving.clusters: give a single fleet")
    dis = serving.disaggregation
    pools = {"prefill": 0, "decode": 0, "both": 0}
    for group in serving.groups():
        pools[group.role] += group.count
    if cand.active_replicas is not None:
        if dis is not None:
            raise FieldValueError(
                "planner.candidates.active_replicas",
                "a disaggregated fleet sizes its pools: use prefill_replicas and decode_replicas",
            )
        _within(cand.active_replicas, "active_replicas", pools["both"], "serving's replicas")
    for pool in ("prefill", "decode"):
        values = getattr(cand, f"{pool}_replicas")
        if values is None:
            continue
        if dis is None:
            raise FieldValueError(f"planner.candidates.{pool}_replicas", "needs serving.disaggregation; a co-located fleet uses active_replicas")
        _within(values, f"{pool}_replicas", pools[pool], f"the {pool} pool's replicas")
    if cand.parallelism is not None:
        if dis is not None:
            raise FieldValueError("planner.candidates.parallelism", "not supported yet with serving.disaggregation: give a co-located fleet")
        for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
            if group.batch_server is not None:
                raise FieldValueError(
                    "planner.candidates.parallelism", f"serving.{path}batch_server: a batch server's latency model is not rebuilt per tp"
                )
    if cand.max_num_seqs is not None:
        for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
            if group.batch_server is not None:
                raise FieldValueError("planner.candidates.max_num_seqs", f"serving.{path}batch_server has no continuous-batching limit to change")


def _check_speculation_knobs(cand: PlannerCandidates, spec: Any) -> None:
    """``gamma`` and ``fused_fraction`` need a ``speculation`` section that can honour them."""
    for knob in ("gamma", "fused_fraction"):
        if getattr(cand, knob) is not None and spec is None:
            raise FieldValueError(f"planner.candidates.{knob}", "needs a speculation section (speculative decoding's knob)")
    if spec is None:
        return
    if cand.gamma is not None:
        for i, g in enumerate(cand.gamma):
            if not spec.k_min <= g <= spec.k_max:
                raise FieldValueError(
                    f"planner.candidates.gamma[{i}]", f"{g} is outside [speculation.k_min, speculation.k_max] = [{spec.k_min}, {spec.k_max}]"
                )
    if cand.fused_fraction is not None and spec.fused is None:
        raise FieldValueError(
            "planner.candidates.fused_fraction",
            f"needs fused rounds: speculation.mode hybrid (or fused) with a speculation.fused section; mode is {spec.mode} without one",
        )


def _within(values: tuple[int, ...], knob: str, size: int, what: str) -> None:
    if max(values) > size:
        raise FieldValueError(f"planner.candidates.{knob}", f"{max(values)} exceeds {what} ({size}): the fleet is built at its largest size")
