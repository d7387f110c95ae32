"""The scenario config tree: frozen attrs classes, one default per setting.

A scenario YAML file maps onto :class:`Scenario`::

    seed: 42
    workload:        # WorkloadConfig
      aggregate_rate: 10.0
      num_requests: 2000
      clients: [...]  # ClientConfig
    serving:         # ServingConfig
      replicas: 1
      router: {kind: round_robin}
      engine: {...}  # EngineConfig
      latency_model: {kind: blis_linear, params: {model: llama-3.1-8b-instruct, gpu: H100, tp: 2}}
    slo:             # per-class targets used for goodput
      interactive: {ttft_s: 0.5, tpot_s: 0.05}
    simulation:      # SimulationConfig
      mode: event_per_change

Units are in the names (``_s`` seconds, ``_tokens`` tokens). Distributions
and arrival processes are the registered classes themselves
(:mod:`simpy_llm.workload.distributions`, :mod:`simpy_llm.workload.arrivals`);
routers and latency models are :class:`PolicySpec` entries resolved against
their registries when the simulation is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NewType

import attrs

from simpy_llm.config.autoscaler import AutoscalerConfig, check_autoscaler
from simpy_llm.config.common import (
    AdmissionSpec,
    ArrivalField,
    BatchServiceSpec,
    BinSelectorSpec,
    KvBlocks,
    LatencySpec,
    LengthField,
    LinkFaults,
    NetworkConfig,
    OutageWindow,
    PolicySpec,
    PriorityField,
    Probability,
    RouterSpec,
    SchedulerSpec,
    TimeWindow,
)
from simpy_llm.config.engine import (
    ENGINE_PRESETS,
    REUSABLE_PROMPT_TAIL,
    EngineConfig,
    LlamaCppPreset,
    SlotCacheConfig,
)
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.metrics import MetricsConfig
from simpy_llm.config.paths import resolve_path
from simpy_llm.config.planner import PlannerConfig, check_planner
from simpy_llm.config.serving import (
    LOCAL_NVME_BYTES_PER_S,
    MAX_BINS,
    ROLES,
    SLA_CONTROLLER_KINDS,
    WEIGHT_SOURCES,
    BatchServerConfig,
    BinsConfig,
    ClusterConfig,
    DisaggregationConfig,
    DynamicBatchingConfig,
    KvTransferConfig,
    MemoryLimitConfig,
    ReplicaGroupConfig,
    ServingConfig,
    check_replica_kind,
)
from simpy_llm.config.speculation import SpeculationConfig
from simpy_llm.config.validators import (
    MAX_SEED,
    MAX_TIME_S,
    MIN_PERIOD_S,
    all_of,
    at_least,
    at_most,
    greater_than,
    in_range,
    one_of,
    optional,
)
from simpy_llm.config.workload import (
    MAX_FAN_OUT,
    MAX_ITERATIONS,
    ActiveWindow,
    AgenticConfig,
    ClientConfig,
    LifecycleConfig,
    LoopConfig,
    MultimodalConfig,
    MultiTurnConfig,
    ReasoningConfig,
    ServeGenConfig,
    StepConfig,
    ToolConfig,
    TraceSource,
    WorkloadConfig,
)

__all__ = [
    "ENGINE_PRESETS",
    "LOCAL_NVME_BYTES_PER_S",
    "MAX_BINS",
    "MAX_FAN_OUT",
    "MAX_ITERATIONS",
    "REUSABLE_PROMPT_TAIL",
    "ROLES",
    "SLA_CONTROLLER_KINDS",
    "WEIGHT_SOURCES",
    "ActiveWindow",
    "AdmissionSpec",
    "AgenticConfig",
    "ArrivalField",
    "BatchServerConfig",
    "BatchServiceSpec",
    "BinSelectorSpec",
    "BinsConfig",
    "ClientConfig",
    "ClusterConfig",
    "DisaggregationConfig",
    "DynamicBatchingConfig",
    "EngineConfig",
    "KvBlocks",
    "KvTransferConfig",
    "LatencySpec",
    "LengthField",
    "LifecycleConfig",
    "LinkFaults",
    "LlamaCppPreset",
    "LoopConfig",
    "MemoryLimitConfig",
    "MultiTurnConfig",
    "MultimodalConfig",
    "NetworkConfig",
    "OutageWindow",
    "PolicySpec",
    "PriorityField",
    "Probability",
    "ProcessKindSpec",
    "ProcessSpec",
    "ReasoningConfig",
    "ReplicaGroupConfig",
    "RouterSpec",
    "SLOTarget",
    "Scenario",
    "SchedulerSpec",
    "ServeGenConfig",
    "ServingConfig",
    "SimulationConfig",
    "SlotCacheConfig",
    "StepConfig",
    "TimeWindow",
    "ToolConfig",
    "TraceSource",
    "WorkloadConfig",
    "check_replica_kind",
    "is_plugin_path",
    "rebuild_with",
]




@attrs.frozen(kw_only=True)
class SLOTarget:
    """Latency targets of one SLO class; a request meets its SLO when every given target holds.

    Each request is judged on its own (goodput counts those that meet their class's
    targets); a capacity search's bounds on a statistic over many requests
    (``ttft_p99=0.5``) are :class:`~simpy_llm.explore.capacity.SloCriterion`.
    """

    ttft_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Time to first token, seconds."""
    tpot_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Mean time per output token after the first, seconds."""
    e2e_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """End-to-end latency, seconds."""
    tvt_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Time to verified tokens (speculative decoding): a request's longest round, seconds
    (requests without verify rounds cannot miss it); also the verify pool's EDF deadline."""

    def __attrs_post_init__(self) -> None:
        # A class without a target would count every one of its requests as meeting it.
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None and self.tvt_s is None:
            raise FieldValueError("", "give at least one target: ttft_s, tpot_s, e2e_s or tvt_s")


