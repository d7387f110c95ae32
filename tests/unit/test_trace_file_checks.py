"""The files a scenario references are checked before it runs: a missing file, an unreadable
header, a missing column or a wrong header value is a ScenarioError naming the scenario
file, the trace's key path and the file, from ``validate`` and every command that runs;
rows are read only when the simulation is built, and a bad row is then a message with the
file and line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.config import ScenarioError
from simpy_llm.config.schema import TraceSource
from simpy_llm.loading import load_scenario
from simpy_llm.workload.checks import check_spec_files
from simpy_llm.workload.traces import (
    Trace,
    check_trace_files,
    load_trace,
    write_trace_v2,
)
from tests.helpers import tiny_scenario

AZURE = str(Path(__file__).resolve().parents[2] / "data" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")


def _scenario_file(tmp_path: Path, trace: dict[str, Any], **extra: Any) -> Path:
    """A small scenario replaying *trace* (a trace source), written to ``tmp_path/s.yaml``."""
    data = tiny_scenario()
    data["workload"] = {"traces": [trace]}
    data.update(extra)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _trace_v2(tmp_path: Path, header: dict[str, Any] | None = None, rows: int = 3) -> Path:
    frame = {"arrival_time_us": [1000 * i for i in range(rows)], "input_tokens": [5] * rows, "output_tokens": [2] * rows}
    return write_trace_v2(Trace(header or {}, frame), tmp_path / "t")[1]


def _errors(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_missing_trace_is_refused_by_validate_and_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace file that is not there: validate and run exit 2 with the scenario file, the key
    path of the reference and the file (validate used to say ok, run to end in a traceback)."""
    path = _scenario_file(tmp_path, {"path": "nope.csv", "format": "azure"})
    assert main(["validate", str(path)]) == 2
    assert main(["run", str(path), "--progress", "off"]) == 2
    err = _errors(capsys)
    line = f"workload.traces[0].path: {tmp_path / 'nope.csv'}: file not found"
    assert err.count(f"{path}: 1 problem(s) in scenario") == 2 and err.count(line) == 2


def test_a_missing_column_in_the_header_names_the_trace_key_and_the_file(tmp_path: Path) -> None:
    """An Azure file read as BurstGPT lacks BurstGPT's columns: the check says which, and what
    the header has, at the trace's key path."""
    path = _scenario_file(tmp_path, {"path": AZURE, "format": "burstgpt"})
    with pytest.raises(ScenarioError) as err:
        check_spec_files(load_scenario(path), str(path))
    assert err.value.source == str(path) and err.value.paths == ["workload.traces[0].path"]
    assert (
        f"{AZURE}: line 1: missing column(s) Timestamp, Request tokens, Response tokens; the header has: "
        "TIMESTAMP, ContextTokens, GeneratedTokens"
    ) in str(err.value)


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "--grid", "seed=1,2", "--workers", "1"],
        ["capacity", "--slo", "ttft_p99=0.5", "--quiet"],
        ["workload", "--out", "OUT"],
    ],
)
def test_every_command_refuses_a_missing_trace_with_its_key_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """sweep, capacity and workload exit 2 on a missing trace with the scenario file, the
    reference's key path and the file, before any run (no traceback, no output)."""
    path = _scenario_file(tmp_path, {"path": "nope.csv", "format": "azure"})
    args = [command[0], str(path), *(str(tmp_path / "out") if a == "OUT" else a for a in command[1:])]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert f"workload.traces[0].path: {tmp_path / 'nope.csv'}: file not found" in err
    assert not (tmp_path / "out").exists()


