"""Checks across components: what a config's values cannot say on their own.

The config classes (:mod:`simpy_llm.config`) check values and shapes when they are made;
they import nothing above them. What needs the components themselves is checked here, in
the build step above them: a replica group's device profile and its role, a batch server's
need of a latency model, a fleet's plan (``kv_num_blocks: auto``, swap settings), a
disaggregated fleet's topology, an agentic workflow's graph, a process's seam, acceptance
curves and draft devices, the planner's summary metrics and parallelism candidates.

A check that needs a component only a feature uses (device profiles, topologies, acceptance
curves, the planner, batch servers, agentic workflows) imports it when it runs, that is when
the scenario has the feature: loading a scenario imports what the scenario uses, and
``simpy-llm run`` starts the sooner (``benchmarks/bench_startup.py``).

Each check takes one config object and raises :class:`~simpy_llm.config.errors.FieldValueError`
naming the key inside it, as the class's own checks do. The loader runs a class's checks
right after it makes an object of that class (:func:`register_checks`), so a problem is
reported at its key path among the others, exactly where a value problem would be;
:func:`check_config` runs them over a config built in Python.

Examples
--------
>>> from simpy_llm.config.schema import ProcessSpec, PolicySpec
>>> spec = ProcessSpec(between="replica", process=PolicySpec(kind="rate_limit", params={"rate_per_s": 1.0}))
>>> check_config(spec)
Traceback (most recent call last):
...
simpy_llm.config.errors.ScenarioError: <config>: 1 problem(s) in scenario
  between: ...
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.planner import NAMED_OBJECTIVES, PlannerConfig
from simpy_llm.config.schema import (
    AgenticConfig,
    BatchServerConfig,
    PolicySpec,
    ProcessSpec,
    ReplicaGroupConfig,
    Scenario,
    ServingConfig,
    ToolConfig,
)
from simpy_llm.config.speculation import DrafterConfig, DraftGroupConfig, FusedConfig, SpeculationConfig
from simpy_llm.config.structure import attrs_hook_factory, build_policy, converter
from simpy_llm.processes import check_place
from simpy_llm.serving.fleet import plan_fleet
from simpy_llm.serving.latency import latency_models
from simpy_llm.workload.distributions import ClampedGaussian

if TYPE_CHECKING:
    from simpy_llm.serving.devices import DeviceProfile

__all__ = ["CHECKS", "check_config", "register_checks"]

C = TypeVar("C")

CHECKS: dict[type, list[Callable[[Any], None]]] = {}
"""Config class -> the checks run on each object of it, in order."""


def _checks(cls: type[C]) -> Callable[[Callable[[C], None]], Callable[[C], None]]:
    def add(check: Callable[[C], None]) -> Callable[[C], None]:
        CHECKS.setdefault(cls, []).append(check)
        return check

    return add


@_checks(ToolConfig)
def _tool_latency(tool: ToolConfig) -> None:
    if isinstance(tool.latency_s, ClampedGaussian):
        # Its bounds are whole tokens (min >= 1): as a time it would never draw below 1 s.
        raise FieldValueError(
            "latency_s", "gaussian is clamped to token bounds (min >= 1), never below 1 s; "
            "for a time use normal, gamma, lognormal, exponential or uniform"
        )


@_checks(AgenticConfig)
def _workflow(config: AgenticConfig) -> None:
    from simpy_llm.workload.workflows import check_workflow

    check_workflow(config)


def _batch_service_latency(batch_server: BatchServerConfig | None, latency_model: PolicySpec | None) -> None:
    """A batch server has a latency model exactly when its service model uses one."""
    if batch_server is None:
        return
    from simpy_llm.serving.batching import batch_service_models

    kind = batch_server.service.kind
    needs = getattr(batch_service_models.get(kind), "needs_latency_model", False)  # a user's service model may leave it out
    if needs and latency_model is None:
        raise FieldValueError("latency_model", f"required by batch_server.service kind {kind!r}")
    if not needs and latency_model is not None:
        raise FieldValueError("latency_model", f"not used by batch_server.service kind {kind!r} (remove it)")


def _device(name: str) -> DeviceProfile:
    """The device profile *name* (a shipped id or a file), its problems reported at ``device``."""
    from simpy_llm.serving.devices import device_profile

    try:
        return device_profile(name)
    except ScenarioError as exc:
        raise FieldValueError("device", f"{exc}") from None


@_checks(ReplicaGroupConfig)
def _replica_group(group: ReplicaGroupConfig) -> None:
    _batch_service_latency(group.batch_server, group.latency_model)
    if group.device is None:
        return
    profile = _device(group.device)
    if profile.role == "draft":
        raise FieldValueError("device", f"{profile.id!r} is a draft device; a replica runs on a target (or any) device")
    if profile.availability:
        raise FieldValueError("device", f"{profile.id!r} has availability windows, which replicas do not model yet (only draft devices will)")
    if group.warm_retention_s is not None and profile.cold_start is None and group.weights_from is None:
        raise FieldValueError("warm_retention_s", f"device {profile.id!r} has no cold_start and no weights_from is given: nothing to pay again")
    if group.role != "both" and group.batch_server is not None:
        raise FieldValueError("role", "a batch_server serves whole requests; only continuous-batching replicas can be a prefill or decode pool")


@_checks(ServingConfig)
def _serving(serving: ServingConfig) -> None:
    if not serving.replica_groups and not serving.clusters:
        _batch_service_latency(serving.batch_server, serving.latency_model)
    dis = serving.disaggregation
    if dis is not None and dis.topology is not None:
        _topology(serving, dis.topology)
    plans = plan_fleet(serving)  # resolves kv_num_blocks: auto and the swap settings, or says why not
    if dis is not None and dis.kv_transfer.bytes_per_token is None:
        # the hand-off's default size is one stage's KV times tp: it would miss the other stages' layers
        staged = sorted({p.group for p in plans if p.role == "prefill" and p.latency.hardware is not None and p.latency.hardware.pp > 1})
        if staged:
            raise FieldValueError(
                "disaggregation.kv_transfer.bytes_per_token",
                f"required: the prefill group {staged[0]!r} runs pipeline stages (pp > 1), whose KV hand-off size is not derived",
            )


def _topology(serving: ServingConfig, spec: dict[str, Any]) -> None:
    """The topology builds, and its endpoints are the fleet's replicas (``<group>/<k>``):
    every replica is one; a ``complete`` or ``clos`` topology names no other (a ``links``
    topology may have switches)."""
    from simpy_llm.network.topology import Topology

    try:
        topology = Topology.from_spec(spec)
    except FieldValueError as exc:
        raise FieldValueError(f"disaggregation.topology.{exc.field}".rstrip("."), exc.message) from None
    names = serving.replica_names()
    missing = [n for n in names if n not in topology.endpoints]
    if missing:
        raise FieldValueError(
            "disaggregation.topology",
            f"the replicas {', '.join(missing)} are not endpoints of the topology (a replica is <group>/<k>)",
        )
    extra = [e for e in topology.endpoints if e not in set(names)]
    if extra and spec.get("type") != "links":
        raise FieldValueError("disaggregation.topology.endpoints", f"{', '.join(extra)} name no replica; the replicas are {', '.join(names)}")


@_checks(ProcessSpec)
def _process_place(spec: ProcessSpec) -> None:
    key = "between" if spec.between is not None else "instead_of"
    try:
        check_place(spec.seam, instead=spec.instead_of is not None)
    except ValueError as exc:
        raise FieldValueError(key, str(exc)) from None


def _known_curve(curve: str) -> None:
    from simpy_llm.speculative.curves import acceptance_model

    try:
        acceptance_model(curve)
    except (ScenarioError, KeyError, ValueError) as exc:
        raise FieldValueError("acceptance", str(exc)) from None


_checks(DrafterConfig)(lambda drafter: _known_curve(drafter.acceptance))
_checks(FusedConfig)(lambda fused: _known_curve(fused.acceptance))


@_checks(DraftGroupConfig)
def _draft_device(group: DraftGroupConfig) -> None:
    if group.device is None:
        return
    profile = _device(group.device)
    if profile.role == "target":
        raise FieldValueError("device", f"{profile.id!r} is a target device; a draft group runs on a draft (or any) device")


@_checks(SpeculationConfig)
def _curves_cover_k(spec: SpeculationConfig) -> None:
    """Each acceptance curve covers ``k_max`` and, with several temperatures, is told which."""
    from simpy_llm.speculative.curves import acceptance_model

    where = [(f"drafts[{g}].drafters[{d}].acceptance", dr.acceptance) for g, grp in enumerate(spec.drafts) for d, dr in enumerate(grp.drafters)]
    if spec.fused is not None:
        where.append(("fused.acceptance", spec.fused.acceptance))
    for path, curve in where:
        model = acceptance_model(curve)
        if model.k_max < spec.k_max:
            raise FieldValueError(path, f"curve {model.name!r} covers k up to {model.k_max}, below k_max ({spec.k_max})")
        if spec.temperature is None and len(model.temperatures) > 1:
            raise FieldValueError(path, f"curve {model.name!r} has temperatures {list(model.temperatures)}: set speculation.temperature")


@_checks(DrafterConfig)
def _known_target_curves(drafter: DrafterConfig) -> None:
    """Each per-target curve names a curve, as ``acceptance`` does."""
    from simpy_llm.speculative.curves import acceptance_model

    for name, curve in drafter.acceptance_by_target.items():
        try:
            acceptance_model(curve)
        except (ScenarioError, KeyError, ValueError) as exc:
            raise FieldValueError(f"acceptance_by_target.{name}", str(exc)) from None


@_checks(SpeculationConfig)
def _target_curves_cover_k(spec: SpeculationConfig) -> None:
    """Each per-target curve covers ``k_max`` and, with several temperatures, is told which."""
    from simpy_llm.speculative.curves import acceptance_model

    for g, group in enumerate(spec.drafts):
        for d, drafter in enumerate(group.drafters):
            for name, curve in drafter.acceptance_by_target.items():
                path = f"drafts[{g}].drafters[{d}].acceptance_by_target.{name}"
                model = acceptance_model(curve)
                if model.k_max < spec.k_max:
                    raise FieldValueError(path, f"curve {model.name!r} covers k up to {model.k_max}, below k_max ({spec.k_max})")
                if spec.temperature is None and len(model.temperatures) > 1:
                    raise FieldValueError(path, f"curve {model.name!r} has temperatures {list(model.temperatures)}: set speculation.temperature")


@_checks(Scenario)
def _draft_targets(scenario: Scenario) -> None:
    """A draft group's ``targets`` and the keys of its per-target settings name targets of the
    fleet, and a per-target setting reaches a target the group may use."""
    spec = scenario.speculation
    if spec is None:
        return
    from simpy_llm.speculative.targets import FleetTargets

    fleet = FleetTargets(scenario.serving)
    for g, group in enumerate(spec.drafts):
        where = f"speculation.drafts[{g}]"
        for j, name in enumerate(group.targets):
            if not fleet.indices(name):
                raise FieldValueError(f"{where}.targets[{j}]", fleet.unknown_message(name))
        allowed = fleet.allowed(group.targets) if group.targets else None
        keyed: list[tuple[str, Collection[str]]] = [(f"{where}.rtt_ms_by_target", group.rtt_ms_by_target.keys())]
        keyed += [(f"{where}.drafters[{d}].acceptance_by_target", dr.acceptance_by_target.keys()) for d, dr in enumerate(group.drafters)]
        for path, mapping in keyed:
            for name in mapping:
                covered = fleet.indices(name)
                if not covered:
                    raise FieldValueError(f"{path}.{name}", fleet.unknown_message(name))
                if allowed is not None and not allowed.intersection(covered):
                    raise FieldValueError(f"{path}.{name}", f"{name!r} is none of the group's targets {list(group.targets)}: it would never apply")


@_checks(Scenario)
def _cohort_keys(scenario: Scenario) -> None:
    """A fairness cohort groups by a key the scenario's records tell apart: draft groups and
    devices need speculation, clusters need clusters."""
    needs = {"draft_group": scenario.speculation is not None, "draft_device": scenario.speculation is not None,
             "cluster": bool(scenario.serving.clusters)}
    why = {"draft_group": "speculation (draft groups)", "draft_device": "speculation (draft devices)", "cluster": "serving.clusters"}
    for i, cohort in enumerate(scenario.metrics.fairness.cohorts):
        if not needs.get(cohort.by, True):
            raise FieldValueError(f"metrics.fairness.cohorts[{i}].by", f"{cohort.by} needs {why[cohort.by]}; every request would be in one group")


@_checks(Scenario)
def _gateway_weights(scenario: Scenario) -> None:
    """A fair gateway's weights name sub-queues the workload's clients can fill: a mistyped
    tenant would silently weigh 1 (checked when the clients are the whole workload)."""
    gateway = scenario.serving.gateway
    wl = scenario.workload
    if gateway is None or gateway.dispatch.kind != "fair" or wl.traces or wl.servegen_data is not None:
        return
    by = gateway.queue_by
    if by == "priority" and not all(isinstance(c.priority, int) for c in wl.clients):
        return  # priorities drawn per request: the sub-queues are not known here
    fields = {"tenant": lambda c: c.tenant_id or c.id, "client": lambda c: c.id, "slo_class": lambda c: c.slo_class,
              "priority": lambda c: c.priority, "none": lambda c: ""}
    keys = {str(fields[by](c)) for c in wl.clients}
    for name in gateway.dispatch.params.get("weights") or {}:
        if str(name) not in keys:
            raise FieldValueError(
                f"serving.gateway.dispatch.params.weights.{name}",
                f"no client's {gateway.queue_by} is {name!r}; the sub-queues are {', '.join(sorted(keys))}",
            )


@_checks(Scenario)
def _client_cap(scenario: Scenario) -> None:
    """A cap on the workload's requests in flight needs every request's end told to the client:
    the draft devices of speculative decoding take a rejected prompt's end themselves, and a
    planner's what-if runs replay arrivals without the client, so both are refused with it."""
    if scenario.workload.max_concurrency is None:
        return
    for section, given in (("speculation", scenario.speculation is not None), ("planner", scenario.planner is not None)):
        if given:
            raise FieldValueError("workload.max_concurrency", f"is not modelled with a {section} section (give one or the other)")


