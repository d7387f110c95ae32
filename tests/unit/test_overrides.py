"""Overrides in every accepted form, ``Scenario.replace`` and ``repr``, and the workload defaults
that overrides run into (rate_fraction, num_requests vs horizon_s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm import Simulation
from simpy_llm.config import ScenarioError
from simpy_llm.loading import apply_overrides, load_scenario, scenario_from_dict

# --------------------------------------------------------------------------- override forms


def test_one_override_string_is_one_override(quickstart_path: Path) -> None:
    """``load_scenario(path, "seed=7")`` applies the one override (it does not iterate characters)."""
    assert load_scenario(quickstart_path, "seed=7").seed == 7


def test_a_list_of_override_strings_still_works(quickstart_path: Path) -> None:
    """A list of ``dotted.key=value`` strings sets each (values parsed as YAML)."""
    s = load_scenario(quickstart_path, ["seed=7", "workload.num_requests=300"])
    assert (s.seed, s.workload.num_requests) == (7, 300)


def test_a_mapping_of_overrides_takes_values_as_given(quickstart_path: Path) -> None:
    """``{dotted.key: value}`` sets each value unparsed: the string "yes" stays a string."""
    s = load_scenario(quickstart_path, {"name": "yes", "workload.num_requests": 300, "workload.clients.0.rate_fraction": 0.5})
    assert (s.name, s.workload.num_requests, s.workload.clients[0].rate_fraction) == ("yes", 300, 0.5)


def test_a_mapping_value_is_copied() -> None:
    """Changing a list after passing it as an override value does not change the result."""
    value = [1, 2]
    out = apply_overrides({}, {"a.b": value})
    value.append(3)
    assert out == {"a": {"b": [1, 2]}}


def test_a_mapping_override_value_is_still_validated(quickstart_path: Path) -> None:
    """A mapping value of the wrong type is reported at its key path like any other."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, {"workload.num_requests": "300"})
    assert info.value.paths == ["workload.num_requests"] and "must be an integer" in str(info.value)


@pytest.mark.parametrize("overrides", [123, [1], {1: 2}], ids=["number", "list of numbers", "non-string key"])
def test_malformed_overrides_are_scenario_errors(quickstart_path: Path, overrides: Any) -> None:
    """Overrides that are neither strings, lists of strings nor a string-keyed mapping raise ScenarioError."""
    with pytest.raises(ScenarioError, match="override"):
        load_scenario(quickstart_path, overrides)


# --------------------------------------------------------------------------- Scenario.replace


def test_replace_returns_a_new_validated_scenario(quickstart_path: Path) -> None:
    """replace() sets dotted keys (and top-level names) on a copy; the original is unchanged."""
    s = load_scenario(quickstart_path)
    t = s.replace(**{"workload.num_requests": 300, "serving.replicas": 3}, seed=9)
    assert (t.workload.num_requests, t.serving.replicas, t.seed) == (300, 3, 9)
    assert (s.workload.num_requests, s.serving.replicas, s.seed) == (20000, 1, 42)
    assert t == load_scenario(quickstart_path, ["workload.num_requests=300", "serving.replicas=3", "seed=9"])


def test_replace_rejects_an_invalid_value_at_its_key_path(quickstart_path: Path) -> None:
    """replace() validates as loading does: a bad value is a ScenarioError naming the key and the file."""
    s = load_scenario(quickstart_path)
    with pytest.raises(ScenarioError) as info:
        s.replace(**{"serving.replicas": 0})
    assert info.value.paths == ["serving.replicas"]
    assert info.value.source == str(quickstart_path.resolve())


def _trace_scenario(tmp_path: Path, quickstart_data: dict) -> Path:
    conf = tmp_path / "conf"
    conf.mkdir()
    data = quickstart_data
    data["workload"] = {"traces": [{"path": "a.csv", "format": "csv"}]}
    f = conf / "s.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_replace_keeps_paths_relative_to_the_scenario_file(
    tmp_path: Path, quickstart_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After replace(), the scenario's paths and relative paths in the changes both resolve
    against the scenario file's directory, not the current one."""
    f = _trace_scenario(tmp_path, quickstart_data)
    monkeypatch.chdir(tmp_path)
    s = load_scenario(f)
    assert s.workload.traces[0].path == str(f.parent / "a.csv")
    t = s.replace(seed=3).replace(**{"workload.traces.0.path": "b.csv"})
    assert t.workload.traces[0].path == str(f.parent / "b.csv")


