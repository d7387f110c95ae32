"""Bare workload specs: ``load_workload`` (errors naming the file and key path, relative paths,
overrides), telling a scenario from a workload spec by content, and a scenario whose workload is
``{file: PATH}`` (inline keys, ``--set workload.*`` after the file is read, errors inside the file)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from simpy_llm.config import ScenarioError, WorkloadConfig
from simpy_llm.config.paths import base_dir
from simpy_llm.loading import (
    load_scenario,
    load_workload,
    load_workload_or_scenario,
    override_spec,
    scenario_from_dict,
    scenario_to_dict,
    workload_from_dict,
    workload_to_dict,
)

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = sorted((REPO / "scenarios" / "workloads").glob("*.yaml"))
TWO_CLIENTS = REPO / "scenarios" / "workloads" / "two_clients.yaml"
TWO_CLIENTS_DATA: dict[str, Any] = yaml.safe_load(TWO_CLIENTS.read_text())
SERVING = {"latency_model": {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}}
TRACE_CSV = "arrival_time_us,input_tokens,output_tokens\n0,10,5\n1000,12,6\n"


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _scenario(workload: Any, **top: Any) -> dict[str, Any]:
    return {"name": "ref", "seed": 42, "workload": workload, "serving": copy.deepcopy(SERVING), **top}


# ------------------------------------------------------------------ load_workload


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_every_shipped_workload_spec_loads_and_round_trips(path: Path) -> None:
    """Each bare workload spec under scenarios/workloads loads, and its plain-data form loads back equal."""
    wl = load_workload(path)
    assert isinstance(wl, WorkloadConfig)
    assert workload_from_dict(workload_to_dict(wl)) == wl


def test_shipped_workload_equals_the_two_clients_scenario_workload() -> None:
    """The shipped workload spec is the two_clients scenario's workload, with the seed written in it."""
    scenario = load_scenario(REPO / "scenarios" / "two_clients.yaml", ["workload.num_requests=2000"])
    assert load_workload(TWO_CLIENTS) == attrs.evolve(scenario.workload, seed=scenario.seed)


def test_a_bad_value_names_the_workload_file_and_key_path(tmp_path: Path) -> None:
    """A bad value is a ScenarioError whose source is the workload file, whose key path is relative
    to the workload, and whose message says it is a workload spec and what is allowed."""
    data = copy.deepcopy(TWO_CLIENTS_DATA)
    data["clients"][0]["arrival"]["cv"] = -1.0
    path = _write(tmp_path / "bad.yaml", data)
    with pytest.raises(ScenarioError) as err:
        load_workload(path)
    assert err.value.source == str(path) and err.value.paths == ["clients[0].arrival.cv"]
    assert str(err.value).startswith(f"{path}: 1 problem(s) in workload spec") and "must be > 0" in str(err.value)


def test_an_unknown_key_is_reported_with_the_allowed_ones(tmp_path: Path) -> None:
    """An unknown top-level key is named, with the workload's keys listed as allowed."""
    path = _write(tmp_path / "odd.yaml", {**TWO_CLIENTS_DATA, "horizon": 10})
    with pytest.raises(ScenarioError) as err:
        load_workload(path)
    assert err.value.paths == ["horizon"] and "allowed: clients, aggregate_rate" in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("clients: [\n", "not valid YAML: line"),
        ("serving: {}\nworkload: {}\n", "this is a scenario"),
    ],
    ids=["empty", "list", "bad yaml", "scenario"],
)
def test_a_file_that_is_no_workload_spec_says_why(tmp_path: Path, text: str, message: str) -> None:
    """An empty file, a non-mapping, invalid YAML and a scenario each give one clear problem."""
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_workload(path)
    assert len(err.value.problems) == 1 and message in str(err.value)


def test_a_missing_file_names_it(tmp_path: Path) -> None:
    """A workload file that does not exist is reported as unreadable, naming it."""
    with pytest.raises(ScenarioError) as err:
        load_workload(tmp_path / "nope.yaml")
    assert err.value.source == str(tmp_path / "nope.yaml") and "cannot read file" in str(err.value)


def test_relative_paths_resolve_against_the_workload_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace path in a workload file is relative to that file's directory, whatever the current directory."""
    (tmp_path / "specs" / "data").mkdir(parents=True)
    (tmp_path / "specs" / "data" / "t.csv").write_text(TRACE_CSV)
    _write(tmp_path / "specs" / "replay.yaml", {"traces": [{"path": "data/t.csv", "format": "csv"}]})
    monkeypatch.chdir(tmp_path)
    assert load_workload("specs/replay.yaml").traces[0].path == str(tmp_path / "specs" / "data" / "t.csv")


