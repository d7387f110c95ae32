"""Scenario configuration as data: the frozen config tree, each class checking its own values.

Loading a scenario (YAML, overrides, plugins, the checks across components) is
:mod:`simpy_llm.loading`'s, which sits above the components whose registries it looks
names up in; ``load_scenario`` and ``scenario_from_dict`` are also at the top level
(``from simpy_llm import load_scenario``).
"""

from typing import Any

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.planner import PlannerCandidates, PlannerConfig
from simpy_llm.config.schema import (
    ClientConfig,
    EngineConfig,
    PolicySpec,
    Scenario,
    ServingConfig,
    SimulationConfig,
    SLOTarget,
    WorkloadConfig,
)
from simpy_llm.config.structure import build_policy

__all__ = [
    "ClientConfig",
    "EngineConfig",
    "FieldValueError",
    "PlannerCandidates",
    "PlannerConfig",
    "PolicySpec",
    "SLOTarget",
    "Scenario",
    "ScenarioError",
    "ServingConfig",
    "SimulationConfig",
    "WorkloadConfig",
    "build_policy",
]

_MOVED = frozenset({
    "apply_overrides", "load_entry_point_plugins", "load_plugins", "load_scenario", "load_workload", "load_workload_or_scenario",
    "scenario_from_dict", "scenario_hash", "scenario_to_dict", "workload_from_dict", "workload_to_dict",
})


def __getattr__(name: str) -> Any:
    # Names this package exported before loading moved above the components: say where they are
    # (importing simpy_llm.loading from here would tie config to everything it loads).
    if name in _MOVED:
        raise AttributeError(f"simpy_llm.config.{name} is now simpy_llm.loading.{name} (loading sits above the components)")
    raise AttributeError(f"module 'simpy_llm.config' has no attribute {name!r}")