@_checks(PlannerConfig)
def _planner_metrics(planner: PlannerConfig) -> None:
    """The objective and the constraints name numeric figures of a what-if's summary."""
    from simpy_llm.metrics.summary_paths import summary_metric_path

    if planner.objective not in NAMED_OBJECTIVES:
        problem = summary_metric_path(planner.objective.removeprefix("-"))
        if problem:
            raise FieldValueError("objective", f"{problem}; or one of {', '.join(NAMED_OBJECTIVES)}")
    for path in planner.constraints:
        problem = summary_metric_path(path)
        if problem:
            raise FieldValueError(f"constraints.{path}", problem)


@_checks(Scenario)
def _planner_parallelism(scenario: Scenario) -> None:
    """Parallelism candidates need latency models rebuilt at each degree: each group's model
    takes ``tp`` and names its hardware, the groups share one degree, and every candidate's
    layout splits the groups' GPUs and builds (the model shards that many ways, fits, has a
    profile at that degree)."""
    planner = scenario.planner
    if planner is None or planner.candidates.parallelism is None:
        return
    from simpy_llm.serving.planner import fleet_tp, layout_serving

    serving = scenario.serving
    try:
        plans = plan_fleet(serving)
    except FieldValueError:
        return  # the fleet's own problem, reported at its key path by the serving checks
    key = "planner.candidates.parallelism"
    by_group = {p.group: p for p in plans}
    for path, group in zip(serving.group_paths(), serving.groups(), strict=True):
        spec = group.latency_model
        if spec is None:
            continue  # a batch server: refused by the planner's own check
        plan = by_group[group.name]
        hardware = getattr(plan.latency, "hardware", None)
        try:
            rebuilt = build_policy(PolicySpec(kind=spec.kind, params={**spec.params, "tp": plan.gpus}), latency_models)
        except FieldValueError:
            rebuilt = None
        if hardware is not None and hardware.pp > 1:
            raise FieldValueError(
                key, f"serving.{path}latency_model runs pp {hardware.pp} pipeline stages: a parallelism candidate sets the "
                "tensor-parallel degree of one-stage replicas (give pp: 1, or leave parallelism out)"
            )
        if hardware is None or rebuilt is None or getattr(rebuilt, "hardware", None) is None:
            raise FieldValueError(
                key, f"serving.{path}latency_model ({spec.kind}) cannot change its tensor-parallel degree: a parallelism "
                "candidate needs a latency model that takes tp and names its model and gpu (roofline, profile, blis_linear with a profile)"
            )
    try:
        base = fleet_tp(plans)
    except FieldValueError as exc:
        raise FieldValueError(key, exc.message) from None
    for i, candidate in enumerate(planner.candidates.parallelism):
        try:
            layout = layout_serving(serving, candidate.tp, base)
        except FieldValueError as exc:
            raise FieldValueError(f"{key}[{i}].tp", exc.message) from None
        try:
            plan_fleet(layout)
        except FieldValueError as exc:
            raise FieldValueError(f"{key}[{i}].tp", f"at tp {candidate.tp}, serving.{exc.field}: {exc.message}") from None