@pytest.mark.parametrize(
    "overrides",
    [["aggregate_rate=5"], ["workload.aggregate_rate=5"], "aggregate_rate=5", {"aggregate_rate": 5.0}, {"workload.aggregate_rate": 5.0}],
    ids=["list", "list with workload.", "string", "mapping", "mapping with workload."],
)
def test_overrides_are_relative_to_the_workload(overrides: Any) -> None:
    """Overrides of a bare spec take keys relative to the workload, with or without a leading
    ``workload.``, in every form load_scenario takes."""
    wl = load_workload(TWO_CLIENTS, overrides)
    assert wl.aggregate_rate == 5.0 and wl.clients == load_workload(TWO_CLIENTS).clients


def test_overrides_reach_list_items_and_the_seed() -> None:
    """List items go by index and ``seed`` is the workload's own."""
    wl = load_workload(TWO_CLIENTS, ["clients.1.rate_fraction=0.5", "workload.seed=7"])
    assert wl.clients[1].rate_fraction == 0.5 and wl.seed == 7


def test_a_bad_override_names_the_workload_file() -> None:
    """An override into a missing list item is a workload-spec error naming the key."""
    with pytest.raises(ScenarioError) as err:
        load_workload(TWO_CLIENTS, ["clients.5.rate_fraction=1"])
    assert err.value.paths == ["clients.5"] and "in workload spec" in str(err.value)


def test_load_workload_or_scenario_decides_by_content(tmp_path: Path) -> None:
    """A mapping with serving or workload at the top is a scenario; anything else a bare spec."""
    assert load_workload_or_scenario(REPO / "scenarios" / "quickstart.yaml").name == "quickstart"
    assert isinstance(load_workload_or_scenario(TWO_CLIENTS), WorkloadConfig)
    only_workload = _write(tmp_path / "s.yaml", {"workload": copy.deepcopy(TWO_CLIENTS_DATA)})
    with pytest.raises(ScenarioError) as err:  # a scenario (by content) without serving
        load_workload_or_scenario(only_workload)
    assert err.value.paths == ["serving"]


def test_load_scenario_on_a_bare_spec_points_to_the_reference_form() -> None:
    """Running a bare workload spec as a scenario says what it is and how to simulate it."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(TWO_CLIENTS)
    assert "bare workload spec" in str(err.value) and "workload: {file: PATH}" in str(err.value)


def test_override_spec_applies_to_loaded_objects() -> None:
    """Overrides apply to a loaded scenario (its keys) and a loaded bare spec (keys relative to it)."""
    wl = load_workload(TWO_CLIENTS)
    assert override_spec(wl, ["workload.num_requests=10"]).num_requests == 10
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    assert override_spec(scenario, ["workload.num_requests=10", "seed=3"]).seed == 3


# ------------------------------------------------------------------ workload: {file: PATH}


def test_a_referenced_workload_equals_the_inline_one(tmp_path: Path) -> None:
    """``workload: {file: PATH}`` (relative to the scenario) gives the workload written in that file."""
    path = _write(tmp_path / "sc" / "s.yaml", _scenario({"file": str(TWO_CLIENTS)}))
    relative = _write(tmp_path / "sc2" / "s.yaml", _scenario({"file": "wl/two.yaml"}))
    _write(tmp_path / "sc2" / "wl" / "two.yaml", TWO_CLIENTS_DATA)
    assert load_scenario(path).workload == load_workload(TWO_CLIENTS) == load_scenario(relative).workload


def test_keys_beside_file_replace_the_files_top_level_keys(tmp_path: Path) -> None:
    """A key given beside ``file`` replaces the file's key of that name; the others stay."""
    path = _write(tmp_path / "s.yaml", _scenario({"file": str(TWO_CLIENTS), "aggregate_rate": 10.0, "seed": 3}))
    wl = load_scenario(path).workload
    assert (wl.aggregate_rate, wl.seed) == (10.0, 3)
    assert wl.clients == load_workload(TWO_CLIENTS).clients


def test_set_applies_after_the_file_is_read(tmp_path: Path) -> None:
    """``--set workload.*`` reaches into the file's keys (list items included) and can switch
    num_requests for horizon_s; ``--set workload.file`` picks another file."""
    path = _write(tmp_path / "s.yaml", _scenario({"file": str(TWO_CLIENTS), "aggregate_rate": 10.0}))
    wl = load_scenario(path, ["workload.clients.1.rate_fraction=0.6", "workload.horizon_s=30", "workload.num_requests=null"]).workload
    assert wl.clients[1].rate_fraction == 0.6 and wl.clients[0] == load_workload(TWO_CLIENTS).clients[0]
    assert (wl.horizon_s, wl.num_requests, wl.aggregate_rate) == (30.0, None, 10.0)
    other = _write(tmp_path / "other.yaml", {**TWO_CLIENTS_DATA, "num_requests": 7})
    assert load_scenario(path, [f"workload.file={other}"]).workload.num_requests == 7


