"""The planner: a periodic process that resizes the fleet by what-if simulations (seed 003 §6.3).

With a ``planner`` section (:mod:`simpy_llm.config.planner`, ``docs/planner.md``) the
simulation starts a :class:`Planner`. Each tick it

1. gathers telemetry: the requests that arrived in the last ``window_s`` (their arrival
   offsets and token lengths), the replicas' queues;
2. evaluates every candidate configuration by a **what-if simulation**: a fresh
   simulation of the scenario (no planner), the candidate applied from time 0, fed the
   window's requests at their offsets, run until they have all finished; all candidates of
   a tick share one seed drawn from the ``planner`` stream (common random numbers);
3. scores each by the objective, checks the constraints on its summary, and lets its
   :class:`~simpy_llm.policies.planning.PlannerChoice` pick one;
4. applies it through :class:`FleetControl` to newly routed work only: requests already
   at a replica finish there; a replica leaving a pool drains.

The fleet is built at its largest size; a pool's size is the number of its replicas
(the first ones, in fleet order) the router may choose among. With speculative decoding
the replicas are verify servers (the GPUs), the what-if feeds the window's requests to
the draft fleet at the times their clients sent them, and the knobs ``gamma`` and
``fused_fraction`` reach the draft fleet (:meth:`~simpy_llm.speculative.draft.DraftFleet.plan_gamma`,
:meth:`~simpy_llm.speculative.draft.DraftFleet.plan_fused_fraction`).

With ``candidates.parallelism`` the fleet is also built at each candidate tensor-parallel
degree it does not run at (:func:`parallelism_fleet`): those replicas follow the
scenario's own, inactive, and a tick that changes the degree swaps the active set; a
what-if runs the candidate's layout as its whole fleet (:func:`what_if_layout`). With
``ticks.on`` the planner watches the replicas' inboxes (:meth:`Planner.watch`) and ticks
also when a trigger condition becomes true.

The planner sees its simulation through :class:`PlannerHost` (the clock, the fleet, the
arrivals, what-if runs), which :class:`~simpy_llm.simulation.Simulation` implements: it
imports neither the simulation nor the results.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import attrs
import numpy as np

from simpy_llm.config.common import PolicySpec
from simpy_llm.config.engine import EngineConfig
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.planner import KNOBS
from simpy_llm.entities import Request
from simpy_llm.policies.planning import BestFeasible, Evaluation
from simpy_llm.serving.fleet import ReplicaPlan, plan_fleet

if TYPE_CHECKING:
    from simpy.events import Event

    from simpy_llm.config.planner import PlannerConfig
    from simpy_llm.config.schema import Scenario
    from simpy_llm.config.serving import ServingConfig
    from simpy_llm.kernel import Environment
    from simpy_llm.metrics.summary import Summary
    from simpy_llm.policies.planning import PlannerChoice
    from simpy_llm.rng import RandomStreams
    from simpy_llm.serving.batching import BatchServer
    from simpy_llm.serving.disaggregation import KvHandoff
    from simpy_llm.serving.engine import Replica
    from simpy_llm.serving.router import Router
    from simpy_llm.speculative.draft import DraftFleet
    from simpy_llm.speculative.verify import VerifyServer
    from simpy_llm.wire import Wire

__all__ = [
    "DECISION_COLUMNS",
    "TRIGGER_COLUMNS",
    "WHAT_IF_DRAIN_WINDOWS",
    "Fleet",
    "FleetControl",
    "Planner",
    "PlannerHost",
    "PlannerLog",
    "WhatIf",
    "gpu_seconds",
    "layout_serving",
    "parallelism_fleet",
    "what_if_arrivals",
    "what_if_layout",
]

WHAT_IF_DRAIN_WINDOWS = 20
"""A what-if run stops this many windows after its start; requests still unfinished then
make the candidate infeasible (an overloaded configuration)."""

_COPIED = (
    "client_id", "tenant_id", "slo_class", "priority", "streaming", "prompt_tokens", "output_tokens",
    "prefix_group", "prefix_tokens", "prefix_blocks", "prefix_block_tokens", "context",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "warm_up",
)
"""Request fields a what-if replay copies (what the workload decided; not the lifecycle)."""

_POOLS = ("active_replicas", "prefill_replicas", "decode_replicas")
"""The knobs that size a pool of replicas."""

DECISION_COLUMNS = (
    "tick", "time_s", "status", "window_requests", "waiting_requests", "running_requests",
    "candidate", "gpus", "score", "feasible", "violation", "chosen", "applied",
)
"""Columns of :meth:`Results.planner_decisions() <simpy_llm.metrics.results.Results.planner_decisions>`."""

TRIGGER_COLUMNS = ("tick", "time_s", "trigger", "condition_s")
"""Columns of :meth:`PlannerResults.triggers() <simpy_llm.serving.planner_results.PlannerResults.triggers>`."""


def describe(config: Mapping[str, float | None]) -> str:
    """``knob=value`` pairs in knob order.

    >>> describe({"max_num_seqs": 8, "active_replicas": 2})
    'active_replicas=2,max_num_seqs=8'
    """
    return ",".join(f"{k}={config[k]}" for k in KNOBS if k in config)


class Fleet(Protocol):
    """The parts of a simulation whose knobs :class:`FleetControl` turns
    (:class:`~simpy_llm.simulation.Simulation` has them)."""

    @property
    def plans(self) -> Sequence[ReplicaPlan]:
        """Each replica's plan, in fleet order (its role, GPUs and engine settings)."""
        ...

    @property
    def router(self) -> Router:
        """The router newly arriving requests reach (over the replicas, or the prefill pool)."""
        ...

    @property
    def kv_handoff(self) -> KvHandoff | None:
        """The hand-off to the decode pool of a disaggregated fleet (None: co-located)."""
        ...

    @property
    def draft_fleet(self) -> DraftFleet | None:
        """The draft devices of speculative decoding (None without it)."""
        ...

    @property
    def replicas(self) -> Sequence[Replica | BatchServer | VerifyServer]:
        """The replicas, in fleet order."""
        ...

    @property
    def wires(self) -> Mapping[str, Wire]:
        """The Wires between the components, by seam name (``replica:<i>``: replica *i*'s inbox)."""
        ...

    @property
    def layouts(self) -> Mapping[int, Sequence[int]]:
        """With parallelism candidates, each tensor-parallel degree's replicas (fleet indices),
        the scenario's own degree first (empty without: :func:`parallelism_fleet`)."""
        ...


