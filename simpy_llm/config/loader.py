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

import copy
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import re
import reprlib
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, get_args, get_origin, get_type_hints

import attrs
import cattrs
import numpy as np
import yaml
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.paths import base_dir, resolve_path
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
    Probability,
    ProcessKindSpec,
    RouterSpec,
    Scenario,
    SchedulerSpec,
    WorkloadConfig,
    is_plugin_path,
)
from simpy_llm.config.speculation import GammaSpec, ModeSelectorSpec
from simpy_llm.registry import Registry

__all__ = [
    "PLUGIN_ENTRY_POINT_GROUP",
    "apply_overrides",
    "build_policy",
    "converter",
    "load_entry_point_plugins",
    "load_plugins",
    "load_scenario",
    "load_workload",
    "load_workload_or_scenario",
    "override_spec",
    "scenario_from_dict",
    "scenario_hash",
    "scenario_to_dict",
    "workload_from_dict",
    "workload_to_dict",
]


class _Problems(Exception):
    """Problems found inside a custom hook, with paths relative to the hooked value."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__(problems)
        self.problems = problems


converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
"""The converter every config goes through (strict: see the module docstring)."""


def _strict_int(value: Any, _t: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problems([("", f"must be an integer, got {value!r}")])
    return value


def _strict_float(value: Any, _t: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Problems([("", f"must be a number, got {value!r}")])
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise _Problems([("", f"must be a finite number, got {reprlib.repr(value)}")])
    return number


def _strict_str(value: Any, _t: Any) -> str:
    if not isinstance(value, str):
        raise _Problems([("", f"must be a string, got {value!r}")])
    return value


def _strict_bool(value: Any, _t: Any) -> bool:
    if not isinstance(value, bool):
        raise _Problems([("", f"must be true or false, got {value!r}")])
    return value


def _injected_only(_given: Any, t: Any) -> Any:
    raise _Problems([("", f"a {getattr(t, '__name__', t)} is provided by the simulation, not the scenario")])


def _probability(value: Any, _t: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return _strict_float(value, _t)


converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(Probability, _probability)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(bool, _strict_bool)


def _init_names(cls: type) -> list[str]:
    """The keys a scenario may give for attrs class *cls* (its ``__init__`` fields)."""
    return [a.name for a in attrs.fields(cls) if a.init]


def _attrs_hook_factory(cls: type) -> Any:
    """Structure an attrs class, first insisting on a mapping (so the error says what is allowed)."""
    inner = converter.gen_structure_attrs_fromdict(cls)
    keys = ", ".join(_init_names(cls)) or "none"

    def hook(value: Any, t: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Problems([("", f"must be a mapping with keys: {keys}; got {reprlib.repr(value)}")])
        return inner(value, t)

    return hook


def _is_homogeneous_tuple(t: Any) -> bool:
    args = get_args(t)
    return get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_hook_factory(t: Any) -> Any:
    """``tuple[X, ...]`` from a YAML list (not a string or a mapping), each item's problems at ``[i]``."""
    item_type = get_args(t)[0]

    def hook(value: Any, _t: Any) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise _Problems([("", f"must be a list of {_describe(item_type)}; got {reprlib.repr(value)}")])
        items, problems = [], []
        for i, item in enumerate(value):
            try:
                items.append(converter.structure(item, item_type))
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += _problems_of(exc, f"[{i}]")
        if problems:
            raise _Problems(problems)
        return tuple(items)

    return hook


def _dict_hook_factory(t: Any) -> Any:
    """``dict[K, V]`` from a YAML mapping, each value's problems under its key."""
    key_type, value_type = get_args(t) or (Any, Any)

    def hook(value: Any, _t: Any) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            raise _Problems([("", f"must be a mapping of names to {_describe(value_type)}; got {reprlib.repr(value)}")])
        out, problems = {}, []
        for k, v in value.items():
            try:
                key = converter.structure(k, key_type)
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += _problems_of(exc, f"[{k!r}]")
                continue
            try:
                out[key] = converter.structure(v, value_type)
            except Exception as exc:  # noqa: BLE001 - reported with its path
                problems += _problems_of(exc, str(k))
        if problems:
            raise _Problems(problems)
        return out

    return hook


def _describe(t: Any) -> str:
    if isinstance(t, type) and attrs.has(t):
        return f"mappings with keys: {', '.join(_init_names(t)) or 'none'}"
    return getattr(t, "__name__", str(t))


converter.register_structure_hook_factory(lambda t: isinstance(t, type) and attrs.has(t), _attrs_hook_factory)
converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook_factory)
converter.register_structure_hook_factory(lambda t: get_origin(t) is dict, _dict_hook_factory)
# Policies may declare an ``rng`` field; the simulation injects its stream.
converter.register_structure_hook(np.random.Generator, _injected_only)


