"""Exact sharded runs: a fleet split across processes, window by window (``docs/scale.md``).

With ``serving.view_refresh_s = Δ`` and ``serving.view_refresh_fields: all`` a router
knows, inside each window ``[kΔ, (k+1)Δ)``, only the replicas' state as of ``kΔ`` and the
counts of what it routed itself. Its decisions inside a window therefore depend on
nothing the replicas do inside it, which is an exact lookahead of Δ for a conservative
parallel run:

* the **coordinator** makes the workload's arrivals exactly as a single run does (the
  same sources and random streams), routes each window's arrivals with the entry
  router's policy (the cluster router with ``serving.clusters``, else the router) over
  views holding the snapshot taken at ``kΔ``, and sends every executor slot the
  window's targets (4 bytes a request); it makes the next window's arrivals while the
  slots advance;
* each **slot** makes the window's rows again (cheaper than pickling requests; right
  after replying to the last window, while it waits) and gives each of its shards those
  routed to it;
* each **shard** is a :class:`~simpy_llm.simulation.Simulation` of the scenario driven
  from outside (``external_arrivals``), owning some clusters (or a contiguous run of
  replicas): it injects each request at exactly its arrival time, simulates to
  ``(k+1)Δ`` and returns the snapshot fields of its replicas.

A shard builds the whole fleet (so every replica keeps its fleet index and its random
streams, which are named by index) but only its own replicas ever receive a request.
The records are merged and sorted by request id: the same, byte for byte, as the single
run's. See :func:`run_sharded` for what the summary shares and what it does not. The
arrivals are made in :mod:`~simpy_llm.explore.sharded_arrivals`; the slots, and how the
coordinator calls them, are in :mod:`~simpy_llm.explore.sharded_hosts`.

Examples
--------
>>> from simpy_llm import Simulation, load_scenario
>>> scenario = load_scenario("scenarios/seed003_multi_cluster.yaml", [
...     "workload.horizon_s=5", "serving.view_refresh_s=0.5", "serving.view_refresh_fields=all"])
>>> sharded = run_sharded(scenario, shards=3)          # in-process shards, one after another
>>> single = Simulation(scenario).run(progress=False)
>>> sharded.to_dataframe().equals(single.to_dataframe())
True
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import pickle
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.structure import build_policy
from simpy_llm.explore.sharded_arrivals import _Arrivals
from simpy_llm.explore.sharded_hosts import (
    SNAPSHOT_FIELDS,
    _Host,
    _Local,
    _Piped,
    _Remote,
    _ShardHost,
    _window_end,
    piped_host,
)
from simpy_llm.kernel import Environment
from simpy_llm.metrics.monitors import LevelMonitor
from simpy_llm.metrics.recorder import RECORD_FIELDS, Recorder
from simpy_llm.metrics.results import Results
from simpy_llm.policies.routing import routing_policies
from simpy_llm.rng import RandomStreams
from simpy_llm.serving.router import Router
from simpy_llm.serving.views import ClusterView, RouterCounts
from simpy_llm.simulation import Simulation
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario
    from simpy_llm.entities import Request

__all__ = ["QUIET_WORKERS", "ShardedRun", "WindowStats", "run_sharded", "sharding_problems"]

QUIET_WORKERS: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.tick.interval": "1s",
}
"""Dask settings for a cluster that runs shards (``dask.config.set(QUIET_WORKERS)`` before
making it; :func:`run_sharded` with *workers* does so for the cluster it makes).

