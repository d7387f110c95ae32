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
share of requests running fused). Every key changes what is simulated; a knob the
scenario's fleet cannot honour is rejected, naming it.
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

__all__ = ["NAMED_OBJECTIVES", "PlannerCandidates", "PlannerConfig", "check_planner"]

NAMED_OBJECTIVES = ("goodput_per_gpu", "goodput")
"""``planner.objective`` values besides a summary path: requests meeting their SLO per second
per GPU in use, and per second."""
MAX_CANDIDATES = 256
"""Most candidate configurations a tick may evaluate (each one is a what-if simulation)."""
KNOBS = ("active_replicas", "prefill_replicas", "decode_replicas", "max_num_seqs", "gamma", "fused_fraction")
"""The knobs the planner can turn at run time, in the order a configuration lists them."""


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

    def combinations(self) -> list[dict[str, float]]:
        """Every combination, as ``{knob: value}``, in the lists' order (last knob fastest).

        >>> PlannerCandidates(active_replicas=[1, 2], max_num_seqs=[8]).combinations()
        [{'active_replicas': 1, 'max_num_seqs': 8}, {'active_replicas': 2, 'max_num_seqs': 8}]
        """
        knobs = self.knobs()
        return [dict(zip(knobs, values, strict=True)) for values in itertools.product(*(getattr(self, k) for k in knobs))]


def _objective(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise FieldValueError(attr.name, f"must be one of {', '.join(NAMED_OBJECTIVES)} or a summary path (prefix '-' to minimise)")


def _constraints(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    for path, bound in value.items():
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound != bound:
            raise FieldValueError(f"{attr.name}.{path}", f"must be a number (the metric's upper bound), got {bound!r}")


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

    def __attrs_post_init__(self) -> None:
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
