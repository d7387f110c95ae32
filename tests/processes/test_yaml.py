"""User processes from YAML: the ``processes:`` section, registered kinds, plugins, and errors
that name the key path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.config import ScenarioError
from simpy_llm.loading import load_scenario, scenario_from_dict, scenario_to_dict
from simpy_llm.processes import between, process_kinds, rate_limit

PLUGIN = '''
from simpy_llm.processes import process_kinds


@process_kinds.register("hold")
def hold(env, ports, delay_s):
    """Hold each request for delay_s, one at a time."""
    while True:
        req = yield ports.inbox.get()
        yield env.timeout(delay_s)
        yield ports.outbox.put(req)
'''


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process registry and imported plugin modules as they were before the test."""
    monkeypatch.setattr(process_kinds, "_items", dict(process_kinds._items))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_simpy_llm_plugin_"):
            del sys.modules[name]


def _data(quickstart_data: dict[str, Any], processes: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    data = quickstart_data
    data["workload"]["num_requests"] = 200
    data["serving"]["replicas"] = 2
    data["processes"] = processes
    data.update(top)
    return data


def test_a_registered_process_from_yaml_runs_as_the_same_one_from_python(quickstart_data):
    """``processes: [{between: replica:0, process: {kind: rate_limit, params: ...}}]`` gives the
    records of the same process placed from Python."""
    data = _data(quickstart_data, [{"between": "replica:0", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1.5}}}])
    scenario = scenario_from_dict(data)
    from_yaml = Simulation(scenario).run(progress=False).to_dataframe()
    plain = scenario_from_dict({k: v for k, v in data.items() if k != "processes"})
    from_python = Simulation(plain, processes=[between("replica:0", rate_limit, rate_per_s=1.5)]).run(progress=False).to_dataframe()
    assert from_yaml.equals(from_python)
    assert not from_yaml.equals(Simulation(plain).run(progress=False).to_dataframe())


def test_a_process_kind_from_a_plugin_file_is_placed(tmp_path, monkeypatch, quickstart_data):
    """A process registered in a plugin file the scenario names holds every request for its
    ``delay_s`` (one at a time) between the arrivals and the router, and the scenario's plain
    data form keeps the section."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gates.py").write_text(PLUGIN)
    data = _data(quickstart_data, [{"between": "arrivals", "process": {"kind": "hold", "params": {"delay_s": 0.25}}}],
                 plugins=["gates.py"])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    scenario = load_scenario(tmp_path / "s.yaml")
    frame = Simulation(scenario).run(progress=False).to_dataframe().sort_values("request_id")
    plain = Simulation(scenario.replace(processes=[])).run(progress=False).to_dataframe().sort_values("request_id")
    queueing = (plain["enqueue_s"] - plain["arrival_s"]).to_numpy()  # the model's own, per request
    reached = frame["enqueue_s"].to_numpy() - queueing  # when the held request reached the router
    assert (reached[1:] - reached[:-1] >= 0.25 - 1e-9).all()
    assert (reached >= frame["arrival_s"].to_numpy() + 0.25 - 1e-9).all()
    assert scenario_to_dict(scenario)["processes"] == [
        {"process": {"kind": "hold", "params": {"delay_s": 0.25}}, "between": "arrivals", "instead_of": None}]


@pytest.mark.parametrize(("entry", "path", "message"), [
    ({"between": "arrivals", "process": {"kind": "no_such"}}, "processes[0].process.kind", "unknown process kind 'no_such'"),
    ({"between": "arrivals", "process": {"kind": "rate_limit", "params": {"rate": 2}}}, "processes[0].process.params.rate", "unknown parameter"),
    ({"between": "arrivals", "process": {"kind": "rate_limit", "params": {"ports": 2, "rate_per_s": 1}}},
     "processes[0].process.params.ports", "set by the simulation"),
    ({"between": "arrivals", "instead_of": "router", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1}}},
     "processes[0].between", "exactly one of between"),
    ({"between": "replica", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1}}}, "processes[0].between", "unknown seam"),
    ({"instead_of": "arrivals", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1}}},
     "processes[0].instead_of", "instead_of takes 'router' or 'replica:<index>'"),
    ({"between": "arrivals", "proces": {"kind": "rate_limit"}}, "processes[0].proces", "unknown key"),
])
def test_a_bad_processes_entry_is_refused_with_its_key_path(quickstart_data, entry, path, message):
    """A bad ``processes:`` entry is refused when the scenario is read, naming its key path and
    what is allowed."""
    with pytest.raises(ScenarioError) as caught:
        scenario_from_dict(_data(quickstart_data, [entry]))
    problems = dict(caught.value.problems)
    assert path in problems, caught.value
    assert message in problems[path]


def test_a_seam_the_scenario_lacks_is_refused_with_its_key_path(quickstart_data):
    """A ``processes:`` entry at a seam this scenario has not (a third replica of two) is refused
    when the simulation is built, naming the key path and the seams there are."""
    scenario = scenario_from_dict(_data(quickstart_data, [
        {"between": "arrivals", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1}}},
        {"between": "replica:2", "process": {"kind": "rate_limit", "params": {"rate_per_s": 1}}}]))
    with pytest.raises(ScenarioError) as caught:
        Simulation(scenario)
    assert caught.value.paths == ["processes[1].between"]
    assert "its seams: router, arrivals, replica:0, replica:1" in str(caught.value)