A shard keeps its core busy for the whole run, and Dask's own periodic work takes time
from it: by default each worker samples its threads' stacks for the profiler every 10 ms,
checks its memory every 100 ms and its system every 500 ms, and the scheduler and
workers tick their event loops every 20 ms. On 2 cores that took ~0.2 CPU s a worker and
~0.15 s in the coordinator's process over a 4 s run (``benchmarks/RESULTS.md``). Without
the profiler and with slower checks the workers still spill, pause and report as
configured, a second later at most; the dashboard's profile page stays empty.
"""


def sharding_problems(scenario: Scenario) -> list[tuple[str, str]]:
    """What keeps *scenario* from an exact sharded run: ``(key path, reason)`` pairs (empty: none).

    The first version shards open-loop workloads over co-located replicas whose entry
    router reads stale views of every field.

    Examples
    --------
    >>> from simpy_llm import load_scenario
    >>> [key for key, _ in sharding_problems(load_scenario("scenarios/quickstart.yaml"))]
    ['serving.view_refresh_s']
    """
    serving, wl = scenario.serving, scenario.workload
    problems: list[tuple[str, str]] = []
    if serving.view_refresh_s is None:
        problems.append(("serving.view_refresh_s", "required: a sharded run advances in windows of the views' refresh period"))
    elif serving.view_refresh_fields != "all":
        problems.append(("serving.view_refresh_fields", "must be all: with state the router reads departures live, so its "
                         "decisions inside a window depend on what the shards simulate in it"))
    router_key = "serving.cluster_router" if serving.clusters else "serving.router"
    entry = serving.entry_router
    scorers = (entry.params or {}).get("weights", {}) if entry.kind == "weighted_score" else {}
    if entry.kind == "prefix_affinity" or "prefix" in scorers:
        problems.append((router_key, "reads the replicas' prefix caches, which live in other shards"))
    if serving.admission.kind != "always":
        problems.append(("serving.admission", "not sharded yet: only always (an admission drop would be the coordinator's record)"))
    for key, given, why in (
        ("serving.disaggregation", serving.disaggregation is not None, "a KV hand-off would cross shards"),
        ("serving.gateway", serving.gateway is not None, "its saturation needs the live counts of one router"),
        ("planner", scenario.planner is not None, "its ticks resize the whole fleet at once"),
        ("autoscaler", scenario.autoscaler is not None, "it resizes the whole fleet at once"),
        ("speculation", scenario.speculation is not None, "draft devices stand before the router"),
        ("processes", bool(scenario.processes), "a user process may act across shards"),
        ("workload.max_concurrency", wl.max_concurrency is not None,
         "closed loop: the next request waits for a completion inside the window"),
        ("simulation.timeseries_interval_s", scenario.simulation.timeseries_interval_s is not None,
         "not merged across shards yet"),
    ):
        if given:
            problems.append((key, f"not sharded: {why}"))
    for i, client in enumerate(wl.clients):
        for field, given in (
            ("multi_turn", client.multi_turn is not None),
            ("conversational_probability", client.conversational_probability > 0),
            ("agentic", client.agentic is not None),
        ):
            if given:
                problems.append((f"workload.clients[{i}].{field}", "closed loop: a session's next round depends on a "
                                 "completion inside the window"))
        if client.network is not None:
            problems.append((f"workload.clients[{i}].network", "not sharded yet: the uplinks stand before the router"))
    return problems


def _refuse_unshardable(scenario: Scenario) -> None:
    problems = sharding_problems(scenario)
    if problems:
        raise ScenarioError(scenario.loaded_from or "<dict>", problems, what="scenario for a sharded run")

class _ReportedView:
    """A replica as the coordinator's router sees it: the fields its shard reported at the
    window's start (as a :class:`~simpy_llm.serving.views.FullSnapshotView` holds them),
    and the router's own counts."""

    __slots__ = ("_departed", "_departed_tokens", "_kv_free", "_kv_used", "_queued", "_routed", "_routed_tokens",
                 "_running", "_waiting", "capacity", "group", "index", "kv_total_blocks", "prefill_s_per_token")

    def __init__(self, statics: tuple[int, str, float, int, float], counts: RouterCounts) -> None:
        self.index, self.group, self.capacity, self.kv_total_blocks, self.prefill_s_per_token = statics
        # The counts' lists (changed in place by the router), held to spare a lookup per read.
        self._routed, self._routed_tokens = counts.routed, counts.routed_tokens
        self.set((0,) * SNAPSHOT_FIELDS)

    def set(self, fields: Sequence[int]) -> None:
        """Take the reported fields (:data:`SNAPSHOT_FIELDS` of them, in order)."""
        (self._waiting, self._running, self._queued, self._kv_free, self._kv_used,
         self._departed, self._departed_tokens) = fields

    @property
    def outstanding_requests(self) -> int:
        return self._routed[self.index] - self._departed

    @property
    def outstanding_tokens(self) -> int:
        return self._routed_tokens[self.index] - self._departed_tokens

    @property
    def waiting_requests(self) -> int:
        return self._waiting

    @property
    def running_requests(self) -> int:
        return self._running

    @property
    def queued_prompt_tokens(self) -> int:
        return self._queued

    @property
    def kv_free_blocks(self) -> int:
        return self._kv_free

    @property
    def kv_utilization(self) -> float:
        return self._kv_used / self.kv_total_blocks

    def prefix_hit_tokens(self, request: Request) -> int:
        raise RuntimeError("a sharded run's entry router cannot read prefix caches: they live in the shards")


