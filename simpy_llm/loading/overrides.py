"""Overrides: ``dotted.key=value`` changes applied to a scenario's (or a workload spec's)
plain data before it is structured."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

from simpy_llm.config.errors import ScenarioError

__all__ = ["Overrides", "apply_overrides", "ordered_overrides", "override_items"]

Overrides = str | Sequence[str] | Mapping[str, Any]
"""``"dotted.key=value"``, a list of them, or a mapping ``{"dotted.key": value}``."""


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
    for key, value in override_items(overrides, source):
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


def override_items(overrides: Overrides, source: str) -> Iterator[tuple[str, Any]]:
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


def ordered_overrides(overrides: Overrides, source: str, *, workload_keys: bool = False) -> dict[str, Any]:
    """*overrides* as one mapping applied in the order given (a key given again moves to its
    last place, with its last value). With *workload_keys* (a bare workload spec) the keys
    are relative to the workload: a leading ``workload.`` is dropped, so one command line
    serves a scenario and a bare spec."""
    out: dict[str, Any] = {}
    for key, value in override_items(overrides, source):
        if workload_keys:
            key = key.removeprefix("workload.") or key
        out.pop(key, None)
        out[key] = value
    return out