class WhatIf(NamedTuple):
    """What a what-if run of a candidate configuration gave."""

    summary: Summary
    """Its summary."""
    unfinished: int
    """Replayed requests still unfinished when it stopped (an overloaded candidate has some)."""


class PlannerHost(Protocol):
    """What the planner needs from the simulation it plans for: its clock, its fleet, the
    requests arriving, and what-if runs. :class:`~simpy_llm.simulation.Simulation` builds
    one for its planner."""

    @property
    def env(self) -> Environment:
        """The running simulation's environment (the planner's process runs in it)."""
        ...

    @property
    def fleet(self) -> Fleet:
        """The running simulation's fleet (the configuration the planner changes)."""
        ...

    @property
    def rng(self) -> np.random.Generator:
        """The planner's random stream (``planner``): each tick's what-if seed."""
        ...

    def active(self) -> bool:
        """Whether anything may still happen in the run (the planner's ticks stop when not)."""
        ...

    def arrival_log(self) -> list[Request]:
        """A list every arriving request is appended to from now on, in arrival order (the
        planner trims it to its window)."""
        ...

    def what_if(self, candidate: Mapping[str, float], arrivals: Sequence[tuple[float, dict[str, Any]]], seed: int,
                window_s: float) -> WhatIf:
        """Run the scenario afresh (no planner, *seed*) with *candidate* in force from time 0,
        fed *arrivals* (``(offset_s, request fields)`` in order, from :func:`what_if_arrivals`)
        where the workload puts requests, until they have all finished or
        :data:`WHAT_IF_DRAIN_WINDOWS` windows of *window_s* have passed."""
        ...


