"""Probing one setting of a capacity search: the probe's window (:data:`_Window`, requests
or seconds of arrivals, and its pruning bound), the scenario built with its overrides
(:func:`_build`, :func:`_value_at`), one simulation run and judged (:func:`_run_probe`,
:func:`_judge` and the occupancies), the result (:class:`Probe`) and :class:`_Prober`,
which probes each setting once per seed and infers verdicts by monotonicity. Imports
:mod:`simpy_llm.explore.capacity.criteria` only."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import attrs
import numpy as np

from simpy_llm.explore.capacity.criteria import SloCriterion, StabilityCriteria
from simpy_llm.loading import apply_overrides, load_scenario, scenario_from_dict
from simpy_llm.simulation import Simulation

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario
    from simpy_llm.metrics.results import Results


DEFAULT_WARMUP_REQUESTS = 1000
DEFAULT_MEASURE_REQUESTS = 10_000


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
class _RequestWindow:
    """A probe that runs for ``warmup_requests + measure_requests`` arrivals."""

    warmup_requests: int
    measure_requests: int

    def overrides(self) -> dict[str, Any]:
        return {"workload.horizon_s": None, "workload.num_requests": self.warmup_requests + self.measure_requests}

    def prune_bound(self, criteria: StabilityCriteria, load: float) -> int:
        if criteria.prune_backlog is not None:
            return criteria.prune_backlog
        return max(100, math.ceil((self.warmup_requests + self.measure_requests) / 4))

    def bounds(self, arrivals_sorted: np.ndarray) -> tuple[float, float]:
        """The measurement window ``(t0, t1)``."""
        if arrivals_sorted.size <= self.warmup_requests:
            return math.nan, math.nan
        return float(arrivals_sorted[self.warmup_requests]), float(arrivals_sorted[-1])


@attrs.frozen(kw_only=True)
class _TimeWindow:
    """A probe that runs for ``warmup_s + measure_s`` seconds of arrivals."""

    warmup_s: float
    measure_s: float

    def overrides(self) -> dict[str, Any]:
        return {"workload.num_requests": None, "workload.horizon_s": self.warmup_s + self.measure_s}

    def prune_bound(self, criteria: StabilityCriteria, load: float) -> int:
        if criteria.prune_backlog is not None:
            return criteria.prune_backlog
        return max(100, math.ceil(load * (self.warmup_s + self.measure_s) / 4))

    def bounds(self, arrivals_sorted: np.ndarray) -> tuple[float, float]:
        """The measurement window ``(t0, t1)``."""
        return float(self.warmup_s), float(self.warmup_s + self.measure_s)


_Window = _RequestWindow | _TimeWindow
"""How long a probe runs: requests or seconds of arrivals."""


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
        return _TimeWindow(warmup_s=warmup_s, measure_s=float(measure_s))
    warmup_requests = DEFAULT_WARMUP_REQUESTS if warmup_requests is None else warmup_requests
    measure_requests = DEFAULT_MEASURE_REQUESTS if measure_requests is None else measure_requests
    for name, value, least in (("warmup_requests", warmup_requests, 0), ("measure_requests", measure_requests, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return _RequestWindow(warmup_requests=warmup_requests, measure_requests=measure_requests)


def _build(scenario: Any, overrides: Mapping[str, Any]) -> Scenario:
    """The scenario (a YAML path or plain data) with *overrides* applied, validated."""

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


class _Figures(TypedDict):
    """A finished probe's figures over its window: the :class:`Probe` fields of the same names."""

    measured_requests: int
    offered_rps: float
    throughput_rps: float
    backlog_growth: float
    drop_fraction: float
    goodput_rps: float
    goodput_fraction: float
    busy_fraction: float
    batch_occupancy: float
    kv_occupancy: float
    latency_s: dict[str, float]
    slo_values: dict[str, float]


def _judge(
    results: Results, window: _Window, criteria: StabilityCriteria
) -> tuple[_Figures, list[str], list[str]]:
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
    slo_values: dict[str, float] = {}
    for target in criteria.slo:
        mask = done if target.slo_class is None else done & (c["slo_class"] == target.slo_class)
        slo_values[target.name] = target.value(derived[f"{target.metric}_s"][mask])
    completions_in = int((completed & (c["completion_s"] > t0) & (c["completion_s"] <= t1)).sum())
    s = results.summary()
    busy = [b / results.end_s for b in s["engine"]["busy_s"]] if results.end_s > 0 else []
    figures: _Figures = {
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

    sim = Simulation(_build(scenario, overrides))
    bound = window.prune_bound(criteria, load)
    live = sim.recorder.live

    def watch(_finished: int, _total: Any, now_s: float) -> None:
        if len(live) > bound:
            raise _Pruned(now_s, len(live))

    nan = math.nan
    seed = int(sim.scenario.seed)
    try:
        results = sim.run(progress=watch)
    except _Pruned as stop:
        return Probe(
            load=float(load), replicas=replicas, seed=seed, stable=False, meets_slo=False, pruned=True, sim_time_s=float(stop.now_s),
            reason=f"pruned: {stop.backlog} requests in the system > {bound} at t={stop.now_s:.4g} s",
            measured_requests=0, offered_rps=nan, throughput_rps=nan, backlog_growth=nan, drop_fraction=nan,
            goodput_rps=nan, goodput_fraction=nan, busy_fraction=nan, batch_occupancy=nan, kv_occupancy=nan,
            latency_s=dict.fromkeys(LATENCY_COLUMNS, nan), slo_values={t.name: nan for t in criteria.slo},
        )
    figures, unstable, missed = _judge(results, window, criteria)
    stable = not unstable
    meets = stable and not missed
    return Probe(
        load=float(load), replicas=replicas, seed=seed, stable=stable, meets_slo=meets, pruned=False, sim_time_s=float(results.end_s),
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