@attrs.frozen(kw_only=True)
class SimulationConfig:
    """How the simulation itself runs."""

    mode: str = attrs.field(default="event_per_change", validator=one_of(("event_per_change", "event_per_step")))
    """``event_per_change``: one SimPy event per batch-composition change (fast);
    ``event_per_step``: one per engine step (the reference; same records)."""
    until_s: float | None = attrs.field(default=None, validator=optional(all_of(greater_than(0), at_most(MAX_TIME_S))))
    """Stop the simulation at this time (requests still in flight are reported as such).
    Default: run until every generated request has finished."""
    timeseries_interval_s: float | None = attrs.field(
        default=None, validator=optional(all_of(greater_than(0), in_range(MIN_PERIOD_S, MAX_TIME_S)))
    )
    """Sample each replica's queue length, batch size, KV use and busy state every this
    many simulated seconds (``Results.timeseries()``). Default: no sampling."""


def is_plugin_path(plugin: str) -> bool:
    """Whether a ``plugins`` entry names a Python file (``.py``, or a path with a slash), not a module.

    >>> is_plugin_path("my_policies.py"), is_plugin_path("lib/policies"), is_plugin_path("my_pkg.policies")
    (True, True, False)
    """
    return plugin.endswith(".py") or "/" in plugin or "\\" in plugin


def _plugin_paths(plugins: Any) -> Any:
    """File plugins made absolute against the scenario file's directory; module names as given."""
    if not isinstance(plugins, (list, tuple)):
        return plugins
    return tuple(resolve_path(p) if isinstance(p, str) and is_plugin_path(p) else p for p in plugins)


ProcessKindSpec = NewType("ProcessKindSpec", PolicySpec)
"""A :class:`PolicySpec` naming a process function (:data:`simpy_llm.processes.process_kinds`)."""


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """A user process placed at a seam (``docs/processes.md``): ``between`` a Wire's producers
    and its consumer, or ``instead_of`` a component.

    >>> ProcessSpec(between="arrivals", process=PolicySpec(kind="rate_limit", params={"rate_per_s": 2.0})).seam
    'arrivals'
    """

    process: ProcessKindSpec
    """The registered process function and its parameters (``{kind: ..., params: {...}}``)."""
    between: str | None = None
    """The seam (a Wire) to stand on: ``arrivals``, ``replica:0``..."""
    instead_of: str | None = None
    """The component to stand in for: ``router`` or ``replica:<index>``."""

    def __attrs_post_init__(self) -> None:
        if (self.between is None) == (self.instead_of is None):
            raise FieldValueError("between", "give exactly one of between (a seam) and instead_of (a component)")

    @property
    def seam(self) -> str:
        """Where the process goes."""
        return self.between if self.between is not None else self.instead_of  # type: ignore[return-value]


_rebuild: Callable[[Scenario, dict[str, Any]], Scenario] | None = None
"""How :meth:`Scenario.replace` validates the changed scenario: the loader's, which sits above
this module (it knows the registries) and sets it with :func:`rebuild_with` when imported."""


def rebuild_with(rebuild: Callable[[Scenario, dict[str, Any]], Scenario]) -> Callable[[Scenario, dict[str, Any]], Scenario]:
    """Use *rebuild* for :meth:`Scenario.replace` (the loader calls this once)."""
    global _rebuild
    _rebuild = rebuild
    return rebuild


