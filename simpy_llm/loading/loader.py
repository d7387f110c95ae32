"""YAML -> :class:`~simpy_llm.config.schema.Scenario`, strictly.

Structuring goes through one cattrs converter that forbids unknown keys,
refuses silent type coercion (``"3"`` is not an int, ``1.5`` is not an int,
``true`` is not a number) and rejects NaN/Inf. Every problem found becomes an
entry of one :class:`ScenarioError` naming the file, the key path and what is
allowed. Loading reads the file and nothing else, with one deliberate
exception: the plugins a scenario names (``plugins:``), and those installed
under the ``simpy_llm.plugins`` entry-point group, are imported first, so that
the names they register are known (:func:`load_plugins`); and a scenario whose
``workload`` is ``{file: PATH}`` reads that workload file.

A *bare workload spec* is a file whose top level is a workload
(:class:`~simpy_llm.config.schema.WorkloadConfig`'s keys, no ``serving``):
:func:`load_workload` reads one, :func:`load_workload_or_scenario` reads either kind,
deciding by content (a mapping with ``serving`` or ``workload`` at the top is a scenario).
"""

from __future__ import annotations

import functools
import importlib
import re
import reprlib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, get_type_hints

import attrs
import numpy as np

from simpy_llm.config.autoscaler import ScalingSpec
from simpy_llm.config.errors import WORKLOAD_SPEC, ScenarioError
from simpy_llm.config.gateway import DispatchSpec
from simpy_llm.config.paths import base_dir, resolve_path
from simpy_llm.config.plain import scenario_to_dict, unstructure, workload_to_dict
from simpy_llm.config.profile import FittedLatencySpec, check_ranges, load_profile, profile_latency_model
from simpy_llm.config.schema import (
    ENGINE_PRESETS,
    AdmissionSpec,
    ArrivalField,
    BatchServiceSpec,
    BinSelectorSpec,
    EngineConfig,
    KvBlocks,
    LatencySpec,
    LengthField,
    PolicySpec,
    PriorityField,
    ProcessKindSpec,
    RouterSpec,
    Scenario,
    SchedulerSpec,
    WorkloadConfig,
    rebuild_with,
)
from simpy_llm.config.speculation import DrafterPolicySpec, GammaSpec, ModeSelectorSpec
from simpy_llm.config.structure import (
    Problems,
    Unreadable,
    attrs_hook_factory,
    build_policy,
    converter,
    init_names,
    problems_of,
    read_yaml,
    require_mapping,
    structure_or_problems,
    tagged,
)
from simpy_llm.loading.checks import register_checks
from simpy_llm.loading.overrides import Overrides, apply_overrides, ordered_overrides, override_items
from simpy_llm.loading.plugins import import_plugins_of, load_entry_point_plugins
from simpy_llm.policies.admission import admission_policies
from simpy_llm.policies.routing import routing_policies
from simpy_llm.policies.scheduling import scheduler_policies
from simpy_llm.processes import process_kinds
from simpy_llm.registry import Registry
from simpy_llm.serving.latency import latency_models
from simpy_llm.workload.arrivals import arrival_processes
from simpy_llm.workload.distributions import length_distributions

# The servegen_windows arrival process registers itself when its module is imported: on first
# need, so that a scenario without it does not load the ServeGen reader.
arrival_processes.load_from("simpy_llm.workload.servegen")

__all__ = [
    "WORKLOAD_SPEC",
    "load_scenario",
    "load_workload",
    "load_workload_or_scenario",
    "override_spec",
    "replace_scenario",
    "scenario_from_dict",
    "workload_from_dict",
]


def _placeholders(names: tuple[str, ...]) -> dict[str, Any]:
    """Stand-ins for the values the simulation injects, so a policy can be built to check its params."""
    # A process function given None for env and ports only makes its generator, which never runs.
    known: dict[str, Any] = {"rng": np.random.default_rng(0), "slo": {}, "env": None, "ports": None}
    return {name: known[name] for name in names if name in known}