class _ReportedClusterView(ClusterView):
    """A cluster as the coordinator's cluster router sees it: its replicas' reported
    fields summed, and outstanding counts from what the router sent to the cluster (the
    sum, over its replicas, of what the cluster's own router sent each, as in a single run)."""

    __slots__ = ("_departed", "_departed_tokens", "_routed", "_routed_tokens")

    def __init__(self, index: int, name: str, views: Sequence[_ReportedView], counts: RouterCounts) -> None:
        super().__init__(index, name, views)  # type: ignore[arg-type]  # ClusterView reads only the ReplicaView fields
        self._routed, self._routed_tokens = counts.routed, counts.routed_tokens
        self.refresh()

    def refresh(self) -> None:
        """Sum the departures its replicas reported."""
        views: tuple[_ReportedView, ...] = self._views  # type: ignore[assignment]  # built from _ReportedViews
        self._departed = sum(v._departed for v in views)
        self._departed_tokens = sum(v._departed_tokens for v in views)

    @property
    def outstanding_requests(self) -> int:
        return self._routed[self.index] - self._departed

    @property
    def outstanding_tokens(self) -> int:
        return self._routed_tokens[self.index] - self._departed_tokens


class WindowStats(NamedTuple):
    """Figures of a sharded run's windows (what :attr:`ShardedRun.windows` holds)."""

    windows: int
    """Windows advanced."""
    routed: int
    """Requests routed (shipped to the shards)."""
    route_s: float
    """Wall seconds the coordinator spent routing and sending, while the slots waited (and
    making the first window's arrivals)."""
    route_cpu_s: float
    """CPU seconds the coordinator's thread spent on what ``route_s`` counts."""
    advance_s: float
    """Wall seconds from sending a window to the last slot's reply (their simulation and
    the messages; ``make_s`` inside it)."""
    sent_bytes: int
    """Pickled bytes of the arrivals shipped."""
    reply_bytes: int
    """Pickled bytes of the snapshots returned (0 unless ``measure_messages``)."""
    host_busy_s: tuple[float, ...]
    """Wall seconds each executor slot spent advancing its shards (measured where they run)."""
    host_cpu_s: tuple[float, ...]
    """CPU seconds each slot's thread spent advancing its shards (below ``host_busy_s``
    when the slot waited for a core)."""
    slowest_s: float
    """The sum over the windows of the slowest slot's wall time: the wait had the messages
    cost nothing."""
    slowest_cpu_s: float
    """The sum over the windows of the slowest slot's CPU time: with ``route_cpu_s``, the
    run's critical path on cores of its own."""
    make_s: float = 0.0
    """Wall seconds the coordinator spent making the next window's arrivals, and replaying
    the last window's changes of the requests in the system, while the slots advanced (off
    the critical path on cores of its own)."""
    make_cpu_s: float = 0.0
    """CPU seconds of ``make_s``."""
    finish_s: float = 0.0
    """Wall seconds from asking the slots to finish to their records received."""
    merge_s: float = 0.0
    """Wall seconds merging the records and tallies into Results."""
    start_s: float = 0.0
    """Wall seconds from :meth:`ShardedRun.run` to the first window: the slots built (on
    workers: the library imported there, the actors created, their connections made;
    with ``workers``, the cluster's start too) and their first snapshot."""
    host_prep_cpu_s: tuple[float, ...] = ()
    """CPU seconds of ``host_cpu_s`` each slot spent before its shards advanced: reading
    the window's message, making the window's rows (unless made ahead) and handing its own
    to its shards (work a single run does not do, but for making the requests)."""
    host_ahead_cpu_s: tuple[float, ...] = ()
    """CPU seconds each slot spent making the next window's rows right after replying,
    outside ``host_cpu_s`` (a slot served over its own connection does; the rows need no
    routing, and the slot would otherwise wait for the other slots or the routing)."""


