"""A client with ``rate_fraction: 0`` is left out of the workload, with a ScenarioWarning naming it.

The warning comes when the simulation is built; loading and validating a scenario stay quiet.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.loading import load_scenario
from simpy_llm.workload.export import generate_requests
from tests.helpers import columns_equal, tiny_scenario


def _with_idle_client() -> dict[str, Any]:
    """The tiny scenario plus a second client ``idle`` with rate_fraction 0."""
    data = tiny_scenario()
    idle = dict(copy.deepcopy(data["workload"]["clients"][0]), id="idle", rate_fraction=0.0)
    data["workload"]["clients"].append(idle)
    return data


def test_scenario_warning_is_a_user_warning() -> None:
    """ScenarioWarning is a UserWarning (shown by default, filterable by category)."""
    assert issubclass(ScenarioWarning, UserWarning)


def test_building_the_simulation_warns_naming_the_client_and_its_key() -> None:
    """Building a Simulation with a rate_fraction-0 client warns once, naming the client and its key path."""
    scenario = scenario_from_dict(_with_idle_client())
    with pytest.warns(ScenarioWarning) as caught:
        sim = Simulation(scenario)
    messages = [str(w.message) for w in caught if issubclass(w.category, ScenarioWarning)]
    assert len(messages) == 1
    assert "'idle'" in messages[0] and "workload.clients[1].rate_fraction" in messages[0]
    assert [src.client.id for src in sim.sources] == ["c0"]


def test_the_warning_points_at_the_code_that_builds_the_simulation() -> None:
    """The warning's location is the caller's line, not the library's."""
    scenario = scenario_from_dict(_with_idle_client())
    with pytest.warns(ScenarioWarning) as caught:
        Simulation(scenario)
    assert Path(caught[0].filename).resolve() == Path(__file__).resolve()


def test_the_excluded_client_sends_nothing_and_changes_nothing() -> None:
    """The run's records equal those of the scenario without the client: it sends no request and
    the other clients keep their rates and draws."""
    with pytest.warns(ScenarioWarning, match="'idle'"):
        with_idle = Simulation(scenario_from_dict(_with_idle_client())).run()
    without = Simulation(scenario_from_dict(tiny_scenario())).run()
    assert "idle" not in set(with_idle.columns["client_id"].tolist())
    assert len(with_idle.columns["request_id"]) == 50
    assert columns_equal(with_idle, without) == []


def test_loading_a_scenario_does_not_warn(tmp_path: Path) -> None:
    """Loading (from data or a file) and validating give no warning: the client is legal config."""
    data = _with_idle_client()
    path = tmp_path / "idle.yaml"
    path.write_text(yaml.safe_dump(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario_from_dict(copy.deepcopy(data))
        load_scenario(path)
        assert main(["validate", str(path)]) == 0
    assert [w for w in caught if issubclass(w.category, ScenarioWarning)] == []


def test_generating_the_workload_warns_too() -> None:
    """Generating the requests without simulating builds the simulation's sources, so it warns as a run does."""
    with pytest.warns(ScenarioWarning, match="'idle'"):
        table = generate_requests(scenario_from_dict(_with_idle_client()))
    assert set(table.client_id) == {"c0"}


def test_clients_with_a_positive_rate_fraction_do_not_warn() -> None:
    """A scenario whose clients all have rate_fraction > 0 builds without any warning."""
    data = _with_idle_client()
    data["workload"]["clients"][1]["rate_fraction"] = 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = Simulation(scenario_from_dict(data))
    assert [w for w in caught if issubclass(w.category, ScenarioWarning)] == []
    assert [src.client.id for src in sim.sources] == ["c0", "idle"]
    assert np.isclose(sum(src.rate for src in sim.sources), 50.0)


def test_every_zero_rate_client_is_named() -> None:
    """Two rate_fraction-0 clients give one warning each."""
    data = _with_idle_client()
    data["workload"]["clients"].append(dict(copy.deepcopy(data["workload"]["clients"][1]), id="idle2"))
    with pytest.warns(ScenarioWarning) as caught:
        Simulation(scenario_from_dict(data))
    named = sorted(str(w.message).split("'")[1] for w in caught if issubclass(w.category, ScenarioWarning))
    assert named == ["idle", "idle2"]