def test_set_can_mend_a_bad_value_of_the_file(tmp_path: Path) -> None:
    """A value the file gets wrong may be corrected from the command line."""
    data = copy.deepcopy(TWO_CLIENTS_DATA)
    data["clients"][0]["arrival"]["cv"] = -1.0
    bad = _write(tmp_path / "wl.yaml", data)
    path = _write(tmp_path / "s.yaml", _scenario({"file": "wl.yaml"}))
    with pytest.raises(ScenarioError):
        load_scenario(path)
    assert load_scenario(path, ["workload.clients.0.arrival.cv=2"]).workload.clients[0].arrival.cv == 2.0
    assert bad.exists()


def test_an_error_inside_the_referenced_file_names_the_file_and_key_path(tmp_path: Path) -> None:
    """A bad value read from the workload file is reported at its scenario key path, the message
    naming the workload file and the key path inside it; a bad key given inline names no file."""
    data = copy.deepcopy(TWO_CLIENTS_DATA)
    data["clients"][1]["input_distribution"]["params"]["std_dev"] = -5
    wl_path = _write(tmp_path / "wl" / "bad.yaml", data)
    path = _write(tmp_path / "s.yaml", _scenario({"file": "wl/bad.yaml", "num_requests": 0}))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    problems = dict(err.value.problems)
    assert err.value.source == str(path)
    in_file = problems["workload.clients[1].input_distribution.params.std_dev"]
    assert f"workload file {wl_path}" in in_file and "at clients[1].input_distribution.params.std_dev" in in_file
    path.write_text(yaml.safe_dump(_scenario({"file": str(TWO_CLIENTS), "num_requests": 0})))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.problems == [("workload.num_requests", "must be >= 1, got 0")]


@pytest.mark.parametrize(
    ("file_value", "content", "message"),
    [
        ("missing.yaml", None, "cannot read file"),
        ("empty.yaml", "", "is empty"),
        ("list.yaml", "- 1\n", "must hold a mapping"),
        ("scenario.yaml", "workload: {}\nserving: {}\n", "is a scenario"),
        ("nested.yaml", "file: other.yaml\n", "unknown key"),
        ("", None, "must be the path of a workload spec file"),
    ],
    ids=["missing", "empty", "list", "scenario", "nested reference", "empty path"],
)
def test_a_reference_to_an_unusable_file_is_reported_at_workload_file(tmp_path: Path, file_value: str, content: str | None, message: str) -> None:
    """A missing, empty or non-workload file, a workload file referencing another (``file`` is
    no workload key), or no path at all, is one problem at ``workload.file``."""
    if content is not None:
        (tmp_path / file_value).write_text(content)
    path = _write(tmp_path / "s.yaml", _scenario({"file": file_value}))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.paths == ["workload.file"] and message in str(err.value)


def test_paths_in_the_file_resolve_against_it_and_inline_ones_against_the_scenario(tmp_path: Path) -> None:
    """A relative trace path written in the workload file is relative to the workload file; one
    given beside ``file`` is relative to the scenario file."""
    (tmp_path / "wl").mkdir()
    (tmp_path / "wl" / "near_workload.csv").write_text(TRACE_CSV)
    (tmp_path / "near_scenario.csv").write_text(TRACE_CSV)
    _write(tmp_path / "wl" / "replay.yaml", {"traces": [{"path": "near_workload.csv", "format": "csv"}]})
    path = _write(tmp_path / "s.yaml", _scenario({"file": "wl/replay.yaml"}))
    assert load_scenario(path).workload.traces[0].path == str(tmp_path / "wl" / "near_workload.csv")
    path = _write(tmp_path / "s.yaml", _scenario({"file": "wl/replay.yaml", "traces": [{"path": "near_scenario.csv", "format": "csv"}]}))
    assert load_scenario(path).workload.traces[0].path == str(tmp_path / "near_scenario.csv")


def test_replace_and_to_dict_work_on_a_referenced_workload(tmp_path: Path) -> None:
    """scenario_to_dict gives the workload inline (no ``file``), which loads back to an equal
    scenario; replace() changes it as for any scenario."""
    path = _write(tmp_path / "s.yaml", _scenario({"file": str(TWO_CLIENTS)}))
    scenario = load_scenario(path)
    data = scenario_to_dict(scenario)
    assert "file" not in data["workload"] and scenario_from_dict(data) == scenario
    assert scenario.replace(**{"workload.aggregate_rate": 20.0}).workload.aggregate_rate == 20.0


def test_scenario_from_dict_reads_the_reference_relative_to_the_base_directory() -> None:
    """From data, ``file`` resolves against the directory being loaded from (the current one by default)."""
    with base_dir(REPO / "scenarios"):
        scenario = scenario_from_dict(_scenario({"file": "workloads/two_clients.yaml"}))
    assert scenario.workload == load_workload(TWO_CLIENTS)


def test_the_shipped_scenario_by_reference_loads_its_workload_file() -> None:
    """scenarios/two_clients_by_reference.yaml reads the shipped workload spec, with its own rate."""
    scenario = load_scenario(REPO / "scenarios" / "two_clients_by_reference.yaml")
    assert scenario.workload == attrs.evolve(load_workload(TWO_CLIENTS), aggregate_rate=50.0)
