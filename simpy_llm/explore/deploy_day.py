"""What a deployment costs over a day-shaped load: static against autoscaled.

A day is a schedule of windows, each with its rate (requests/s): rates given, or ServeGen's
aggregate diurnal rates (:func:`servegen_rates`). :func:`deploy_day` runs the deployment
search (:func:`~simpy_llm.explore.deploy.deploy`) at the day's *peak* window rate, so each
configuration's fewest passing replicas is its *static* count, the fleet that carries the
peak and is kept for 24 h. For the cheapest few configurations (*top*) it then simulates the
whole day (:func:`day_costs`) twice over:

* **static**: the static count, always on; cost per day ``replicas x tp x price x 24``;
* **autoscaled**: the same configuration under each autoscaler setting given
  (:class:`ScalingSetting`: a policy, a metric, its target or thresholds, the fewest and the
  most replicas), its cost per day the summary's ``replica_seconds`` over the simulated day,
  scaled to 24 h, times ``tp x price``.

Each window of the day stands for ``24 h / windows`` of a real day and is simulated for
``window_s`` seconds at its own rate (time compression when ``window_s`` is shorter: fewer
requests, the same rates; the autoscaler's periods are not scaled). Every client of the
scenario keeps its arrival process, lengths and share of the traffic; only the rate changes
from window to window (the ``windows`` arrival process with the client's process in each).
A run over the day ends with the day (``simulation.until_s``); it *meets the SLOs* when the
backlog grows over the last window by at most the stability criterion's ``max_backlog_growth``
of that window's arrivals and every SLO criterion holds over the day's completed requests and
in each window's (by arrival; a window without completions is not judged). ``docs/capacity.md``, "Over a day: static against autoscaled".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from simpy_llm.config.autoscaler import AUTOSCALER_METRICS
from simpy_llm.explore.capacity.criteria import SloCriterion, StabilityCriteria
from simpy_llm.explore.capacity.probing import _build
from simpy_llm.explore.deploy_results import Configuration, DeployResult, save_result_files

__all__ = ["Day", "DayResult", "DayRow", "ScalingSetting", "day_costs", "deploy_day", "parse_autoscaler", "servegen_rates"]

DAY_S = 86400.0
"""Seconds in the day a cost per day is over."""
POLICIES = ("target", "threshold")
"""The scaling policies an autoscaler setting may name (:mod:`simpy_llm.policies.scaling`)."""


def _positive(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@attrs.frozen(kw_only=True)
class Day:
    """A day-shaped load: one rate per window, each window simulated for ``window_s`` seconds.

    >>> d = Day(rates=(10.0, 20.0, 20.0, 10.0), window_s=60)
    >>> d.peak, d.mean, d.day_s, d.compression
    (20.0, 15.0, 240.0, 360.0)
    """

    rates: tuple[float, ...] = attrs.field(converter=lambda v: tuple(float(x) for x in v))
    """Requests per second of each window, in the day's order."""
    window_s: float = attrs.field(converter=float)
    """Simulated seconds of each window (a real window lasts ``24 h / len(rates)``)."""

    def __attrs_post_init__(self) -> None:
        if not self.rates:
            raise ValueError("the day needs at least one window rate")
        if any(not (math.isfinite(r) and r >= 0) for r in self.rates) or max(self.rates) <= 0:
            raise ValueError(f"the day's window rates must be finite, >= 0 and not all 0; got {list(self.rates)}")
        if not _positive(self.window_s):
            raise ValueError(f"window_s must be a number of seconds > 0, got {self.window_s!r}")

    @property
    def peak(self) -> float:
        """The busiest window's rate, requests/s."""
        return max(self.rates)

    @property
    def mean(self) -> float:
        """The day's mean rate, requests/s."""
        return sum(self.rates) / len(self.rates)

    @property
    def day_s(self) -> float:
        """Simulated seconds of the whole day."""
        return len(self.rates) * self.window_s

    @property
    def compression(self) -> float:
        """Real seconds per simulated second (1: the day runs in full)."""
        return DAY_S / self.day_s

    def overrides(self, scenario: Any) -> dict[str, Any]:
        """The scenario keys that run the loaded *scenario*'s clients over the day: each
        client's arrival process inside every window, at the window's rate."""
        from simpy_llm.config.plain import unstructure
        from simpy_llm.workload.arrivals import WindowedArrivals

        workload = scenario.workload
        if workload.servegen_data is not None or workload.traces or not workload.clients:
            raise ValueError("the day's shape is given to workload.clients: a scenario with servegen_data or traces "
                             "has none to give it to (use --day servegen:DIR with a scenario of clients)")
        out: dict[str, Any] = {}
        for i, client in enumerate(workload.clients):
            arrival = unstructure(client.arrival)
            if isinstance(client.arrival, WindowedArrivals) or arrival.get("process") in ("windows", "servegen_windows"):
                raise ValueError(f"workload.clients.{i}.arrival: already changes its rate by window "
                                 f"({arrival.get('process')}); the day gives the rate, so give a stationary process")
            out[f"workload.clients.{i}.arrival"] = {
                "process": "windows", "window_s": self.window_s,
                "windows": [{"start_s": k * self.window_s, "rate": r, "process": arrival} for k, r in enumerate(self.rates)],
            }
        out.update({"workload.aggregate_rate": self.mean, "workload.num_requests": None,
                    "workload.horizon_s": self.day_s, "simulation.until_s": self.day_s})
        return out