class FleetControl:
    """The run-time knobs of one simulation's fleet: pool sizes, batch limits and, with
    speculative decoding, the γ and the fused share of newly started requests.

    Parameters
    ----------
    fleet
        The simulation whose router(s) and replicas it changes.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        plans = fleet.plans
        self.pools: dict[str, list[int]] = {
            "active_replicas": [i for i, p in enumerate(plans) if p.role == "both"],
            "prefill_replicas": [i for i, p in enumerate(plans) if p.role == "prefill"],
            "decode_replicas": [i for i, p in enumerate(plans) if p.role == "decode"],
        }
        """Fleet indices of each pool, in order."""
        self.routers = {"active_replicas": fleet.router, "prefill_replicas": fleet.router}
        if fleet.kv_handoff is not None:
            self.routers["decode_replicas"] = fleet.kv_handoff.decode_router
        seqs = {p.engine.max_num_seqs for p in plans if p.batch_server is None}
        self.config: dict[str, float | None] = {
            "active_replicas": len(self.pools["active_replicas"]),
            "prefill_replicas": len(self.pools["prefill_replicas"]),
            "decode_replicas": len(self.pools["decode_replicas"]),
            "max_num_seqs": max(seqs) if seqs else 0,
            **self._speculation_config(),
        }
        """Every knob's value in force (``max_num_seqs``: the largest of the groups' until set;
        ``gamma``, ``fused_fraction``: None while the scenario's γ policy or mode selector decides;
        ``parallelism``: the degree whose replicas are active, with parallelism candidates)."""
        self.active = [True] * len(plans)
        """Whether each replica may receive newly routed requests."""
        self.layouts: dict[int, list[int]] = {tp: list(members) for tp, members in fleet.layouts.items()}
        """Each tensor-parallel degree's replicas (empty without parallelism candidates)."""
        if self.layouts:
            # The scenario's own degree comes first and serves from the start; the others wait.
            tp, members = next(iter(self.layouts.items()))
            self.config["parallelism"] = tp
            self._use_layout(members)

    def _speculation_config(self) -> dict[str, float | None]:
        """``gamma`` and ``fused_fraction`` as the scenario sets them: a static γ policy's γ,
        mode ``fused`` (1) or ``distributed`` (0); None when adaptive."""
        fleet = self.fleet.draft_fleet
        if fleet is None:
            return {"gamma": None, "fused_fraction": None}
        from simpy_llm.policies.gamma import StaticGamma  # a draft fleet's: speculative decoding only

        cfg = fleet.config
        policy = fleet.new_policy()
        gamma = max(cfg.k_min, min(cfg.k_max, policy.gamma)) if type(policy) is StaticGamma else None
        fraction = {"fused": 1.0, "distributed": 0.0}.get(cfg.mode)
        return {"gamma": gamma, "fused_fraction": fraction}

    def current(self, knobs: Sequence[str]) -> dict[str, float | None]:
        """The configuration in force, over *knobs*."""
        return {k: self.config[k] for k in knobs}

    def pool_size(self, pool: str, config: Mapping[str, float | None] | None = None) -> int:
        """The replicas of *pool* active under *config* (default: the configuration in force)."""
        size = (self.config if config is None else config)[pool]
        if size is None:  # never: every pool has a size
            raise ValueError(f"{pool} has no size")
        return int(size)  # a count: configurations hold every knob as a number

    def gpus(self, config: Mapping[str, float]) -> int:
        """GPUs of the replicas *config* keeps active (the rest of the fleet as in force)."""
        merged = {**self.config, **config}
        pools = self.pools
        if "parallelism" in config:
            members = self.layouts[int(config["parallelism"])]
            pools = {**pools, "active_replicas": members}
            merged["active_replicas"] = len(members)
        plans = self.fleet.plans
        return sum(plans[i].gpus for pool in _POOLS for i in pools[pool][:self.pool_size(pool, merged)])

    def _use_layout(self, members: list[int]) -> list[tuple[int, bool]]:
        """Make *members* the co-located pool, every other replica of the layouts inactive;
        returns ``(replica, active)`` per replica whose activity changed."""
        router = self.routers["active_replicas"]
        entry = router.indices
        router.set_active([entry.index(i) for i in members])
        self.pools["active_replicas"] = members
        self.config["active_replicas"] = len(members)
        on = set(members)
        changed = []
        for layout in self.layouts.values():
            for i in layout:
                if self.active[i] != (i in on):
                    self.active[i] = i in on
                    changed.append((i, i in on))
        return changed

    def apply(self, config: Mapping[str, float]) -> list[tuple[int, bool]]:
        """Put *config* in force for newly routed work (``gamma``: newly started requests;
        ``fused_fraction``: newly admitted ones); returns ``(replica, active)`` per replica
        whose activity changed."""
        changed = []
        for knob, value in config.items():
            if knob in ("gamma", "fused_fraction"):
                drafts = self.fleet.draft_fleet
                if drafts is None:
                    raise ValueError(f"planner knob {knob} needs speculative decoding")
                if knob == "gamma":
                    drafts.plan_gamma(int(value))
                else:
                    drafts.plan_fused_fraction(float(value))
            elif knob == "parallelism":
                if int(value) not in self.layouts:
                    raise ValueError(f"planner knob parallelism: no replicas built at tp {value}")
                changed.extend(self._use_layout(self.layouts[int(value)]))
            elif knob == "max_num_seqs":
                for rep in self.fleet.replicas:
                    if hasattr(rep, "set_max_num_seqs"):
                        rep.set_max_num_seqs(int(value))
            else:
                members = self.pools[knob]
                router = self.routers[knob]
                entry = router.indices
                size = int(value)
                router.set_active([entry.index(i) for i in members[:size]])
                for n, i in enumerate(members):
                    on = n < size
                    if self.active[i] != on:
                        self.active[i] = on
                        changed.append((i, on))
            self.config[knob] = value
        return changed


