"""The plain-data form of a config (as a manifest or a trace header records it), and its hash.

A class registered in a tagged registry (an arrival process under ``process``, a length
distribution under ``type``) is written with its tag: the modules that own those registries
declare them with :func:`tag_registry`, so this module, below them, knows none by name.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs

from simpy_llm.config.schema import Scenario, WorkloadConfig
from simpy_llm.registry import Registry

__all__ = ["scenario_hash", "scenario_to_dict", "tag_registry", "unstructure", "workload_to_dict"]

TAGGED: list[tuple[Registry[Any], str]] = []
"""The registries whose members are written with a tag key, and the key."""


def tag_registry(registry: Registry[Any], tag: str) -> None:
    """Write the members of *registry* with ``{tag: name, ...}`` in plain data."""
    if (registry, tag) not in TAGGED:
        TAGGED.append((registry, tag))


def unstructure(obj: Any) -> Any:
    """Plain data that structures back into *obj*."""
    if attrs.has(type(obj)):
        out = {}
        for a in attrs.fields(type(obj)):
            if not a.init:  # not something a scenario can give (e.g. where it was loaded from)
                continue
            v = getattr(obj, a.name)
            out[a.alias if a.alias and a.alias != a.name and not a.name.startswith("_") else a.name] = unstructure(v)
        tag = _tag_of(obj)
        if "type" in tag:  # length distributions nest their fields under params
            return {**tag, "params": out}
        return {**tag, **out} if tag else out
    if isinstance(obj, (list, tuple)):
        return [unstructure(v) for v in obj]
    if isinstance(obj, dict):
        return {k: unstructure(v) for k, v in obj.items()}
    return obj


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain-data form of a scenario (as written in a manifest). A workload read from a
    file (``workload: {file: PATH}``) is given inline, its paths absolute."""
    return unstructure(scenario)


def workload_to_dict(workload: WorkloadConfig) -> dict[str, Any]:
    """Plain-data form of a workload: a bare workload spec (:func:`~simpy_llm.loading.workload_from_dict`
    gives back an equal workload).

    >>> from simpy_llm.loading import load_workload, workload_from_dict
    >>> wl = load_workload("scenarios/workloads/two_clients.yaml")
    >>> workload_from_dict(workload_to_dict(wl)) == wl
    True
    """
    return unstructure(workload)


def _tag_of(obj: Any) -> dict[str, str]:
    for registry, tag in TAGGED:
        for name in registry.names():
            if registry.get(name) is type(obj):
                return {tag: name}
    return {}


def scenario_hash(scenario: Scenario) -> str:
    """SHA-256 of the scenario's canonical JSON form (stable across runs and machines)."""
    blob = json.dumps(scenario_to_dict(scenario), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()