@attrs.frozen(kw_only=True)
class Scenario:
    """A whole scenario: workload, serving system, SLOs and run settings.

    Examples
    --------
    >>> from simpy_llm import load_scenario
    >>> s = load_scenario("scenarios/quickstart.yaml")
    >>> s
    <Scenario name='quickstart' clients=2 replicas=1 router=round_robin scheduler=fcfs>
    >>> s.replace(**{"serving.replicas": 4, "serving.router.kind": "least_loaded"})
    <Scenario name='quickstart' clients=2 replicas=4 router=least_loaded scheduler=fcfs>
    """

    workload: WorkloadConfig
    serving: ServingConfig
    seed: int = attrs.field(default=0, validator=all_of(at_least(0), at_most(MAX_SEED)))
    """Root seed of every random stream."""
    name: str = ""
    """Free-form label."""
    slo: dict[str, SLOTarget] = attrs.field(factory=dict)
    """SLO targets per class name. When given, every ``slo_class`` of a client or of
    ``servegen_data`` must be one of its keys (and a replayed trace's classes are checked
    when its file is read; see ``docs/scenarios.md``, "SLO classes")."""
    simulation: SimulationConfig = attrs.field(factory=SimulationConfig)
    speculation: SpeculationConfig | None = None
    """Speculative decoding: draft devices run the requests, the fleet verifies
    (:mod:`simpy_llm.config.speculation`, ``docs/speculative.md``). None: plain decoding."""
    planner: PlannerConfig | None = None
    """A periodic planner that resizes the fleet's active pools and batch limits by what-if
    simulations (:mod:`simpy_llm.config.planner`, ``docs/planner.md``). None: the
    configuration stays as given."""
    autoscaler: AutoscalerConfig | None = None
    """A metric-driven autoscaler of the co-located fleet's active replicas
    (:mod:`simpy_llm.config.autoscaler`, ``docs/autoscaling.md``). None: every replica serves
    throughout."""
    metrics: MetricsConfig = attrs.field(factory=MetricsConfig)
    """How the summary groups requests: fairness cohorts (:mod:`simpy_llm.config.metrics`)."""
    processes: tuple[ProcessSpec, ...] = ()
    """User processes placed at seams, in the order items pass them (``docs/processes.md``);
    their functions are registered in :data:`simpy_llm.processes.process_kinds`."""
    plugins: tuple[str, ...] = attrs.field(default=(), converter=_plugin_paths)
    """Modules (``my_package.policies``) or Python files (``my_policies.py``, relative to
    the scenario file) imported before the rest of the scenario is read, so that the
    policies they register can be named in it."""
    _loaded_from: str | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """The file the scenario was loaded from (relative paths of :meth:`replace` resolve
    against its directory); None when built from data."""

    def __attrs_post_init__(self) -> None:
        if self.slo:
            self._check_slo_classes()
        if self.speculation is not None:
            self._check_speculation()
            if self.serving.gateway is not None:
                raise FieldValueError("serving.gateway", "is not modelled with a speculation section yet (give one or the other)")
        if self.planner is not None:
            check_planner(self)
        if self.autoscaler is not None:
            if self.speculation is not None:
                raise FieldValueError("autoscaler", "is not modelled with a speculation section yet (give one or the other)")
            check_autoscaler(self)

    def _check_slo_classes(self) -> None:
        """With an ``slo`` section, every SLO class the scenario names is one of its keys: a
        request of a class without targets would count as meeting them. (A replayed trace's
        classes are in its file: they are checked when the file is read.)"""
        wl = self.workload
        named = [(f"workload.clients[{i}].slo_class", c.slo_class) for i, c in enumerate(wl.clients)]
        if wl.servegen_data is not None:
            named.append(("workload.servegen_data.slo_class", wl.servegen_data.slo_class))
        for path, name in named:
            if name not in self.slo:
                raise FieldValueError(path, f"unknown SLO class {name!r}; the slo section defines: {', '.join(sorted(self.slo))}")

    def _check_speculation(self) -> None:
        """What speculative decoding cannot run with, and the draft groups' clients."""
        serving, wl, speculation = self.serving, self.workload, self.speculation
        assert speculation is not None  # called only with a speculation section
        if self.simulation.mode != "event_per_change":
            raise FieldValueError(
                "simulation.mode", "applies to continuous-batching replicas; verify servers take one event per pass in any mode"
            )
        if serving.disaggregation is not None:
            self._check_disaggregated_speculation()
        for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
            if group.batch_server is not None:
                raise FieldValueError(f"serving.{path}batch_server", "speculative decoding's targets are verify servers, not batch servers")
            if group.role == "prefill":
                continue  # a disaggregated fleet's prefill pool: engine replicas, every engine key read
            engine = group.engine
            unread = (
                ("scheduler", engine.scheduler.kind != "fcfs", "their order is speculation.verify.order"),
                ("preemption_mode", engine.preemption_mode != "recompute", "they admit by KV reservation and never preempt"),
                ("swap_space_blocks", engine.swap_space_blocks > 0, "they never preempt"),
                ("ubatch_tokens", engine.ubatch_tokens is not None, "their passes are timed whole"),
                ("prefill_breaks", bool(engine.prefill_breaks), "their passes are timed whole"),
                ("reusable_prompt_tail", engine.reusable_prompt_tail is not None, "they have no prefix cache"),
                ("slot_cache", engine.slot_cache is not None, "they have no prefix cache"),
            )
            for key, set_, why in unread:
                if set_:
                    raise FieldValueError(f"serving.{path}engine.{key}", f"does not apply to speculative decoding's verify servers: {why}")
        if speculation.verify.preemption_slack_ms is not None and not any(
            c.tvt_s is not None or c.tpot_s is not None for c in self.slo.values()
        ):
            raise FieldValueError(
                "speculation.verify.preemption_slack_ms",
                "no SLO class sets tvt_s or tpot_s: no round has a deadline, so none would ever cut a pass",
            )
        known = {c.id for c in wl.clients}
        for i, c in enumerate(wl.clients):
            if c.network is not None:
                raise FieldValueError(
                    f"workload.clients[{i}].network",
                    "with speculation the draft groups' networks carry the requests; give the network to the draft group",
                )
        claimed: dict[str, str] = {}
        for g, draft_group in enumerate(speculation.drafts):
            for cid in draft_group.clients:
                if known and cid not in known:
                    raise FieldValueError(f"speculation.drafts[{g}].clients", f"no workload client {cid!r}; clients: {', '.join(sorted(known))}")
                if cid in claimed:
                    raise FieldValueError(f"speculation.drafts[{g}].clients", f"client {cid!r} is already run by draft group {claimed[cid]!r}")
                claimed[cid] = draft_group.name
        if len([g for g in speculation.drafts if not g.clients]) > 1:
            raise FieldValueError("speculation.drafts", "at most one draft group may leave clients empty (it takes every other client)")

    def _check_disaggregated_speculation(self) -> None:
        """What speculation on a disaggregated fleet (``docs/speculative.md``) cannot run with."""
        speculation = self.speculation
        assert speculation is not None  # called only with a speculation section
        if self.planner is not None:
            raise FieldValueError("planner", "resizes a co-located speculative fleet; remove it or serving.disaggregation")
        if speculation.verify.prefix_caching:
            raise FieldValueError(
                "speculation.verify.prefix_caching",
                "a decode-pool verify server receives each prompt's KV whole; remove it with serving.disaggregation",
            )
        for g, group in enumerate(speculation.drafts):
            bound = (
                ("targets", bool(group.targets)), ("rtt_ms_by_target", bool(group.rtt_ms_by_target)),
                ("drafters", any(d.acceptance_by_target for d in group.drafters)),
            )
            for key, set_ in bound:
                if set_:
                    raise FieldValueError(
                        f"speculation.drafts[{g}].{key}" + ("[].acceptance_by_target" if key == "drafters" else ""),
                        "binds a draft group to targets, which a disaggregated fleet's entry router (its prefill pool) does not see",
                    )

    @property
    def loaded_from(self) -> str | None:
        """The file the scenario was loaded from (absolute), or None when it was built from data."""
        return self._loaded_from

    def replace(self, **changes: Any) -> Scenario:
        """A new scenario with *changes* applied, validated as a loaded one is.

        Keys are dotted paths as for ``--set`` (``"workload.num_requests"``; list items
        by index, ``"workload.clients.0.rate_fraction"``), plain names for top-level
        keys (``seed=7``); values are taken as given, not parsed. Relative paths
        resolve against the directory of the file the scenario was loaded from.

        Raises
        ------
        ScenarioError
            If the changed scenario is not valid.
        """
        if _rebuild is None:
            raise RuntimeError("Scenario.replace needs the loader: import simpy_llm (or simpy_llm.loading) first")
        return _rebuild(self, changes)

    def __repr__(self) -> str:
        wl, serving = self.workload, self.serving
        parts = [f"name={self.name!r}"]
        if wl.clients:
            parts.append(f"clients={len(wl.clients)}")
        if wl.servegen_data is not None:
            parts.append(f"servegen={wl.servegen_data.path.rstrip('/').rsplit('/', 1)[-1]!r}")
        if wl.traces:
            parts.append(f"traces={len(wl.traces)}")
        parts.append(f"replicas={serving.num_replicas}")
        if serving.replica_groups:
            parts.append(f"groups={len(serving.replica_groups)}")
        parts.append(f"router={serving.entry_router.kind}")
        schedulers = dict.fromkeys(g.engine.scheduler.kind for g in serving.groups())
        parts.append(f"scheduler={'/'.join(schedulers)}")
        return f"<Scenario {' '.join(parts)}>"