@attrs.define(eq=False)
class PlannerLog:
    """What the planner did, for :class:`~simpy_llm.metrics.results.Results`."""

    rows: list[tuple] = attrs.field(factory=list)
    """One row per (tick, candidate) in :data:`DECISION_COLUMNS` order; a skipped tick has one."""
    activity: list[tuple[float, int, bool]] = attrs.field(factory=list)
    """``(time_s, replica, active)`` per change of a replica's activity."""
    gpus: list[int] = attrs.field(factory=list)
    """GPUs of each replica."""
    ticks: int = 0
    """Ticks run (skipped ones included)."""
    changes: int = 0
    """Ticks that applied a different configuration."""
    final: dict[str, float | None] = attrs.field(factory=dict)
    """The configuration in force at the end, over the planned knobs."""
    what_if_s: float = 0.0
    """Wall-clock seconds spent in what-if simulations."""
    triggers: list[tuple[int, float, str, float]] = attrs.field(factory=list)
    """``(tick, time_s, trigger, condition_s)`` per tick a trigger condition brought forward:
    the trigger's name and when its condition became true (the tick waits out
    ``ticks.min_gap_s``)."""


class Planner:
    """The planner process of one simulation.

    Parameters
    ----------
    host
        The simulation it plans for, as the planner sees it (:class:`PlannerHost`).
    config
        The scenario's ``planner`` section.
    policy
        Chooses among the evaluated candidates (default :class:`~simpy_llm.policies.planning.BestFeasible`).
    """

    def __init__(self, host: PlannerHost, config: PlannerConfig, policy: PlannerChoice | None = None) -> None:
        self.host = host
        self.config = config
        self.policy = policy or BestFeasible()
        self.control = FleetControl(host.fleet)
        self.knobs = config.candidates.knobs()
        self.candidates = config.candidates.combinations()
        self.rng = host.rng
        self.window_s = config.window_s if config.window_s is not None else config.interval_s
        """Recent arrivals each what-if replays, s (``window_s``, by default ``interval_s``)."""
        self.log = PlannerLog(gpus=[p.gpus for p in host.fleet.plans], final=self.control.current(self.knobs))
        for i, on in enumerate(self.control.active):
            if not on:  # a replica of another parallelism layout: its GPUs are not in use
                self.log.activity.append((0.0, i, False))
        self.arrivals = host.arrival_log()
        """The requests that arrived since the last tick's window began, in arrival order."""
        self._fired: Event | None = None
        """With ``ticks``: the event a trigger succeeds (None until the first tick)."""
        self._cause: tuple[str, float] = ("", math.nan)
        """The trigger that succeeded :attr:`_fired` and when its condition became true."""
        self._over: list[bool] = []
        """With ``ticks.on.queue_over``: whether each replica was last seen at or over the bound."""
        self._deliver: list[Callable[[Request], None]] = []
        """With ``ticks``: each replica's delivery past the planner (to where its inbox delivered before)."""
        self._routed = 0
        """With ``ticks.on.arrival_burst``: requests that reached an entry replica since the last tick."""
        if config.ticks is None:
            self.process = host.env.process(self._run())
        else:
            self.watch()
            self.process = host.env.process(self._run_triggered())

    def _run(self) -> Generator[Event, None, None]:
        """Process: a tick at ``first_tick_s`` and every ``interval_s`` after, while the run is active.

        Yields
        ------
        Timeout
            Until the next tick.
        """
        env = self.host.env
        first = self.config.first_tick_s
        yield env.timeout(first if first is not None else self.config.interval_s)
        tick = 0
        while self.host.active():
            self.tick(tick)
            tick += 1
            yield env.timeout(self.config.interval_s)

    def _run_triggered(self) -> Generator[Event, None, None]:
        """Process: a tick at ``first_tick_s``, then ``interval_s`` after the last tick or when
        a trigger fires, whichever comes first, never sooner than ``ticks.min_gap_s`` after
        the last tick.

        Yields
        ------
        Event
            Until the next tick: a timeout, or any of the cadence's timeout and the trigger.
        """
        env = self.host.env
        ticks = self.config.ticks
        assert ticks is not None  # this process runs only with ticks
        first = self.config.first_tick_s
        yield env.timeout(first if first is not None else self.config.interval_s)
        tick = 0
        while self.host.active():
            self.tick(tick)
            tick += 1
            last = env.now
            fired = self._fired = env.event()
            self._routed = 0
            cadence = env.timeout(self.config.interval_s)
            yield env.any_of([cadence, fired])
            if cadence.processed or not fired.triggered:
                continue
            name, at = self._cause
            self.log.triggers.append((tick, max(at, last + ticks.min_gap_s), name, at))
            wait = last + ticks.min_gap_s - env.now
            if wait > 0:
                yield env.timeout(wait)

    def watch(self) -> None:
        """Check the trigger conditions as each request reaches a replica: the planner stands
        between every replica's inbox and the replica (:meth:`~simpy_llm.kernel.Wire.intercept`)."""
        on = self.config.ticks.on if self.config.ticks is not None else None
        if on is None:
            return
        plans = self.host.fleet.plans
        replicas = self.host.fleet.replicas
        self._over = [False] * len(replicas)
        wires = self.host.fleet.wires
        for i in range(len(replicas)):
            entry = plans[i].role != "decode"
            self._deliver.append(wires[f"replica:{i}"].intercept(functools.partial(self._delivered, i, entry)))

    def _delivered(self, i: int, entry: bool, req: Request) -> None:
        """*req* reaches replica *i*: deliver it, then check the triggers."""
        self._deliver[i](req)
        ticks = self.config.ticks
        assert ticks is not None  # watched only with ticks
        on = ticks.on
        if on.queue_over is not None:
            over = len(self.host.fleet.replicas[i].waiting) >= on.queue_over
            if over and not self._over[i]:
                self._fire("queue_over")
            self._over[i] = over
        if entry and on.arrival_burst is not None:
            self._routed += 1
            if self._routed == on.arrival_burst:
                self._fire("arrival_burst")

    def _fire(self, name: str) -> None:
        """Bring the next tick forward (the first condition since the last tick counts)."""
        fired = self._fired
        if fired is not None and not fired.triggered:
            self._cause = (name, self.host.env.now)
            fired.succeed()

    def window(self) -> list[Request]:
        """The requests that arrived in the last ``window_s`` (the log is trimmed to them)."""
        start = self.host.env.now - self.window_s
        log = self.arrivals
        kept = [r for r in log if r.arrival_s > start]
        log[:] = kept
        return kept

    def tick(self, tick: int) -> None:
        """Gather telemetry, evaluate every candidate, apply the chosen one."""
        cfg, log, fleet = self.config, self.log, self.host.fleet
        now = self.host.env.now
        reqs = self.window()
        waiting = sum(len(r.waiting) for r in fleet.replicas)
        running = sum(len(r.running) for r in fleet.replicas)
        log.ticks += 1
        seed = int(self.rng.integers(0, 2**62))  # drawn every tick, skipped or not: ticks stay aligned
        if len(reqs) < cfg.min_requests:
            log.rows.append((tick, now, "skipped", len(reqs), waiting, running, "", 0, math.nan, False, math.nan, False, False))
            return
        arrivals = what_if_arrivals(reqs, now - self.window_s, speculative=fleet.draft_fleet is not None)
        wall0 = time.perf_counter()
        evaluations = [self.evaluate(c, arrivals, seed) for c in self.candidates]
        log.what_if_s += time.perf_counter() - wall0
        current_config = self.control.current(self.knobs)
        current = next((i for i, c in enumerate(self.candidates) if c == current_config), -1)
        chosen = self.policy.choose(evaluations, current)
        if not 0 <= chosen < len(evaluations):
            raise ValueError(f"planner choice returned {chosen}; there are {len(evaluations)} candidates")
        applied = chosen != current
        if applied:
            for replica, on in self.control.apply(self.candidates[chosen]):
                log.activity.append((now, replica, on))
            log.changes += 1
            log.final = self.control.current(self.knobs)
        for i, e in enumerate(evaluations):
            log.rows.append((tick, now, "evaluated", len(reqs), waiting, running, describe(e.config), e.gpus,
                             e.score, e.feasible, e.violation, i == chosen, applied and i == chosen))

    def evaluate(self, candidate: dict[str, float], arrivals: Sequence[tuple[float, dict[str, Any]]], seed: int) -> Evaluation:
        """Score *candidate* by a what-if simulation replaying *arrivals* (offset, request fields)."""
        summary, unfinished = self.host.what_if(candidate, arrivals, seed, self.window_s)
        gpus = self.control.gpus(candidate)
        score = objective_value(self.config.objective, summary, gpus)
        violation = math.inf if unfinished else 0.0
        for path, bound in self.config.constraints.items():
            value = metric(summary, path)
            if value is None or value != value:
                violation = math.inf
            elif value > bound:
                excess = value / bound - 1.0 if bound > 0 else math.inf
                violation = max(violation, excess)
        return Evaluation(config=candidate, gpus=gpus, score=score, feasible=violation == 0.0, violation=violation)