def servegen_rates(path: str | Path, rate_scale: float = 1.0) -> tuple[float, ...]:
    """ServeGen's aggregate rate per 600 s window (requests/s): the sum over the clients with
    both a trace and a dataset (those :func:`~simpy_llm.workload.servegen.load_servegen` loads)
    of their windows' rates, times *rate_scale*.

    >>> rates = servegen_rates("data/servegen/language/m-large", 0.05)
    >>> len(rates), round(max(rates), 2)
    (144, 26.55)
    """
    from simpy_llm.workload.servegen import read_trace

    if not _positive(rate_scale):
        raise ValueError(f"the ServeGen rate scale must be > 0, got {rate_scale!r}")
    root = Path(path)
    traces = sorted(root.glob("chunk-*-trace.csv"))
    traces = [t for t in traces if (root / t.name.replace("-trace.csv", "-dataset.json")).is_file()]
    if not traces:
        raise ValueError(f"{root}: no ServeGen client (chunk-<id>-trace.csv with its dataset) there")
    total: dict[float, float] = {}
    for trace in traces:
        for w in read_trace(trace):
            total[w.start_s] = total.get(w.start_s, 0.0) + w.rate
    return tuple(total[s] * rate_scale for s in sorted(total))


@attrs.frozen(kw_only=True)
class ScalingSetting:
    """One autoscaler setting of the grid: ``target`` with its target value, or ``threshold``
    with its low and high bounds, on a metric; the fewest and the most replicas (None: the
    configuration's static count). The rest of the ``autoscaler`` section (sampling, lag,
    windows, stabilisation) is the scenario's, or the section's defaults.

    >>> ScalingSetting(policy="target", metric="queue_depth", values=(4.0,), min_replicas=1).label(3)
    'target queue_depth=4, 1-3 replicas'
    """

    policy: str
    metric: str
    values: tuple[float, ...] = attrs.field(converter=lambda v: tuple(float(x) for x in v))
    """``(target,)`` or ``(low, high)``."""
    min_replicas: int = 1
    max_replicas: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"autoscaler policy {self.policy!r} is not allowed; allowed: {', '.join(POLICIES)}")
        if self.metric not in AUTOSCALER_METRICS:
            raise ValueError(f"autoscaler metric {self.metric!r} is not allowed; allowed: {', '.join(AUTOSCALER_METRICS)}")
        want = 1 if self.policy == "target" else 2
        if len(self.values) != want or not all(_positive(v) for v in self.values):
            shape = "a target > 0" if want == 1 else "LOW-HIGH, both > 0"
            raise ValueError(f"autoscaler {self.policy}:{self.metric}: give {shape}, got {list(self.values)}")
        if want == 2 and not self.values[0] < self.values[1]:
            raise ValueError(f"autoscaler threshold:{self.metric}: low must be below high, got {list(self.values)}")
        top = self.max_replicas if self.max_replicas is not None else self.min_replicas
        if not (isinstance(self.min_replicas, int) and self.min_replicas >= 1 and isinstance(top, int) and top >= self.min_replicas):
            raise ValueError(f"autoscaler replicas: need 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})")

    def bounds(self, static: int) -> tuple[int, int]:
        """``(min, max)`` replicas for a configuration whose static count is *static*."""
        top = self.max_replicas if self.max_replicas is not None else static
        return self.min_replicas, max(top, self.min_replicas)

    def label(self, static: int) -> str:
        low, high = self.bounds(static)
        value = "-".join(f"{v:g}" for v in self.values)
        return f"{self.policy} {self.metric}={value}, {low}-{high} replicas"

    def section(self, base: Mapping[str, Any], static: int) -> dict[str, Any]:
        """The scenario's ``autoscaler`` section for this setting over the scenario's own *base*."""
        low, high = self.bounds(static)
        params = {"target": self.values[0]} if self.policy == "target" else {"low": self.values[0], "high": self.values[1]}
        return {**base, "metric": self.metric, "policy": {"kind": self.policy, "params": params},
                "min_replicas": low, "max_replicas": high, "initial_replicas": None}


