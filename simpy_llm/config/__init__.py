"""Scenario configuration: the frozen config tree and its strict YAML loader (scenarios and bare workload specs)."""

from simpy_llm.config.errors import FieldValueError, ScenarioError
from simpy_llm.config.loader import (
    apply_overrides,
    build_policy,
    load_entry_point_plugins,
    load_plugins,
    load_scenario,
    load_workload,
    load_workload_or_scenario,
    scenario_from_dict,
    scenario_hash,
    scenario_to_dict,
    workload_from_dict,
    workload_to_dict,
)
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
    "apply_overrides",
    "build_policy",
    "load_entry_point_plugins",
    "load_plugins",
    "load_scenario",
    "load_workload",
    "load_workload_or_scenario",
    "scenario_from_dict",
    "scenario_hash",
    "scenario_to_dict",
    "workload_from_dict",
    "workload_to_dict",
]
