"""Simulation: builds the components from a scenario, wires their Stores, runs.

Kept whole (over 800 lines): the wiring is kept in one place: building and
connecting every component, and the runs made of it (a whole run, and the what-if runs a
planner asks for).

Wiring happens here and only here::

    WorkloadGenerator --Wire--> [ClientNetwork] --Wire--> Router (admission, routing) --Wire per replica--> Replica
          ^                 (uplinks)              | rejected                        |  (ingress + engine)
          |                                        |                                 |  or BatchServer
          +--- SessionRegistry <-------------------+----- completions Wire <---------+  completed, dropped

The ClientNetwork stands between only when some client has a ``network``. With a
``speculation`` section a DraftFleet stands there instead (draft devices run the
requests, prompts and bundles cross their links) and the replicas are VerifyServers.

Examples
--------
>>> from simpy_llm import Simulation, load_scenario
>>> sim = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=200"]))
>>> results = sim.run()
>>> results.summary()["requests"]["completed"]
200
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import sys
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, cast

import attrs
import numpy as np

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.structure import build_policy
from simpy_llm.entities import Request
from simpy_llm.kernel import Environment
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.metrics.results import Results
from simpy_llm.metrics.stream import DEFAULT_CHUNK_REQUESTS, RecordStream
from simpy_llm.policies.admission import AlwaysAdmit, admission_policies
from simpy_llm.policies.routing import routing_policies
from simpy_llm.policies.scheduling import scheduler_policies
from simpy_llm.processes import Ports, UserProcess, process_kinds, seam_error
from simpy_llm.progress import (
    AUTO_MIN_REQUESTS,
    AUTO_PROJECTION_MIN_S,
    ProgressCallback,
    RunEstimator,
    plain_progress,
    progress_wanted,
    rich_progress,
    watched,
)
from simpy_llm.rng import RandomStreams
from simpy_llm.serving.engine import Replica
from simpy_llm.serving.fleet import ReplicaPlan, plan_fleet
from simpy_llm.serving.router import Router
from simpy_llm.serving.views import ClusterView, FullSnapshotView, LiveView, RouterCounts, SnapshotView, refresh_views
from simpy_llm.wire import Wire
from simpy_llm.workload.checks import check_spec_files, warn_unknown_trace_classes
from simpy_llm.workload.distributions import SamplingError
from simpy_llm.workload.gate import ConcurrencyGate
from simpy_llm.workload.generator import ClientSource, WorkloadGenerator, sampling_scenario_error
from simpy_llm.workload.sessions import ReplayedContexts, SessionRegistry
from simpy_llm.workload.sources import WorkloadSources, build_sources, workload_seed

if TYPE_CHECKING:
    import simpy
    from simpy.events import Event

    from simpy_llm.config.schema import DisaggregationConfig, PolicySpec, ProcessSpec, Scenario
    from simpy_llm.config.speculation import SpeculationConfig
    from simpy_llm.network.client import ClientNetwork
    from simpy_llm.network.link import Link
    from simpy_llm.policies.admission import AdmissionPolicy
    from simpy_llm.policies.planning import PlannerChoice
    from simpy_llm.policies.routing import RoutingPolicy
    from simpy_llm.policies.scheduling import SchedulerPolicy
    from simpy_llm.serving.autoscaler import Autoscaler
    from simpy_llm.serving.batching import BatchServer
    from simpy_llm.serving.disaggregation import KvHandoff
    from simpy_llm.serving.engine import TokenListener
    from simpy_llm.serving.gateway import Gateway
    from simpy_llm.serving.latency import LatencyModel
    from simpy_llm.serving.planner import Planner, WhatIf
    from simpy_llm.speculative.draft import DraftFleet
    from simpy_llm.speculative.verify import VerifyServer

__all__ = ["Simulation"]

_SLICE_WALL_S = 0.25
"""Wall seconds a slice of a run with progress aims at (adapted slice by slice)."""


def _user_process(spec: ProcessSpec) -> UserProcess:
    """The process a scenario's ``processes:`` entry names, at its seam."""

    def function(env: simpy.Environment, ports: Ports) -> Generator:
        # build_policy calls a registered function as it calls a class (its docstring), but its
        # registry parameter is annotated for classes only.
        return build_policy(spec.process, process_kinds, env=env, ports=ports)  # type: ignore[arg-type]

    return UserProcess(spec.seam, function, instead=spec.instead_of is not None)


def _send_at(router: Router, position: int, req: Request) -> None:
    """Route *req* to the replica at *position*, as the router's policy would have."""
    router.send(req, position)


def _complete(
    env: simpy.Environment, recorder: Recorder, replica: Replica | BatchServer, completions: Wire | None, req: Request
) -> None:
    """A stood-in replica completed *req* now (``Ports.done``)."""
    now = env.now
    if req.first_scheduled_s != req.first_scheduled_s:  # nan: unset
        req.first_scheduled_s = now
    if req.first_token_s != req.first_token_s:
        req.first_token_s = now
    if req.completion_s != req.completion_s:
        req.completion_s = now
    if not req.generated_tokens:
        req.generated_tokens = req.output_tokens
    replica.departed += 1
    replica.departed_tokens += req.prompt_tokens
    recorder.on_complete(req)
    recorder.on_departure(now)
    if completions is not None:
        completions.put(req)


class _DeviceSettings(TypedDict):
    """A replica's cold start, unload and throttling (the keywords a Replica takes for them)."""

    load_s: float
    warm_retention_s: float | None
    throttle: tuple[float, float] | None


def _device_settings(plan: ReplicaPlan) -> _DeviceSettings:
    """A replica's cold start, unload and throttling (its device profile and weights' source,
    ``docs/devices.md``)."""
    device = plan.device
    throttle = None
    if device is not None and device.thermal is not None:
        throttle = (device.thermal.throttle_after_s, device.thermal.throttle_factor)
    return {"load_s": plan.load_s, "warm_retention_s": plan.warm_retention_s, "throttle": throttle}


class _Given(NamedTuple):
    """The objects a :class:`Simulation` was given in place of the scenario's."""

    latency_model: LatencyModel | None
    routing_policy: RoutingPolicy | None
    scheduler_policy: SchedulerPolicy | None
    admission_policy: AdmissionPolicy | None
    processes: tuple[UserProcess, ...]

    def copied(self) -> _Given:
        """Each object deep-copied on its own, with whatever state it holds now."""
        return _Given(
            copy.deepcopy(self.latency_model), copy.deepcopy(self.routing_policy), copy.deepcopy(self.scheduler_policy),
            copy.deepcopy(self.admission_policy), copy.deepcopy(self.processes),
        )