def parse_autoscaler(text: str, min_replicas: int = 1, max_replicas: int | None = None) -> list[ScalingSetting]:
    """The settings of ``POLICY:METRIC=V1,V2``: ``target:queue_depth=4,8`` (two targets) or
    ``threshold:queue_depth=2-8`` (low 2, high 8).

    >>> [s.values for s in parse_autoscaler("target:queue_depth=4,8")]
    [(4.0,), (8.0,)]
    >>> parse_autoscaler("target=4")
    Traceback (most recent call last):
    ...
    ValueError: --autoscaler 'target=4': write POLICY:METRIC=VALUE[,VALUE], e.g. target:queue_depth=4,8
    """
    head, sep, values = text.partition("=")
    policy, colon, metric = head.partition(":")
    if not sep or not colon or not values.strip():
        raise ValueError(f"--autoscaler {text!r}: write POLICY:METRIC=VALUE[,VALUE], e.g. target:queue_depth=4,8")
    out = []
    for item in (v.strip() for v in values.split(",") if v.strip()):
        try:
            numbers = [float(x) for x in item.split("-")]
        except ValueError:
            raise ValueError(f"--autoscaler {text!r}: {item!r} is not a number (or LOW-HIGH)") from None
        out.append(ScalingSetting(policy=policy.strip(), metric=metric.strip(), values=numbers,
                                  min_replicas=min_replicas, max_replicas=max_replicas))
    return out


@attrs.frozen(kw_only=True)
class DayRow:
    """One configuration run over the day, static or under one autoscaler setting."""

    configuration: Configuration
    mode: str
    """``static`` or ``autoscaled``."""
    setting: str
    """The autoscaler setting (``-`` for static)."""
    static_replicas: int
    """The fewest replicas meeting the SLOs at the peak rate."""
    mean_replicas: float
    """Active replicas averaged over the day (the static count for static)."""
    replica_seconds: float
    """Replica-seconds over the simulated day."""
    cost_per_day: float
    """US dollars per day."""
    meets_slo: bool
    windows_met: int
    """Windows whose completed requests meet every SLO criterion."""
    windows_judged: int
    day_values: dict[str, float]
    """Each SLO criterion's value over the day."""
    worst_window: int
    """The window whose SLO criterion is furthest over (or nearest) its bound (-1: none judged)."""
    worst_ttft_p99_s: float
    worst_tpot_p99_s: float
    reason: str

    def row(self) -> dict[str, Any]:
        c = self.configuration
        return {"configuration": c.label(), "index": c.index, "gpu": c.gpu, "tp": c.tp, "mode": self.mode,
                "setting": self.setting, "static_replicas": self.static_replicas, "mean_replicas": self.mean_replicas,
                "replica_seconds": self.replica_seconds, "cost_per_day": self.cost_per_day, "meets_slo": self.meets_slo,
                "windows_met": self.windows_met, "windows_judged": self.windows_judged,
                **{f"day_{k}": v for k, v in self.day_values.items()}, "worst_window": self.worst_window,
                "worst_ttft_p99_s": self.worst_ttft_p99_s, "worst_tpot_p99_s": self.worst_tpot_p99_s, "reason": self.reason}