def what_if_arrivals(requests: Sequence[Request], start_s: float, *, speculative: bool) -> list[tuple[float, dict[str, Any]]]:
    """*requests* as a what-if replays them: ``(offset_s, fields)`` in order of offset, each
    offset from *start_s* to where the workload put the request (its arrival at the router,
    or with speculative decoding when its client sent it to the draft fleet: :func:`sent_s`),
    the fields what the workload decided (not the lifecycle)."""
    when = sent_s if speculative else _arrival_s
    return sorted(((max(when(r) - start_s, 0.0), {f: getattr(r, f) for f in _COPIED}) for r in requests), key=lambda a: a[0])


def _arrival_s(req: Request) -> float:
    return req.arrival_s


def sent_s(req: Request) -> float:
    """When *req*'s client sent it: its arrival less its upload and its wait for a draft
    device (each counted when known).

    >>> sent_s(Request(id=0, client_id="c", prompt_tokens=8, output_tokens=4, arrival_s=5.0, upload_s=0.5, draft_wait_s=1.0))
    3.5
    """
    t = req.arrival_s
    if req.upload_s == req.upload_s:
        t -= req.upload_s
    if req.draft_wait_s == req.draft_wait_s:
        t -= req.draft_wait_s
    return t


def metric(summary: Any, path: str) -> float | None:
    """The number at dotted *path* of *summary* (None when absent or undefined)."""
    value = summary
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
        if value is None:
            return None
    return float(value)