class _Coordinator:
    """The workload and the entry router, over views holding the shards' reports."""

    def __init__(self, scenario: Scenario, statics: list[tuple[int, str, float, int, float]]) -> None:
        serving = scenario.serving
        env = self.env = Environment()
        n_replicas = len(statics)
        counts = RouterCounts(n_replicas)
        self.views = [_ReportedView(s, counts) for s in sorted(statics)]
        self.cluster_views: list[_ReportedClusterView] = []
        if serving.clusters:
            counts = RouterCounts(len(serving.clusters))
            cluster_of = serving.cluster_of()
            for c, cl in enumerate(serving.clusters):
                members = [v for v in self.views if cluster_of[v.group] == cl.name]
                self.cluster_views.append(_ReportedClusterView(c, cl.name, members, counts))
            views: Sequence[Any] = self.cluster_views
        else:
            views = self.views
        self.targets: list[int] = []
        """The target of each request routed in the current window, in arrival order."""
        outboxes = []
        for target in range(len(views)):
            outbox = Wire(env)
            outbox.connect(functools.partial(self._ship, target))
            outboxes.append(outbox)
        policy = build_policy(serving.entry_router, routing_policies, rng=RandomStreams(scenario.seed).stream("router"))
        # The router is called for each arrival (route); its environment never runs: with
        # admission always, routing reads no clock.
        self.router = Router(env, Wire(env), outboxes, views, counts, policy, Recorder(num_replicas=n_replicas))
        self.arrivals = _Arrivals(scenario, quiet=False)

    def _ship(self, target: int, req: Request) -> None:
        self.targets.append(target)

    def report(self, snapshots: Sequence[Sequence[int]], owned: Sequence[Sequence[int]]) -> None:
        """Take each shard's snapshot of its replicas (*owned*: their fleet indices, in order)."""
        views = self.views
        for fields, indices in zip(snapshots, owned, strict=True):
            for k, i in enumerate(indices):
                views[i].set(fields[k * SNAPSHOT_FIELDS:(k + 1) * SNAPSHOT_FIELDS])
        for cv in self.cluster_views:
            cv.refresh()

    def make_until(self, until: float) -> list[Request]:
        """Make the arrivals before *until* (after the previous window's), in arrival order:
        work that needs no snapshot, done while the slots advance the window before."""
        return self.arrivals.every(until)

    def route(self, requests: Sequence[Request]) -> list[int]:
        """Route *requests* (one window's, in arrival order) over the views as reported; return their targets."""
        route = self.router.route
        for req in requests:
            route(req)
        targets, self.targets = self.targets, []
        return targets


