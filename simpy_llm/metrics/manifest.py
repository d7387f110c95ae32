"""The data files a scenario reads, with their hashes, for a run's manifest (seed 003 §5.6).

A run is reproducible when its seed, its scenario and every file that scenario
reads are pinned; :func:`input_files` lists the last: latency tables (LUTs),
acceptance curves, device profiles, traces and profiles, each with its SHA-256,
so a changed curve or table shows in the manifest even under the same name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simpy_llm.config.plain import scenario_to_dict
from simpy_llm.serving.profiles import profiles_dir, profiles_path

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario

__all__ = ["input_files"]


_CURVES_BY_NAME = ("acceptance_by_target",)
"""Keys whose mapping values are acceptance curves, named by the mapping's keys."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _named_file(key: str, value: str) -> Path | None:
    """The file a shipped name stands for under *key* (an acceptance curve, a device profile)."""
    if key in ("acceptance",):
        from simpy_llm.speculative.curves import acceptance_model  # only speculative scenarios name curves

        try:
            return Path(acceptance_model(value).path)
        except Exception:  # noqa: BLE001 - not a curve name: not an input file
            return None
    if key == "device":

        candidate = profiles_path() / f"{value}.yaml"
        return candidate if candidate.is_file() else None
    return None


def _display(path: Path) -> str:
    """A shipped file relative to the folder holding ``profiles/``; any other as given."""

    root = profiles_dir().resolve().parent
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def input_files(scenario: Scenario) -> dict[str, dict[str, str]]:
    """``{key path: {"path": file, "sha256": digest}}`` for every file the scenario names.

    Examples
    --------
    >>> from simpy_llm import load_scenario
    >>> files = input_files(load_scenario("scenarios/heterogeneous_fleet.yaml"))
    >>> sorted(files)[:1], len(next(iter(files.values()))["sha256"])
    (['serving.replica_groups[0].device'], 64)
    """

    found: dict[str, dict[str, str]] = {}

    def walk(value: Any, path: str, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                # A mapping of targets to curves (acceptance_by_target) holds curve names under target names.
                walk(v, f"{path}.{k}" if path else str(k), "acceptance" if key in _CURVES_BY_NAME else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]", key)
        elif isinstance(value, str) and value:
            file = Path(value) if ("/" in value or "\\" in value) and Path(value).is_file() else _named_file(key, value)
            if file is not None and file.is_file():
                found[path] = {"path": _display(file), "sha256": _sha256(file)}

    walk(scenario_to_dict(scenario), "", "")
    return dict(sorted(found.items()))