@attrs.frozen(kw_only=True)
class DayResult:
    """Every configuration's day, static and autoscaled, and the cheapest meeting the SLOs."""

    day: Day
    criteria: StabilityCriteria
    rows: tuple[DayRow, ...]
    search: DeployResult | None = None
    """The deployment search at the peak rate that gave the static counts (None: counts given)."""

    @property
    def best(self) -> DayRow | None:
        """The cheapest row meeting the SLOs (ties: the earlier row; None: none meets them)."""
        ok = [r for r in self.rows if r.meets_slo]
        return min(ok, key=lambda r: r.cost_per_day) if ok else None

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.row() for r in self.rows])

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"day": {"rates": list(self.day.rates), "window_s": self.day.window_s, "peak": self.day.peak,
                        "mean": self.day.mean, "compression": self.day.compression},
                "criteria": self.criteria.to_dict(),
                "best": None if best is None else best.row(),
                "rows": [{k: _plain(v) for k, v in r.row().items()} for r in self.rows]}

    def to_markdown(self) -> str:
        d, best = self.day, self.best
        answer = ("none meets the SLOs over the day" if best is None else
                  f"{best.configuration.label()}, {best.mode}" + ("" if best.mode == "static" else f" ({best.setting})")
                  + f" = {best.cost_per_day:.4g} USD/day")
        lines = [f"- **answer**: {answer}",
                 f"- **day**: {len(d.rates)} windows, peak {d.peak:.4g} requests/s, mean {d.mean:.4g}; each window "
                 f"simulated for {d.window_s:g} s (compression {d.compression:.4g}x)", "",
                 "| configuration | mode | setting | replicas | mean replicas | USD/day | meets SLOs | windows met "
                 "| worst window | worst TTFT p99 (s) | worst TPOT p99 (s) | why |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r.configuration.label()} | {r.mode} | {r.setting} | {r.static_replicas} | {r.mean_replicas:.4g} "
                         f"| {r.cost_per_day:.4g} | {'yes' if r.meets_slo else 'no'} | {r.windows_met}/{r.windows_judged} "
                         f"| {r.worst_window} | {_num(r.worst_ttft_p99_s)} | {_num(r.worst_tpot_p99_s)} | {r.reason} |")
        return "\n".join(lines) + "\n"

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``deploy_day.json``, ``deploy_day.csv`` and ``deploy_day.md`` into *directory*."""
        return save_result_files(directory, "deploy_day", self.to_dict(), self.to_frame(), self.to_markdown())


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _judge_day(results: Any, day: Day, criteria: StabilityCriteria) -> dict[str, Any]:
    """The day's verdict: backlog at the end, each SLO criterion over the day and per window."""
    c = results.columns
    arrival, status = c["arrival_s"], c["status"]
    done = status == "completed"
    dropped = status == "dropped"
    leave = np.where(done | dropped, np.where(np.isnan(c["completion_s"]), arrival, c["completion_s"]), math.inf)

    def backlog(t: float) -> int:
        return int((arrival <= t).sum() - (leave <= t).sum())

    # Growth over the last window, as a capacity probe judges its window: requests in flight
    # when the day is cut are not a backlog, a count that grows through the window is.
    t0, t1 = day.day_s - day.window_s, day.day_s
    last = int(((arrival > t0) & (arrival <= t1)).sum())
    growth = (backlog(t1) - backlog(t0)) / last if last else math.nan
    derived = results.derived()
    window = np.minimum((arrival // day.window_s).astype(int), len(day.rates) - 1)

    def values(mask: np.ndarray) -> dict[str, float]:
        out = {}
        for t in criteria.slo:
            m = mask if t.slo_class is None else mask & (c["slo_class"] == t.slo_class)
            out[t.name] = t.value(derived[f"{t.metric}_s"][m])
        return out

    def over(v: Mapping[str, float]) -> float:
        return max((v[t.name] / t.target_s for t in criteria.slo if not math.isnan(v[t.name])), default=0.0)

    day_values = values(done)
    why = []
    if not last:
        why.append("no request arrived in the last window: the backlog cannot be judged")
    elif growth > criteria.max_backlog_growth:
        why.append(f"backlog grew by {growth:.3g} of arrivals in the last window > {criteria.max_backlog_growth:g}")
    n = len(arrival)
    if criteria.max_drop_fraction is not None and n and int(dropped.sum()) / n > criteria.max_drop_fraction:
        why.append(f"dropped {int(dropped.sum()) / n:.3g} of requests > {criteria.max_drop_fraction:g}")
    why += [f"{t.name} {day_values[t.name]:.4g} s > {t.target_s:g} s over the day"
            for t in criteria.slo if day_values[t.name] > t.target_s]
    met = judged = 0
    worst, worst_over, worst_mask = -1, -math.inf, None
    for k in range(len(day.rates)):
        mask = done & (window == k)
        if not mask.any():
            continue
        judged += 1
        v = values(mask)
        met += all(not v[t.name] > t.target_s for t in criteria.slo)
        if over(v) > worst_over:
            worst, worst_over, worst_mask = k, over(v), mask
    if met < judged:
        why.append(f"misses the SLOs in {judged - met} of {judged} windows")
    p99 = SloCriterion.parse
    return {"meets": not why, "reason": "; ".join(why) or "ok", "windows_met": met, "windows_judged": judged,
            "day_values": day_values, "worst_window": worst,
            "worst_ttft": math.nan if worst_mask is None else p99("ttft_p99", 1.0).value(derived["ttft_s"][worst_mask]),
            "worst_tpot": math.nan if worst_mask is None else p99("tpot_p99", 1.0).value(derived["tpot_s"][worst_mask])}


def per_day(mean_replicas: float, config: Configuration) -> float:
    """US dollars per day of *mean_replicas* replicas of *config* on average: ``mean x tp x
    pp x price x 24``.

    >>> c = Configuration(index=0, model="m", gpu="H100", tp=2, scheduler="fcfs", max_num_seqs=8,
    ...                   max_num_batched_tokens=512, chunked_prefill=True, price_per_gpu_hour=3.5, kv_auto=False)
    >>> per_day(3, c)
    504.0
    """
    return mean_replicas * (config.tp * config.pp * config.price_per_gpu_hour) * 24.0


def day_costs(
    scenario: str | Path | Mapping[str, Any],
    day: Day,
    runs: Sequence[tuple[Configuration, int]],
    settings: Sequence[ScalingSetting],
    criteria: StabilityCriteria,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> DayResult:
    """Simulate each configuration over *day*: with its static count always on, then under
    each autoscaler setting (module docstring).

    Parameters
    ----------
    scenario
        The scenario (a YAML path or its plain data) whose clients carry the day.
    day
        The day-shaped load.
    runs
        ``(configuration, static count)`` pairs: co-located configurations without
        speculative decoding (the autoscaler sizes only those).
    settings
        The autoscaler settings to try (none: static only).
    criteria
        The SLO criteria and the stability criterion's ``max_backlog_growth``.
    overrides
        Scenario keys set under every run.

    Returns
    -------
    DayResult
    """
    from simpy_llm.config.plain import unstructure
    from simpy_llm.explore.deploy import REPLICAS_KEY
    from simpy_llm.simulation import Simulation

    fixed = dict(overrides or {})
    loaded = _build(scenario, fixed)
    base = {} if loaded.autoscaler is None else unstructure(loaded.autoscaler)
    shape = day.overrides(loaded)
    rows = []
    for config, static in runs:
        if config.decode is not None or config.speculation:
            raise ValueError(f"{config.label()}: the autoscaler sizes co-located fleets without speculative decoding")
        if not (isinstance(static, int) and static >= 1):
            raise ValueError(f"{config.label()}: the static count must be an integer >= 1, got {static!r}")
        plans: list[tuple[str, str, int, Any]] = [("static", "-", static, None)]
        plans += [("autoscaled", s.label(static), s.bounds(static)[1], s.section(base, static)) for s in settings]
        for mode, label, fleet, section in plans:
            run = {**fixed, **config.overrides(), **shape, REPLICAS_KEY: fleet, "autoscaler": section}
            results = Simulation(_build(scenario, run)).run()
            verdict = _judge_day(results, day, criteria)
            if section is None:
                replica_s, mean = static * day.day_s, float(static)
            else:
                replica_s = float(results.summary()["autoscaler"]["replica_seconds"])
                mean = replica_s / day.day_s
            rows.append(DayRow(
                configuration=config, mode=mode, setting=label, static_replicas=static, mean_replicas=mean,
                replica_seconds=replica_s, cost_per_day=per_day(mean, config), meets_slo=verdict["meets"],
                windows_met=verdict["windows_met"], windows_judged=verdict["windows_judged"],
                day_values=verdict["day_values"], worst_window=verdict["worst_window"],
                worst_ttft_p99_s=verdict["worst_ttft"], worst_tpot_p99_s=verdict["worst_tpot"], reason=verdict["reason"]))
    return DayResult(day=day, criteria=criteria, rows=tuple(rows))


def deploy_day(
    scenario: str | Path | Mapping[str, Any],
    day: Day,
    *,
    slo: StabilityCriteria | Mapping[str, float] | Sequence[str],
    autoscalers: Iterable[ScalingSetting] = (),
    top: int = 3,
    overrides: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    **search: Any,
) -> DayResult:
    """The deployment search at *day*'s peak rate, then the *top* cheapest configurations that
    meet the SLOs there simulated over the day, static and under each of *autoscalers*.

    Parameters
    ----------
    scenario, slo, overrides
        As :func:`~simpy_llm.explore.deploy.deploy` (its ``load`` is the day's peak; a
        scenario's own ``autoscaler`` is off in that search).
    day
        The day-shaped load.
    autoscalers
        The autoscaler settings to try on each configuration.
    top
        How many of the cheapest configurations at the peak to run over the day.
    out
        Write ``deploy_day.json``, ``.csv`` and ``.md`` here (and the search's own files and
        run directory).
    **search
        The other arguments of :func:`~simpy_llm.explore.deploy.deploy` (``gpus``, ``tp``...).

    Returns
    -------
    DayResult
        With :attr:`DayResult.search` the search at the peak.
    """
    from simpy_llm.explore.deploy import deploy

    if not (isinstance(top, int) and not isinstance(top, bool) and top >= 1):
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    settings = list(autoscalers)
    criteria = slo if isinstance(slo, StabilityCriteria) else StabilityCriteria(slo=slo)
    fixed = {**dict(overrides or {}), "autoscaler": None}
    result = deploy(scenario, load=day.peak, slo=criteria, overrides=fixed, out=out, **search)
    found = sorted((o for o in result.outcomes if o.min_replicas is not None and o.configuration.decode is None
                    and not o.configuration.speculation), key=lambda o: (o.cost_per_hour, o.configuration.index))
    runs = [(o.configuration, int(o.min_replicas)) for o in found[:top] if o.min_replicas is not None]
    # The day's runs keep the scenario's own autoscaler section under each setting's keys.
    days = day_costs(scenario, day, runs, settings, criteria, overrides=overrides)
    days = attrs.evolve(days, search=result)
    if out is not None:
        days.save(out)
    return days