def _elsewhere(module: str, name: str) -> Callable[[], Registry[Any]]:
    """The registry *name* of *module*, imported when a scenario first gives a spec of its kind
    (batch servers, speculative decoding): a scenario without one does not load the module."""

    def registry() -> Registry[Any]:
        found: Registry[Any] = getattr(importlib.import_module(module), name)
        return found

    return registry


def _policy_hook(registry: Registry[Any] | Callable[[], Registry[Any]], injected: tuple[str, ...] = ()) -> Any:
    """Hook for a :class:`PolicySpec`; *injected* names the fields the simulation sets;
    *registry* may be given by a function that returns it (:func:`_elsewhere`)."""

    def hook(value: Any, _t: Any) -> PolicySpec:
        registry_ = registry if isinstance(registry, Registry) else registry()
        return _policy_spec(value, registry_, injected)

    return hook


def _policy_spec(value: Any, registry: Registry[Any], injected: tuple[str, ...]) -> PolicySpec:
    """*value* structured as a :class:`PolicySpec` of *registry* (see :func:`_policy_hook`)."""
    value = require_mapping(value, "with keys kind and params")
    extra = sorted(set(value) - {"kind", "params"}, key=str)
    if extra:
        raise Problems([(str(extra[0]), "unknown key; allowed: kind, params")])
    kind = value.get("kind")
    if kind is None:
        raise Problems([("kind", f"required key is missing; one of: {', '.join(registry.names())}")])
    if not isinstance(kind, str) or kind not in registry:
        raise Problems([("kind", f"unknown {registry.what} {kind!r}; one of: {', '.join(registry.names())}")])
    params = value.get("params") or {}
    if not isinstance(params, Mapping):
        raise Problems([("params", f"must be a mapping (of parameters), got {reprlib.repr(params)}")])
    params = dict(params)
    odd = sorted((k for k in params if not isinstance(k, str)), key=str)
    if odd:
        raise Problems([(f"params.{odd[0]}", "unknown key; parameter names are strings")])
    bad = sorted((k for k in params if k in injected), key=str)
    if bad:
        raise Problems([(f"params.{bad[0]}", "is set by the simulation, not the scenario")])
    spec = PolicySpec(kind=kind, params=params)
    try:
        built = build_policy(spec, registry, **_placeholders(injected))
    except Exception as exc:  # noqa: BLE001 - reported with its path
        raise Problems(list(problems_of(exc, "params"))) from None
    resolved = _resolved_paths(built, params)
    return PolicySpec(kind=kind, params={**params, **resolved}) if resolved else spec