class ShardedRun:
    """One sharded run of *scenario* (see :func:`run_sharded` for the parameters).

    After :meth:`run`, :attr:`windows` holds the windows' figures; *measure_messages*
    adds the pickled size of the snapshots returned (the arrivals' messages are always
    counted).
    """

    def __init__(self, scenario: Scenario, *, workers: int | None = None, client: Any = None, shards: int | None = None,
                 measure_messages: bool = False) -> None:
        _refuse_unshardable(scenario)
        self.scenario = scenario
        serving = scenario.serving
        units = len(serving.clusters) if serving.clusters else _fleet_size(scenario)
        slots = workers if client is None else len(client.scheduler_info()["workers"])
        n = shards or slots or (units if serving.clusters else 1)
        if not 1 <= n <= units:
            raise ValueError(f"shards must be 1 to {units} (the {'clusters' if serving.clusters else 'replicas'}), got {n}")
        self.targets = [list(part) for part in np.array_split(np.arange(units), n)]
        """The entry router's positions each shard serves (contiguous)."""
        self.workers = workers
        self.client = client
        self.measure_messages = measure_messages
        self.windows: WindowStats | None = None
        self._started = 0.0

    def run(self) -> Results:
        """Run to the end (every request finished, or ``simulation.until_s``)."""
        self._started = time.perf_counter()
        if self.client is not None:
            return self._run_on(self.client)
        if self.workers:
            import dask  # the explore extra's; only a run on workers needs it
            from dask.distributed import Client, LocalCluster

            with dask.config.set(QUIET_WORKERS):  # read by the scheduler and by each worker as it starts
                cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address="127.0.0.1:0")
            with cluster, Client(cluster) as client:
                return self._run_on(client)
        return self._drive([_Local(_ShardHost(self.scenario, self.targets))], [list(range(len(self.targets)))])

    def _run_on(self, client: Any) -> Results:
        addresses = sorted(client.scheduler_info()["workers"])
        slots = min(len(addresses), len(self.targets))
        groups = [list(range(k, len(self.targets), slots)) for k in range(slots)]
        building = [  # every slot builds its shards at once
            client.submit(_ShardHost, self.scenario, [self.targets[s] for s in g], actor=True, workers=[addresses[k]],
                          allow_other_workers=False)
            for k, g in enumerate(groups)
        ]
        actors = [future.result() for future in building]
        serve_on = [piped_host(a) for a in addresses[:slots]]
        if any(host is None for host in serve_on):
            return self._drive([_Remote(a, len(g)) for a, g in zip(actors, groups, strict=True)], groups)
        key = secrets.token_bytes(32)
        listening = [a.listen(host, key) for a, host in zip(actors, serve_on, strict=True)]
        piped = [_Piped(tuple(pending.result()), key) for pending in listening]
        try:
            return self._drive(piped, groups)
        finally:
            for host in piped:
                host.close()

    def _drive(self, hosts: Sequence[_Host], groups: list[list[int]] | None = None) -> Results:
        """:meth:`_windows`, with the garbage collector's young threshold raised (:func:`_fewer_collections`)."""
        with _fewer_collections():
            return self._windows(hosts, groups)

    def _windows(self, hosts: Sequence[_Host], groups: list[list[int]] | None = None) -> Results:
        """The windows: route with the snapshot at kΔ, advance every shard to (k+1)Δ.

        While the slots advance window k, the coordinator makes window k+1's arrivals
        (which need no snapshot); routing them waits for the slots' snapshots.
        """
        scenario = self.scenario
        groups = groups or [[s] for s in range(len(self.targets))]
        order = [s for g in groups for s in g]  # shards in the hosts' order
        wall0 = time.perf_counter()
        statics_by_host = [h.call("statics") for h in hosts]
        statics = [s for per_host in statics_by_host for per_shard in per_host for s in per_shard]
        owned_by_shard: list[list[int]] = [[] for _ in self.targets]
        for s, per_shard in zip(order, (p for per_host in statics_by_host for p in per_host), strict=True):
            owned_by_shard[s] = [st[0] for st in per_shard]
        coordinator = _Coordinator(scenario, statics)
        owned = [owned_by_shard[s] for s in order]
        coordinator.report([f for h in hosts for f in h.call("snapshot")], owned)
        start_s = time.perf_counter() - self._started
        until = scenario.simulation.until_s
        t, windows, routed, route_s, advance_s, sent_bytes, reply_bytes = 0.0, 0, 0, 0.0, 0.0, 0, 0
        host_busy, host_cpu, slowest_s, slowest_cpu_s, route_cpu_s = [0.0] * len(hosts), [0.0] * len(hosts), 0.0, 0.0, 0.0
        make_s = make_cpu_s = 0.0
        in_system = _InSystem()
        host_prep, host_ahead = [0.0] * len(hosts), [0.0] * len(hosts)
        cpu0 = time.thread_time()
        requests = coordinator.make_until(_window_end(scenario, t))
        route_cpu_s += time.thread_time() - cpu0
        route_s += time.perf_counter() - wall0
        while until is None or t < until:
            t = _window_end(scenario, t)
            w0, cpu0 = time.perf_counter(), time.thread_time()
            targets = coordinator.route(requests)
            message = pickle.dumps((np.array(targets, dtype=np.int32).tobytes(), t), protocol=pickle.HIGHEST_PROTOCOL)
            routed += len(targets)
            sent_bytes += len(message) * len(hosts)
            pending = [h.start("advance", message) for h in hosts]
            w1, cpu1 = time.perf_counter(), time.thread_time()
            route_cpu_s += cpu1 - cpu0
            route_s += w1 - w0
            last = until is not None and t >= until
            requests = [] if last else coordinator.make_until(_window_end(scenario, t))
            in_system.replay()
            make_s += time.perf_counter() - w1
            make_cpu_s += time.thread_time() - cpu1
            done = [h.wait(p) for h, p in zip(hosts, pending, strict=True)]
            advance_s += time.perf_counter() - w1
            replies = [r for host_replies, *_ in done for r in host_replies]
            for k, (_, took, cpu, prep, ahead) in enumerate(done):
                host_busy[k] += took
                host_cpu[k] += cpu
                host_prep[k] += prep
                host_ahead[k] += ahead
            slowest_s += max(d[1] for d in done)
            slowest_cpu_s += max(d[2] for d in done)
            windows += 1
            if self.measure_messages:
                reply_bytes += len(pickle.dumps(replies, protocol=pickle.HIGHEST_PROTOCOL))
            coordinator.report([snap for snap, _, _ in replies], owned)
            in_system.add([changes for _, _, changes in replies], t)
            if coordinator.arrivals.exhausted and not requests and not any(live for _, live, _ in replies):
                break
        w0 = time.perf_counter()
        finishing = [h.start("finish", until) for h in hosts]
        parts = [p for h, pending in zip(hosts, finishing, strict=True) for p in h.wait(pending)]
        finish_s = time.perf_counter() - w0
        in_system.add([p["in_system"] for p in parts], math.inf)
        in_system.replay()
        results = _merge(scenario, parts, len(statics), statics, in_system.level, time.perf_counter() - wall0)
        self.windows = WindowStats(windows, routed, route_s, route_cpu_s, advance_s, sent_bytes, reply_bytes,
                                   tuple(host_busy), tuple(host_cpu), slowest_s, slowest_cpu_s, make_s, make_cpu_s,
                                   finish_s, time.perf_counter() - w0 - finish_s, start_s, tuple(host_prep),
                                   tuple(host_ahead))
        return results


