"""Latency profiles: a latency model's coefficients in a file of their own.

A profile is YAML with at least a ``latency_model`` (what a scenario's
``serving.latency_model`` takes)::

    profile_version: 1
    latency_model: {kind: batch_table, params: {...}}
    server: {...}        # optional: the server it describes (a trace header's server block)
    fit: {...}           # optional: how it was made (``simpy-llm calibrate fit``)

A scenario names one in place of a latency model, ``latency_model: {profile:
path/to/profile.yaml}`` (relative to the scenario file); the loader reads the
file and uses its ``latency_model``, so the scenario's manifest and
``scenario_to_dict`` show the coefficients themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simpy_llm.config.errors import ScenarioError

__all__ = ["PROFILE_VERSION", "load_profile"]

PROFILE_VERSION = 1
"""The ``profile_version`` this project reads and writes."""


def load_profile(path: Path | str) -> dict[str, Any]:
    """The profile at *path* as plain data.

    Raises
    ------
    ScenarioError
        The file is missing, not YAML, has another ``profile_version``, or has no
        ``latency_model: {kind: NAME, params: {...}}``.
    """
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(source, [("", f"cannot read profile: {exc.strerror}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [("", f"not valid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise ScenarioError(source, [("", "a profile must be a mapping with latency_model")])
    version = data.get("profile_version", PROFILE_VERSION)
    if version != PROFILE_VERSION:
        raise ScenarioError(source, [("profile_version", f"must be {PROFILE_VERSION}, got {version!r}")])
    model = data.get("latency_model")
    if not isinstance(model, dict) or not isinstance(model.get("kind"), str):
        raise ScenarioError(source, [("latency_model", "required: {kind: NAME, params: {...}}")])
    return data