def _resolved_paths(built: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The path parameters of *built* (attrs fields converted by :func:`resolve_path`) as it
    resolved them against the scenario's directory: the spec keeps them absolute, so the
    simulation building the policy again later, from any directory, reads the same file."""
    if not attrs.has(type(built)):
        return {}
    out = {}
    for a in attrs.fields(type(built)):
        key = a.alias if a.alias and not a.alias.startswith("_") else a.name
        if a.converter is resolve_path and key in params:
            out[key] = getattr(built, a.name)
    return out


def _arrival(value: Any, _t: Any) -> Any:
    """An arrival process; naming a length distribution as the process points to ``distribution``."""
    try:
        return tagged(value, arrival_processes, "process", flat=True)
    except Problems as exc:
        name = value.get("process") if isinstance(value, Mapping) else None
        if not (isinstance(name, str) and name not in arrival_processes and name in length_distributions):
            raise
        hint = f"; for gaps drawn from the {name} distribution write {{process: distribution, gaps: {{type: {name}, params: {{...}}}}}}"
        raise Problems([(p, m + hint if p == "process" else m) for p, m in exc.problems]) from None


def _priority(value: Any, _t: Any) -> Any:
    """An integer priority, or a length distribution ``{type: NAME, params: {...}}`` drawn per request."""
    if isinstance(value, Mapping):
        return tagged(value, length_distributions, "type", flat=False)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Problems([("", f"must be an integer or a length distribution {{type: NAME, params: {{...}}}}, got {reprlib.repr(value)}")])
    return value


def _kv_blocks(value: Any, _t: Any) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise Problems([("", f"must be a number of blocks or auto, got {reprlib.repr(value)}")])
    if value < 1:
        raise Problems([("", f"must be >= 1, got {value!r}")])
    return value


converter.register_structure_hook(ArrivalField, _arrival)
converter.register_structure_hook(LengthField, lambda v, _t: tagged(v, length_distributions, "type", flat=False))
converter.register_structure_hook(RouterSpec, _policy_hook(routing_policies, injected=("rng",)))
_latency_spec = _policy_hook(latency_models, injected=("rng",))


def _latency(value: Any, t: Any) -> PolicySpec:
    """A latency model: ``{kind, params}`` (with ``fitted_ranges``: a :class:`FittedLatencySpec`),
    or ``{profile: FILE}`` naming a latency profile (:mod:`simpy_llm.config.profile`; relative
    to the scenario file) whose model, and the ranges it was fitted on, are used."""
    if isinstance(value, Mapping) and "profile" in value:
        extra = sorted(set(value) - {"profile"}, key=str)
        if extra:
            raise Problems([(str(extra[0]), "unknown key beside profile; give either profile or kind and params")])
        path = value["profile"]
        if not isinstance(path, str) or not path:
            raise Problems([("profile", f"must be the path of a profile file, got {reprlib.repr(path)}")])
        try:
            profile = load_profile(resolve_path(path))
        except ScenarioError as exc:
            raise Problems([("profile", f"{exc.source}: {msg if not where else where + ': ' + msg}") for where, msg in exc.problems]) from None
        try:
            return _latency(profile_latency_model(profile), t)
        except Problems as exc:
            raise Problems([("profile", f"{path}: latency_model.{where}: {msg}") for where, msg in exc.problems]) from None
    if isinstance(value, Mapping):
        extra = sorted(set(value) - {"kind", "params", "fitted_ranges"}, key=str)
        if extra:
            raise Problems([(str(extra[0]), "unknown key; allowed: kind, params, fitted_ranges (or profile alone)")])
    if isinstance(value, Mapping) and "fitted_ranges" in value:
        ranges, problems = check_ranges(value["fitted_ranges"])
        if problems:
            raise Problems([(f"fitted_ranges.{where}" if where else "fitted_ranges", msg) for where, msg in problems])
        spec = _latency_spec({k: v for k, v in value.items() if k != "fitted_ranges"}, t)
        return FittedLatencySpec(kind=spec.kind, params=spec.params, fitted_ranges=ranges)
    return _latency_spec(value, t)


converter.register_structure_hook(LatencySpec, _latency)
converter.register_structure_hook(SchedulerSpec, _policy_hook(scheduler_policies, injected=("slo",)))
converter.register_structure_hook(AdmissionSpec, _policy_hook(admission_policies, injected=("slo", "rng")))
converter.register_structure_hook(ProcessKindSpec, _policy_hook(process_kinds, injected=("env", "ports")))
converter.register_structure_hook(
    BatchServiceSpec, _policy_hook(_elsewhere("simpy_llm.serving.batching", "batch_service_models"), injected=("rng", "latency"))
)
converter.register_structure_hook(BinSelectorSpec, _policy_hook(_elsewhere("simpy_llm.policies.batching", "bin_selectors")))
converter.register_structure_hook(KvBlocks, _kv_blocks)
converter.register_structure_hook(GammaSpec, _policy_hook(_elsewhere("simpy_llm.policies.gamma", "gamma_policies")))
converter.register_structure_hook(ScalingSpec, _policy_hook(_elsewhere("simpy_llm.policies.scaling", "scaling_policies")))
converter.register_structure_hook(DispatchSpec, _policy_hook(_elsewhere("simpy_llm.policies.gateway", "gateway_dispatch")))
converter.register_structure_hook(ModeSelectorSpec, _policy_hook(_elsewhere("simpy_llm.policies.mode", "mode_selectors")))
converter.register_structure_hook(DrafterPolicySpec, _policy_hook(_elsewhere("simpy_llm.policies.drafter_selection", "drafter_policies")))
_engine_fields = attrs_hook_factory(EngineConfig)


def _engine(value: Any, t: Any) -> EngineConfig:
    """An engine: its own keys, or ``preset: NAME`` and that preset's keys (``ENGINE_PRESETS``)."""
    if not isinstance(value, Mapping) or "preset" not in value:
        return _engine_fields(value, t)
    name = value["preset"]
    if not isinstance(name, str) or name not in ENGINE_PRESETS:
        raise Problems([("preset", f"unknown engine preset {reprlib.repr(name)}; one of: {', '.join(ENGINE_PRESETS)}")])
    fields = {k: v for k, v in value.items() if k != "preset"}
    preset = structure_or_problems(fields, ENGINE_PRESETS[name])
    return preset if isinstance(preset, EngineConfig) else preset.engine()


converter.register_structure_hook(EngineConfig, _engine)
converter.register_structure_hook(PriorityField, _priority)

# --------------------------------------------------------------------------- workload specs


def _is_scenario_data(data: Any) -> bool:
    """Whether *data* is a scenario rather than a bare workload spec: a mapping with
    ``serving`` or ``workload`` at the top."""
    return isinstance(data, Mapping) and ("serving" in data or "workload" in data)


@functools.cache
def _workload_fields_hook() -> Any:
    """The strict attrs hook of :class:`WorkloadConfig` itself (no ``file`` key), made on
    first use, once every hook its fields need is registered."""
    return attrs_hook_factory(WorkloadConfig)


@functools.cache
def _workload_types() -> dict[str, Any]:
    """The type of each key a workload may give."""
    hints = get_type_hints(WorkloadConfig)
    return {name: hints[name] for name in init_names(WorkloadConfig)}




def _workload_file(value: Mapping[str, Any], tolerate: Collection[str] = ()) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The workload file a ``{file: PATH, ...}`` mapping names (relative to the scenario's
    directory), its top-level keys each structured where the file lies (so its relative
    paths resolve against the file's directory) and given back as plain data, and its
    keys as written.

    Raises :class:`Problems` at ``file`` when the file cannot be used, and at the key
    path inside the workload (its message naming the file) for a bad key of the file,
    unless the key is in *tolerate* (replaced by the scenario: it is then left out of the
    structured keys).
    """
    text = value["file"]
    if not isinstance(text, str) or not text.strip():
        raise Problems([("file", f"must be the path of a workload spec file, got {reprlib.repr(text)}")])
    path = Path(resolve_path(text))
    try:
        data = read_yaml(path)
    except Unreadable as exc:
        raise Problems([("file", f"workload file {path}: {exc}")]) from None
    if data is None:
        raise Problems([("file", f"workload file {path} is empty: a workload spec is a mapping with clients, servegen_data or traces")])
    if not isinstance(data, Mapping):
        raise Problems([("file", f"workload file {path} must hold a mapping (a bare workload spec), got {type(data).__name__}")])
    if _is_scenario_data(data):
        raise Problems([("file", f"workload file {path} is a scenario (it has serving or workload at the top level), not a bare workload spec")])
    types = _workload_types()
    out: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    with base_dir(path.parent):
        for key, raw in data.items():
            if key in tolerate:
                try:
                    out[key] = unstructure(converter.structure(raw, types[key]))
                except Exception:  # noqa: BLE001, S112 - replaced by the scenario's own value
                    continue
            elif key not in types:
                problems.append((str(key), f"unknown key; allowed: {', '.join(types)} (workload file {path})"))
            else:
                try:
                    out[key] = unstructure(converter.structure(raw, types[key]))
                except Exception as exc:  # noqa: BLE001 - reported with its path
                    problems += [(p, f"{m} (workload file {path}, at {p})") for p, m in problems_of(exc, key)]
    if problems:
        raise Problems(problems)
    return path, out, dict(data)


def _workload(value: Any, t: Any) -> WorkloadConfig:
    """A workload: its own keys, or ``file: PATH`` (a bare workload spec) and keys that
    replace that file's top-level keys."""
    if not isinstance(value, Mapping) or "file" not in value:
        return _workload_fields_hook()(value, t)
    given = {k: v for k, v in value.items() if k != "file"}
    path, from_file, written = _workload_file(value, tolerate=set(given) & set(_workload_types()))
    try:
        return _workload_fields_hook()({**from_file, **given}, t)
    except Exception as exc:  # noqa: BLE001 - reported with its path, naming the file where the key came from it
        problems = []
        for p, m in problems_of(exc, ""):
            top = re.split(r"[.\[]", p, maxsplit=1)[0]
            same = top in given and any(top in d and given[top] == d[top] for d in (from_file, written))
            if top not in given or same:
                m = f"{m} (workload file {path}{', at ' + p if p else ''})"
            problems.append((p, m))
        raise Problems(problems) from None


converter.register_structure_hook(WorkloadConfig, _workload)


def scenario_from_dict(data: Any, source: str = "<dict>") -> Scenario:
    """Build a :class:`Scenario` from plain data (as YAML would give).

    Raises
    ------
    ScenarioError
        Listing every problem with its key path.

    Examples
    --------
    >>> scenario_from_dict({"workload": {}}, source="demo.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: demo.yaml: 2 problem(s) in scenario
      workload.clients: give clients, servegen_data or traces
      serving: required key is missing
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(source, [("", f"a scenario must be a mapping, got {type(data).__name__}")])
    import_plugins_of(data, source)
    try:
        return converter.structure(data, Scenario)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a ScenarioError
        raise ScenarioError(source, list(problems_of(exc, ""))) from None



def load_scenario(path: str | Path, overrides: Overrides | None = None) -> Scenario:
    """Read a scenario YAML file, apply *overrides*, validate.

    *overrides* is one ``"dotted.key=value"`` string, a list of them (values
    parsed as YAML), or a mapping ``{"dotted.key": value}`` (values taken as
    given); see :func:`apply_overrides`. Relative paths in the file and in the
    overrides are relative to the file's directory. The plugins the scenario
    names are imported before the rest is checked (:func:`load_plugins`).

    The workload may be a reference to a bare workload spec, ``workload: {file:
    PATH}`` (relative to the scenario file); keys beside ``file`` replace the
    file's top-level keys, and overrides of ``workload.*`` apply after the file
    is read (``workload.clients.0.rate_fraction=2`` reaches into the file's
    clients). Relative paths written in the workload file resolve against its
    own directory; those given beside ``file`` or in overrides against the
    scenario file's. A problem in a key read from the workload file names that
    file and the key path.

    Raises
    ------
    ScenarioError
        If the file is missing, empty, is not valid YAML, names a plugin that
        cannot be imported, or does not describe a valid scenario (a bare
        workload spec is not one: the error says so).
    """
    source = str(path)
    try:
        data = read_yaml(Path(path))
    except Unreadable as exc:
        raise ScenarioError(source, [("", str(exc))]) from None
    if data is None:  # nothing but whitespace and comments
        raise ScenarioError(source, [("", "empty file: a scenario must be a mapping with at least workload and serving")])
    if isinstance(data, Mapping) and not _is_scenario_data(data) and set(data) & (set(_workload_types()) - set(init_names(Scenario))):
        raise ScenarioError(
            source,
            [("", "this is a bare workload spec (no serving section): simpy-llm workload and simpy-llm observe take it "
                  "as it is (load_workload in Python); to simulate it, reference it from a scenario: workload: {file: PATH}")],
        )
    resolved = Path(path).resolve()
    with base_dir(resolved.parent):
        if overrides:
            data = _scenario_overrides(data, overrides, source)
        scenario = scenario_from_dict(data, source)
    object.__setattr__(scenario, "_loaded_from", str(resolved))  # where relative paths of a replace() resolve
    return scenario



def _scenario_overrides(data: Any, overrides: Overrides, source: str) -> Any:
    """*data* with *overrides* applied in order; before the first one that reaches into a
    workload given as ``{file: PATH}``, the file's keys are read into it (keeping ``file``),
    so ``workload.clients.0...`` finds the file's clients."""
    expanded = False
    for key, value in list(override_items(overrides, source)):
        if not expanded and key.startswith("workload.") and key != "workload.file":
            data, expanded = _with_workload_file_read(data), True
        data = apply_overrides(data, {key: value}, source)
    return data


def _with_workload_file_read(data: Any) -> Any:
    """*data* whose ``workload: {file: PATH, ...}`` also holds the file's keys (those given
    beside ``file`` kept); as it was when there is no such reference or the file cannot be
    used (structuring then reports why, at ``workload.file``)."""
    workload = data.get("workload") if isinstance(data, Mapping) else None
    if not isinstance(workload, Mapping) or "file" not in workload:
        return data
    try:
        _path, from_file, written = _workload_file(workload, tolerate=set(_workload_types()))
    except Problems:
        return data
    # A key whose value is bad in the file is read as written: the overrides may mend it.
    return {**data, "workload": {**{k: from_file.get(k, v) for k, v in written.items()}, **workload}}


def workload_from_dict(data: Any, source: str = "<dict>") -> WorkloadConfig:
    """Build a :class:`WorkloadConfig` from the plain data of a bare workload spec.

    Raises
    ------
    ScenarioError
        Listing every problem with its key path, relative to the workload (``what`` is
        ``"workload spec"``); for a scenario's data, saying so.

    Examples
    --------
    >>> workload_from_dict({"aggregate_rate": 5.0, "clients": []}, source="wl.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: wl.yaml: 1 problem(s) in workload spec
      clients: give clients, servegen_data or traces
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(source, [("", f"a workload spec must be a mapping, got {type(data).__name__}")], WORKLOAD_SPEC)
    if _is_scenario_data(data):
        raise ScenarioError(
            source,
            [("", "this is a scenario (it has serving or workload at the top level), not a bare workload spec: load it with load_scenario")],
            WORKLOAD_SPEC,
        )
    load_entry_point_plugins(source)
    try:
        return _workload_fields_hook()(data, WorkloadConfig)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a ScenarioError
        raise ScenarioError(source, list(problems_of(exc, "")), WORKLOAD_SPEC) from None


def load_workload(path: str | Path, overrides: Overrides | None = None) -> WorkloadConfig:
    """Read a bare workload spec file (a workload at the top level: ``version``, ``seed``,
    ``category``, ``aggregate_rate``, ``num_requests`` or ``horizon_s``, ``clients``,
    ``servegen_data``, ``traces``), apply *overrides*, validate.

    *overrides* take the forms of :func:`load_scenario`'s, with keys relative to the
    workload (``aggregate_rate=5``, ``clients.0.rate_fraction=2``); a leading
    ``workload.`` is dropped, so the keys a scenario takes work too. Relative paths
    in the file and in the overrides resolve against the file's directory. Without
    a ``seed`` the workload's random streams use seed 0 (in a scenario: the
    scenario's seed).

    Raises
    ------
    ScenarioError
        Naming the file and each problem's key path inside the workload; a scenario
        file is refused with a message saying so.

    Examples
    --------
    >>> wl = load_workload("scenarios/workloads/two_clients.yaml", ["aggregate_rate=50"])
    >>> wl.seed, wl.aggregate_rate, [c.id for c in wl.clients]
    (42, 50.0, ['high-volume-batch', 'realtime-chat'])
    """
    source = str(path)
    try:
        data = read_yaml(Path(path))
    except Unreadable as exc:
        raise ScenarioError(source, [("", str(exc))], WORKLOAD_SPEC) from None
    if data is None:
        raise ScenarioError(source, [("", "empty file: a workload spec must be a mapping with clients, servegen_data or traces")], WORKLOAD_SPEC)
    if overrides and not _is_scenario_data(data):
        try:
            data = apply_overrides(data, ordered_overrides(overrides, source, workload_keys=True), source)
        except ScenarioError as exc:
            raise ScenarioError(exc.source, exc.problems, WORKLOAD_SPEC) from None
    with base_dir(Path(path).resolve().parent):
        return workload_from_dict(data, source)


def load_workload_or_scenario(path: str | Path, overrides: Overrides | None = None) -> Scenario | WorkloadConfig:
    """Read *path* as a scenario (:func:`load_scenario`) if its top level is a mapping with
    ``serving`` or ``workload``, else as a bare workload spec (:func:`load_workload`);
    *overrides* as each of them takes them.

    >>> load_workload_or_scenario("scenarios/quickstart.yaml").name
    'quickstart'
    >>> load_workload_or_scenario("scenarios/workloads/two_clients.yaml").aggregate_rate
    100.0
    """
    try:
        data = read_yaml(Path(path))
    except Unreadable as exc:
        raise ScenarioError(str(path), [("", str(exc))], "scenario or workload spec") from None
    if _is_scenario_data(data):
        return load_scenario(path, overrides)
    return load_workload(path, overrides)


def override_spec(spec: Scenario | WorkloadConfig, overrides: Overrides) -> Scenario | WorkloadConfig:
    """*spec* with *overrides* applied (in any form :func:`load_scenario` takes), validated:
    a scenario through :meth:`Scenario.replace`, a bare workload spec with keys relative
    to it (a leading ``workload.`` dropped).

    >>> wl = load_workload("scenarios/workloads/two_clients.yaml")
    >>> override_spec(wl, ["workload.num_requests=10", "seed=3"]).num_requests, override_spec(wl, "seed=3").seed
    (10, 3)
    """
    if isinstance(spec, Scenario):
        return spec.replace(**ordered_overrides(overrides, "<overrides>"))
    if isinstance(spec, WorkloadConfig):
        changes = ordered_overrides(overrides, "<overrides>", workload_keys=True)
        return workload_from_dict(apply_overrides(workload_to_dict(spec), changes, "<overrides>"), "<overrides>")
    raise TypeError(f"expected a Scenario or a WorkloadConfig, got {type(spec).__name__}")


# --------------------------------------------------------------------------- plugins



@rebuild_with
def replace_scenario(scenario: Scenario, changes: dict[str, Any]) -> Scenario:
    """*scenario* with *changes* applied (dotted keys, values as given), loaded again from
    plain data so that every check runs: what :meth:`Scenario.replace <simpy_llm.config.schema.Scenario.replace>`
    does. Relative paths resolve against the directory of the file *scenario* came from."""
    loaded_from = scenario.loaded_from
    source = loaded_from or "<replace>"
    data = apply_overrides(scenario_to_dict(scenario), changes, source)
    if loaded_from is None:
        return scenario_from_dict(data, source)
    with base_dir(Path(loaded_from).parent):
        new = scenario_from_dict(data, source)
    object.__setattr__(new, "_loaded_from", loaded_from)
    return new


register_checks()  # last: each checked class's structuring, generated on first use, reads the hooks registered above