YOUNG_THRESHOLD = 50_000
"""The garbage collector's first threshold while a sharded run's windows go (at least)."""


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the garbage collector's first threshold to :data:`YOUNG_THRESHOLD` (unless
    higher already), and restore it after.

    The coordinator makes the next window's requests (~1,300 a window in
    ``bench_sharded``) while the slots advance, and they live until they are routed. With
    the default threshold (700) every window's making set off a collection that found
    them alive; they were promoted, and the older generations' collections then walked
    the coordinator's whole process (Dask's client and scheduler with it): 800
    collections and ~0.6 of its ~4 CPU seconds at 1,000,000 requests, on cores the slots
    need. The requests die by reference count once routed, so there is nothing there to
    collect; reference cycles made meanwhile (by other threads, or by shards run in this
    process) are still collected, less often. Nothing else of the collector's settings is
    changed.
    """
    first, second, third = gc.get_threshold()
    gc.set_threshold(max(first, YOUNG_THRESHOLD), second, third)
    try:
        yield
    finally:
        gc.set_threshold(first, second, third)


def _fleet_size(scenario: Scenario) -> int:
    serving = scenario.serving
    if serving.replica_groups:
        return sum(g.count for g in serving.replica_groups)
    return serving.replicas


class _InSystem:
    """The fleet's requests in the system, replayed from the shards' changes window by window.

    A window's changes wait until the next window is sent (:meth:`replay` then runs beside
    the slots); those at or after the window's end wait for the next window's, so that
    the changes of one instant, from any shard, are replayed together: arrivals before
    departures, as :meth:`LevelMonitor.replay` orders them, and as a single run's are.
    Every later change is at or after the window's end, so the level, its peak and its
    area (summed in the order of time) are those of one replay of all changes.
    """

    def __init__(self) -> None:
        self.level = LevelMonitor()
        self._times = np.empty(0, dtype=np.float64)
        self._deltas = np.empty(0, dtype=np.int64)
        self._due = 0

    def add(self, changes: Sequence[tuple[bytes, bytes]], end: float) -> None:
        """Take the shards' changes (time and delta bytes) of a window ending at *end*,
        beside those not replayed yet."""
        self._times = np.concatenate([self._times, *(np.frombuffer(t, dtype=np.float64) for t, _ in changes)])
        self._deltas = np.concatenate([self._deltas, *(np.frombuffer(d, dtype=np.int64) for _, d in changes)])
        order = np.argsort(self._times, kind="stable")
        self._times, self._deltas = self._times[order], self._deltas[order]
        self._due = int(np.searchsorted(self._times, end, side="left"))

    def replay(self) -> None:
        """Replay the changes before the last window's end."""
        if self._due:
            self.level.replay(self._times[:self._due], self._deltas[:self._due])
            self._times, self._deltas, self._due = self._times[self._due:], self._deltas[self._due:], 0


