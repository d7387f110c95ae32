"""Capacity: the largest load a serving system sustains, and the fleet a load needs.

:func:`max_stable_load` fixes a scenario's policies and hardware and searches the
offered load (by default ``workload.aggregate_rate``, requests/s) for two limits:

* the **max stable load**: the largest load whose queue does not grow (the
  backlog over the measurement window grows by less than a set share of the
  arrivals) and that drops no more than a set share of requests;
* the **max SLO-goodput load**: the largest load that is stable *and* meets every
  SLO criterion given (a percentile or mean of a latency metric, optionally of one
  SLO class) and the goodput attainment asked for.

:func:`min_replicas` answers the converse question: the fewest replicas that meet
the same criteria at a given load.

How a load is judged (a *probe*)
--------------------------------
A probe runs the scenario at that load for ``warmup_requests + measure_requests``
requests (or ``warmup_s + measure_s`` seconds of arrivals). The first part is
warm-up: nothing in it is judged. The **measurement window** runs from the first
measured arrival to the last arrival (or from ``warmup_s`` to the end of the
horizon); after it the run drains its backlog so every measured request
finishes. In the window:

* *backlog growth* = (requests in the system at the window's end - at its start)
  / arrivals in the window, a request leaving the system when it completes or is
  dropped (a dropped request without a completion time leaves at its arrival);
* *drop fraction* = dropped / measured requests;
* each SLO criterion's statistic is taken over the measured requests that completed
  (of its SLO class, when it names one);
* *goodput fraction* = the share of measured completed requests meeting the
  scenario's own per-class SLO targets (``slo:`` in the scenario: TTFT and E2E as
  the client sees them, TPOT, and TVT with speculative decoding).

Three figures tell how much room a probe left; the first is not headroom:

* *busy fraction*: the share of the run (warm-up and drain included) the replicas'
  engines spent running steps, averaged over the replicas. A continuous-batching
  engine steps whenever it holds one request, so at any load that keeps one request
  in service it reads close to 1, at a third of capacity as at capacity: it says
  the engine never idles, not that it is full;
* *batch occupancy*: the time-weighted mean number of requests in service (from
  their first schedule to their completion) over the measurement window, divided by
  the fleet's batch slots (``max_num_seqs`` summed over the replicas). By Little's
  law it is load x time in service / slots; it reaches 1 only when every slot is
  taken all the time. It is NaN for fleets whose slots are not ``max_num_seqs`` of
  co-located replicas (request-level batch servers, disaggregated pools, speculative
  decoding's verify servers, a planner changing the fleet);
* *KV occupancy*: the KV cache's time-weighted use (used blocks over blocks, the
  summary's ``kv_utilization``), over the run, averaged over the replicas. Slots are
  not always what runs out first: long prompts fill the KV cache with slots to
  spare, and then preemptions, not a full batch, end the stable range. The tighter
  of the two occupancies is the headroom.

**Early pruning.** While a probe runs, the requests in the system are checked
every 1/200 of its expected duration; as soon as they exceed
:attr:`StabilityCriteria.prune_backlog` the probe stops and the load is judged
unstable (a stable queue essentially never holds that many). And no load is
probed twice: a load at or above one known unstable is unstable, a load at or
below one known to meet every criterion meets them (both limits are taken to be
monotone in the load).

The search
----------
From ``low`` (default: the scenario's own load) the search doubles the load
until a probe fails (or halves it until one succeeds), unless ``high`` closes
the bracket; then it bisects between the largest passing and the smallest failing
load until ``upper / lower - 1 <= tolerance``. It does so for the SLO criteria
first, then for stability alone, reusing every probe. With several seeds a load
passes only if it passes under every seed (a failing seed ends the load's
probes). The reported limit is the bracket's lower end: the largest load seen to
pass.

Examples
--------
A single FIFO server with constant 40 ms service (M/D/1, mu = 25 requests/s):

>>> scenario = {
...     "seed": 1,
...     "workload": {"aggregate_rate": 10.0, "num_requests": 100, "clients": [{
...         "id": "only", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
...         "input_distribution": {"type": "constant", "params": {"value": 3500}},
...         "output_distribution": {"type": "constant", "params": {"value": 1}}}]},
...     "serving": {"replicas": 1,
...         "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "chunked_prefill": False},
...         "latency_model": {"kind": "blis_linear", "params": {
...             "beta0_us": 5000.0, "beta1_us": 10.0, "beta2_us": 1.0}}}}
>>> card = max_stable_load(scenario, tolerance=0.05, warmup_requests=200, measure_requests=3000,
...                        criteria=StabilityCriteria(slo={"queue_delay_mean": 0.08}))
>>> 22 < card.max_stable_load <= 26, 18 < card.max_goodput_load < 22  # mu = 25; PK gives 20 for Wq = 0.08 s
(True, True)
>>> card.upper_stable_load / card.max_stable_load - 1 <= 0.05
True
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from simpy_llm.workload.checks import check_spec_files, request_slo_classes

if TYPE_CHECKING:
    import pandas as pd

    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.results import Results

__all__ = [
    "CapacityCard",
    "Probe",
    "ReplicaCard",
    "SloCriterion",
    "StabilityCriteria",
    "check_slo_classes",
    "max_stable_load",
    "min_replicas",
]

SLO_METRICS = ("ttft", "tpot", "e2e", "queue_delay", "client_ttft", "client_e2e")
"""Latency metrics an SLO criterion may name (``Results.derived()`` without ``_s``)."""

_SLO_RE = re.compile(r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>mean|p\d+(?:\.\d+)?)(?:\[(?P<cls>[^\]]+)\])?$")

DEFAULT_WARMUP_REQUESTS = 1000
DEFAULT_MEASURE_REQUESTS = 10_000
MAX_BRACKET_STEPS = 30
"""Doublings or halvings the bracketing may take before giving up."""


# --- criteria ---------------------------------------------------------------
@attrs.frozen(kw_only=True)
class SloCriterion:
    """One SLO criterion of a capacity search: a statistic of a latency metric, over the
    measured requests, at most a bound.

    A criterion judges a load (a population of requests), not a request: the per-request
    targets of a scenario's SLO classes, which decide goodput, are
    :class:`~simpy_llm.config.schema.SLOTarget` (``min_goodput_fraction`` of
    :class:`StabilityCriteria` asks for a share of requests meeting those).

    Written ``METRIC_STAT[CLASS]=TARGET``: ``ttft_p99=0.5`` (the 99th percentile of
    TTFT at most 0.5 s), ``queue_delay_mean=0.08``, ``e2e_p95[interactive]=10``.

    Examples
    --------
    >>> t = SloCriterion.parse("ttft_p99[interactive]=0.5")
    >>> t.metric, t.statistic, t.slo_class, t.target_s, t.name
    ('ttft', 'p99', 'interactive', 0.5, 'ttft_p99[interactive]')
    >>> t.value(np.array([0.1, 0.2, 0.3]))
    0.298
    >>> SloCriterion.parse("latency_p99=1")
    Traceback (most recent call last):
    ...
    ValueError: SLO 'latency_p99=1': unknown metric 'latency'; allowed: ttft, tpot, e2e, queue_delay, client_ttft, client_e2e
    """

    metric: str = attrs.field()
    """A latency metric: one of :data:`SLO_METRICS`."""
    statistic: str = attrs.field()
    """``mean`` or a percentile ``pNN`` (``p50``, ``p99``, ``p99.9``; numpy's linear interpolation)."""
    target_s: float = attrs.field(converter=float)
    """The bound, s: the target is met when the statistic is at most this."""
    slo_class: str | None = None
    """Only requests of this SLO class count (None: every request)."""

    @metric.validator
    def _check_metric(self, _attribute: Any, value: str) -> None:
        if value not in SLO_METRICS:
            raise ValueError(f"unknown metric {value!r}; allowed: {', '.join(SLO_METRICS)}")

    @statistic.validator
    def _check_statistic(self, _attribute: Any, value: str) -> None:
        if value != "mean" and not (re.fullmatch(r"p\d+(\.\d+)?", value) and 0 <= float(value[1:]) <= 100):
            raise ValueError(f"unknown statistic {value!r}; allowed: mean or a percentile p0..p100 (p99, p99.9)")

    @target_s.validator
    def _check_target(self, _attribute: Any, value: float) -> None:
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"an SLO criterion's bound must be a finite number of seconds > 0, got {value!r}")

    @property
    def name(self) -> str:
        """``metric_statistic`` with ``[class]`` when it has one."""
        base = f"{self.metric}_{self.statistic}"
        return f"{base}[{self.slo_class}]" if self.slo_class else base

    @classmethod
    def parse(cls, text: str, target: float | None = None) -> SloCriterion:
        """``"ttft_p99=0.5"``, or a name ``"ttft_p99[cls]"`` and its *target* in seconds."""
        where = f"SLO {text!r}"
        if target is None:
            name, sep, raw = str(text).partition("=")
            if not sep:
                raise ValueError(f"{where}: write METRIC_STAT=SECONDS, e.g. ttft_p99=0.5 or queue_delay_mean[interactive]=0.1")
            try:
                target = float(raw)
            except ValueError:
                raise ValueError(f"{where}: the target {raw!r} is not a number of seconds") from None
        else:
            name = str(text)
        m = _SLO_RE.match(name.strip())
        if not m:
            raise ValueError(
                f"{where}: write METRIC_STAT[CLASS], e.g. ttft_p99, e2e_p95[interactive] or queue_delay_mean "
                f"(metrics: {', '.join(SLO_METRICS)}; statistics: mean, pNN)"
            )
        try:
            return cls(metric=m["metric"], statistic=m["stat"], target_s=target, slo_class=m["cls"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    def value(self, values: np.ndarray) -> float:
        """The statistic over *values* (NaNs left out; NaN when none is left)."""
        values = values[~np.isnan(values)]
        if not values.size:
            return math.nan
        if self.statistic == "mean":
            return float(values.mean())
        return float(np.percentile(values, float(self.statistic[1:])))


def _slo_criteria(value: Any) -> tuple[SloCriterion, ...]:
    """The ``slo`` of :class:`StabilityCriteria` from a mapping, strings or criteria."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return tuple(SloCriterion.parse(str(k), v) for k, v in value.items())
    if isinstance(value, (str, SloCriterion)):
        value = [value]
    out = []
    for item in value:
        out.append(item if isinstance(item, SloCriterion) else SloCriterion.parse(item))
    return tuple(out)


def check_slo_classes(criteria: StabilityCriteria, scenario: Scenario) -> None:
    """Each SLO criterion that names a class (``ttft_p99[interactive]``) names one that
    *scenario*'s requests can carry (:func:`~simpy_llm.workload.checks.request_slo_classes`):
    a class no request has would judge no request, and pass every load.

    Raises
    ------
    ValueError
        Naming the target, the unknown class and the scenario's classes.

    Examples
    --------
    >>> from simpy_llm.config import load_scenario
    >>> check_slo_classes(StabilityCriteria(slo="ttft_p99[interactve]=0.5"), load_scenario("scenarios/quickstart.yaml"))
    Traceback (most recent call last):
    ...
    ValueError: SLO 'ttft_p99[interactve]': unknown SLO class 'interactve'; the scenario's requests have: batch, interactive
    """
    named = [t for t in criteria.slo if t.slo_class is not None]
    if not named:
        return
    known = request_slo_classes(scenario)
    for target in named:
        if target.slo_class not in known:
            raise ValueError(
                f"SLO {target.name!r}: unknown SLO class {target.slo_class!r}; the scenario's requests have: {', '.join(known)}"
            )


def _check_before_probes(criteria: StabilityCriteria, scenario: Scenario) -> None:
    """The files *scenario* references (:func:`~simpy_llm.workload.checks.check_spec_files`)
    and the classes its SLO criteria name, before the first probe."""
    check_spec_files(scenario)
    check_slo_classes(criteria, scenario)


def _fraction_or_none(_instance: Any, attribute: Any, value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1] (or None), got {value!r}")


@attrs.frozen(kw_only=True)
class StabilityCriteria:
    """What a load must satisfy (see :mod:`simpy_llm.explore.capacity` for each measure).

    Stability alone is :attr:`max_backlog_growth`, :attr:`max_drop_fraction` and the
    pruning bound; the SLO criteria (:attr:`slo`, :attr:`min_goodput_fraction`) are
    judged on stable loads only: an unstable load fails them by definition.

    Examples
    --------
    >>> c = StabilityCriteria(slo={"ttft_p99": 0.5, "queue_delay_mean[batch]": 2}, min_goodput_fraction=0.9)
    >>> [t.name for t in c.slo], c.has_slo
    (['ttft_p99', 'queue_delay_mean[batch]'], True)
    >>> StabilityCriteria(max_backlog_growth=0)
    Traceback (most recent call last):
    ...
    ValueError: max_backlog_growth must be in (0, 1], got 0
    """

    max_backlog_growth: float = attrs.field(default=0.01)
    """Largest backlog growth over the measurement window, as a share of the window's
    arrivals (0.01: the system keeps up with 99% of what arrives), in (0, 1]."""
    max_drop_fraction: float | None = attrs.field(default=0.01, validator=_fraction_or_none)
    """Largest share of measured requests dropped (None: drops do not count)."""
    prune_backlog: int | None = attrs.field(default=None)
    """Requests in the system beyond which a probe stops at once, judged unstable (None:
    ``max(100, n / 4)`` for a probe of *n* requests, warm-up included, or without a
    request count ``n = load * (warmup_s + measure_s)``). A stable system holds about
    ``load * latency`` requests (Little's law), which the bound must leave room for: a
    quarter of the probe's requests in the system at once means the latency is a quarter
    of the whole run, too long for the run to judge; an overloaded one passes it once its
    backlog has grown by that much."""
    slo: tuple[SloCriterion, ...] = attrs.field(default=(), converter=_slo_criteria)
    """SLO criteria: a mapping ``{"ttft_p99": 0.5}``, strings ``"ttft_p99=0.5"`` or
    :class:`SloCriterion` objects; every one must be met."""
    min_goodput_fraction: float | None = attrs.field(default=None, validator=_fraction_or_none)
    """Smallest share of measured completed requests that meet the scenario's own
    per-class SLO targets (None: not judged)."""

    @max_backlog_growth.validator
    def _check_growth(self, _attribute: Any, value: float) -> None:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"max_backlog_growth must be in (0, 1], got {value!r}")

    @prune_backlog.validator
    def _check_prune(self, _attribute: Any, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"prune_backlog must be an integer >= 1 (or None), got {value!r}")

    @property
    def has_slo(self) -> bool:
        """Whether any SLO criterion is set (else the two limits coincide)."""
        return bool(self.slo) or self.min_goodput_fraction is not None

    def describe(self) -> str:
        """The criteria in one line, as the cards print them.

        >>> StabilityCriteria(slo={"ttft_p99": 0.5}).describe()
        'backlog growth <= 0.01 of arrivals, drops <= 0.01; SLO: ttft_p99 <= 0.5 s'
        """
        slo = ", ".join(f"{t.name} <= {t.target_s:g} s" for t in self.slo) or "none"
        return (
            f"backlog growth <= {self.max_backlog_growth:g} of arrivals"
            + (f", drops <= {self.max_drop_fraction:g}" if self.max_drop_fraction is not None else "")
            + f"; SLO: {slo}"
            + (f"; goodput fraction >= {self.min_goodput_fraction:g}" if self.min_goodput_fraction is not None else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able); :meth:`from_dict` reads it back."""
        return {
            "max_backlog_growth": self.max_backlog_growth,
            "max_drop_fraction": self.max_drop_fraction,
            "prune_backlog": self.prune_backlog,
            "slo": {t.name: t.target_s for t in self.slo},
            "min_goodput_fraction": self.min_goodput_fraction,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StabilityCriteria:
        """The criteria :meth:`to_dict` wrote."""
        return cls(**dict(data))


# --- probes -----------------------------------------------------------------
@attrs.frozen(kw_only=True)
class Probe:
    """One simulation of the search: a setting (load or replicas) under one seed, judged.

    Figures are over the measurement window (see :mod:`simpy_llm.explore.capacity`);
    NaN when the probe was pruned or had nothing to measure.
    """

    load: float
    """Offered load set (the value of the load key: requests/s for ``workload.aggregate_rate``)."""
    replicas: int | None
    """The replica count set (None: the scenario's own)."""
    seed: int
    """The scenario's root seed in this probe."""
    stable: bool
    """Whether the queue kept up (backlog growth and drops within bounds, not pruned)."""
    meets_slo: bool
    """Whether it is stable and meets every SLO criterion."""
    reason: str
    """Why it failed (every criterion missed, ``; ``-separated), or ``ok``."""
    pruned: bool
    """Whether it was stopped early because its backlog passed the pruning bound."""
    sim_time_s: float
    """Simulated time the probe ran, s (up to the pruning when pruned)."""
    measured_requests: int
    """Requests arriving in the measurement window."""
    offered_rps: float
    """Measured arrivals per second of the window."""
    throughput_rps: float
    """Completions per second within the window."""
    backlog_growth: float
    """Backlog growth over the window / arrivals in it."""
    drop_fraction: float
    """Dropped measured requests / measured requests."""
    goodput_rps: float
    """Measured requests meeting the scenario's SLO targets per second of the window."""
    goodput_fraction: float
    """Share of measured completed requests meeting the scenario's SLO targets (NaN without)."""
    busy_fraction: float
    """Mean over replicas of busy time (running steps, loading the model) / run duration,
    warm-up and drain included: close to 1 whenever one request is always in service, so
    not a measure of headroom (see :attr:`batch_occupancy`)."""
    batch_occupancy: float
    """Time-weighted mean of the requests in service (first schedule to completion) over the
    measurement window, over the fleet's batch slots (``max_num_seqs`` summed): the share
    of the slots in use, 1 when full; NaN for fleets without such slots (see
    :mod:`simpy_llm.explore.capacity`)."""
    kv_occupancy: float
    """Time-weighted share of the KV cache's blocks in use over the run (warm-up and drain
    included), mean over replicas (``summary()["kv_utilization"]``; NaN without a KV cache)."""
    latency_s: Mapping[str, float]
    """``ttft_p50``, ``ttft_p99``, ``tpot_p50``, ``tpot_p99``, ``e2e_p50``, ``e2e_p99``,
    ``queue_delay_mean``, ``queue_delay_p99`` over measured completed requests, s."""
    slo_values: Mapping[str, float]
    """Each SLO criterion's measured statistic, s, by its name."""

    def row(self) -> dict[str, Any]:
        """The probe as one flat row (latencies and SLO values as columns)."""
        out = attrs.asdict(self, recurse=False)
        latency = out.pop("latency_s")
        slo = out.pop("slo_values")
        out.update({f"{k}_s": v for k, v in latency.items()})
        out.update({f"slo:{k}": v for k, v in slo.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: _jsonable(v) for k, v in attrs.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        """The probe :meth:`to_dict` wrote. A card written before probes had occupancies
        keeps its ``utilization`` as :attr:`busy_fraction` (the same figure) and gets NaN
        occupancies."""
        data = dict(data)
        if "utilization" in data and "busy_fraction" not in data:
            data["busy_fraction"] = data.pop("utilization")
            data.setdefault("batch_occupancy", None)
            data.setdefault("kv_occupancy", None)
        floats = [f.name for f in attrs.fields(cls) if f.type in ("float",)]
        for name in floats:
            data[name] = _unjson(data[name])
        for name in ("latency_s", "slo_values"):
            data[name] = {k: _unjson(v) for k, v in data[name].items()}
        return cls(**data)


LATENCY_COLUMNS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "queue_delay_mean", "queue_delay_p99")


def _jsonable(value: Any) -> Any:
    """NaN as None and infinities as strings, recursively: strict JSON."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    if isinstance(value, np.integer):
        return int(value)
    return value


def _unjson(value: Any) -> Any:
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return float(value)
    return value


class _Pruned(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised from the progress callback to stop a probe whose backlog passed the bound."""

    def __init__(self, now_s: float, backlog: int) -> None:
        super().__init__(now_s, backlog)
        self.now_s = now_s
        self.backlog = backlog


@attrs.frozen(kw_only=True)
class _Window:
    """How long a probe runs: requests or seconds of arrivals."""

    warmup_requests: int | None
    measure_requests: int | None
    warmup_s: float | None
    measure_s: float | None

    def overrides(self) -> dict[str, Any]:
        if self.measure_requests is not None:
            return {"workload.horizon_s": None, "workload.num_requests": self.warmup_requests + self.measure_requests}
        return {"workload.num_requests": None, "workload.horizon_s": self.warmup_s + self.measure_s}

    def prune_bound(self, criteria: StabilityCriteria, load: float) -> int:
        if criteria.prune_backlog is not None:
            return criteria.prune_backlog
        if self.measure_requests is not None:
            n = self.warmup_requests + self.measure_requests
        else:
            n = load * (self.warmup_s + self.measure_s)
        return max(100, math.ceil(n / 4))

    def bounds(self, arrivals_sorted: np.ndarray) -> tuple[float, float]:
        """The measurement window ``(t0, t1)``."""
        if self.measure_requests is not None:
            if arrivals_sorted.size <= self.warmup_requests:
                return math.nan, math.nan
            return float(arrivals_sorted[self.warmup_requests]), float(arrivals_sorted[-1])
        return float(self.warmup_s), float(self.warmup_s + self.measure_s)


def _window(
    warmup_requests: int | None, measure_requests: int | None, warmup_s: float | None, measure_s: float | None
) -> _Window:
    by_time = warmup_s is not None or measure_s is not None
    by_count = warmup_requests is not None or measure_requests is not None
    if by_time and by_count:
        raise ValueError("give the windows in requests (warmup_requests, measure_requests) or in seconds "
                         "(warmup_s, measure_s), not both")
    if by_time:
        warmup_s = 0.0 if warmup_s is None else float(warmup_s)
        if measure_s is None:
            raise ValueError("measure_s is required with warmup_s: the measurement window's length, s")
        if not (warmup_s >= 0 and math.isfinite(warmup_s)):
            raise ValueError(f"warmup_s must be a finite number >= 0, got {warmup_s!r}")
        if not (measure_s > 0 and math.isfinite(measure_s)):
            raise ValueError(f"measure_s must be a finite number > 0, got {measure_s!r}")
        return _Window(warmup_requests=None, measure_requests=None, warmup_s=warmup_s, measure_s=float(measure_s))
    warmup_requests = DEFAULT_WARMUP_REQUESTS if warmup_requests is None else warmup_requests
    measure_requests = DEFAULT_MEASURE_REQUESTS if measure_requests is None else measure_requests
    for name, value, least in (("warmup_requests", warmup_requests, 0), ("measure_requests", measure_requests, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return _Window(warmup_requests=warmup_requests, measure_requests=measure_requests, warmup_s=None, measure_s=None)


def _build(scenario: Any, overrides: Mapping[str, Any]) -> Scenario:
    """The scenario (a YAML path or plain data) with *overrides* applied, validated."""
    from simpy_llm.config.loader import apply_overrides, load_scenario, scenario_from_dict

    if isinstance(scenario, Mapping):
        return scenario_from_dict(apply_overrides(dict(scenario), dict(overrides)))
    return load_scenario(scenario, dict(overrides))


def _value_at(scenario: Scenario, key: str) -> Any:
    """The loaded scenario's value at a dotted *key* (list items by index)."""
    node: Any = scenario
    for part in key.split("."):
        if isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, Mapping) and part in node:
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            return None
    return node


def _judge(
    results: Results, window: _Window, criteria: StabilityCriteria
) -> tuple[dict[str, Any], list[str], list[str]]:
    """The window's figures, the stability failures and the SLO failures of one finished run."""
    c = results.columns
    arrival = c["arrival_s"]
    status = c["status"]
    completed = status == "completed"
    dropped = status == "dropped"
    t0, t1 = window.bounds(np.sort(arrival))
    measured = (arrival >= t0) & (arrival <= t1)
    n = int(measured.sum())
    span = t1 - t0
    leave = np.where(completed, c["completion_s"], np.where(dropped & np.isnan(c["completion_s"]), arrival, c["completion_s"]))
    leave = np.where(completed | dropped, leave, math.inf)  # in flight at the end: never left

    def backlog(t: float) -> int:
        return int((arrival <= t).sum() - (leave <= t).sum())

    in_window = int(((arrival > t0) & (arrival <= t1)).sum())
    growth = (backlog(t1) - backlog(t0)) / in_window if in_window else math.nan
    done = measured & completed
    derived = results.derived()
    client = {"ttft": derived["client_ttft_s"], "tpot": derived["tpot_s"], "e2e": derived["client_e2e_s"]}
    met = _slo_met(results, done, client)
    stat = SloCriterion.parse
    latency = {
        name: stat(name, 1.0).value(derived[f"{stat(name, 1.0).metric}_s"][done]) for name in LATENCY_COLUMNS
    }
    slo_values = {}
    for target in criteria.slo:
        mask = done if target.slo_class is None else done & (c["slo_class"] == target.slo_class)
        slo_values[target.name] = target.value(derived[f"{target.metric}_s"][mask])
    completions_in = int((completed & (c["completion_s"] > t0) & (c["completion_s"] <= t1)).sum())
    s = results.summary()
    busy = [b / results.end_s for b in s["engine"]["busy_s"]] if results.end_s > 0 else []
    figures = {
        "measured_requests": n,
        "offered_rps": in_window / span if span > 0 else math.nan,
        "throughput_rps": completions_in / span if span > 0 else math.nan,
        "backlog_growth": growth,
        "drop_fraction": float((measured & dropped).sum()) / n if n else math.nan,
        "goodput_rps": float(met.sum()) / span if span > 0 else math.nan,
        "goodput_fraction": float(met.mean()) if met.size else math.nan,
        "busy_fraction": float(np.mean(busy)) if busy else math.nan,
        "batch_occupancy": _batch_occupancy(results, t0, t1),
        "kv_occupancy": float(s["kv_utilization"]["time_weighted_mean"]),
        "latency_s": latency,
        "slo_values": slo_values,
    }
    unstable, missed = [], []
    if n == 0 or not math.isfinite(growth):
        unstable.append("nothing measured: lengthen the measurement window")
    elif growth > criteria.max_backlog_growth:
        unstable.append(f"backlog grew by {growth:.3g} of arrivals > {criteria.max_backlog_growth:g}")
    if criteria.max_drop_fraction is not None and n and figures["drop_fraction"] > criteria.max_drop_fraction:
        unstable.append(f"dropped {figures['drop_fraction']:.3g} of requests > {criteria.max_drop_fraction:g}")
    if not done.any() and (criteria.slo or criteria.min_goodput_fraction is not None):
        missed.append("no measured request completed")
    for target in criteria.slo:
        value = slo_values[target.name]
        if value > target.target_s:
            missed.append(f"{target.name} {value:.4g} s > {target.target_s:g} s")
    gf = figures["goodput_fraction"]
    if criteria.min_goodput_fraction is not None and not gf >= criteria.min_goodput_fraction:
        missed.append(f"goodput fraction {gf:.3g} < {criteria.min_goodput_fraction:g}")
    return figures, unstable, missed


def _batch_slots(scenario: Scenario) -> int | None:
    """The fleet's batch slots, ``max_num_seqs`` summed over its replicas; None when its
    slots are not that (batch servers, disaggregated pools, verify servers, a planner)."""
    serving = scenario.serving
    if serving.disaggregation is not None or scenario.speculation is not None or scenario.planner is not None:
        return None
    groups = serving.groups()
    if any(group.batch_server is not None for group in groups):
        return None
    return sum(group.count * group.engine.max_num_seqs for group in groups)


def _batch_occupancy(results: Results, t0: float, t1: float) -> float:
    """Time-weighted mean of the requests in service over ``[t0, t1]``, over the fleet's
    batch slots (:attr:`Probe.batch_occupancy`).

    A request is in service from its first schedule to its completion (to the end of the
    run if it never completed), its preemptions included.
    """
    slots = _batch_slots(results.scenario)
    if not slots or not t1 > t0:
        return math.nan
    c = results.columns
    start = c["first_scheduled_s"]
    scheduled = ~np.isnan(start)
    end = np.where(np.isnan(c["completion_s"]), results.end_s, c["completion_s"])[scheduled]
    overlap = np.clip(np.minimum(end, t1) - np.maximum(start[scheduled], t0), 0.0, None)
    return float(overlap.sum() / (t1 - t0) / slots)


def _slo_met(results: Results, done: np.ndarray, client: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per request of *done*: whether it met its class's targets in the scenario's ``slo``
    (TTFT and E2E as the client sees them; no TPOT or TVT cannot miss)."""
    c = results.columns
    classes = c["slo_class"][done]
    met = np.ones(int(done.sum()), dtype=bool)
    for name, target in results.scenario.slo.items():
        mask = classes == name
        for values, limit, lenient in (
            (client["ttft"][done], target.ttft_s, False),
            (client["tpot"][done], target.tpot_s, True),
            (client["e2e"][done], target.e2e_s, False),
            (c["tvt_s"][done], target.tvt_s, True),
        ):
            if limit is None:
                continue
            ok = (values <= limit) | np.isnan(values) if lenient else values <= limit
            met &= ~mask | ok
    return met


def _run_probe(
    scenario: Any,
    overrides: Mapping[str, Any],
    *,
    load: float,
    replicas: int | None,
    window: _Window,
    criteria: StabilityCriteria,
) -> Probe:
    """Simulate one setting and judge it."""
    from simpy_llm.simulation import Simulation

    sim = Simulation(_build(scenario, overrides))
    bound = window.prune_bound(criteria, load)
    live = sim.recorder.live

    def watch(_finished: int, _total: Any, now_s: float) -> None:
        if len(live) > bound:
            raise _Pruned(now_s, len(live))

    nan = math.nan
    common = {"load": float(load), "replicas": replicas, "seed": int(sim.scenario.seed)}
    try:
        results = sim.run(progress=watch)
    except _Pruned as stop:
        return Probe(
            **common, stable=False, meets_slo=False, pruned=True, sim_time_s=float(stop.now_s),
            reason=f"pruned: {stop.backlog} requests in the system > {bound} at t={stop.now_s:.4g} s",
            measured_requests=0, offered_rps=nan, throughput_rps=nan, backlog_growth=nan, drop_fraction=nan,
            goodput_rps=nan, goodput_fraction=nan, busy_fraction=nan, batch_occupancy=nan, kv_occupancy=nan,
            latency_s=dict.fromkeys(LATENCY_COLUMNS, nan), slo_values={t.name: nan for t in criteria.slo},
        )
    figures, unstable, missed = _judge(results, window, criteria)
    stable = not unstable
    meets = stable and not missed
    return Probe(
        **common, stable=stable, meets_slo=meets, pruned=False, sim_time_s=float(results.end_s),
        reason="; ".join(unstable + missed) or "ok", **figures,
    )


class _Prober:
    """Probes settings once each (per seed), remembers verdicts, infers by monotonicity."""

    def __init__(
        self,
        scenario: Any,
        overrides: Mapping[str, Any],
        key: str,
        seeds: list[int | None],
        probe: Callable[[float, dict[str, Any]], Probe],
        progress: bool,
        more_is_harder: bool = True,
    ) -> None:
        self.scenario = scenario
        self.overrides = dict(overrides)
        self.key = key
        self.seeds = seeds
        self.probe = probe
        self.progress = progress
        self.sign = 1.0 if more_is_harder else -1.0
        """+1: a larger setting is harder to pass (a load); -1: easier (a replica count)."""
        self.probes: list[Probe] = []
        self.verdicts: dict[float, tuple[bool, bool]] = {}

    def known(self, x: float) -> tuple[bool, bool] | None:
        """``(stable, meets)`` of *x* if probed or implied by monotonicity, else None."""
        if x in self.verdicts:
            return self.verdicts[x]
        k = self.sign
        if any(not s and k * y <= k * x for y, (s, _m) in self.verdicts.items()):
            return (False, False)
        if any(m and k * y >= k * x for y, (_s, m) in self.verdicts.items()):
            return (True, True)
        return None

    def __call__(self, x: float) -> tuple[bool, bool]:
        verdict = self.known(x)
        if verdict is not None:
            return verdict
        stable = meets = True
        for seed in self.seeds:
            extra: dict[str, Any] = {self.key: x}
            if seed is not None:
                # The whole run's root seed: the workload's too, unless the overrides fix it.
                extra["seed"] = seed
                whole = self.overrides.get("workload")
                if "workload.seed" not in self.overrides and not (isinstance(whole, Mapping) and "seed" in whole):
                    extra["workload.seed"] = seed
            p = self.probe(x, {**self.overrides, **extra})
            self.probes.append(p)
            if self.progress:
                print(f"capacity: {self.key}={x:.6g} seed={p.seed}: "
                      f"{'meets SLO' if p.meets_slo else 'stable' if p.stable else 'unstable'} ({p.reason})",
                      file=sys.stderr, flush=True)
            stable &= p.stable
            meets &= p.meets_slo
            if not meets and not stable:
                break  # a failing seed settles the load
        self.verdicts[x] = (stable, meets)
        return stable, meets

    def bounds(self, which: int) -> tuple[float, float]:
        """Largest passing and smallest failing setting known for verdict *which* (0 stable, 1 meets)."""
        passing = [x for x, v in self.verdicts.items() if v[which]]
        failing = [x for x, v in self.verdicts.items() if not v[which]]
        return max(passing, default=math.nan), min(failing, default=math.inf)


def _search_continuous(
    prober: _Prober, which: int, start: float, high: float | None, tolerance: float
) -> tuple[float, float]:
    """``(lower, upper)``: the largest passing and smallest failing load, ``upper / lower - 1 <= tolerance``
    (lower NaN if no load passed; upper inf if none failed up to *high* or the doubling limit)."""
    lo, hi = prober.bounds(which)
    if math.isnan(lo) and math.isinf(hi):
        x = start
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    if math.isinf(hi) and high is not None and high > lo:
        if not prober(high)[which]:
            hi = high
        else:
            lo = high
    steps = 0
    while math.isinf(hi) and high is None and steps < MAX_BRACKET_STEPS:
        x = lo * 2
        steps += 1
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    steps = 0
    while math.isnan(lo) and steps < MAX_BRACKET_STEPS:
        x = hi / 2
        steps += 1
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    if math.isnan(lo) or math.isinf(hi):
        return lo, hi
    while hi / lo - 1 > tolerance:
        x = (lo + hi) / 2
        if prober(x)[which]:
            lo = x
        else:
            hi = x
    return lo, hi


# --- cards --------------------------------------------------------------------
def _probe_frame(probes: Iterable[Probe]) -> pd.DataFrame:
    import pandas as pd

    rows = [p.row() for p in probes]
    frame = pd.DataFrame(rows)
    if not rows:
        frame = pd.DataFrame(columns=[f.name for f in attrs.fields(Probe)])
    return frame


def _fmt(x: float, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "none found"
    return f"{x:.{digits}g}"


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for _, row in frame[columns].iterrows():
        cells = []
        for v in row.tolist():
            cells.append(_fmt(v) if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@attrs.frozen(kw_only=True)
class CapacityCard:
    """What :func:`max_stable_load` found: the limits and every probe behind them.

    The limits are the lower ends of their final brackets (the largest load seen to
    pass); the true limit lies between them and the ``upper_*`` loads (up to noise).
    """

    scenario: str
    """The scenario searched (its name, or its path)."""
    load_key: str
    """The dotted key varied (``workload.aggregate_rate``: requests/s)."""
    tolerance: float
    """Relative width the brackets were closed to."""
    criteria: StabilityCriteria
    """What a load had to satisfy."""
    max_stable_load: float
    """Largest load found stable (NaN: none was)."""
    upper_stable_load: float
    """Smallest load found unstable (inf: none was up to the search's limit)."""
    max_goodput_load: float
    """Largest load found stable and meeting every SLO criterion (the max SLO-goodput load;
    equal to :attr:`max_stable_load` when the criteria have no SLO part)."""
    upper_goodput_load: float
    """Smallest load found failing them (inf: none was)."""
    probes: tuple[Probe, ...] = attrs.field(converter=tuple)
    """Every simulation run, in the order run."""

    @property
    def bracketed(self) -> bool:
        """Whether both limits were bracketed (a passing and a failing load found for each)."""
        return all(math.isfinite(x) for x in (self.max_stable_load, self.upper_stable_load,
                                             self.max_goodput_load, self.upper_goodput_load))

    def to_frame(self) -> pd.DataFrame:
        """One row per probe, sorted by load (then seed), with ``tpot_inflation``: TPOT p50
        over TPOT p50 at the lowest load probed (prefill/decode interference: how much
        decode slows as more prefills share its steps; NaN without multi-token outputs)."""
        frame = _probe_frame(self.probes)
        if not len(frame):
            return frame
        frame = frame.sort_values(["load", "seed"], kind="stable").reset_index(drop=True)
        base = frame["tpot_p50_s"].dropna()
        frame["tpot_inflation"] = frame["tpot_p50_s"] / base.iloc[0] if len(base) else math.nan
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Plain, strict-JSON data (NaN as null, infinity as ``"inf"``); :meth:`from_dict` reads it."""
        return {
            "kind": "capacity",
            "scenario": self.scenario,
            "load_key": self.load_key,
            "tolerance": self.tolerance,
            "criteria": self.criteria.to_dict(),
            "max_stable_load": _jsonable(self.max_stable_load),
            "upper_stable_load": _jsonable(self.upper_stable_load),
            "max_goodput_load": _jsonable(self.max_goodput_load),
            "upper_goodput_load": _jsonable(self.upper_goodput_load),
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityCard:
        """The card :meth:`to_dict` wrote."""
        data = dict(data)
        data.pop("kind", None)
        data["criteria"] = StabilityCriteria.from_dict(data["criteria"])
        data["probes"] = [Probe.from_dict(p) for p in data["probes"]]
        for name in ("max_stable_load", "upper_stable_load", "max_goodput_load", "upper_goodput_load"):
            data[name] = _unjson(data[name])
        return cls(**data)

    def to_markdown(self) -> str:
        """The card as Markdown: the limits, the criteria, then the probes' curve."""
        lines = [
            f"# Capacity card: {self.scenario}",
            "",
            f"- **max stable load** ({self.load_key}): {_fmt(self.max_stable_load)} "
            f"(unstable at {_fmt(self.upper_stable_load)})",
            f"- **max SLO-goodput load**: {_fmt(self.max_goodput_load)} (fails at {_fmt(self.upper_goodput_load)})",
            f"- criteria: {self.criteria.describe()}",
            f"- search tolerance: {self.tolerance:g} (relative); {len(self.probes)} probes, "
            f"{sum(p.pruned for p in self.probes)} pruned early",
            "",
        ]
        frame = self.to_frame()
        if len(frame):
            cols = ["load", "seed", "stable", "meets_slo", "throughput_rps", "ttft_p99_s", "e2e_p99_s",
                    "busy_fraction", "batch_occupancy", "kv_occupancy", "tpot_inflation", "reason"]
            lines.append(_table(frame, cols))
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def plot(self, ax: Any = None, metric: str | None = None) -> Any:
        """Latency and throughput against load, with the limits marked; returns the axes.

        *metric*: the latency column drawn (default: the first SLO criterion's, else
        ``e2e_p99_s``). Needs matplotlib.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _fig, ax = plt.subplots(figsize=(7, 4))
        frame = self.to_frame()
        frame = frame[~frame["pruned"]] if len(frame) else frame
        if metric is None:
            metric = f"slo:{self.criteria.slo[0].name}" if self.criteria.slo else "e2e_p99_s"
        if len(frame):
            ax.plot(frame["load"], frame[metric], "o-", color="C0", label=metric)
        ax.set_xlabel(self.load_key)
        ax.set_ylabel(f"{metric} (s)")
        ax2 = ax.twinx()
        if len(frame):
            ax2.plot(frame["load"], frame["throughput_rps"], "s--", color="C1", label="throughput")
        ax2.set_ylabel("throughput (requests/s)")
        for x, name, style in ((self.max_stable_load, "max stable", ":"), (self.max_goodput_load, "max SLO-goodput", "-.")):
            if math.isfinite(x):
                ax.axvline(x, color="k", linestyle=style, label=f"{name} {x:.4g}")
        for t in self.criteria.slo:
            if metric == f"slo:{t.name}":
                ax.axhline(t.target_s, color="C3", linestyle=":", label=f"target {t.target_s:g} s")
        ax.legend(loc="upper left", fontsize="small")
        ax.set_title(f"capacity: {self.scenario}")
        return ax

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``capacity.json``, ``capacity.csv``, ``capacity.md`` and ``capacity.png``
        into *directory* (created); returns the paths written."""
        return _save(self, Path(directory), "capacity")


@attrs.frozen(kw_only=True)
class ReplicaCard:
    """What :func:`min_replicas` found: the fewest replicas meeting the criteria at a load."""

    scenario: str
    """The scenario searched (its name, or its path)."""
    replicas_key: str
    """The dotted key varied (``serving.replicas``)."""
    load_key: str
    """The dotted key holding the load."""
    load: float
    """The load every probe ran at."""
    criteria: StabilityCriteria
    """What the fleet had to satisfy."""
    min_replicas: int | None
    """Fewest replicas that met every criterion (None: none up to ``max_replicas``)."""
    probes: tuple[Probe, ...] = attrs.field(converter=tuple)
    """Every simulation run, in the order run."""

    def to_frame(self) -> pd.DataFrame:
        """One row per probe, sorted by replica count (then seed)."""
        frame = _probe_frame(self.probes)
        if len(frame):
            frame = frame.sort_values(["replicas", "seed"], kind="stable").reset_index(drop=True)
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Plain, strict-JSON data; :meth:`from_dict` reads it."""
        return {
            "kind": "replicas",
            "scenario": self.scenario,
            "replicas_key": self.replicas_key,
            "load_key": self.load_key,
            "load": _jsonable(self.load),
            "criteria": self.criteria.to_dict(),
            "min_replicas": self.min_replicas,
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaCard:
        """The card :meth:`to_dict` wrote."""
        data = dict(data)
        data.pop("kind", None)
        data["criteria"] = StabilityCriteria.from_dict(data["criteria"])
        data["probes"] = [Probe.from_dict(p) for p in data["probes"]]
        return cls(**data)

    def to_markdown(self) -> str:
        """The card as Markdown."""
        answer = str(self.min_replicas) if self.min_replicas is not None else "none found"
        lines = [
            f"# Replicas card: {self.scenario}",
            "",
            f"- **replicas needed** ({self.replicas_key}) at {self.load_key} = {self.load:g}: {answer}",
            f"- criteria: {self.criteria.describe()}",
            f"- {len(self.probes)} probes, {sum(p.pruned for p in self.probes)} pruned early",
            "",
        ]
        frame = self.to_frame()
        if len(frame):
            cols = ["replicas", "seed", "stable", "meets_slo", "throughput_rps", "ttft_p99_s", "e2e_p99_s",
                    "busy_fraction", "batch_occupancy", "kv_occupancy", "reason"]
            lines.append(_table(frame, cols))
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def plot(self, ax: Any = None, metric: str | None = None) -> Any:
        """Latency against replica count, the answer marked; returns the axes (needs matplotlib)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _fig, ax = plt.subplots(figsize=(7, 4))
        frame = self.to_frame()
        frame = frame[~frame["pruned"]] if len(frame) else frame
        if metric is None:
            metric = f"slo:{self.criteria.slo[0].name}" if self.criteria.slo else "e2e_p99_s"
        if len(frame):
            ax.plot(frame["replicas"], frame[metric], "o-", label=metric)
        if self.min_replicas is not None:
            ax.axvline(self.min_replicas, color="k", linestyle=":", label=f"needed: {self.min_replicas}")
        for t in self.criteria.slo:
            if metric == f"slo:{t.name}":
                ax.axhline(t.target_s, color="C3", linestyle=":", label=f"target {t.target_s:g} s")
        ax.set_xlabel(self.replicas_key)
        ax.set_ylabel(f"{metric} (s)")
        ax.legend(fontsize="small")
        ax.set_title(f"replicas at {self.load:g}: {self.scenario}")
        return ax

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``replicas.json``, ``replicas.csv``, ``replicas.md`` and ``replicas.png``
        into *directory* (created); returns the paths written."""
        return _save(self, Path(directory), "replicas")


def _save(card: CapacityCard | ReplicaCard, directory: Path, stem: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(card.to_dict(), indent=2, allow_nan=False) + "\n")
    written.append(path)
    path = directory / f"{stem}.csv"
    card.to_frame().to_csv(path, index=False)
    written.append(path)
    path = directory / f"{stem}.md"
    path.write_text(card.to_markdown())
    written.append(path)
    # matplotlib is a dependency: the plot is part of the card, never skipped
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    ax = card.plot()
    path = directory / f"{stem}.png"
    ax.figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(ax.figure)
    written.append(path)
    return written


# --- searches -------------------------------------------------------------------
def _check_common(scenario: Any, tolerance: float | None, seeds: Iterable[int] | None) -> list[int | None]:
    if not isinstance(scenario, (str, Path, Mapping)):
        raise TypeError(f"scenario must be a YAML path or a scenario mapping, got {type(scenario).__name__}")
    if tolerance is not None and not (0 < tolerance < 1):
        raise ValueError(f"tolerance must be a relative width in (0, 1), got {tolerance!r}")
    if seeds is None:
        return [None]
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a list of integers, got {seeds!r}")
    out = [s.item() if isinstance(s, np.generic) else s for s in seeds]
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"seeds must be integers, got {s!r}")
    if not out:
        raise ValueError("seeds is empty: give None to use the scenario's seed, or at least one seed")
    return list(dict.fromkeys(out))


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _name(scenario: Any, loaded: Scenario) -> str:
    return loaded.name or (str(scenario) if not isinstance(scenario, Mapping) else "<scenario>")


def max_stable_load(
    scenario: str | Path | Mapping[str, Any],
    *,
    load_key: str = "workload.aggregate_rate",
    low: float | None = None,
    high: float | None = None,
    tolerance: float = 0.02,
    criteria: StabilityCriteria | None = None,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    warmup_s: float | None = None,
    measure_s: float | None = None,
    seeds: Iterable[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> CapacityCard:
    """Search the largest stable load and the largest load meeting the SLOs (seed 003's mode B).

    Parameters
    ----------
    scenario
        A scenario YAML path, or the scenario as plain data (a mapping as YAML would give).
    load_key
        The dotted key holding the load (any key an override accepts; it must take
        positive numbers and more of it must mean more load).
    low, high
        The search starts at *low* (default: the scenario's value at *load_key*) and
        brackets by doubling (or halving) from it; *high*, when given, closes the
        bracket from above instead (a load stable at *high* is reported as at least
        *high*, with ``upper_*`` infinite).
    tolerance
        Relative width ``upper / lower - 1`` each bracket is closed to, in (0, 1).
    criteria
        What a load must satisfy (default :class:`StabilityCriteria()`: stability only).
    warmup_requests, measure_requests
        Requests per probe left out as warm-up, then measured (default 1000 and 10000).
    warmup_s, measure_s
        Instead of request counts: seconds of arrivals as warm-up, then measured.
    seeds
        Run every probe under each of these root seeds (a load passes only under all);
        default: the scenario's seed. Each is the whole run's root seed: it sets
        ``seed`` and ``workload.seed`` (a workload with a seed of its own varies with
        it), unless *overrides* give ``workload.seed``, which then holds the workload.
    overrides
        ``{"dotted.key": value}`` applied to every probe before the load and window.
    progress
        Print one line per probe on standard error.

    Returns
    -------
    CapacityCard

    Raises
    ------
    ScenarioError
        If the scenario (with the overrides, at the starting load) is not valid.
    ValueError
        If a bound, the tolerance, a window or the seeds are out of range, or the
        scenario has no number at *load_key* and *low* is not given.
    TypeError
        If *scenario* is neither a path nor a mapping, or a seed is not an integer.
    """
    seed_list = _check_common(scenario, tolerance, seeds)
    criteria = StabilityCriteria() if criteria is None else criteria
    if not isinstance(criteria, StabilityCriteria):
        raise TypeError(f"criteria must be a StabilityCriteria, got {type(criteria).__name__}")
    window = _window(warmup_requests, measure_requests, warmup_s, measure_s)
    low, high = _positive("low", low), _positive("high", high)
    if low is not None and high is not None and not high > low:
        raise ValueError(f"high ({high:g}) must be above low ({low:g})")
    fixed = {**dict(overrides or {}), **window.overrides()}
    loaded = _build(scenario, fixed)
    _check_before_probes(criteria, loaded)
    if low is None:
        current = _value_at(loaded, load_key)
        if isinstance(current, bool) or not isinstance(current, (int, float)) or not current > 0:
            raise ValueError(
                f"the scenario has no positive number at {load_key!r} (found {current!r}): give low= "
                f"(the load to start from) or a load_key the scenario sets"
            )
        low = float(current)
        if high is not None and low >= high:
            low = high / 2

    def probe(x: float, ov: dict[str, Any]) -> Probe:
        return _run_probe(scenario, ov, load=x, replicas=None, window=window, criteria=criteria)

    prober = _Prober(scenario, fixed, load_key, seed_list, probe, progress)
    g_lo, g_hi = _search_continuous(prober, 1, low, high, tolerance)
    s_lo, s_hi = _search_continuous(prober, 0, low, high, tolerance)
    return CapacityCard(
        scenario=_name(scenario, loaded),
        load_key=load_key,
        tolerance=tolerance,
        criteria=criteria,
        max_stable_load=s_lo,
        upper_stable_load=s_hi,
        max_goodput_load=g_lo,
        upper_goodput_load=g_hi,
        probes=prober.probes,
    )


def min_replicas(
    scenario: str | Path | Mapping[str, Any],
    *,
    load: float | None = None,
    criteria: StabilityCriteria | None = None,
    load_key: str = "workload.aggregate_rate",
    replicas_key: str = "serving.replicas",
    max_replicas: int = 1024,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    warmup_s: float | None = None,
    measure_s: float | None = None,
    seeds: Iterable[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> ReplicaCard:
    """The fewest replicas that are stable and meet the SLO criteria at *load*.

    Doubles the replica count from 1 until one passes, then bisects the integers
    between the last failing and the first passing count (passing is taken to be
    monotone in the count). Probes, windows, seeds and criteria are as in
    :func:`max_stable_load`.

    Parameters
    ----------
    load
        The load every probe runs at (set at *load_key*; default: the scenario's own).
    replicas_key
        The dotted key holding the replica count (``serving.replicas``; a group's
        ``serving.replica_groups.0.count``).
    max_replicas
        Give up above this count (the card's ``min_replicas`` is then None).

    Returns
    -------
    ReplicaCard

    Raises
    ------
    ScenarioError, ValueError, TypeError
        As :func:`max_stable_load`; ValueError also for *max_replicas* < 1.

    Examples
    --------
    Twenty M/D/1-like requests per second, each 40 ms alone on a replica, with a
    mean queueing delay of at most 10 ms:

    >>> from simpy_llm.explore.capacity import _doctest_scenario
    >>> card = min_replicas(_doctest_scenario(), load=20.0, criteria=StabilityCriteria(slo={"queue_delay_mean": 0.01}),
    ...                     warmup_requests=100, measure_requests=2000)
    >>> card.min_replicas
    2
    """
    seed_list = _check_common(scenario, None, seeds)
    criteria = StabilityCriteria() if criteria is None else criteria
    if not isinstance(criteria, StabilityCriteria):
        raise TypeError(f"criteria must be a StabilityCriteria, got {type(criteria).__name__}")
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise ValueError(f"max_replicas must be an integer >= 1, got {max_replicas!r}")
    window = _window(warmup_requests, measure_requests, warmup_s, measure_s)
    load = _positive("load", load)
    fixed = {**dict(overrides or {}), **window.overrides()}
    if load is not None:
        fixed[load_key] = load
    loaded = _build(scenario, fixed)
    _check_before_probes(criteria, loaded)
    if load is None:
        current = _value_at(loaded, load_key)
        if isinstance(current, bool) or not isinstance(current, (int, float)) or not current > 0:
            raise ValueError(f"the scenario has no positive number at {load_key!r} (found {current!r}): give load=")
        load = float(current)

    def probe(n: float, ov: dict[str, Any]) -> Probe:
        return _run_probe(scenario, ov, load=load, replicas=int(n), window=window, criteria=criteria)

    prober = _Prober(scenario, fixed, replicas_key, seed_list, probe, progress, more_is_harder=False)
    good, bad = None, 0
    n = 1
    while n <= max_replicas:
        if prober(n)[1]:
            good = n
            break
        bad = n
        n = min(n * 2, max_replicas) if n < max_replicas else max_replicas + 1
    if good is not None:
        while good - bad > 1:
            mid = (good + bad) // 2
            if prober(mid)[1]:
                good = mid
            else:
                bad = mid
    return ReplicaCard(
        scenario=_name(scenario, loaded),
        replicas_key=replicas_key,
        load_key=load_key,
        load=load,
        criteria=criteria,
        min_replicas=good,
        probes=prober.probes,
    )


def _doctest_scenario(mean_service_s: float = 0.04) -> dict[str, Any]:
    """A small single-server scenario for examples: Poisson arrivals, one request at a
    time, constant *mean_service_s* service (an M/D/1 queue per replica)."""
    beta1_us = 10.0
    beta0_us = mean_service_s * 1e6 - 3500 * beta1_us
    return {
        "seed": 1,
        "workload": {"aggregate_rate": 10.0, "num_requests": 100, "clients": [{
            "id": "only", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 3500}},
            "output_distribution": {"type": "constant", "params": {"value": 1}}}]},
        "serving": {"replicas": 1, "router": {"kind": "least_loaded"},
                    "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "chunked_prefill": False},
                    "latency_model": {"kind": "blis_linear", "params": {
                        "beta0_us": beta0_us, "beta1_us": beta1_us, "beta2_us": 1.0}}},
    }