def _problems_of(exc: BaseException, path: str) -> Iterator[tuple[str, str]]:
    """Flatten a (possibly nested) structuring error into (key path, message)."""

    def join(base: str, name: Any) -> str:
        name = str(name)
        if not name:
            return base
        if name.startswith("["):
            return base + name
        return f"{base}.{name}" if base else name

    if isinstance(exc, _Problems):
        for sub, msg in exc.problems:
            yield join(path, sub), msg
    elif isinstance(exc, FieldValueError):
        yield join(path, exc.field), exc.message
    elif isinstance(exc, ClassValidationError):
        with_notes, without = exc.group_exceptions()
        for sub_exc, note in with_notes:
            yield from _problems_of(sub_exc, join(path, note.name))
        for sub_exc in without:
            yield from _problems_of(sub_exc, path)
    elif isinstance(exc, IterableValidationError):
        with_notes, without = exc.group_exceptions()
        for sub_exc, note in with_notes:
            idx = note.index
            yield from _problems_of(sub_exc, join(path, idx) if isinstance(idx, str) else f"{path}[{idx}]")
        for sub_exc in without:
            yield from _problems_of(sub_exc, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        allowed = (", ".join(_init_names(exc.cl)) or "none") if attrs.has(exc.cl) else "?"
        for key in sorted(exc.extra_fields, key=str):
            yield join(path, str(key)), f"unknown key; allowed: {allowed}"
    elif isinstance(exc, KeyError):
        yield path, "required key is missing"
    elif isinstance(exc, BaseExceptionGroup):
        for sub_exc in exc.exceptions:
            yield from _problems_of(sub_exc, path)
    elif isinstance(exc, TypeError):
        yield path, f"wrong type: {exc}"
    else:
        yield path, str(exc)


def _structure_or_problems(value: Any, cls: type, prefix: str = "") -> Any:
    try:
        return converter.structure(value, cls)
    except Exception as exc:  # noqa: BLE001 - every structuring failure is reported
        raise _Problems(list(_problems_of(exc, prefix))) from None


def _require_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Problems([("", f"must be a mapping ({what}), got {value!r}")])
    return value


def _tagged(value: Any, registry: Registry[type], tag: str, flat: bool) -> Any:
    """Structure ``{tag: NAME, ...}`` into the class registered under NAME.

    With *flat* the class's fields sit beside the tag; otherwise under ``params``.
    A class with a ``from_params(fields)`` classmethod builds itself from them
    (its :class:`FieldValueError` is reported under ``params``).
    """
    value = _require_mapping(value, f"with key {tag!r}")
    if tag not in value:
        raise _Problems([(tag, f"required key is missing; one of: {', '.join(registry.names())}")])
    name = value[tag]
    if not isinstance(name, str) or name not in registry:
        raise _Problems([(tag, f"unknown {registry.what} {name!r}; one of: {', '.join(registry.names())}")])
    cls = registry.get(name)
    if flat:
        fields = {k: v for k, v in value.items() if k != tag}
        allowed = [tag, *(a.alias or a.name for a in attrs.fields(cls))] if attrs.has(cls) else [tag]
        extra = sorted(set(value) - set(allowed), key=str)
        if extra:
            raise _Problems([(str(extra[0]), f"unknown key for {tag} {name!r}; allowed: {', '.join(allowed)}")])
        prefix = ""
    else:
        extra = sorted(set(value) - {tag, "params"}, key=str)
        if extra:
            raise _Problems([(str(extra[0]), f"unknown key; allowed: {tag}, params")])
        params = value.get("params", {})
        if not isinstance(params, Mapping):
            raise _Problems([("params", f"must be a mapping (of parameters), got {reprlib.repr(params)}")])
        fields = dict(params)
        prefix = "params"
    if hasattr(cls, "from_params"):  # the class parses its own parameters (e.g. a PMF file)
        try:
            return cls.from_params(fields)
        except Exception as exc:  # noqa: BLE001 - reported with its path
            raise _Problems(list(_problems_of(exc, prefix))) from None
    try:
        return _structure_or_problems(_aliased(cls, fields), cls, prefix)
    except _Problems as exc:  # report attribute names under their YAML keys (mean_param -> mean)
        raise _Problems([_unaliased(cls, prefix, p, m) for p, m in exc.problems]) from None


def _aliased(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """Map YAML keys to attribute names where a field has an alias (``mean`` -> ``mean_param``)."""
    if not attrs.has(cls):
        return fields
    alias_to_name = {a.alias: a.name for a in attrs.fields(cls) if a.alias and a.alias != a.name}
    return {alias_to_name.get(k, k): v for k, v in fields.items()}


def _unaliased(cls: type, prefix: str, path: str, message: str) -> tuple[str, str]:
    """Rewrite attribute names that have a YAML alias back to the alias in a problem."""
    if not attrs.has(cls):
        return path, message
    for a in attrs.fields(cls):
        if a.alias and a.alias != a.name and a.init:
            head = f"{prefix}.{a.name}" if prefix else a.name
            if path == head or path.startswith((head + ".", head + "[")):
                path = (f"{prefix}.{a.alias}" if prefix else a.alias) + path[len(head):]
            message = re.sub(rf"\b{re.escape(a.name)}\b", a.alias, message)
    return path, message


def build_policy(spec: PolicySpec, registry: Registry[type], **inject: Any) -> Any:
    """Instantiate the implementation *spec* names.

    Uses the class's ``from_params(params)`` when it has one; otherwise
    structures ``params`` into an attrs class (strictly), or calls any other
    class (or function) with them as keyword arguments, checked against its
    signature first. Keyword arguments in *inject* are passed to classes that
    declare a field or constructor parameter of that name (e.g. ``rng``); YAML
    may not set them.

    Examples
    --------
    >>> class Threshold:  # a plain class: no attrs needed
    ...     def __init__(self, limit=10, rng=None):
    ...         self.limit, self.rng = limit, rng
    >>> thresholds = Registry("threshold")
    >>> _ = thresholds.register("threshold")(Threshold)
    >>> build_policy(PolicySpec(kind="threshold", params={"limit": 3}), thresholds, rng="stream").limit
    3
    >>> build_policy(PolicySpec(kind="threshold", params={"limt": 3}), thresholds, rng="stream")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.FieldValueError: limt: unknown parameter of Threshold; accepted: limit
    """
    cls = registry.get(spec.kind)
    if hasattr(cls, "from_params"):
        obj = cls.from_params(dict(spec.params))
    else:
        injected = set(inject)
        bad = sorted(injected & set(spec.params))
        if bad:
            raise FieldValueError(bad[0], "is set by the simulation, not the scenario")
        if not attrs.has(cls):
            return _call_with_params(cls, dict(spec.params), inject)
        obj = converter.structure(dict(spec.params), cls)
    if attrs.has(type(obj)):
        names = attrs.fields_dict(type(obj))
        wanted = {k: v for k, v in inject.items() if k in names}
        if wanted:
            obj = attrs.evolve(obj, **wanted)
    return obj


def _call_with_params(cls: Any, params: dict[str, Any], inject: Mapping[str, Any]) -> Any:
    """``cls(**params)`` for a class that is not an attrs class, its keywords checked first.

    Unknown keywords and missing required ones raise :class:`FieldValueError` naming
    the key; injected values go only to parameters that ask for them by name.
    """
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check against (a builtin): let the call decide
        signature = None
    kwargs = dict(params)
    if signature is not None:
        named = {
            name: p
            for name, p in signature.parameters.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        settable = [name for name in named if name not in inject]
        for key in params:
            if key not in named and not any_keyword:
                what = getattr(cls, "__name__", repr(cls))
                raise FieldValueError(key, f"unknown parameter of {what}; accepted: {', '.join(settable) or 'none'}")
        for name, p in named.items():
            if p.default is inspect.Parameter.empty and name not in params and name not in inject:
                raise FieldValueError(name, "required parameter is missing")
        kwargs.update({k: v for k, v in inject.items() if k in named})
    try:
        return cls(**kwargs)
    except FieldValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the constructor's own complaint, reported under params
        what = getattr(cls, "__name__", repr(cls))
        raise ValueError(f"{what}({', '.join(sorted(params))}) raised {type(exc).__name__}: {exc}") from exc


def _placeholders(names: tuple[str, ...]) -> dict[str, Any]:
    """Stand-ins for the values the simulation injects, so a policy can be built to check its params."""
    # A process function given None for env and ports only makes its generator, which never runs.
    known: dict[str, Any] = {"rng": np.random.default_rng(0), "slo": {}, "env": None, "ports": None}
    return {name: known[name] for name in names if name in known}


def _policy_hook(registry_getter: Any, injected: tuple[str, ...] = ()) -> Any:
    """Hook for a :class:`PolicySpec`; *injected* names the fields the simulation sets."""

    def hook(value: Any, _t: Any) -> PolicySpec:
        value = _require_mapping(value, "with keys kind and params")
        extra = sorted(set(value) - {"kind", "params"}, key=str)
        if extra:
            raise _Problems([(str(extra[0]), "unknown key; allowed: kind, params")])
        registry = registry_getter()
        kind = value.get("kind")
        if kind is None:
            raise _Problems([("kind", f"required key is missing; one of: {', '.join(registry.names())}")])
        if not isinstance(kind, str) or kind not in registry:
            raise _Problems([("kind", f"unknown {registry.what} {kind!r}; one of: {', '.join(registry.names())}")])
        params = value.get("params") or {}
        if not isinstance(params, Mapping):
            raise _Problems([("params", f"must be a mapping (of parameters), got {reprlib.repr(params)}")])
        params = dict(params)
        odd = sorted((k for k in params if not isinstance(k, str)), key=str)
        if odd:
            raise _Problems([(f"params.{odd[0]}", "unknown key; parameter names are strings")])
        bad = sorted((k for k in params if k in injected), key=str)
        if bad:
            raise _Problems([(f"params.{bad[0]}", "is set by the simulation, not the scenario")])
        spec = PolicySpec(kind=kind, params=params)
        try:
            built = build_policy(spec, registry, **_placeholders(injected))
        except Exception as exc:  # noqa: BLE001 - reported with its path
            raise _Problems(list(_problems_of(exc, "params"))) from None
        resolved = _resolved_paths(built, params)
        return PolicySpec(kind=kind, params={**params, **resolved}) if resolved else spec

    return hook


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


def _arrivals() -> Registry[type]:
    from simpy_llm.workload import servegen  # noqa: F401 - registers servegen_windows
    from simpy_llm.workload.arrivals import arrival_processes

    return arrival_processes


def _lengths() -> Registry[type]:
    from simpy_llm.workload.distributions import length_distributions

    return length_distributions


def _routers() -> Registry[type]:
    from simpy_llm.policies.routing import routing_policies

    return routing_policies


def _latencies() -> Registry[type]:
    from simpy_llm.serving.latency import latency_models

    return latency_models


def _batch_services() -> Registry[type]:
    from simpy_llm.serving.batching import batch_service_models

    return batch_service_models


def _bin_selectors() -> Registry[type]:
    from simpy_llm.policies.batching import bin_selectors

    return bin_selectors


def _schedulers() -> Registry[type]:
    from simpy_llm.policies.scheduling import scheduler_policies

    return scheduler_policies


def _admissions() -> Registry[type]:
    from simpy_llm.policies.admission import admission_policies

    return admission_policies


def _gammas() -> Registry[type]:
    from simpy_llm.policies.gamma import gamma_policies

    return gamma_policies


def _process_kinds() -> Registry[Any]:
    from simpy_llm.processes import process_kinds

    return process_kinds


def _mode_selectors() -> Registry[type]:
    from simpy_llm.policies.mode import mode_selectors

    return mode_selectors


def _arrival(value: Any, _t: Any) -> Any:
    """An arrival process; naming a length distribution as the process points to ``distribution``."""
    try:
        return _tagged(value, _arrivals(), "process", flat=True)
    except _Problems as exc:
        name = value.get("process") if isinstance(value, Mapping) else None
        if not (isinstance(name, str) and name not in _arrivals() and name in _lengths()):
            raise
        hint = f"; for gaps drawn from the {name} distribution write {{process: distribution, gaps: {{type: {name}, params: {{...}}}}}}"
        raise _Problems([(p, m + hint if p == "process" else m) for p, m in exc.problems]) from None


def _priority(value: Any, _t: Any) -> Any:
    """An integer priority, or a length distribution ``{type: NAME, params: {...}}`` drawn per request."""
    if isinstance(value, Mapping):
        return _tagged(value, _lengths(), "type", flat=False)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problems([("", f"must be an integer or a length distribution {{type: NAME, params: {{...}}}}, got {reprlib.repr(value)}")])
    return value


def _kv_blocks(value: Any, _t: Any) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problems([("", f"must be a number of blocks or auto, got {reprlib.repr(value)}")])
    if value < 1:
        raise _Problems([("", f"must be >= 1, got {value!r}")])
    return value


converter.register_structure_hook(ArrivalField, _arrival)
converter.register_structure_hook(LengthField, lambda v, _t: _tagged(v, _lengths(), "type", flat=False))
converter.register_structure_hook(RouterSpec, _policy_hook(_routers, injected=("rng",)))
_latency_spec = _policy_hook(_latencies, injected=("rng",))


def _latency(value: Any, t: Any) -> PolicySpec:
    """A latency model: ``{kind, params}`` (with ``fitted_ranges``: a :class:`FittedLatencySpec`),
    or ``{profile: FILE}`` naming a latency profile (:mod:`simpy_llm.config.profile`; relative
    to the scenario file) whose model, and the ranges it was fitted on, are used."""
    if isinstance(value, Mapping) and "profile" in value:
        extra = sorted(set(value) - {"profile"}, key=str)
        if extra:
            raise _Problems([(str(extra[0]), "unknown key beside profile; give either profile or kind and params")])
        path = value["profile"]
        if not isinstance(path, str) or not path:
            raise _Problems([("profile", f"must be the path of a profile file, got {reprlib.repr(path)}")])
        try:
            profile = load_profile(resolve_path(path))
        except ScenarioError as exc:
            raise _Problems([("profile", f"{exc.source}: {msg if not where else where + ': ' + msg}") for where, msg in exc.problems]) from None
        try:
            return _latency(profile_latency_model(profile), t)
        except _Problems as exc:
            raise _Problems([("profile", f"{path}: latency_model.{where}: {msg}") for where, msg in exc.problems]) from None
    if isinstance(value, Mapping):
        extra = sorted(set(value) - {"kind", "params", "fitted_ranges"}, key=str)
        if extra:
            raise _Problems([(str(extra[0]), "unknown key; allowed: kind, params, fitted_ranges (or profile alone)")])
    if isinstance(value, Mapping) and "fitted_ranges" in value:
        ranges, problems = check_ranges(value["fitted_ranges"])
        if problems:
            raise _Problems([(f"fitted_ranges.{where}" if where else "fitted_ranges", msg) for where, msg in problems])
        spec = _latency_spec({k: v for k, v in value.items() if k != "fitted_ranges"}, t)
        return FittedLatencySpec(kind=spec.kind, params=spec.params, fitted_ranges=ranges)
    return _latency_spec(value, t)


converter.register_structure_hook(LatencySpec, _latency)
converter.register_structure_hook(SchedulerSpec, _policy_hook(_schedulers, injected=("slo",)))
converter.register_structure_hook(AdmissionSpec, _policy_hook(_admissions, injected=("slo", "rng")))
converter.register_structure_hook(ProcessKindSpec, _policy_hook(_process_kinds, injected=("env", "ports")))
converter.register_structure_hook(BatchServiceSpec, _policy_hook(_batch_services, injected=("rng", "latency")))
converter.register_structure_hook(BinSelectorSpec, _policy_hook(_bin_selectors))
converter.register_structure_hook(KvBlocks, _kv_blocks)
converter.register_structure_hook(GammaSpec, _policy_hook(_gammas))
converter.register_structure_hook(ModeSelectorSpec, _policy_hook(_mode_selectors))
_engine_fields = _attrs_hook_factory(EngineConfig)


def _engine(value: Any, t: Any) -> EngineConfig:
    """An engine: its own keys, or ``preset: NAME`` and that preset's keys (``ENGINE_PRESETS``)."""
    if not isinstance(value, Mapping) or "preset" not in value:
        return _engine_fields(value, t)
    name = value["preset"]
    if not isinstance(name, str) or name not in ENGINE_PRESETS:
        raise _Problems([("preset", f"unknown engine preset {reprlib.repr(name)}; one of: {', '.join(ENGINE_PRESETS)}")])
    fields = {k: v for k, v in value.items() if k != "preset"}
    preset = _structure_or_problems(fields, ENGINE_PRESETS[name])
    return preset if isinstance(preset, EngineConfig) else preset.engine()


converter.register_structure_hook(EngineConfig, _engine)
converter.register_structure_hook(PriorityField, _priority)

# --------------------------------------------------------------------------- workload specs

WORKLOAD_SPEC = "workload spec"
"""What a :class:`ScenarioError` about a bare workload spec says the file holds."""


def _is_scenario_data(data: Any) -> bool:
    """Whether *data* is a scenario rather than a bare workload spec: a mapping with
    ``serving`` or ``workload`` at the top."""
    return isinstance(data, Mapping) and ("serving" in data or "workload" in data)


@functools.cache
def _workload_fields_hook() -> Any:
    """The strict attrs hook of :class:`WorkloadConfig` itself (no ``file`` key), made on
    first use, once every hook its fields need is registered."""
    return _attrs_hook_factory(WorkloadConfig)


@functools.cache
def _workload_types() -> dict[str, Any]:
    """The type of each key a workload may give."""
    hints = get_type_hints(WorkloadConfig)
    return {name: hints[name] for name in _init_names(WorkloadConfig)}


class _Unreadable(Exception):
    """A YAML file that cannot be read or parsed (the message says why)."""


def _read_yaml(path: Path, what: str = "file") -> Any:
    """The data in the YAML file *path* (None when it holds only whitespace and comments)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _Unreadable(f"cannot read {what}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _Unreadable(f"not valid YAML: {where}{getattr(exc, 'problem', exc)}") from None


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The data in the YAML file *path*, a *what* (``"device profile"``) for messages.

    Raises
    ------
    ScenarioError
        Naming the file when it cannot be read or is not YAML (with the line and column).
    """
    try:
        return _read_yaml(Path(path), what)
    except _Unreadable as exc:
        raise ScenarioError(str(path), [("", str(exc))], what) from None


def _workload_file(value: Mapping[str, Any], tolerate: Collection[str] = ()) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The workload file a ``{file: PATH, ...}`` mapping names (relative to the scenario's
    directory), its top-level keys each structured where the file lies (so its relative
    paths resolve against the file's directory) and given back as plain data, and its
    keys as written.

    Raises :class:`_Problems` at ``file`` when the file cannot be used, and at the key
    path inside the workload (its message naming the file) for a bad key of the file,
    unless the key is in *tolerate* (replaced by the scenario: it is then left out of the
    structured keys).
    """
    text = value["file"]
    if not isinstance(text, str) or not text.strip():
        raise _Problems([("file", f"must be the path of a workload spec file, got {reprlib.repr(text)}")])
    path = Path(resolve_path(text))
    try:
        data = _read_yaml(path)
    except _Unreadable as exc:
        raise _Problems([("file", f"workload file {path}: {exc}")]) from None
    if data is None:
        raise _Problems([("file", f"workload file {path} is empty: a workload spec is a mapping with clients, servegen_data or traces")])
    if not isinstance(data, Mapping):
        raise _Problems([("file", f"workload file {path} must hold a mapping (a bare workload spec), got {type(data).__name__}")])
    if _is_scenario_data(data):
        raise _Problems([("file", f"workload file {path} is a scenario (it has serving or workload at the top level), not a bare workload spec")])
    types = _workload_types()
    out: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    with base_dir(path.parent):
        for key, raw in data.items():
            if key in tolerate:
                try:
                    out[key] = _unstructure(converter.structure(raw, types[key]))
                except Exception:  # noqa: BLE001, S112 - replaced by the scenario's own value
                    continue
            elif key not in types:
                problems.append((str(key), f"unknown key; allowed: {', '.join(types)} (workload file {path})"))
            else:
                try:
                    out[key] = _unstructure(converter.structure(raw, types[key]))
                except Exception as exc:  # noqa: BLE001 - reported with its path
                    problems += [(p, f"{m} (workload file {path}, at {p})") for p, m in _problems_of(exc, key)]
    if problems:
        raise _Problems(problems)
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
        for p, m in _problems_of(exc, ""):
            top = re.split(r"[.\[]", p, maxsplit=1)[0]
            same = top in given and any(top in d and given[top] == d[top] for d in (from_file, written))
            if top not in given or same:
                m = f"{m} (workload file {path}{', at ' + p if p else ''})"
            problems.append((p, m))
        raise _Problems(problems) from None


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
    _import_plugins_of(data, source)
    try:
        return converter.structure(data, Scenario)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a ScenarioError
        raise ScenarioError(source, list(_problems_of(exc, ""))) from None


Overrides = str | Sequence[str] | Mapping[str, Any]
"""``"dotted.key=value"``, a list of them, or a mapping ``{"dotted.key": value}``."""


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
        data = _read_yaml(Path(path))
    except _Unreadable as exc:
        raise ScenarioError(source, [("", str(exc))]) from None
    if data is None:  # nothing but whitespace and comments
        raise ScenarioError(source, [("", "empty file: a scenario must be a mapping with at least workload and serving")])
    if isinstance(data, Mapping) and not _is_scenario_data(data) and set(data) & (set(_workload_types()) - set(_init_names(Scenario))):
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


def apply_overrides(data: Any, overrides: Overrides, source: str = "<overrides>") -> Any:
    """Return a copy of *data* with each override set.

    *overrides* is one ``"dotted.key=value"`` string or a list of them (each value
    parsed as YAML), or a mapping ``{"dotted.key": value}`` whose values are set
    as given (not parsed). List items are addressed by index:
    ``workload.clients.0.rate_fraction=2``.

    >>> apply_overrides({"a": {"b": 1}}, ["a.b=2.5", "seed=7"])
    {'a': {'b': 2.5}, 'seed': 7}
    >>> apply_overrides({"a": {"b": 1}}, "a.b=yes")
    {'a': {'b': True}}
    >>> apply_overrides({"a": {"b": 1}}, {"a.b": "yes", "a.c": [1, 2]})
    {'a': {'b': 'yes', 'c': [1, 2]}}
    """
    # A plain copy, not deepcopy: a YAML alias (``*name``) loads as one object shared by
    # every place that names it, and deepcopy would keep it shared, so an override of one
    # place would change the others.
    data = _unshared(data) if data is not None else {}
    for key, value in _override_items(overrides, source):
        node = data
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ScenarioError(source, [(where, f"no list item {part!r} (the list has {len(node)})")])
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ScenarioError(source, [(where, "cannot set a key inside a non-mapping value")])
    return data


def _unshared(value: Any) -> Any:
    """A copy of nested dicts and lists in which no container appears twice."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return copy.deepcopy(value)


def _override_items(overrides: Overrides, source: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` pairs of any accepted form of *overrides*."""
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            if not isinstance(key, str) or not key:
                raise ScenarioError(source, [("", f"override key {key!r} must be a dotted.key string")])
            yield key, copy.deepcopy(value)  # later changes to the caller's value must not reach the data
        return
    if isinstance(overrides, str):
        overrides = [overrides]
    elif not isinstance(overrides, Sequence):
        raise ScenarioError(
            source, [("", f"overrides must be a 'dotted.key=value' string, a list of them or a mapping, got {type(overrides).__name__}")]
        )
    for item in overrides:
        if not isinstance(item, str):
            raise ScenarioError(source, [("", f"override {item!r} must be a 'dotted.key=value' string")])
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ScenarioError(source, [("", f"override {item!r} must look like dotted.key=value")])
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ScenarioError(source, [(key, f"override value {raw!r} is not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
        yield key, value


def _scenario_overrides(data: Any, overrides: Overrides, source: str) -> Any:
    """*data* with *overrides* applied in order; before the first one that reaches into a
    workload given as ``{file: PATH}``, the file's keys are read into it (keeping ``file``),
    so ``workload.clients.0...`` finds the file's clients."""
    expanded = False
    for key, value in list(_override_items(overrides, source)):
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
    except _Problems:
        return data
    # A key whose value is bad in the file is read as written: the overrides may mend it.
    return {**data, "workload": {**{k: from_file.get(k, v) for k, v in written.items()}, **workload}}


def _ordered_overrides(overrides: Overrides, source: str, *, workload_keys: bool = False) -> dict[str, Any]:
    """*overrides* as one mapping applied in the order given (a key given again moves to its
    last place, with its last value). With *workload_keys* (a bare workload spec) the keys
    are relative to the workload: a leading ``workload.`` is dropped, so one command line
    serves a scenario and a bare spec."""
    out: dict[str, Any] = {}
    for key, value in _override_items(overrides, source):
        if workload_keys:
            key = key.removeprefix("workload.") or key
        out.pop(key, None)
        out[key] = value
    return out


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
        raise ScenarioError(source, list(_problems_of(exc, "")), WORKLOAD_SPEC) from None


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
        data = _read_yaml(Path(path))
    except _Unreadable as exc:
        raise ScenarioError(source, [("", str(exc))], WORKLOAD_SPEC) from None
    if data is None:
        raise ScenarioError(source, [("", "empty file: a workload spec must be a mapping with clients, servegen_data or traces")], WORKLOAD_SPEC)
    if overrides and not _is_scenario_data(data):
        try:
            data = apply_overrides(data, _ordered_overrides(overrides, source, workload_keys=True), source)
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
        data = _read_yaml(Path(path))
    except _Unreadable as exc:
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
        return spec.replace(**_ordered_overrides(overrides, "<overrides>"))
    if isinstance(spec, WorkloadConfig):
        changes = _ordered_overrides(overrides, "<overrides>", workload_keys=True)
        return workload_from_dict(apply_overrides(workload_to_dict(spec), changes, "<overrides>"), "<overrides>")
    raise TypeError(f"expected a Scenario or a WorkloadConfig, got {type(spec).__name__}")


# --------------------------------------------------------------------------- plugins

PLUGIN_ENTRY_POINT_GROUP = "simpy_llm.plugins"
"""Entry-point group whose members are imported once, before the first scenario is loaded."""

_entry_points_loaded = False


def load_plugins(plugins: Sequence[str], source: str = "<plugins>", key: str = "plugins") -> list[ModuleType]:
    """Import each plugin so that the names it registers are known.

    A plugin is a module name (``my_package.policies``, found on ``sys.path``) or
    a Python file (``my_policies.py`` or any path with a ``/``): relative to the
    scenario file's directory while a scenario is loaded, else to the current
    directory. Each module or file is imported once per process; importing it
    again returns the module already imported.

    Raises
    ------
    ScenarioError
        Naming ``<key>[i]``, the plugin and the import error, for every plugin
        that cannot be imported.

    Examples
    --------
    >>> [m.__name__ for m in load_plugins(["json", "collections.abc"])]
    ['json', 'collections.abc']
    >>> load_plugins(["no_such_module_here"], source="demo.yaml")
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: demo.yaml: 1 problem(s) in scenario
      plugins[0]: cannot import plugin 'no_such_module_here': ModuleNotFoundError: ...
    """
    modules, problems = [], []
    for i, plugin in enumerate(plugins):
        where = f"{key}[{i}]"
        if not isinstance(plugin, str) or not plugin.strip():
            problems.append((where, f"must be a module name or a Python file, got {plugin!r}"))
            continue
        try:
            modules.append(_import_file(plugin) if is_plugin_path(plugin) else importlib.import_module(plugin))
        except _PluginFileMissing as exc:
            problems.append((where, f"cannot import plugin {plugin!r}: no such file: {exc}"))
        except Exception as exc:  # noqa: BLE001 - any failure of the plugin's own code is reported
            hint = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == plugin.split(".")[0]:
                hint = " (not on sys.path; for a file, give its path, e.g. my_policies.py)"
            problems.append((where, f"cannot import plugin {plugin!r}: {type(exc).__name__}: {exc}{hint}"))
    if problems:
        raise ScenarioError(source, problems)
    return modules


class _PluginFileMissing(Exception):
    """A plugin path that names no file."""


def _import_file(path_text: str) -> ModuleType:
    """Import a Python file as a module named after its absolute path (once per process)."""
    path = Path(resolve_path(path_text)).resolve()
    if not path.is_file():
        raise _PluginFileMissing(str(path))
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_simpy_llm_plugin_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does (attrs and dataclasses look it up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_entry_point_plugins(source: str = "<plugins>") -> None:
    """Import the plugins installed under the ``simpy_llm.plugins`` entry-point group.

    Runs once per process: later calls return at once. A package declares its
    plugin module in its ``pyproject.toml``::

        [project.entry-points."simpy_llm.plugins"]
        my_policies = "my_package.policies"

    Raises
    ------
    ScenarioError
        Naming each entry point that cannot be loaded and why (the next call tries again).
    """
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    problems = []
    for entry_point in importlib.metadata.entry_points(group=PLUGIN_ENTRY_POINT_GROUP):
        try:
            entry_point.load()
        except Exception as exc:  # noqa: BLE001 - an installed plugin's failure is reported
            problems.append(
                ("", f"cannot load plugin {entry_point.name!r} = {entry_point.value!r} "
                     f"(entry point group {PLUGIN_ENTRY_POINT_GROUP}): {type(exc).__name__}: {exc}")
            )
    if problems:
        raise ScenarioError(source, problems)
    _entry_points_loaded = True


def _import_plugins_of(data: Mapping[str, Any], source: str) -> None:
    """Import the installed plugins and those *data* names, before its policies are looked up."""
    load_entry_point_plugins(source)
    plugins = data.get("plugins")
    # a malformed list is left to the structuring, which reports it at its key path
    if isinstance(plugins, (list, tuple)) and all(isinstance(p, str) for p in plugins):
        load_plugins(plugins, source)


def _unstructure(obj: Any) -> Any:
    """Plain data that structures back into *obj*."""
    if attrs.has(type(obj)):
        out = {}
        for a in attrs.fields(type(obj)):
            if not a.init:  # not something a scenario can give (e.g. where it was loaded from)
                continue
            v = getattr(obj, a.name)
            out[a.alias if a.alias and a.alias != a.name and not a.name.startswith("_") else a.name] = _unstructure(v)
        tag = _tag_of(obj)
        if "type" in tag:  # length distributions nest their fields under params
            return {**tag, "params": out}
        return {**tag, **out} if tag else out
    if isinstance(obj, (list, tuple)):
        return [_unstructure(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _unstructure(v) for k, v in obj.items()}
    return obj


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain-data form of a scenario (as written in a manifest). A workload read from a
    file (``workload: {file: PATH}``) is given inline, its paths absolute."""
    return _unstructure(scenario)


def workload_to_dict(workload: WorkloadConfig) -> dict[str, Any]:
    """Plain-data form of a workload: a bare workload spec (:func:`workload_from_dict`
    gives back an equal workload).

    >>> wl = load_workload("scenarios/workloads/two_clients.yaml")
    >>> workload_from_dict(workload_to_dict(wl)) == wl
    True
    """
    return _unstructure(workload)


def _tag_of(obj: Any) -> dict[str, str]:
    for registry, tag in ((_arrivals(), "process"), (_lengths(), "type")):
        for name in registry.names():
            if registry.get(name) is type(obj):
                return {tag: name}
    return {}


def scenario_hash(scenario: Scenario) -> str:
    """SHA-256 of the scenario's canonical JSON form (stable across runs and machines)."""
    blob = json.dumps(scenario_to_dict(scenario), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()

