"""The autoscaler: a process that samples a metric of the active replicas, sees it late and
averaged, and resizes the co-located pool by a scaling policy (``docs/autoscaling.md``).

One process does both jobs, so that a sample and a decision due at the same time come in a
fixed order (the sample first):

* **samples** at ``k x sample_interval_s`` (``k >= 1``): the metric averaged over the replicas
  active then (:data:`~simpy_llm.config.autoscaler.AUTOSCALER_METRICS`); with a TTFT metric,
  the time to first token of each request whose first token came since the previous sample;
* **decisions** at ``first_sync_s + j x sync_period_s``: the mean of the samples taken in
  ``(t - lag_s - window_s, t - lag_s]`` is *seen*; the policy recommends a count from it and the
  count active now; the recommendation is stabilised as Kubernetes' HPA does (no higher than
  the lowest recommendation of the last ``scale_up_stabilization_s``, no lower than the highest
  of the last ``scale_down_stabilization_s``, itself included), bounded by ``min_replicas`` and
  ``max_replicas``, and applied to newly routed requests (the first *n* replicas of the pool,
  :class:`~simpy_llm.serving.planner.FleetControl`). With a TTFT metric, *seen* is the 90th
  percentile (linear interpolation, numpy's default) or the mean of the TTFTs collected by
  ``t - lag_s`` whose first token came in ``(t - lag_s - window_s, t - lag_s]``. A decision
  that sees no sample (no first token, with a TTFT metric) changes nothing.

A replica added serves at once, paying its cold start (if its group has one) when work first
reaches it; one removed finishes the requests it holds.

A policy with the attributes of :class:`~simpy_llm.policies.scaling.Activating` (``event``,
KEDA's ScaledObject) sees the metric's total rather than its mean per replica, and adds
**polls** at ``m x polling_interval_s`` (after a sample, before a decision, at a tie): a total
above ``activation`` marks the fleet active and, at zero replicas, activates the pool's first
replica; with ``min_replicas: 0``, a total at or below it ``cooldown_s`` after the last active
poll takes the fleet to zero. At zero, arriving requests are held in front of the router and
routed, in arrival order, at the poll that activates the fleet.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence, Sized
from typing import TYPE_CHECKING, Protocol

import attrs

from simpy_llm.config.autoscaler import TTFT_METRICS
from simpy_llm.policies.scaling import Activating

if TYPE_CHECKING:
    import pandas as pd
    from simpy.core import Environment
    from simpy.events import Event

    from simpy_llm.config.autoscaler import AutoscalerConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.metrics.summary import AutoscalerSection
    from simpy_llm.policies.scaling import ScalingPolicy
    from simpy_llm.serving.planner import Fleet

__all__ = ["DECISION_COLUMNS", "Autoscaler", "AutoscalerLog", "Sampled", "autoscaler_summary", "percentile", "sample_metric"]

DECISION_COLUMNS = ("time_s", "seen", "samples", "current", "recommended", "stabilized", "replicas")
"""One row per decision: its time, the metric seen (NaN: no sample in the window), the samples
averaged, the replicas active before it, the policy's recommendation, the recommendation after
the stabilisation windows, and the replicas active after it (bounded). With a TTFT metric,
``samples`` is the number of TTFTs the decision saw."""


@attrs.define(eq=False)
class AutoscalerLog:
    """What the autoscaler did, for :class:`~simpy_llm.metrics.results.Results`."""

    rows: list[tuple[float, float, int, int, int, int, int]] = attrs.field(factory=list)
    """One row per decision, :data:`DECISION_COLUMNS`."""
    samples: list[tuple[float, float, int]] = attrs.field(factory=list)
    """``(time_s, value, active replicas)`` per sample (a TTFT metric: the mean TTFT of the
    first tokens the sample collected, NaN for none)."""
    activity: list[tuple[float, int, bool]] = attrs.field(factory=list)
    """``(time_s, replica, active)`` per change of a replica's activity (time 0: the initial pool)."""
    gpus: list[int] = attrs.field(factory=list)
    """GPUs of each replica."""

    def decisions(self) -> pd.DataFrame:
        """The decisions as a frame (:data:`DECISION_COLUMNS`)."""
        import pandas as pd  # where a frame is built: importing the package stays fast

        return pd.DataFrame(self.rows, columns=list(DECISION_COLUMNS))

    def active_seconds(self, end_s: float) -> tuple[float, float]:
        """``(replica-seconds, GPU-seconds)`` the pool was active over ``[0, end_s]``.

        >>> log = AutoscalerLog(activity=[(0.0, 0, True), (10.0, 1, True), (30.0, 1, False)], gpus=[2, 2])
        >>> log.active_seconds(40.0)
        (60.0, 120.0)
        """
        since: dict[int, float] = {}
        replica_s = gpu_s = 0.0
        for t, i, on in self.activity:
            if on:
                since.setdefault(i, t)
            elif i in since:
                span = t - since.pop(i)
                replica_s += span
                gpu_s += span * self.gpus[i]
        for i, t in since.items():
            replica_s += end_s - t
            gpu_s += (end_s - t) * self.gpus[i]
        return replica_s, gpu_s



