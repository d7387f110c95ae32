"""The checks across components (simpy_llm.loading.checks): run by the loader at each object's key
path, and by check_config on a scenario built in Python, with the same problem."""

from __future__ import annotations

import attrs
import pytest

from simpy_llm.config.errors import ScenarioError
from simpy_llm.loading import check_config, scenario_from_dict
from simpy_llm.loading.checks import CHECKS
from tests.helpers import tiny_groups


def test_a_draft_device_under_a_replica_group_is_refused_at_its_key_path() -> None:
    """Loading a replica group on a draft device names serving.replica_groups[1].device."""
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(tiny_groups({"name": "a"}, {"name": "b", "device": "jetson-agx-orin"}))
    assert info.value.paths == ["serving.replica_groups[1].device"]
    assert "is a draft device" in info.value.problems[0][1]


def test_check_config_finds_in_a_python_built_scenario_what_loading_finds() -> None:
    """A scenario changed in Python (attrs.evolve, which checks values only) gets from check_config
    the very problem, at the very key path, that loading the same data reports."""
    scenario = scenario_from_dict(tiny_groups({"name": "a"}, {"name": "b"}))
    check_config(scenario)  # a loaded scenario passes
    groups = scenario.serving.replica_groups
    changed = attrs.evolve(
        scenario, serving=attrs.evolve(scenario.serving, replica_groups=(groups[0], attrs.evolve(groups[1], device="jetson-agx-orin")))
    )
    with pytest.raises(ScenarioError) as built:
        check_config(changed)
    with pytest.raises(ScenarioError) as loaded:
        scenario_from_dict(tiny_groups({"name": "a"}, {"name": "b", "device": "jetson-agx-orin"}))
    assert built.value.problems == loaded.value.problems


def test_every_checked_class_is_a_config_class() -> None:
    """The checks are registered on attrs config classes (the loader wraps their structuring)."""
    assert CHECKS and all(attrs.has(cls) for cls in CHECKS)