def objective_value(objective: str, summary: Any, gpus: int) -> float:
    """*objective* of a what-if's *summary* (higher is better).

    The named goodputs are over the what-if's whole run, its drain included
    (``goodput.whole_run_requests_per_s``): a candidate that leaves a backlog pays for
    the time it takes to clear it."""
    if objective == "goodput_per_gpu":
        return summary["goodput"]["whole_run_requests_per_s"] / gpus if gpus else math.nan
    if objective == "goodput":
        return summary["goodput"]["whole_run_requests_per_s"]
    sign = -1.0 if objective.startswith("-") else 1.0
    value = metric(summary, objective.removeprefix("-"))
    return math.nan if value is None else sign * value


def gpu_seconds(columns: dict[str, np.ndarray], kv_starts: dict[int, float], log: PlannerLog, end_s: float) -> float:
    """GPU-seconds of a planned run: each replica's GPUs times the time it was active or
    still draining the requests routed to it while active.

    A replica that leaves its pool at ``t`` counts until the last request routed to it by
    ``t`` has left it (completed, dropped, or handed off to a decode replica: *kv_starts*
    gives each handed-off request's hand-off time).
    """
    n = len(log.gpus)
    arrival = columns["arrival_s"]
    completion = columns["completion_s"]
    replica = columns["replica"]
    prefill = columns["prefill_replica"]
    ids = columns["request_id"]
    handoff = np.array([kv_starts.get(int(i), math.nan) for i in ids]) if kv_starts else np.full(len(ids), math.nan)
    done = np.where(np.isnan(completion), end_s, completion)
    # (routed to, routed at, left at) of every stay of a request at a replica
    on_prefill = prefill >= 0
    stays_r = np.concatenate([replica, prefill[on_prefill]])
    stays_in = np.concatenate([np.where(on_prefill, handoff, arrival), arrival[on_prefill]])
    stays_out = np.concatenate([done, np.where(np.isnan(handoff[on_prefill]), done[on_prefill], handoff[on_prefill])])
    total = 0.0
    for i in range(n):
        changes = [(t, on) for t, r, on in log.activity if r == i]
        intervals = []
        start: float | None = 0.0
        for t, on in changes:
            if on and start is None:
                start = t
            elif not on and start is not None:
                intervals.append((start, t))
                start = None
        if start is not None:
            intervals.append((start, end_s))
        mine = stays_r == i
        routed, left = stays_in[mine], stays_out[mine]
        covered = 0.0
        last = -math.inf
        for a, d in intervals:
            late = left[(routed <= d) & (routed >= a)]
            end = min(max(d, float(np.nanmax(late, initial=d))), end_s)
            a = max(a, last)
            if end > a:
                covered += end - a
                last = end
        total += log.gpus[i] * covered
    return total