def test_serve_refuses_a_missing_trace_instead_of_serving(tmp_path: Path) -> None:
    """``serve`` exits 2 with the message (it used to start serving a scenario ``validate``
    refuses). Run as a command, stopped after two minutes if it serves."""
    path = _scenario_file(tmp_path, {"path": "nope.csv", "format": "azure"})
    done = subprocess.run(
        [sys.executable, "-m", "simpy_llm.cli", "serve", str(path), "--port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"workload.traces[0].path: {tmp_path / 'nope.csv'}: file not found" in done.stderr


def test_simulation_building_checks_the_files_first(tmp_path: Path) -> None:
    """Building a Simulation of a scenario whose trace is missing raises the same error, naming
    the reference's key path (it used to name only the file)."""
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": str(tmp_path / "gone.csv"), "format": "azure"}], "num_requests": 5}
    data["name"] = "gone"
    with pytest.raises(ScenarioError) as err:
        Simulation(scenario_from_dict(data))
    assert err.value.source == "scenario 'gone'" and err.value.paths == ["workload.traces[0].path"]


@pytest.mark.parametrize(
    ("header", "key", "message"),
    [
        ({"trace_version": 3}, "trace_version", "must be 2, got 3"),
        ({"prefix_block_tokens": "sixteen"}, "prefix_block_tokens", "must be a whole number of tokens >= 1, got 'sixteen'"),
        ({"warm_up_requests": -1}, "warm_up_requests", "must be a whole number >= 0, got -1"),
        ({"prefix_groups": [1, 2]}, "prefix_groups", "must be a mapping of group names to prefix tokens"),
        ({"seed": "x"}, "seed", "must be a whole number >= 0, got 'x'"),
    ],
)
def test_a_wrong_value_in_a_trace_v2_header_is_refused_before_the_run(
    tmp_path: Path, header: dict[str, Any], key: str, message: str
) -> None:
    """A trace v2 header value the replay reads, of the wrong type or out of range, is refused
    by the check (these used to fail in the middle of the run, or say nothing at validate)."""
    csv_path = _trace_v2(tmp_path)
    header_path = csv_path.with_suffix(".yaml")
    written = yaml.safe_load(header_path.read_text())
    header_path.write_text(yaml.safe_dump({**written, **header}))
    with pytest.raises(ScenarioError) as err:
        check_spec_files(load_scenario(_scenario_file(tmp_path, {"path": str(csv_path)})))
    (path, text), = err.value.problems
    assert path == "workload.traces[0].path" and f"{header_path}: " in text and key in text and message in text


def test_a_missing_trace_v2_header_file_is_refused(tmp_path: Path) -> None:
    """The header file of a trace v2 is required: its absence is refused by the check."""
    csv_path = _trace_v2(tmp_path)
    csv_path.with_suffix(".yaml").unlink()
    with pytest.raises(ScenarioError, match=r"workload.traces\[0\].path: .*t.yaml: trace v2 header not found"):
        check_spec_files(load_scenario(_scenario_file(tmp_path, {"path": str(csv_path)})))


def test_replaying_send_times_needs_the_column(tmp_path: Path) -> None:
    """arrival_column: send_time_us on a trace without that column is refused at the check (it
    used to replay no row at all, silently)."""
    csv_path = _trace_v2(tmp_path)
    csv_path.write_text("arrival_time_us,input_tokens,output_tokens\n0,5,2\n1000,5,2\n")
    path = _scenario_file(tmp_path, {"path": str(csv_path), "arrival_column": "send_time_us"})
    with pytest.raises(ScenarioError, match=r"missing column\(s\) send_time_us \(arrival_column: send_time_us"):
        check_spec_files(load_scenario(path))


def test_replaying_send_times_of_a_trace_with_none_is_refused(tmp_path: Path) -> None:
    """A trace whose send_time_us column is there but empty in every row (a generated trace)
    replayed at its send times is refused when its rows are read (it used to replay nothing)."""
    source = TraceSource(path=str(_trace_v2(tmp_path)), arrival_column="send_time_us")
    check_trace_files(source)
    with pytest.raises(ScenarioError) as err:
        load_trace(source)
    assert err.value.paths == ["column send_time_us"] and "no row has a send time" in str(err.value)


def test_a_csv_mapping_naming_a_column_the_header_lacks_is_refused(tmp_path: Path) -> None:
    """A csv trace whose columns mapping names a column the header does not have is refused
    with the mapping's columns, at the check."""
    log = tmp_path / "log.csv"
    log.write_text("t,prompt,completion\n0.5,100,20\n")
    columns = {"arrival_time_s": "t", "input_tokens": "prompt", "output_tokens": "answer"}
    path = _scenario_file(tmp_path, {"path": str(log), "format": "csv", "columns": columns})
    with pytest.raises(ScenarioError, match=r"missing column\(s\) answer \(named in the column mapping\); the header has: t, prompt, completion"):
        check_spec_files(load_scenario(path))


def test_a_mooncake_file_whose_first_object_lacks_a_key_is_refused(tmp_path: Path) -> None:
    """A Mooncake JSONL file is checked by its first object's keys (blank lines skipped)."""
    f = tmp_path / "m.jsonl"
    f.write_text('\n{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ScenarioError) as err:
        check_trace_files(TraceSource(path=str(f), format="mooncake"))
    assert err.value.problems == [("line 2", "missing key(s) output_length; the first object has: timestamp, input_length")]


def test_the_check_reads_no_row(tmp_path: Path) -> None:
    """The header check passes a file whose rows are bad (they are read when the trace is
    loaded, which names the line)."""
    f = tmp_path / "az.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,x,3\n")
    source = TraceSource(path=str(f), format="azure")
    assert "input_tokens" in check_trace_files(source).fields
    with pytest.raises(ScenarioError, match="line 2, column ContextTokens"):
        load_trace(source)


def test_a_file_changed_since_its_last_check_is_checked_again(tmp_path: Path) -> None:
    """Checks are kept per source and file state: a file rewritten without a needed column
    fails its next check."""
    f = tmp_path / "az.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4,3\n")
    source = TraceSource(path=str(f), format="azure")
    assert check_trace_files(source) == check_trace_files(source)
    f.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,4\n")
    with pytest.raises(ScenarioError, match=r"missing column\(s\) GeneratedTokens"):
        check_trace_files(source)


def test_a_bad_row_stops_run_with_the_line_and_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` on a trace whose third line is bad exits 2 printing the file and the line, not a
    traceback; ``validate`` (header only) says ok."""
    f = tmp_path / "az.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4,3\n2023-11-16 18:00:01,-4,3\n")
    path = _scenario_file(tmp_path, {"path": str(f), "format": "azure"})
    assert main(["validate", str(path)]) == 0
    assert main(["run", str(path), "--progress", "off"]) == 2
    err = _errors(capsys)
    assert f"{f}: 1 problem(s)" in err and "line 3, column ContextTokens: must be >= 0, got -4" in err


def test_a_missing_servegen_directory_is_refused_by_validate(capsys: pytest.CaptureFixture[str]) -> None:
    """A ServeGen directory that is not there: validate exits 2 at servegen_data.path (it used
    to say ok)."""
    assert main(["validate", "scenarios/servegen_m_large_day.yaml", "--set", "workload.servegen_data.path=no/such/dir"]) == 2
    err = _errors(capsys)
    assert "workload.servegen_data.path: " in err and "no/such/dir: no such directory" in err


@pytest.mark.parametrize(
    ("trace", "key"),
    [
        ({"format": "azure", "columns": {"input_tokens": "x"}}, "columns"),
        ({"format": "azure", "arrival_column": "send_time_us"}, "arrival_column"),
        ({"format": "mooncake", "server_block": "ignore"}, "server_block"),
    ],
)
def test_settings_of_another_format_are_refused_on_loading(trace: dict[str, Any], key: str) -> None:
    """columns (csv only), arrival_column and server_block (trace_v2 only) given with another
    format are refused when the scenario is loaded (they used to fail when it ran)."""
    data = tiny_scenario()
    data["workload"] = {"traces": [{"path": AZURE, **trace}]}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert err.value.paths == [f"workload.traces[0].{key}"]


def test_a_bare_workload_spec_is_checked_with_keys_relative_to_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bare workload spec replaying a missing file: validate names ``traces[0].path``."""
    spec = tmp_path / "wl.yaml"
    spec.write_text(yaml.safe_dump({"traces": [{"path": "gone.csv", "format": "azure"}]}))
    assert main(["validate", str(spec)]) == 2
    err = _errors(capsys)
    assert f"{spec}: 1 problem(s) in workload spec" in err and f"traces[0].path: {tmp_path / 'gone.csv'}: file not found" in err
