"""Loading scenarios: YAML (or plain data) -> a checked :class:`~simpy_llm.config.schema.Scenario`.

The build step above the components: the config classes (:mod:`simpy_llm.config`) are data
that check their own values; loading looks the names a scenario gives up in the registries
the components fill (routers, schedulers, latency models, arrival processes...), runs the
checks across components (:mod:`simpy_llm.loading.checks`), applies overrides and imports
plugins. ``simpy-llm validate`` and every command that reads a scenario go through it.
"""

from simpy_llm.config.plain import scenario_hash, scenario_to_dict, workload_to_dict
from simpy_llm.config.structure import build_policy
from simpy_llm.loading.checks import check_config
from simpy_llm.loading.loader import (
    WORKLOAD_SPEC,
    load_scenario,
    load_workload,
    load_workload_or_scenario,
    override_spec,
    replace_scenario,
    scenario_from_dict,
    workload_from_dict,
)
from simpy_llm.loading.overrides import Overrides, apply_overrides, ordered_overrides
from simpy_llm.loading.plugins import PLUGIN_ENTRY_POINT_GROUP, load_entry_point_plugins, load_plugins

__all__ = [
    "PLUGIN_ENTRY_POINT_GROUP",
    "WORKLOAD_SPEC",
    "Overrides",
    "apply_overrides",
    "build_policy",
    "check_config",
    "load_entry_point_plugins",
    "load_plugins",
    "load_scenario",
    "load_workload",
    "load_workload_or_scenario",
    "ordered_overrides",
    "override_spec",
    "replace_scenario",
    "scenario_from_dict",
    "scenario_hash",
    "scenario_to_dict",
    "workload_from_dict",
    "workload_to_dict",
]