def _checked_hook(cls: type, checks: list[Callable[[Any], None]]) -> Callable[[Any, Any], Any]:
    # The class's structuring is generated when a scenario first gives one of it: a scenario
    # without a planner, speculation or batch servers never pays for theirs.
    inner: list[Callable[[Any, Any], Any]] = []

    def hook(value: Any, t: Any) -> Any:
        if not inner:
            inner.append(attrs_hook_factory(cls))
        obj = inner[0](value, t)
        for check in checks:
            check(obj)
        return obj

    return hook


def register_checks() -> None:
    """Run each class's checks on every object of it that :data:`~simpy_llm.config.structure.converter`
    structures. Called once by the loader, after every hook the classes' fields need is
    registered (each class's structuring is generated from those hooks when the converter first
    structures an object of it)."""
    for cls, checks in CHECKS.items():
        converter.register_structure_hook(cls, _checked_hook(cls, checks))


def _problems(obj: Any, path: str) -> Iterator[tuple[str, str]]:
    """The problems the checks find in *obj* and every config object inside it, with key paths."""
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _problems(item, f"{path}[{i}]")
        return
    if isinstance(obj, dict):
        for key, item in obj.items():
            yield from _problems(item, f"{path}.{key}" if path else str(key))
        return
    if not attrs.has(type(obj)):
        return
    for a in attrs.fields(type(obj)):
        if a.init:
            yield from _problems(getattr(obj, a.name), f"{path}.{a.name}" if path else a.name)
    for check in CHECKS.get(type(obj), ()):
        try:
            check(obj)
        except FieldValueError as exc:
            yield (f"{path}.{exc.field}" if path else exc.field).rstrip("."), exc.message
            return


def check_config(obj: Any, source: str = "<config>") -> None:
    """Run the cross-component checks over *obj* (a :class:`~simpy_llm.config.schema.Scenario`
    or any config object) and everything inside it, as loading does.

    Raises
    ------
    ScenarioError
        Listing every problem found, with its key path (one per object at most).
    """
    problems = list(_problems(obj, ""))
    if problems:
        raise ScenarioError(source, problems)