class _Blocks(Protocol):
    @property
    def num_blocks(self) -> int: ...

    @property
    def used_blocks(self) -> int: ...


class Sampled(Protocol):
    """What a sample reads of a replica (every replica kind has it, as the router's views read it)."""

    @property
    def waiting(self) -> Sized: ...

    @property
    def running(self) -> Sized: ...

    @property
    def kv(self) -> _Blocks: ...


def autoscaler_summary(log: AutoscalerLog | None, end_s: float) -> AutoscalerSection:
    """The summary's ``autoscaler`` section of a run of *end_s* seconds
    (:class:`~simpy_llm.metrics.summary.AutoscalerStats`); empty without an autoscaler."""
    if log is None:
        return {}
    replica_s, gpu_s = log.active_seconds(end_s)
    rows = log.rows
    return {"autoscaler": {
        "decisions": len(rows),
        "changes": sum(1 for r in rows if r[6] != r[3]),
        "final_replicas": rows[-1][6] if rows else sum(1 for _t, _i, on in log.activity if on),
        "replica_seconds": replica_s,
        "gpu_seconds": gpu_s,
        "mean_replicas": replica_s / end_s if end_s > 0 else None,
    }}


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile of *values* by linear interpolation between the closest ranks
    (numpy's default method).

    >>> percentile([0.1, 0.2, 0.3, 0.4], 90), percentile([3.0], 90)
    (0.37, 3.0)
    """
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def sample_metric(metric: str, replicas: Sequence[Sampled], routed: int, interval_s: float, *, mean: bool = True) -> float:
    """*metric* averaged over the active *replicas* (:data:`~simpy_llm.config.autoscaler.AUTOSCALER_METRICS`),
    or summed over them when not *mean*; ``arrival_rate`` is *routed* requests over *interval_s*
    (per replica when averaged).

    >>> class R:
    ...     waiting, running = [0] * 3, [0] * 5
    ...     class kv:
    ...         num_blocks, used_blocks = 100, 75
    >>> [sample_metric(m, [R(), R()], 40, 5.0) for m in ("queue_depth", "running", "in_system", "kv_usage", "arrival_rate")]
    [3.0, 5.0, 8.0, 0.75, 4.0]
    >>> [sample_metric(m, [R(), R()], 40, 5.0, mean=False) for m in ("queue_depth", "arrival_rate")]
    [6.0, 8.0]
    """
    n = len(replicas) if mean else 1
    if metric == "arrival_rate":
        return routed / interval_s / n
    total = 0.0
    for r in replicas:
        if metric == "queue_depth":
            total += len(r.waiting)
        elif metric == "running":
            total += len(r.running)
        elif metric == "in_system":
            total += len(r.waiting) + len(r.running)
        else:  # kv_usage
            total += r.kv.used_blocks / r.kv.num_blocks
    return total / n


class Autoscaler:
    """The autoscaler process of one simulation (module docstring).

    Parameters
    ----------
    env
        The simulation's environment.
    fleet
        The fleet it resizes (its co-located pool).
    recorder
        The run's recorder (its arrival count gives ``arrival_rate``).
    config
        The scenario's ``autoscaler`` section.
    policy
        The scaling policy built from ``config.policy``.
    active
        Whether the run may still do anything (the process stops when it returns False).
    """

    def __init__(self, env: Environment, fleet: Fleet, recorder: Recorder, config: AutoscalerConfig,
                 policy: ScalingPolicy, active: Callable[[], bool]) -> None:
        self.env = env
        self.config = config
        self.policy = policy
        self.recorder = recorder
        self._active = active
        from simpy_llm.serving.planner import FleetControl  # built with an autoscaler: the results import this module without the planner

        self.control = FleetControl(fleet)
        self.pool = self.control.pools["active_replicas"]
        self.replicas = fleet.replicas
        self.max_replicas = config.max_replicas if config.max_replicas is not None else len(self.pool)
        self.log = AutoscalerLog(gpus=[p.gpus for p in fleet.plans])
        initial = config.initial_replicas if config.initial_replicas is not None else config.min_replicas
        self._apply(max(initial, 1))
        for n, i in enumerate(self.pool):
            if n < initial:
                self.log.activity.append((0.0, i, True))
        self._recent: deque[tuple[float, int]] = deque()
        """``(time_s, recommendation)`` of the decisions inside the longer stabilisation window."""
        self._ttft = config.metric in TTFT_METRICS
        self._pending: list[Request] = []
        """With a TTFT metric: the requests that arrived and had no first token at the last sample."""
        self._firsts: list[tuple[float, float, float]] = []
        """With a TTFT metric: ``(collected_s, first_token_s, ttft_s)`` of the first tokens not yet
        older than every later decision's window."""
        if self._ttft and recorder.arrival_log is None:
            recorder.arrival_log = []  # the arrivals whose first tokens the samples collect
        self._keda = isinstance(policy, Activating)
        """Whether the policy is driven as KEDA drives a ScaledObject (metric totals, activation polls)."""
        self._floor = max(config.min_replicas, 1)
        """Fewest replicas a decision leaves: the HPA never scales to zero, the polls do."""
        self._zero = initial == 0
        """Whether no replica is active (the pool's first is kept routable behind the hold)."""
        self._held: list[Request] = []
        """Requests that arrived while no replica was active, in arrival order."""
        self._last_active = 0.0
        """The last poll that found the metric above the activation threshold, s."""
        self._route: Callable[[Request], None] = fleet.router.route
        """Where an arriving request goes when a replica is active (the router)."""
        if config.min_replicas == 0:
            # Only a fleet that can reach zero pays for the hold: one call per arrival.
            self._route = fleet.router.inbox.intercept(self._hold)
        self.process = env.process(self._run())

    @property
    def current(self) -> int:
        """Replicas active now."""
        return 0 if self._zero else self.control.pool_size("active_replicas")

    def _hold(self, req: Request) -> None:
        """An arriving request: held while no replica is active, routed otherwise."""
        if self._zero:
            self._held.append(req)
        else:
            self._route(req)

    def _to_zero(self) -> None:
        """Deactivate every replica; the ones active finish what they hold."""
        self._apply(1)
        self._zero = True
        self.log.activity.append((self.env.now, self.pool[0], False))

    def _from_zero(self) -> None:
        """Activate the pool's first replica and route the requests held, in arrival order (it
        pays its cold start, if its group has one and its model is not loaded, as any replica
        does when work reaches it)."""
        self._zero = False
        self.log.activity.append((self.env.now, self.pool[0], True))
        held, self._held = self._held, []
        for req in held:
            self._route(req)

    def _total(self, routed: int) -> float:
        """The metric's total now over the active replicas plus the requests held (KEDA's
        trigger reads a queue); *routed* arrivals since the previous sample."""
        cfg = self.config
        active = [self.replicas[i] for i in self.pool[:self.current]]
        return sample_metric(cfg.metric, active, routed, cfg.sample_interval_s, mean=False) + len(self._held)

    def poll(self, now: float, routed: int) -> None:
        """KEDA's activation poll at *now*: from zero, activate when the metric's total is above
        ``activation``; otherwise note the activity, or scale to zero once ``cooldown_s`` has
        passed since the last active poll (``min_replicas: 0`` only)."""
        policy = self.policy
        assert isinstance(policy, Activating)  # polls run only for such a policy
        total = self._total(routed)
        current = self.current
        if total > policy.activation:
            self._last_active = now
            if current == 0:
                self._from_zero()
                self.log.rows.append((now, total, 0, 0, 1, 1, 1))
        elif current > 0 and self.config.min_replicas == 0 and now - self._last_active >= policy.cooldown_s:
            self._to_zero()
            self.log.rows.append((now, total, 0, current, 0, 0, 0))

    def _apply(self, n: int) -> None:
        now = self.env.now
        for i, on in self.control.apply({"active_replicas": n}):
            if now > 0.0 or on:
                self.log.activity.append((now, i, on))

    def _run(self) -> Generator[Event, None, None]:
        """Process: samples and decisions in time order, a sample first at a tie.

        Yields
        ------
        Timeout
            Until the next sample or decision.
        """
        cfg = self.config
        env = self.env
        interval = cfg.sample_interval_s
        next_sample = interval
        next_sync = cfg.first_sync_s if cfg.first_sync_s is not None else cfg.sync_period_s
        policy = self.policy
        polling = policy.polling_interval_s if isinstance(policy, Activating) else math.inf
        next_poll = polling
        k = j = m = 1
        routed_before = 0
        while self._active():
            t = min(next_sample, next_sync, next_poll)
            if t > env.now:
                yield env.timeout(t - env.now)
            if next_sample <= t:
                routed = self.recorder.arrived
                active = [self.replicas[i] for i in self.pool[:self.current]]
                if self._ttft:
                    value = self._collect_first_tokens(env.now)
                elif self._keda:
                    value = self._total(routed - routed_before)
                else:
                    value = sample_metric(cfg.metric, active, routed - routed_before, interval)
                self.log.samples.append((env.now, value, len(active)))
                routed_before = routed
                k += 1
                next_sample = k * interval
            if next_poll <= t:
                self.poll(env.now, self.recorder.arrived - routed_before)
                m += 1
                next_poll = m * polling
            if next_sync <= t:
                self.decide(env.now)
                next_sync = (cfg.first_sync_s if cfg.first_sync_s is not None else cfg.sync_period_s) + j * cfg.sync_period_s
                j += 1

    def _collect_first_tokens(self, now: float) -> float:
        """Take the first tokens that came by *now* from the requests that arrived; return
        their mean TTFT (NaN: none)."""
        log = self.recorder.arrival_log
        pending = self._pending
        if log:
            pending.extend(log)
            log.clear()  # the autoscaler and the planner are never both there: nobody else reads it
        live = self.recorder.live
        keep: list[Request] = []
        got: list[float] = []
        for req in pending:
            first = req.first_token_s
            if first <= now:  # False while NaN: no first token yet
                ttft = first - req.arrival_s
                got.append(ttft)
                self._firsts.append((now, first, ttft))
            elif req.id in live:
                keep.append(req)
            # else dropped before its first token: it never has one
        self._pending = keep
        return sum(got) / len(got) if got else math.nan

    def _ttfts(self, low: float, high: float) -> list[float]:
        """The TTFTs collected by *high* whose first token came in ``(low, high]``; forgets
        those at or before *low* (later decisions' windows start later)."""
        self._firsts = firsts = [f for f in self._firsts if f[1] > low]
        return [ttft for collected, first, ttft in firsts if collected <= high and first <= high]

    def decide(self, now: float) -> None:
        """The decision at *now* (module docstring)."""
        cfg = self.config
        high = now - cfg.lag_s
        low = high - cfg.window_s
        if self._ttft:
            ttfts = self._ttfts(low, high)
            values = [percentile(ttfts, 90) if cfg.metric == "ttft_p90" else sum(ttfts) / len(ttfts)] if ttfts else []
        else:
            values = [v for t, v, _n in self.log.samples if low < t <= high]
        current = self.current
        if not values or current == 0:  # at zero the HPA is idle: the polls bring the fleet back
            self.log.rows.append((now, math.nan, 0, current, current, current, current))
            return
        seen = sum(values) / len(values)
        count = len(ttfts) if self._ttft else len(values)
        recommended = self.policy.desired(seen, current)
        recent = self._recent
        recent.append((now, recommended))
        keep = max(cfg.scale_up_stabilization_s, cfg.scale_down_stabilization_s)
        while recent and recent[0][0] <= now - keep:
            recent.popleft()
        up = min(r for t, r in recent if t > now - cfg.scale_up_stabilization_s or t == now)
        down = max(r for t, r in recent if t > now - cfg.scale_down_stabilization_s or t == now)
        stabilized = min(max(current, up), down)
        replicas = min(max(stabilized, self._floor), self.max_replicas)
        if replicas != current:
            self._apply(replicas)
        self.log.rows.append((now, seen, count, current, recommended, stabilized, replicas))