def test_replace_of_a_scenario_built_from_data_resolves_against_the_current_directory(
    quickstart_data: dict,
) -> None:
    """A scenario built from data (no file) keeps relative paths as given, like the data itself."""
    quickstart_data["workload"] = {"traces": [{"path": "a.csv"}]}
    t = scenario_from_dict(quickstart_data).replace(**{"workload.traces.0.path": "b.csv"})
    assert t.workload.traces[0].path == "b.csv"


# --------------------------------------------------------------------------- repr


def test_repr_is_one_informative_line(quickstart_path: Path) -> None:
    """repr names the scenario, its clients, replicas, router and scheduler on one line."""
    text = repr(load_scenario(quickstart_path, {"serving.router.kind": "least_loaded", "serving.replicas": 3}))
    assert text == "<Scenario name='quickstart' clients=2 replicas=3 router=least_loaded scheduler=fcfs>"


def test_repr_of_a_fleet_counts_groups_and_lists_their_schedulers(quickstart_path: Path) -> None:
    """With replica groups, repr gives the total replicas, the number of groups and each distinct scheduler."""
    lm = {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}
    groups = [
        {"name": "a", "count": 2, "latency_model": lm, "engine": {"scheduler": {"kind": "priority"}}},
        {"name": "b", "count": 3, "latency_model": lm},
    ]
    s = load_scenario(quickstart_path, {"serving": {"replica_groups": groups}})
    assert "\n" not in repr(s)
    assert "replicas=5 groups=2" in repr(s) and "scheduler=priority/fcfs" in repr(s)


def test_repr_counts_traces(tmp_path: Path, quickstart_data: dict) -> None:
    """A replay scenario shows its trace count and no clients."""
    text = repr(load_scenario(_trace_scenario(tmp_path, quickstart_data)))
    assert "traces=1" in text and "clients" not in text


# --------------------------------------------------------------------------- workload defaults


def _one_client(quickstart_data: dict, n: int) -> dict:
    clients = quickstart_data["workload"]["clients"]
    for c in clients:
        del c["rate_fraction"]
    quickstart_data["workload"]["clients"] = clients[:n]
    return quickstart_data


def test_a_single_client_needs_no_rate_fraction(quickstart_data: dict) -> None:
    """Without rate_fraction a single client gets the whole aggregate rate."""
    sim = Simulation(scenario_from_dict(_one_client(quickstart_data, 1)))
    assert sim.scenario.workload.clients[0].rate_fraction == 1.0
    assert [src.rate for src in sim.sources] == [pytest.approx(20.0)]


def test_clients_without_rate_fraction_share_equally(quickstart_data: dict) -> None:
    """Clients that all leave out rate_fraction split the aggregate rate equally."""
    sim = Simulation(scenario_from_dict(_one_client(quickstart_data, 2)))
    assert [src.rate for src in sim.sources] == [pytest.approx(10.0), pytest.approx(10.0)]


def test_setting_horizon_on_a_counted_workload_says_which_key_to_clear(quickstart_path: Path) -> None:
    """Overriding horizon_s on a num_requests scenario names the override that clears the other key."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(quickstart_path, ["workload.horizon_s=60"])
    assert info.value.paths == ["workload.num_requests"]
    assert "both are set" in str(info.value) and "--set workload.num_requests=null" in str(info.value)


def test_clearing_the_other_key_as_the_error_says_works(quickstart_path: Path) -> None:
    """Following the advice (``workload.num_requests=null``) switches the scenario to a horizon."""
    s = load_scenario(quickstart_path, ["workload.horizon_s=60", "workload.num_requests=null"])
    assert (s.workload.num_requests, s.workload.horizon_s) == (None, 60.0)


def test_neither_count_nor_horizon_says_neither_is_set(quickstart_path: Path) -> None:
    """A synthetic workload with neither key is told so."""
    with pytest.raises(ScenarioError, match=r"give exactly one of num_requests or horizon_s \(neither is set\)"):
        load_scenario(quickstart_path, {"workload.num_requests": None})


def test_an_override_through_a_yaml_alias_changes_only_the_place_it_names() -> None:
    """Replica groups that share settings through a YAML anchor stay independent: overriding
    one group's copy leaves the others (which name the same anchor) as written."""
    from simpy_llm import load_scenario

    scenario = load_scenario(
        "scenarios/multi_bin_dynamic.yaml", {"serving.replica_groups.0.batch_server.bins.predictor.sigma": 1.0}
    )
    sigmas = [g.batch_server.bins.predictor.sigma for g in scenario.serving.replica_groups]
    assert sigmas == [1.0, 0.3, 0.3]