class Simulation:
    """One simulation of a :class:`~simpy_llm.config.schema.Scenario`.

    Parameters
    ----------
    scenario
        What to simulate.
    latency_model
        Use this latency model instead of the scenario's (e.g. one fitted in Python).
    routing_policy
        Use this routing policy object instead of the scenario's.
    scheduler_policy
        Use this scheduler policy object on every replica instead of the scenario's.
    admission_policy
        Use this admission policy object instead of the scenario's.
    external_arrivals
        Build the serving side only (router, replicas, recorder): no workload generator
        or sessions run, and :meth:`run` is unavailable. The caller drives :attr:`env`
        and injects each request into :attr:`arrivals` (numbered from :attr:`ids`,
        reported with ``recorder.on_arrival``), as the emulated server does.
    token_listener
        Passed to every replica (see :data:`~simpy_llm.serving.engine.TokenListener`);
        needs ``simulation.mode: event_per_step``.
    planner_policy
        With a ``planner`` section: chooses among each tick's evaluated candidates
        (a :class:`~simpy_llm.policies.planning.PlannerChoice`; default ``best_feasible``).
    processes
        Your own SimPy processes, each placed at a seam with
        :func:`~simpy_llm.processes.between` or :func:`~simpy_llm.processes.instead_of`
        (after those of the scenario's ``processes:`` section; ``docs/processes.md``).
    stream_to
        Write the records to this directory in chunks as the run goes, instead of keeping
        them in memory to the end (Parquet with the ``parquet`` extra, CSV otherwise;
        :mod:`simpy_llm.metrics.stream`): the run's memory no longer grows with its
        requests, and its Results read the chunks (``Results.streamed_records``).
    stream_chunk_requests
        Records per chunk with *stream_to* (default
        :data:`~simpy_llm.metrics.stream.DEFAULT_CHUNK_REQUESTS`).
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        latency_model: LatencyModel | None = None,
        routing_policy: RoutingPolicy | None = None,
        scheduler_policy: SchedulerPolicy | None = None,
        admission_policy: AdmissionPolicy | None = None,
        external_arrivals: bool = False,
        token_listener: TokenListener | None = None,
        planner_policy: PlannerChoice | None = None,
        processes: Sequence[UserProcess] = (),
        stream_to: str | Path | None = None,
        stream_chunk_requests: int = DEFAULT_CHUNK_REQUESTS,
    ) -> None:
        self.scenario = scenario
        self._given = _Given(latency_model, routing_policy, scheduler_policy, admission_policy, tuple(processes))
        """The objects given in place of the scenario's (a planner's what-if runs copy them)."""
        if scenario.planner is not None and external_arrivals:
            raise ValueError("a planner needs run(): its ticks stop when the workload is done")
        if planner_policy is not None and scenario.planner is None:
            raise ValueError("a planner_policy needs the scenario's planner section")
        self.env = Environment()
        self.streams = RandomStreams(scenario.seed)
        serving = scenario.serving
        self.plans: list[ReplicaPlan] = plan_fleet(serving, latency_model, self.streams)
        """Each replica's plan; with planner parallelism candidates, each candidate degree's
        replicas follow the scenario's (``layouts``: their fleet indices by tp, the scenario's first)."""
        self.layouts: dict[int, list[int]] = {}
        if scenario.planner is not None:  # its parallelism candidates may add replicas
            from simpy_llm.serving.planner import parallelism_fleet  # a planner's only: a run without one skips the module

            self.plans, self.layouts = parallelism_fleet(scenario, self.plans, latency_model, self.streams)
        if token_listener is not None and any(p.batch_server is not None for p in self.plans):
            raise ValueError("a token_listener needs continuous-batching replicas; a batch server returns whole responses")
        n_replicas = len(self.plans)
        self.recorder = Recorder(num_replicas=n_replicas)
        self.record_stream: RecordStream | None = None
        """Where the records go as the run goes (``stream_to``); None: they stay in memory."""
        if stream_to is not None:
            self.record_stream = self.recorder.sink = RecordStream(
                stream_to, scenario=scenario, replica_groups=[p.group for p in self.plans], chunk_requests=stream_chunk_requests,
            )
        self.latency_model = self.plans[0].latency
        """The first replica's latency model (the only one unless the fleet has several groups)."""
        ttft_targets = {name: t.ttft_s for name, t in scenario.slo.items() if t.ttft_s is not None}
        self.routing_policy = routing_policy or build_policy(
            serving.entry_router, routing_policies, rng=self.streams.stream("router"),
        )
        """The router's policy: among the replicas, the prefill pool, or the clusters."""
        self.admission_policy = admission_policy or build_policy(
            serving.admission, admission_policies, rng=self.streams.stream("admission"), slo=ttft_targets
        )
        env = self.env
        fast = scenario.simulation.mode == "event_per_change"
        wl = scenario.workload
        self.workload_sources: WorkloadSources | None = None
        """The workload's sources (None with ``external_arrivals``), built as the workload
        export and the observer build them (:func:`~simpy_llm.workload.sources.build_sources`)."""
        if external_arrivals:
            self.workload_streams = RandomStreams(workload_seed(wl, scenario.seed))
            self.sources: list[ClientSource] = []
        else:
            check_spec_files(scenario)  # before a file is read whole: a bad one named by its key path
            workload_sources = self.workload_sources = build_sources(wl, default_seed=scenario.seed, stacklevel=2)
            warn_unknown_trace_classes(scenario, workload_sources.traces, stacklevel=2)
            self.workload_streams = workload_sources.streams
            self.sources = workload_sources.clients
        self.ids = itertools.count()
        arrivals = self.arrivals = Wire(env)
        needs_sessions = any(s.workflow is not None for s in self.sources)
        gated = wl.max_concurrency is not None
        completions = Wire(env) if needs_sessions or gated or serving.gateway is not None else None
        networks = {src.client.id: src.client.network for src in self.sources if src.client.network is not None}
        self.client_network: ClientNetwork | None = None
        """The networked clients' uplinks (None when no client has a network)."""
        self.draft_fleet: DraftFleet | None = None
        """The draft devices of speculative decoding (None without ``speculation``)."""
        spec = scenario.speculation
        sent = arrivals
        drafts = None
        if spec is not None:
            if token_listener is not None:
                raise ValueError("a token_listener needs continuous-batching replicas; speculative decoding runs verify servers")
            sent = Wire(env)
            drafts = self.draft_fleet = self._build_draft_fleet(spec, sent, arrivals, completions)
        elif networks:
            from simpy_llm.network.client import ClientNetwork

            sent = Wire(env)
            self.client_network = ClientNetwork(
                env, sent, arrivals, self.recorder, networks, streams=self._link_stream, dropped=completions,
            )
        self.sent = sent
        """The Wire new requests are put into: :attr:`arrivals` itself, or the inbox of the
        client network or draft fleet standing before the router (with ``external_arrivals``
        and ``speculation``, inject requests here, unreported: the draft fleet reports each
        as it reaches the targets)."""
        replica_inboxes = [Wire(env) for _ in range(n_replicas)]
        schedulers: dict[str, SchedulerPolicy] = {}
        for group in serving.groups():
            if group.batch_server is None:
                schedulers[group.name] = scheduler_policy or build_policy(
                    group.engine.scheduler, scheduler_policies, slo=ttft_targets
                )
        dis = serving.disaggregation
        if dis is not None and token_listener is not None:
            raise ValueError("a token_listener needs co-located replicas; a disaggregated fleet streams from two pools")
        handoffs = Wire(env) if dis is not None else None
        self.replicas: Sequence[Replica | BatchServer | VerifyServer] = [
            Replica(
                env, i, inbox, plan.engine, plan.latency, self.recorder,
                fast=fast, completions=completions, token_listener=token_listener,
                scheduler=schedulers[plan.group], group=plan.group,
                role=plan.role, handoffs=handoffs if plan.role == "prefill" else None,
                until_s=scenario.simulation.until_s, **_device_settings(plan),
            )
            if plan.batch_server is None
            else self._batch_server(i, inbox, plan, completions)
            for i, (inbox, plan) in enumerate(zip(replica_inboxes, self.plans, strict=True))
        ] if drafts is None else self._verify_servers(drafts, replica_inboxes, completions, handoffs, schedulers, fast=fast)
        counts = RouterCounts(n_replicas)
        refresh_s = serving.view_refresh_s
        view_cls = LiveView if refresh_s is None else SnapshotView if serving.view_refresh_fields == "state" else FullSnapshotView
        self.views = [view_cls(rep, counts, plan.capacity) for rep, plan in zip(self.replicas, self.plans, strict=True)]
        admission = None if isinstance(self.admission_policy, AlwaysAdmit) else self.admission_policy
        # A rejected prompt's draft device must hear of it, and moves on to its next request.
        rejected = self.draft_fleet.rejected if self.draft_fleet is not None else completions
        self.cluster_routers: list[Router] = []
        """Each cluster's router, in cluster order (empty without clusters)."""
        if serving.clusters:
            cluster_inboxes = self._build_cluster_routers(replica_inboxes, counts)
            cluster_views = [
                ClusterView(c, cl.name, [v for v, plan in zip(self.views, self.plans, strict=True) if plan.cluster == cl.name])
                for c, cl in enumerate(serving.clusters)
            ]
            self.router = Router(
                env, arrivals, cluster_inboxes, cluster_views, RouterCounts(len(cluster_views)),
                drafts.bind_routing(self.routing_policy, clusters=True) if drafts is not None else self.routing_policy,
                self.recorder, admission=admission, rejected=rejected,
            )
        else:
            entry = [i for i, plan in enumerate(self.plans) if plan.role != "decode"]
            self.router = Router(
                env, arrivals, [replica_inboxes[i] for i in entry], [self.views[i] for i in entry], counts,
                drafts.bind_routing(self.routing_policy) if drafts is not None else self.routing_policy,
                self.recorder, admission=admission, rejected=rejected, indices=entry,
            )
        """The router arrivals reach: over the replicas, the prefill pool when disaggregated,
        or the clusters (each then routing among its replicas)."""
        self.kv_handoff: KvHandoff | None = None
        """The prefill-to-decode hand-off of a disaggregated fleet (None: co-located)."""
        self.kv_links: dict = {}
        """A disaggregated fleet's KV links, by (prefill fleet index, decode position)."""
        if dis is not None and handoffs is not None:
            # With speculation a request the hand-off drops must reach its draft device too.
            dropped = completions if drafts is None else self._told_devices(drafts, completions)
            self.kv_handoff = self._build_handoff(dis, handoffs, replica_inboxes, counts, dropped)
        self.wires: dict[str, Wire] = self._seams(replica_inboxes, completions, handoffs)
        """The Wires between the components, by seam name (``docs/processes.md``)."""
        self._check_seams(scenario)
        self.user_processes: list[simpy.Process] = self._place_processes([*map(_user_process, scenario.processes), *processes])
        """The user processes, in the order given (the scenario's first; ``docs/processes.md``)."""
        # The workload announces its requests to the books where they enter the serving system:
        # here, unless a client network or the draft devices stand before it, or a client cap
        # holds them back (the gate announces each as it sends it).
        announce = not networks and spec is None
        self.sessions = (
            SessionRegistry(
                env, completions, sent, self.recorder, self.ids, wl.horizon_s, announce=announce and not gated
            )
            if needs_sessions and completions is not None
            else None
        )
        self.gate: ConcurrencyGate | None = None
        """The client's cap on requests in flight (None without ``workload.max_concurrency``)."""
        if wl.max_concurrency is not None and completions is not None:
            self.gate = ConcurrencyGate(
                env, wl.max_concurrency, sent, completions,
                on_send=self.recorder.on_arrival if announce else None, consumer_waits=self.sessions is not None,
            )
        self.gateway: Gateway | None = None
        """Flow control in front of the router (None without ``serving.gateway``)."""
        if serving.gateway is not None and completions is not None:
            from simpy_llm.policies.gateway import gateway_dispatch  # a gateway's only
            from simpy_llm.serving.gateway import Gateway

            router = self.router
            self.gateway = Gateway(
                env, arrivals, completions, lambda: router.active_views, serving.gateway,
                build_policy(serving.gateway.dispatch, gateway_dispatch), self.recorder,
                consumer_waits=self.sessions is not None or self.gate is not None,
            )
        self._ran = False
        if refresh_s is not None:
            snapshots = [v for v in self.views if isinstance(v, SnapshotView)]  # every view, with a refresh period
            env.process(refresh_views(env, snapshots, refresh_s, self._active))
        if scenario.simulation.timeseries_interval_s is not None:
            env.process(self._sample(scenario.simulation.timeseries_interval_s))
        self.planner: Planner | None = None
        """The planner process (None without a ``planner`` section)."""
        self.autoscaler: Autoscaler | None = None
        """The autoscaler process (None without an ``autoscaler`` section)."""
        if scenario.autoscaler is not None:
            from simpy_llm.policies.scaling import scaling_policies  # an autoscaler's only
            from simpy_llm.serving.autoscaler import Autoscaler

            policy = build_policy(scenario.autoscaler.policy, scaling_policies)
            self.autoscaler = Autoscaler(env, self, self.recorder, scenario.autoscaler, policy, self._active)
        if self.workload_sources is None:
            self.generator: WorkloadGenerator | None = None
            return
        # Replayed sessions carry their earlier rounds' content, so a prefix cache can find it.
        self._replayed = ReplayedContexts() if self.workload_sources.traces else None
        self.generator = WorkloadGenerator(
            env,
            self.workload_sources.generator_sources(),
            sent,
            self.recorder,
            self.ids,
            num_requests=wl.num_requests,
            horizon_s=wl.horizon_s,
            on_request=self._on_request if self.sessions is not None or self._replayed is not None else None,
            announce=announce and not gated,
        )
        if scenario.planner is not None:
            from simpy_llm.serving.planner import Planner  # a planner's only: a run without one skips the module

            self.planner = Planner(_PlannerHost(self), scenario.planner, planner_policy)

    def _batch_server(self, i: int, inbox: Wire, plan: ReplicaPlan, completions: Wire | None) -> BatchServer:
        """Replica *i*, a batch server of *plan* (its service model draws from ``service/<i>``)."""
        from simpy_llm.serving.batching import BatchServer, build_service_model  # a batch server's only

        assert plan.batch_server is not None  # the plans of batch-server groups carry theirs
        return BatchServer(
            self.env, i, inbox, plan.batch_server,
            build_service_model(plan.batch_server, plan.latency, self.streams.stream(f"service/{i}")),
            self.recorder, completions=completions, group=plan.group,
        )

    def _seams(self, replica_inboxes: list[Wire], completions: Wire | None, handoffs: Wire | None) -> dict[str, Wire]:
        """This simulation's Wires by seam name, in the order items travel."""
        wires = {} if self.sent is self.arrivals else {"sent": self.sent}
        wires["arrivals"] = self.arrivals
        wires |= {f"cluster:{cl.name}": r.inbox for cl, r in zip(self.scenario.serving.clusters, self.cluster_routers, strict=True)}
        wires |= {f"replica:{i}": inbox for i, inbox in enumerate(replica_inboxes)}
        if handoffs is not None:
            wires["handoffs"] = handoffs
        if completions is not None:
            wires["completions"] = completions
        return wires

    def _check_seams(self, scenario: Scenario) -> None:
        """Every seam the scenario's ``processes:`` section names is one this simulation has."""
        for i, spec in enumerate(scenario.processes):
            if spec.seam != "router" and spec.seam not in self.wires:
                key = "between" if spec.between is not None else "instead_of"
                raise ScenarioError(scenario.loaded_from or "<dict>", [(f"processes[{i}].{key}", seam_error(spec.seam, ["router", *self.wires]))])

    def _place_processes(self, processes: Sequence[UserProcess]) -> list[simpy.Process]:
        """Start each user process at its seam (``docs/processes.md``); return them in order.

        The processes between the Wires of one seam are placed last first, so items pass
        them in the order given.
        """
        started = []
        for up in reversed(processes):
            wire = self.wires.get(up.seam)
            if up.instead and up.seam == "router":
                ports = self._router_ports()
            elif wire is None:
                raise ValueError(seam_error(up.seam, ["router", *self.wires]))
            elif up.instead:
                ports = self._replica_ports(up.seam, wire)
            else:
                ports = self._between_ports(up.seam, wire)
            started.append(self.env.process(up.function(self.env, ports)))
        return started[::-1]

    def _rejected_port(self) -> Wire:
        """A Wire whose puts drop the request as the entry router's admission does."""
        rejected = Wire(self.env)
        rejected.connect(self.router.reject)
        return rejected

    def _between_ports(self, seam: str, wire: Wire) -> Ports:
        """The Wires of a process placed between *wire*'s producers and its consumer."""
        inbox, outbox = Wire(self.env), Wire(self.env)
        outbox.connect(wire.intercept(inbox.send))
        # A request may be dropped until it is in a replica; after that, only the replica drops it.
        rejected = None if seam in ("completions", "handoffs") else self._rejected_port()
        return Ports(seam=seam, inbox=inbox, outbox=outbox, rejected=rejected, views=tuple(self.router.views))

    def _router_ports(self) -> Ports:
        """The router's inbox and outboxes for a process that stands in for it."""
        router, inbox = self.router, Wire(self.env)
        self.arrivals.intercept(inbox.send)
        outboxes = []
        for i in range(len(router.views)):
            outbox = Wire(self.env)
            outbox.connect(functools.partial(_send_at, router, i))
            outboxes.append(outbox)
        return Ports(seam="router", inbox=inbox, outboxes=tuple(outboxes), rejected=self._rejected_port(), views=tuple(router.views))

    def _replica_ports(self, seam: str, wire: Wire) -> Ports:
        """A replica's inbox and a completing outbox for a process that stands in for it."""
        from simpy_llm.speculative.verify import VerifyServer

        replica = self.replicas[int(seam.split(":")[1])]
        # With speculation every replica is a verify server.
        if isinstance(replica, VerifyServer) or self.scenario.serving.disaggregation is not None:
            raise ValueError(f"instead_of({seam!r}) takes a co-located replica or batch server; with speculation or "
                             "disaggregated pools put a process between at the seam instead")
        inbox, env = Wire(self.env), self.env

        def enqueue(req: Request) -> None:
            req.enqueue_s = env.now
            inbox.send(req)

        wire.intercept(enqueue)
        done = Wire(env)
        done.connect(functools.partial(_complete, env, self.recorder, replica, self.wires.get("completions")))
        return Ports(seam=seam, inbox=inbox, done=done, replica=replica)

    def _build_cluster_routers(self, replica_inboxes: list[Wire], counts: RouterCounts) -> list[Wire]:
        """Each cluster's router over its replicas; returns their inboxes, in cluster order."""
        inboxes = []
        for cl in self.scenario.serving.clusters:
            members = [i for i, plan in enumerate(self.plans) if plan.cluster == cl.name]
            inbox = Wire(self.env)
            policy = build_policy(cl.router, routing_policies, rng=self.streams.stream(f"router/{cl.name}"))
            if self.draft_fleet is not None:  # a draft group bound to targets sees only those
                policy = self.draft_fleet.bind_routing(policy)
            self.cluster_routers.append(Router(
                self.env, inbox, [replica_inboxes[i] for i in members], [self.views[i] for i in members], counts,
                policy, self.recorder, indices=members,
            ))
            inboxes.append(inbox)
        return inboxes

    def _build_draft_fleet(self, spec: SpeculationConfig, sent: Wire, arrivals: Wire, completions: Wire | None) -> DraftFleet:
        """The draft devices of *spec*, between the workload and the router (``docs/speculative.md``)."""
        from simpy_llm.policies.gamma import gamma_policies
        from simpy_llm.policies.mode import mode_selectors
        from simpy_llm.serving.devices import device_profile
        from simpy_llm.speculative.draft import DraftFleet
        from simpy_llm.speculative.targets import FleetTargets

        # The loader structures both as policy specs (the schema's GammaSpec and ModeSelectorSpec).
        selector = build_policy(cast("PolicySpec", spec.mode_selector), mode_selectors) if spec.mode_selector is not None else None
        gamma = cast("PolicySpec", spec.gamma_policy)
        profiles = {g.name: device_profile(g.device) for g in spec.drafts if g.device is not None}
        return DraftFleet(
            self.env, spec, sent, arrivals, self.recorder,
            policy_factory=lambda: build_policy(gamma, gamma_policies),
            mode_selector=selector, streams=self.streams.stream, device_profiles=profiles, dropped=completions,
            targets=FleetTargets(self.scenario.serving),
        )

    def _verify_servers(
        self, drafts: DraftFleet, inboxes: list[Wire], completions: Wire | None, handoffs: Wire | None,
        schedulers: dict[str, SchedulerPolicy], *, fast: bool,
    ) -> list[Replica | VerifyServer]:
        """The fleet as the targets of *drafts*: one VerifyServer per replica; with
        *handoffs* (a disaggregated fleet) an engine Replica per prefill replica and a
        DecodeVerifyServer per decode replica (``docs/speculative.md``)."""
        from simpy_llm.speculative.curves import acceptance_model
        from simpy_llm.speculative.decode_pool import DecodeVerifyServer, VerifyPool
        from simpy_llm.speculative.verify import VerifyServer

        spec = drafts.config
        fused = acceptance_model(spec.fused.acceptance) if spec.fused is not None else None
        slo = {name: (t.ttft_s, t.tpot_s, t.tvt_s) for name, t in self.scenario.slo.items()}
        fleet: list[Replica | VerifyServer] = []
        servers: dict[int, VerifyServer] = {}
        prefill_out = None if handoffs is None else self._told_devices(drafts, completions)
        for i, (inbox, plan) in enumerate(zip(inboxes, self.plans, strict=True)):
            settings = _device_settings(plan)
            engine = plan.engine
            if plan.role == "prefill":
                fleet.append(Replica(
                    self.env, i, inbox, engine, plan.latency, self.recorder, fast=fast, completions=prefill_out,
                    scheduler=schedulers[plan.group], group=plan.group, role="prefill", handoffs=handoffs,
                    until_s=self.scenario.simulation.until_s, **settings,
                ))
                continue
            blocks = engine.kv_num_blocks
            if not isinstance(blocks, int):  # plan_fleet resolves "auto" from the latency model's hardware
                raise ValueError(f"kv_num_blocks must be a number of blocks, not {blocks!r}")
            kind = VerifyServer if plan.role != "decode" else DecodeVerifyServer
            server = servers[i] = kind(
                self.env, i, inbox, plan.latency, self.recorder, spec,
                kv_capacity_tokens=blocks * engine.kv_block_size,
                max_prefill_tokens=engine.max_num_batched_tokens, max_seqs=engine.max_num_seqs,
                max_model_len=engine.max_model_len, rng=self.streams.stream(f"verify/{i}"),
                fused_acceptance=fused, slo=slo, send_verdict=drafts.send_verdict,
                completions=completions, group=plan.group, throttle=settings["throttle"], load_s=plan.load_s,
                kv_block_size=engine.kv_block_size, warm_retention_s=settings["warm_retention_s"],
            )
            fleet.append(server)
        drafts.servers = list(servers.values()) if handoffs is None else VerifyPool(servers)
        return fleet

    def _told_devices(self, drafts: DraftFleet, completions: Wire | None) -> Wire:
        """A Wire for the requests that end before reaching a decode-pool verify server (a
        one-token answer completed by its prefill replica, a request that replica or the KV
        hand-off dropped): each one's draft device hears of it, and *completions*, if any,
        receives it."""
        ended = Wire(self.env)

        def tell(req: Request) -> None:
            drafts.send_verdict(req, 0 if req.dropped_reason else req.generated_tokens)
            if completions is not None:
                completions.put(req)

        ended.connect(tell)
        return ended

    def _link_stream(self, name: str) -> np.random.Generator:
        """The random stream of the link *name* (its jitter and losses)."""
        return self.streams.stream(f"link/{name}")

    def _build_handoff(
        self, dis: DisaggregationConfig, handoffs: Wire, replica_inboxes: list[Wire], counts: RouterCounts, completions: Wire | None
    ) -> KvHandoff:
        """The decode router, the KV links and the :class:`KvHandoff` of the fleet *dis* disaggregates."""
        from simpy_llm.network.link import Link
        from simpy_llm.network.topology import Topology
        from simpy_llm.serving.disaggregation import KvHandoff

        env = self.env
        prefill = [i for i, plan in enumerate(self.plans) if plan.role == "prefill"]
        decode = [i for i, plan in enumerate(self.plans) if plan.role == "decode"]
        transfers = [Wire(env) for _ in decode]
        decode_router = Router(
            env, Wire(env), transfers, [self.views[i] for i in decode], counts,
            build_policy(dis.decode_router, routing_policies, rng=self.streams.stream("decode_router")),
            self.recorder, indices=decode,
        )
        delivered, lost = Wire(env), Wire(env)
        names = self.scenario.serving.replica_names()
        xfer = dis.kv_transfer
        topology = None
        if dis.topology is not None:
            topology = Topology.from_spec(dis.topology)
        links = {}
        for i in prefill:
            for pos, j in enumerate(decode):
                if topology is None:
                    rtt_s = xfer.rtt_ms / 1e3
                    bandwidth = math.inf if xfer.bandwidth_gbps is None else xfer.bandwidth_gbps * 1e9 / 8
                else:
                    path = topology.path(names[i], names[j])
                    rtt_s, bandwidth = path.rtt_s, path.bandwidth_bytes_per_s
                name = f"kv/{names[i]}->{names[j]}"
                links[(i, pos)] = Link(
                    env, delivered, name=name, rtt_s=rtt_s, bandwidth_bytes_per_s=bandwidth,
                    overhead_s=xfer.overhead_us * 1e-6, rng=self._link_stream(name) if xfer.random else None,
                    dropped=lost, **xfer.link_faults(),
                )
        self.kv_links = links
        return KvHandoff(
            env, handoffs, decode_router, transfers, [replica_inboxes[j] for j in decode], links, delivered,
            self._kv_bytes_per_token(xfer.bytes_per_token, prefill[0]),
            [self.plans[j].latency.output_token_overhead_s for j in decode], self.recorder,
            lost=lost, dropped=completions,
        )

    def _kv_bytes_per_token(self, given: float | None, prefill_index: int) -> float:
        """KV bytes per token on the wire: *given*, or the prefill pool's model over all its GPUs."""
        if given is not None:
            return given
        hardware = self.plans[prefill_index].latency.hardware
        if hardware is None:
            raise ScenarioError(
                f"scenario {self.scenario.name!r}" if self.scenario.name else "<scenario>",
                [("serving.disaggregation.kv_transfer.bytes_per_token",
                  "required: the prefill pool's latency model does not name its model, gpu and tp")],
            )
        return float(hardware.kv_bytes_per_token * hardware.tp)

    def _active(self) -> bool:
        """Whether anything may still happen (periodic processes stop when not)."""
        return self.generator is None or not self._finished()

    def _sample(self, every_s: float):  # noqa: ANN202 - a SimPy process
        """Process: sample every replica's state each *every_s* seconds (time series).

        Yields
        ------
        Timeout
            Until the next sample.
        """
        env = self.env
        on_sample = self.recorder.on_sample
        while True:
            for rep in self.replicas:
                on_sample(env.now, rep.index, len(rep.waiting), len(rep.running), rep.kv.used_blocks, bool(rep.running))
            if not self._active():
                return
            yield env.timeout(every_s)

    def _on_request(self, req: Request, source_index: int) -> None:
        """A new request: a client's opens its session; a replayed one gets its session's context."""
        if source_index < len(self.sources):
            if self.sessions is not None:
                self.sessions.open(req, self.sources[source_index])
        elif self._replayed is not None:  # a trace's request (traces are replayed with their contexts)
            self._replayed(req)

    def _finished(self) -> bool:
        """Whether the workload is done and nothing is left in the system (never while the
        caller drives the arrivals)."""
        if self.generator is None:
            return False
        pending = self.sessions.pending if self.sessions is not None else 0
        if self.client_network is not None:
            pending += len(self.client_network.uploading)
        if self.kv_handoff is not None:
            pending += len(self.kv_handoff.in_transfer)
        if self.draft_fleet is not None:
            pending += len(self.draft_fleet.pending)
        if self.gate is not None:
            pending += len(self.gate.waiting)
        return self.generator.done and not self.recorder.live and not pending

    def __repr__(self) -> str:
        """One line: the scenario's name, the fleet, the router, the engine mode and whether it ran."""
        n = len(self.plans)
        fleet = f"{n} replica{'' if n == 1 else 's'}"
        if self.scenario.serving.replica_groups:
            sizes: dict[str, int] = {}
            for plan in self.plans:
                sizes[plan.group] = sizes.get(plan.group, 0) + 1
            fleet += " in groups " + ", ".join(f"{g} x{k}" for g, k in sizes.items())
        router = self.scenario.serving.entry_router.kind
        if type(self.routing_policy) is not routing_policies.get(router):  # a policy object given to __init__
            router = type(self.routing_policy).__name__
        if self._ran:
            state = f"ran ({self.recorder.arrived:,} requests)"
        else:
            state = "driven by its caller" if self.generator is None else "not run"
        name = f" {self.scenario.name!r}" if self.scenario.name else ""
        return f"<Simulation{name}: {fleet}, router {router}, mode {self.scenario.simulation.mode}, {state}>"

    def run(
        self, progress: bool | ProgressCallback | None = None, progress_every_s: float | None = None
    ) -> Results:
        """Run to the end (every request finished, or ``simulation.until_s``) and return the Results.

        Parameters
        ----------
        progress
            ``None`` (default): progress on standard error when someone is watching (a
            terminal, or a Jupyter kernel with ``ipywidgets``) and the run is expected to
            simulate at least :data:`~simpy_llm.progress.AUTO_MIN_REQUESTS` requests;
            ``True``: always, as a bar on a terminal or in Jupyter, else as a plain line
            every :data:`~simpy_llm.progress.PLAIN_LINE_EVERY_S` wall seconds (a log, a
            pipe); ``False``: never; a callable: called periodically with ``(finished,
            total, sim_time_s)``, no bar. See :mod:`simpy_llm.progress`.
        progress_every_s
            Simulated seconds between progress calls (default: for a callable, 1/200 of the
            expected duration, so what it sees does not depend on the machine's speed; for
            the bar and the lines, slices of about a quarter of a wall second, at most 1/200
            of the expected duration).

        After two wall seconds a run shown with progress prints the projected wall time
        and memory of the whole run, and warns when that memory exceeds the machine's; a
        run left automatic or given a callable prints them only when projected to take a
        minute or more, or more memory than the machine has (expected runs of at least
        ``AUTO_MIN_REQUESTS`` requests; :mod:`simpy_llm.progress`). ``False`` prints nothing.
        Progress changes only how the run is sliced, never its records.
        """
        if self.generator is None:
            raise RuntimeError("a Simulation with external_arrivals is driven by its caller, not run()")
        if self._ran:
            raise RuntimeError("a Simulation runs once; build a new one to run again")
        self._ran = True
        if callable(progress):
            # The caller's own callback may act on what it sees (capacity probes stop a run):
            # its slices stay fixed in simulated time, whatever the machine's speed.
            return self._run(progress, progress_every_s, projection="long", adaptive=False)
        if progress is False:
            return self._run(None, progress_every_s)
        terminal, jupyter = watched()
        expected = self._expected_requests()
        if progress_wanted(progress, terminal=terminal, jupyter=jupyter, expected_requests=expected):
            total = self.scenario.workload.num_requests
            shown = rich_progress(total) if terminal or jupyter else plain_progress(total)
            with shown as update:
                return self._run(update, progress_every_s, projection="always")
        # Nobody watches: a long run still projects itself, and says so if the projection is long.
        return self._run(None, progress_every_s, projection="long" if expected >= AUTO_MIN_REQUESTS else None)

    def _expected_requests(self) -> float:
        """Requests the workload is expected to send: ``num_requests``, else rate x horizon
        (0 when unknown, e.g. a trace replay)."""
        wl = self.scenario.workload
        if wl.num_requests is not None:
            return wl.num_requests
        return sum(src.rate for src in self.sources) * (wl.horizon_s or 0.0)

    def _share_done(self) -> float | None:
        """Share of the run done: the largest of the requests generated out of ``num_requests``
        (or, for a replay of traces only, out of their rows) and of the simulated time out of
        ``horizon_s`` and ``simulation.until_s``, whichever ends the run first (None: unknown)."""
        wl = self.scenario.workload
        shares = []
        generated = self.generator.generated if self.generator is not None else 0
        if wl.num_requests:
            shares.append(generated / wl.num_requests)
        elif not self.sources and self.workload_sources is not None and self.workload_sources.traces:
            rows = sum(len(trace) for _, trace in self.workload_sources.traces)
            if rows:
                shares.append(generated / rows)
        for end_s in (wl.horizon_s, self.scenario.simulation.until_s):
            if end_s:
                shares.append(self.env.now / end_s)
        return max(shares) if shares else None

    def _run(
        self,
        progress: ProgressCallback | None,
        progress_every_s: float | None,
        projection: str | None = None,
        adaptive: bool = True,
    ) -> Results:
        """The run itself: in one piece, or in slices with a *progress* call after each and,
        with *projection* (``"always"`` or ``"long"``: print it only when long or over the
        machine's memory), the run's projection after the warm-up; *adaptive* slices follow
        the wall clock (:meth:`_run_sliced`)."""
        env = self.env
        until = self.scenario.simulation.until_s
        wall0 = time.perf_counter()
        if progress is None and projection is None:
            self._run_until(until)
        else:
            self._run_sliced(progress, progress_every_s, projection, adaptive)
        wall = time.perf_counter() - wall0
        end_s = until if until is not None else self._last_activity_s()
        if until is not None:
            for rep in self.replicas:
                rep.settle(until)
        not_arrived = []
        if self.client_network is not None:
            not_arrived = list(self.client_network.uploading.values())
        if self.draft_fleet is not None:
            not_arrived = list(self.draft_fleet.pending.values())
        for req in sorted(not_arrived, key=lambda r: r.id):
            req.upload_s = math.nan  # still with its client or draft device: arrival_s is when it was sent
            self.recorder.on_arrival(req, env.now)
        for req in sorted(self.recorder.live.values(), key=lambda r: r.id):
            self.recorder.on_in_flight(req)
        if self.sessions is not None:
            self.sessions.close()
        streamed = None
        if self.record_stream is not None:
            self.recorder.finish_stream()
            streamed = self.record_stream.close()
        return Results.from_recorder(
            self.recorder,
            scenario=self.scenario,
            end_s=end_s,
            wall_s=wall,
            events=self._events_processed(),
            steps=sum(r.step for r in self.replicas),
            kv_blocks=[r.kv.num_blocks for r in self.replicas],
            replica_groups=[p.group for p in self.plans],
            replica_devices=[(p.device, p.gpus) for p in self.plans],
            links={link.name: link.statistics() for link in self._links()},
            draft_busy_s=(
                {g: [d.busy_s for d in devices] for g, devices in self.draft_fleet.devices.items()}
                if self.draft_fleet is not None else None
            ),
            planner=self.planner.log if self.planner is not None else None,
            autoscaler=self.autoscaler.log if self.autoscaler is not None else None,
            gateway=self.gateway.summary() if self.gateway is not None else None,
            streamed=streamed,
        )

    def _run_sliced(
        self, progress: ProgressCallback | None, progress_every_s: float | None, projection: str | None, adaptive: bool
    ) -> None:
        """Run in slices of simulated time, calling *progress* after each and making the
        projection once (see :meth:`_run`); without *progress*, the rest runs in one piece
        once the projection is made.

        Slices are *progress_every_s* simulated seconds; else, not *adaptive*, 1/200 of the
        expected duration; else adapted so that each takes about :data:`_SLICE_WALL_S` wall
        seconds: the first is short (so the warm-up is measured from the start), then each
        is scaled by the ratio of that target to the last one's wall time (halved at most,
        doubled at most), up to 1/200 of the expected duration.
        """
        env = self.env
        wl = self.scenario.workload
        until = self.scenario.simulation.until_s
        total = wl.num_requests
        rate = sum(src.rate for src in self.sources)
        if wl.horizon_s is not None:
            expected = wl.horizon_s
        elif wl.num_requests is not None and rate > 0:
            expected = wl.num_requests / rate
        else:
            expected = 3600.0  # traces: no cheap estimate; slices only pace the progress
        if until is not None:
            expected = min(expected, until)
        longest = progress_every_s or max(expected / 200.0, 1e-6)
        adaptive = adaptive and progress_every_s is None
        every = max(longest / 1024.0, 1e-6) if adaptive else longest
        estimator = RunEstimator() if projection is not None else None
        t = 0.0
        while not self._finished() and (until is None or t < until):
            t = t + every if until is None else min(t + every, until)
            slice_start = time.perf_counter()
            self._run_until(t)
            took = time.perf_counter() - slice_start
            if progress is not None:
                progress(self.recorder.arrived - len(self.recorder.live), total, env.now)
            if estimator is not None:
                made = estimator.update(self._share_done())
                if made is not None:
                    estimator = None
                    if projection == "always" or made.wall_s >= AUTO_PROJECTION_MIN_S or made.exceeds_memory:
                        for line in made.lines():
                            print(line, file=sys.stderr, flush=True)
                    if progress is None:  # nothing more to show: the rest in one piece
                        self._run_until(until)
                        return
            if env.peek() == float("inf"):
                break  # nothing left to happen
            if adaptive:
                scale = _SLICE_WALL_S / took if took > 0 else 2.0
                every = min(longest, max(1e-6, every * min(2.0, max(0.5, scale))))
        if progress is not None:
            progress(self.recorder.arrived - len(self.recorder.live), total, env.now)

    def _links(self) -> list[Link]:
        """Every network link: the networked clients' uplinks, then the KV links."""
        uplinks = list(self.client_network.uplinks.values()) if self.client_network is not None else []
        drafts = self.draft_fleet.links() if self.draft_fleet is not None else []
        return uplinks + list(self.kv_links.values()) + drafts

    def _run_until(self, until: float | None) -> None:
        """``env.run(until)``; a distribution drawing NaN or an infinity is the scenario's error."""
        try:
            self.env.run(until=until)
        except SamplingError as exc:
            raise sampling_scenario_error(exc, self.scenario, self.sources) from None

    def _last_activity_s(self) -> float:
        """When the last request finished (or arrived): the end of a run to completion.

        Not ``env.now``: superseded step-end events of the fast mode may lie later
        than the last real activity, and the two modes must report the same end.
        """
        cols = self.recorder.columns
        completions = np.frombuffer(cols["completion_s"], dtype=np.float64)
        arrivals = np.frombuffer(cols["arrival_s"], dtype=np.float64)
        if self.recorder.spilled_extremes:  # streamed records: each chunk's latest, with those still held
            spilled = np.array(self.recorder.spilled_extremes, dtype=np.float64).reshape(-1, 2)
            completions = np.concatenate([completions, spilled[:, 0]])
            arrivals = np.concatenate([arrivals, spilled[:, 1]])
        last = float(np.nanmax(completions, initial=0.0)) if completions.size else 0.0
        return max(last, float(arrivals.max(initial=0.0)))

    def _events_processed(self) -> int:
        # The events scheduled over the run (reading the count uses an event id: read once).
        return self.env.events_scheduled()


