"""SLO classes: a class a scenario names is one its ``slo`` section defines, or it is refused
(on loading, with the trace's header, or by ``capacity --slo``); a replayed trace's own
classes outside ``slo`` are reported. Expected counts are counted by hand from the rows
written here."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from simpy_llm import Simulation, load_scenario, scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import ScenarioWarning
from simpy_llm.explore.capacity import StabilityCriteria, check_slo_classes
from simpy_llm.workload.checks import check_spec_files, request_slo_classes
from simpy_llm.workload.traces import Trace, write_trace_v2
from tests.helpers import tiny_scenario

AZURE = str(Path(__file__).resolve().parents[2] / "data" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")


def test_a_mistyped_client_class_is_refused_naming_the_known_classes(quickstart_path: Path) -> None:
    """A client whose slo_class is not a key of the scenario's slo is refused at its key path,
    the message listing the classes slo defines."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(quickstart_path, ["workload.clients.0.slo_class=interactve"])
    assert err.value.paths == ["workload.clients[0].slo_class"]
    assert "unknown SLO class 'interactve'; the slo section defines: batch, interactive" in str(err.value)


def test_validate_and_run_refuse_the_mistyped_class(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``validate`` and ``run`` exit 2 on the mistyped class (``run`` used to report every
    request of the class as meeting its SLO), printing the message and no summary."""
    args = ["--set", "workload.clients.0.slo_class=interactve", "--set", "workload.num_requests=200"]
    assert main(["validate", str(quickstart_path), *args]) == 2
    assert main(["run", str(quickstart_path), "--progress", "off", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("workload.clients[0].slo_class: unknown SLO class 'interactve'") == 2


def test_a_servegen_class_outside_slo_is_refused() -> None:
    """servegen_data.slo_class is one of slo's keys too."""
    with pytest.raises(ScenarioError) as err:
        load_scenario("scenarios/servegen_m_large_day.yaml", ["workload.servegen_data.slo_class=batch"])
    assert err.value.paths == ["workload.servegen_data.slo_class"] and "defines: interactive" in str(err.value)


def test_a_class_without_targets_is_refused(quickstart_path: Path) -> None:
    """An slo entry with no target at all is refused: its requests would all count as met."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(quickstart_path, {"slo.batch": {}})
    assert err.value.paths == ["slo.batch"] and "give at least one target" in str(err.value)


def test_without_an_slo_section_any_class_loads() -> None:
    """With no slo section no class is checked (no request has a target)."""
    data = tiny_scenario()
    data["workload"]["clients"][0]["slo_class"] = "anything"
    assert scenario_from_dict(data).workload.clients[0].slo_class == "anything"


def _azure_replay(slo_class: str) -> dict:
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": AZURE, "format": "azure", "slo_class": slo_class, "max_requests": 5}]}
    data["slo"] = {"chat": {"ttft_s": 1.0}}
    return data


def test_a_trace_sources_class_is_checked_when_the_file_has_none() -> None:
    """An Azure file gives its rows no class, so the source's slo_class is every row's: it must
    be a key of slo, checked with the file's header (the scenario itself loads)."""
    scenario = scenario_from_dict(_azure_replay("default"), source="replay.yaml")
    with pytest.raises(ScenarioError) as err:
        check_spec_files(scenario, "replay.yaml")
    assert err.value.source == "replay.yaml" and err.value.paths == ["workload.traces[0].slo_class"]
    assert "unknown SLO class 'default'" in str(err.value) and "defines: chat" in str(err.value)
    with pytest.raises(ScenarioError):
        Simulation(scenario)
    check_spec_files(scenario_from_dict(_azure_replay("chat")))


def _classed_trace(tmp_path: Path) -> Path:
    """A trace v2 of 6 rows: classes chat, chat, bulk, "", bulk, other (the blank one takes the
    source's class)."""
    classes = ["chat", "chat", "bulk", "", "bulk", "other"]
    frame = {
        "arrival_time_us": [0, 1000, 2000, 3000, 4000, 5000],
        "input_tokens": [5] * 6,
        "output_tokens": [2] * 6,
        "slo_class": classes,
    }
    return write_trace_v2(Trace({}, frame), tmp_path / "classed")[1]


def test_trace_rows_of_classes_outside_slo_are_replayed_and_reported(tmp_path: Path) -> None:
    """Rows whose own class slo does not define are replayed (all 6 complete) and building the
    simulation warns once, naming the trace's key path and each such class with its rows:
    bulk 2, other 1, and the blank row with the source's class, ``default``, 1."""
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": str(_classed_trace(tmp_path))}]}
    data["slo"] = {"chat": {"ttft_s": 1.0}}
    scenario = scenario_from_dict(data)
    check_spec_files(scenario)  # the source's class is not every row's: not checked with the header
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = Simulation(scenario)
    assert [w.category for w in caught] == [ScenarioWarning]
    message = str(caught[0].message)
    assert message.startswith("workload.traces[0]")
    assert "'bulk' (2 rows), 'default' (1 rows), 'other' (1 rows)" in message and "defines chat" in message
    assert sim.run().summary()["requests"]["completed"] == 6


def test_request_slo_classes_reads_the_classes_of_trace_rows(tmp_path: Path) -> None:
    """The classes a scenario's requests can carry include each trace row's own (a blank one
    the source's), read from the file."""
    data = tiny_scenario()
    data["workload"]["traces"] = [{"path": str(_classed_trace(tmp_path)), "slo_class": "spare"}]
    assert request_slo_classes(scenario_from_dict(data)) == ["bulk", "chat", "default", "other", "spare"]


def test_capacity_refuses_an_slo_target_of_an_unknown_class(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``capacity --slo 'ttft_p99[interactve]=0.5'`` exits 2 before any probe, naming the class
    and the scenario's classes (it used to judge no request and pass every load)."""
    assert main(["capacity", str(quickstart_path), "--slo", "ttft_p99[interactve]=0.5", "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "unknown SLO class 'interactve'; the scenario's requests have: batch, interactive" in err


def test_capacity_accepts_a_known_class() -> None:
    """A target naming a class the scenario's requests carry passes the check."""
    check_slo_classes(StabilityCriteria(slo="ttft_p99[batch]=0.5"), load_scenario("scenarios/quickstart.yaml"))