def _merge(scenario: Scenario, parts: list[dict[str, Any]], n_replicas: int,
           statics: list[tuple[int, str, float, int, float]], in_system: LevelMonitor, wall_s: float) -> Results:
    """The shards' records and tallies as one recorder's, frozen into Results."""
    merged = Recorder(num_replicas=n_replicas)
    columns = merged.columns
    itl_values, itl_weights = [], []
    batch_steps: Counter[int] = Counter()
    steps = 0
    events = 0
    for part in parts:
        for name, kind in RECORD_FIELDS:
            single = part["single"].get(name)
            raw = part["columns"][name] if single is None else single
            if kind == "s":
                codes = merged.codes[name]
                mapping = np.array([codes(value) for value in part["codes"][name]], dtype=np.int64)
                raw = mapping[np.frombuffer(raw, dtype=np.int64)].tobytes() if mapping.size else raw
            columns[name].frombytes(raw if single is None else raw * part["rows"])
        merged.arrived += part["arrived"]
        for name, values in part["per_replica"].items():
            target = getattr(merged, name)
            for i, value in zip(part["owned"], values, strict=True):
                target[i] = value
        steps += sum(part["replica_steps"])
        itl_values.append(np.frombuffer(part["itl"][0], dtype=np.float64))
        itl_weights.append(np.frombuffer(part["itl"][1], dtype=np.int64))
        batch_steps.update(part["batch_steps"])
        merged.preemptions += part["preemptions"]
        merged.cold_starts += part["cold_starts"]
        merged.batches += part["batches"]
        events += part["events"]
    merged.batch_steps = batch_steps
    merged.itl.extend(np.concatenate(itl_values), np.concatenate(itl_weights))
    merged.in_system = in_system  # replayed window by window (_InSystem)
    until = scenario.simulation.until_s
    if until is not None:
        end_s = until
    else:
        completions = np.frombuffer(columns["completion_s"], dtype=np.float64)
        arrivals = np.frombuffer(columns["arrival_s"], dtype=np.float64)
        end_s = max(float(np.nanmax(completions, initial=0.0)) if completions.size else 0.0, float(arrivals.max(initial=0.0)))
    plans = Simulation(scenario, external_arrivals=True).plans
    return Results.from_recorder(
        merged, scenario=scenario, end_s=end_s, wall_s=wall_s, events=events, steps=steps,
        kv_blocks=[s[3] for s in sorted(statics)], replica_groups=[p.group for p in plans],
        replica_devices=[(p.device, p.gpus) for p in plans], links={},
    )


def run_sharded(scenario: Scenario, *, workers: int | None = None, client: Any = None, shards: int | None = None) -> Results:
    """Run *scenario* split into shards, with records identical to ``Simulation(scenario).run()``'s.

    Parameters
    ----------
    scenario
        An open-loop scenario whose views are refreshed every Δ with every field
        (``serving.view_refresh_s``, ``serving.view_refresh_fields: all``); what else is
        refused, and why, is :func:`sharding_problems`'s list.
    workers
        Run the shards on a Dask ``LocalCluster`` of this many worker processes, made for
        the run (the ``explore`` extra). None, without *client*: in this process, one
        shard after another (the simplest executor, for checks).
    client
        A ``dask.distributed.Client`` to run the shards on: each worker holds an actor
        with its shards (``processes=False`` clusters work too, without the speed).
    shards
        How many shards (default: one per worker; in this process, one per cluster, or
        one). Shards are contiguous runs of clusters with ``serving.clusters``, else of
        replicas; several shards on one worker are advanced one after another.

    Returns
    -------
    Results
        The records of every shard, merged and sorted by request id: byte-identical to
        the single run's ``to_dataframe()``. The summary is computed from them as a
        single run's is, with the engine tallies (steps, busy time, tokens, batch sizes)
        taken from the replicas' own shards and the requests in the system merged from
        the shards' changes; the inter-token gaps' tally, whose figures do not depend on
        the order of its values, gives the single run's mean to the bit. What differs:
        ``wall_s`` and the events count (the shards', with their refreshes).
    """
    return ShardedRun(scenario, workers=workers, client=client, shards=shards).run()