def fleet_tp(plans: Sequence[ReplicaPlan]) -> int:
    """The tensor-parallel degree every replica of *plans* runs at.

    >>> from simpy_llm.config.engine import EngineConfig
    >>> fleet_tp([ReplicaPlan(group="a", engine=EngineConfig(), latency=None, capacity=1.0, gpus=2)] * 3)
    2

    Raises
    ------
    FieldValueError
        (field ``parallelism``) When the groups run at different degrees: a parallelism
        candidate sets one degree for the whole fleet.
    """
    tps = sorted({p.gpus for p in plans})
    if len(tps) != 1:
        raise FieldValueError(
            "parallelism", f"the replica groups run at different tp ({', '.join(map(str, tps))}); a candidate sets one for the whole fleet"
        )
    return tps[0]


def layout_serving(serving: ServingConfig, tp: int, base_tp: int) -> ServingConfig:
    """*serving* with every group at tensor-parallel degree *tp* and its GPUs kept: a group
    of ``n`` replicas at *base_tp* becomes ``n base_tp / tp`` replicas whose latency model
    is built with ``tp``. The result lists its groups under ``replica_groups``.

    >>> from simpy_llm.config.serving import ServingConfig
    >>> roofline = PolicySpec(kind="roofline", params={"model": "llama-3.1-8b-instruct", "gpu": "H100"})
    >>> s = ServingConfig(replicas=4, latency_model=roofline)
    >>> [(g.count, g.latency_model.params["tp"]) for g in layout_serving(s, 2, 1).groups()]
    [(2, 2)]

    Raises
    ------
    FieldValueError
        (field ``tp``) When a group's GPUs do not split into replicas of *tp* GPUs.
    """
    groups = []
    for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
        gpus = group.count * base_tp
        if gpus % tp:
            raise FieldValueError(
                "tp", f"serving.{path}count: {group.count} replicas x tp {base_tp} = {gpus} GPUs do not split into replicas of tp {tp}"
            )
        spec = group.latency_model
        assert spec is not None  # a continuous-batching group has one (config.serving.check_replica_kind)
        groups.append(attrs.evolve(group, count=gpus // tp, latency_model=PolicySpec(kind=spec.kind, params={**spec.params, "tp": tp})))
    return attrs.evolve(serving, replica_groups=tuple(groups), replicas=1, latency_model=None, engine=EngineConfig(), batch_server=None)


def parallelism_fleet(
    scenario: Scenario, plans: list[ReplicaPlan], latency_override: object = None, streams: RandomStreams | None = None
) -> tuple[list[ReplicaPlan], dict[int, list[int]]]:
    """*plans* (the scenario's fleet) and, with parallelism candidates, the replicas of each
    candidate degree it does not run at, after them; and each degree's replicas.

    Every layout keeps each group's GPUs (:func:`layout_serving`) and shares its group's
    name, so its replicas take the group's scheduler and latency stream. Without
    parallelism candidates: *plans* and no layouts.

    >>> from simpy_llm import load_scenario
    >>> sc = load_scenario("scenarios/planner_pool_split.yaml", ["planner.candidates={parallelism: [{tp: 1}, {tp: 2}]}"])
    >>> fleet, layouts = parallelism_fleet(sc, plan_fleet(sc.serving))
    >>> layouts, [p.gpus for p in fleet]
    ({2: [0, 1, 2, 3], 1: [4, 5, 6, 7, 8, 9, 10, 11]}, [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1])

    Raises
    ------
    ValueError
        When a latency model given in Python replaces the scenario's (it cannot be rebuilt at another degree).
    """
    planner = scenario.planner
    if planner is None or planner.candidates.parallelism is None:
        return plans, {}
    if latency_override is not None:
        raise ValueError("planner.candidates.parallelism rebuilds each group's latency model at each tp: "
                         "give the latency model in the scenario, not as Simulation(latency_model=...)")
    base = fleet_tp(plans)
    layouts = {base: list(range(len(plans)))}
    fleet = list(plans)
    for tp in planner.candidates.values("parallelism"):
        if tp in layouts:
            continue
        extra = plan_fleet(layout_serving(scenario.serving, int(tp), base), None, streams)
        layouts[int(tp)] = list(range(len(fleet), len(fleet) + len(extra)))
        fleet.extend(extra)
    return fleet, layouts


def what_if_layout(
    scenario: Scenario, candidate: Mapping[str, float], layouts: Mapping[int, Sequence[int]]
) -> tuple[Scenario, dict[str, float]]:
    """The scenario a what-if of *candidate* runs and the knobs it applies at time 0: with a
    ``parallelism`` other than the fleet's own (the first of *layouts*), the candidate
    degree's layout is the what-if's whole fleet.

    >>> from simpy_llm import load_scenario
    >>> sc = load_scenario("scenarios/planner_pool_split.yaml")
    >>> w, knobs = what_if_layout(sc, {"parallelism": 1, "max_num_seqs": 64}, {2: [0, 1, 2, 3], 1: list(range(4, 12))})
    >>> knobs, [(g.count, g.latency_model.params["tp"]) for g in w.serving.groups()]
    ({'max_num_seqs': 64}, [(8, 1)])
    """
    knobs = {k: v for k, v in candidate.items() if k != "parallelism"}
    if "parallelism" not in candidate or not layouts:
        return scenario, knobs
    base = next(iter(layouts))
    tp = int(candidate["parallelism"])
    if tp == base:
        return scenario, knobs
    return attrs.evolve(scenario, serving=layout_serving(scenario.serving, tp, base)), knobs