class _PlannerHost:
    """A running simulation as its planner sees it (:class:`~simpy_llm.serving.planner.PlannerHost`):
    its clock and fleet, its arrivals, and what-if runs of its scenario."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.env = sim.env
        self.fleet = sim
        self.rng = sim.streams.stream("planner")

    def active(self) -> bool:
        """Whether anything may still happen in the run."""
        return self._sim._active()

    def arrival_log(self) -> list[Request]:
        """Start logging the arrivals (the recorder appends each to the list returned)."""
        log: list[Request] = []
        self._sim.recorder.arrival_log = log
        return log

    def what_if(self, candidate: Mapping[str, float], arrivals: Sequence[tuple[float, dict[str, Any]]], seed: int,
                window_s: float) -> WhatIf:
        """Run the scenario afresh (no planner, *seed*) with *candidate* in force from time 0, fed
        *arrivals* (offsets in order); return its summary and how many requests were unfinished
        when it stopped.

        Each request enters where the workload would put it: the router's arrivals, or, with
        speculative decoding, the draft fleet (which binds it to a device and reports it when
        its prompt reaches the targets)."""
        sim = self._sim
        from simpy_llm.serving.planner import WHAT_IF_DRAIN_WINDOWS, FleetControl, WhatIf, what_if_layout  # the planner's own

        scenario, knobs = what_if_layout(attrs.evolve(sim.scenario, planner=None, seed=seed), candidate, sim.layouts)
        given = sim._given.copied()  # fresh objects for each what-if, with their state at the tick
        w = Simulation(
            scenario, external_arrivals=True, latency_model=given.latency_model, routing_policy=given.routing_policy,
            scheduler_policy=given.scheduler_policy, admission_policy=given.admission_policy, processes=given.processes,
        )
        FleetControl(w).apply(knobs)
        env, recorder = w.env, w.recorder
        drafts = w.draft_fleet
        put = w.sent.put if drafts is not None else w.arrivals.put
        state = {"sent": 0}

        def inject() -> Generator[Event, None, None]:
            for offset, fields in arrivals:
                if offset > env.now:
                    yield env.timeout(offset - env.now)
                req = Request(id=next(w.ids), arrival_s=env.now, **fields)
                if drafts is None:
                    recorder.on_arrival(req, env.now)
                put(req)
                state["sent"] += 1

        env.process(inject())
        t = 0.0
        limit = WHAT_IF_DRAIN_WINDOWS * window_s
        while True:
            t += window_s
            w._run_until(t)
            done = state["sent"] == len(arrivals) and not recorder.live and not (
                w.kv_handoff is not None and w.kv_handoff.in_transfer
            ) and not (drafts is not None and drafts.pending)
            if done or t >= limit or env.peek() == math.inf:
                break
        unfinished = len(recorder.live) + (len(drafts.pending) if drafts is not None else 0)
        end_s = w._last_activity_s() if done else t
        if not done:
            for rep in w.replicas:
                rep.settle(t)
            if drafts is not None:
                for req in sorted(drafts.pending.values(), key=lambda r: r.id):
                    req.upload_s = math.nan  # still with its draft device
                    recorder.on_arrival(req, env.now)
            for req in sorted(recorder.live.values(), key=lambda r: r.id):
                recorder.on_in_flight(req)
        results = Results.from_recorder(
            recorder, scenario=scenario, end_s=end_s, wall_s=0.0, events=0, steps=sum(r.step for r in w.replicas),
            kv_blocks=[r.kv.num_blocks for r in w.replicas], replica_groups=[p.group for p in w.plans],
        )
        return WhatIf(results.summary(), unfinished)
