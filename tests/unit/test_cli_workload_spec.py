"""The command line with bare workload specs: ``simpy-llm workload`` takes one as it is and writes
what it writes for a scenario with the same workload; ``validate`` checks one as a workload spec;
``run``, ``validate`` and ``serve`` take a scenario whose workload is a file reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simpy_llm.cli import main
from simpy_llm.workload.traces import read_trace_v2

REPO = Path(__file__).resolve().parents[2]
BARE = str(REPO / "scenarios" / "workloads" / "two_clients.yaml")
SCENARIO = str(REPO / "scenarios" / "two_clients.yaml")
BY_REFERENCE = str(REPO / "scenarios" / "two_clients_by_reference.yaml")


def _workload(tmp_path: Path, name: str, *args: str) -> tuple[bytes, dict]:
    """Run ``simpy-llm workload ARGS --out tmp/name``; the trace CSV's bytes and its header."""
    out = tmp_path / name
    assert main(["workload", *args, "--out", str(out)]) == 0
    return (out / "trace.csv").read_bytes(), read_trace_v2(out / "trace").header


def test_a_bare_spec_writes_the_trace_its_scenario_form_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bare two-client spec (seed 42) and the two_clients scenario (root seed 42) cut to the
    same requests write byte-identical request tables; each header names its own file and seed 42."""
    bare_csv, bare_header = _workload(tmp_path, "bare", BARE)
    scenario_csv, scenario_header = _workload(tmp_path, "scenario", SCENARIO, "--set", "workload.num_requests=2000")
    assert bare_csv == scenario_csv and bare_csv.count(b"\n") == 2001
    assert (bare_header["workload_spec"], bare_header["seed"]) == (BARE, 42)
    assert (scenario_header["workload_spec"], scenario_header["seed"]) == (SCENARIO, 42)
    assert "generated 2000 requests" in capsys.readouterr().out


def test_a_cap_on_requests_in_flight_is_written_into_the_header(tmp_path: Path) -> None:
    """The requests of a workload with max_concurrency are the same due times as without it, and
    the header says the cap they are sent under (absent without one)."""
    capped_csv, capped = _workload(tmp_path, "capped", BARE, "--set", "num_requests=50", "--set", "max_concurrency=3")
    open_csv, open_loop = _workload(tmp_path, "open", BARE, "--set", "num_requests=50")
    assert capped_csv == open_csv
    assert capped["max_concurrency"] == 3 and "max_concurrency" not in open_loop


def test_set_keys_of_a_bare_spec_work_with_and_without_the_workload_prefix(tmp_path: Path) -> None:
    """``--set aggregate_rate=50`` and ``--set workload.aggregate_rate=50`` give the same table, the
    one the scenario referencing the file with ``aggregate_rate: 50`` beside it gives."""
    plain, _ = _workload(tmp_path, "plain", BARE, "--set", "aggregate_rate=50")
    prefixed, _ = _workload(tmp_path, "prefixed", BARE, "--set", "workload.aggregate_rate=50")
    referenced, _ = _workload(tmp_path, "referenced", BY_REFERENCE)
    unchanged, _ = _workload(tmp_path, "unchanged", BARE)
    assert plain == prefixed == referenced != unchanged


def test_seed_overrides_a_bare_specs_own_seed(tmp_path: Path) -> None:
    """``--seed 7`` sets the bare spec's seed (written in the header) and gives what the scenario
    form gives with ``--seed 7``."""
    bare, header = _workload(tmp_path, "bare", BARE, "--seed", "7", "--set", "num_requests=300")
    scenario, _ = _workload(tmp_path, "scenario", SCENARIO, "--seed", "7", "--set", "workload.num_requests=300")
    default, _ = _workload(tmp_path, "default", BARE, "--set", "num_requests=300")
    assert header["seed"] == 7 and bare == scenario != default


def test_a_bad_bare_spec_exits_2_naming_the_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad value in a bare spec (or given with --set) is reported with the file and the key
    path relative to the workload; nothing is written."""
    data = yaml.safe_load(Path(BARE).read_text())
    data["clients"][1]["arrival"] = {"process": "gamma", "cv": 0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["workload", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: 1 problem(s) in workload spec" in err and "clients[1].arrival.cv" in err
    assert main(["workload", BARE, "--out", str(tmp_path / "out"), "--set", "aggregate_rate=-1"]) == 2
    assert "aggregate_rate: must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_and_validate_take_a_scenario_referencing_a_workload_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``validate`` accepts the shipped scenario by reference and ``run`` simulates it with
    ``--set workload.*`` applied after the file is read."""
    assert main(["validate", BY_REFERENCE]) == 0
    args = ["run", BY_REFERENCE, "--progress", "off", "--out", str(tmp_path / "run")]
    assert main([*args, "--set", "workload.num_requests=120", "--set", "workload.clients.0.rate_fraction=1"]) == 0
    assert "simulated 120 requests" in capsys.readouterr().out


def test_run_on_a_bare_spec_says_how_to_simulate_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` on a bare workload spec exits 2 saying it is one and how to reference it."""
    assert main(["run", BARE, "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert err.count("this is a bare workload spec") == 1 and "workload: {file: PATH}" in err


def test_validate_checks_a_bare_spec_as_a_workload_spec(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``validate`` takes a bare workload spec as ``workload`` and ``observe`` do, saying what
    it checked it as: ``PATH: ok: workload spec`` beside a scenario's ``PATH: ok``."""
    assert main(["validate", BARE, str(quickstart_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{BARE}: ok: workload spec", f"{quickstart_path}: ok"] and err == ""


def test_validate_reports_a_bad_bare_spec_with_keys_relative_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    """A bare spec's problem is reported as one of a workload spec, ``--set`` keys relative to
    the workload with or without the ``workload.`` prefix."""
    assert main(["validate", BARE, "--set", "workload.aggregate_rate=-1"]) == 2
    assert main(["validate", BARE, "--set", "aggregate_rate=-1"]) == 2
    err = capsys.readouterr().err
    assert err.count(f"{BARE}: 1 problem(s) in workload spec\n  aggregate_rate: must be > 0") == 2


def test_workload_and_observe_help_say_how_the_file_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    """The help of ``workload`` and ``observe`` says a file is a scenario or a bare spec by content,
    and how ``--set`` keys of a bare spec are written."""
    for command in ("workload", "observe"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "a mapping with serving or workload at the top" in text and "told apart by content" in text
        assert "--set aggregate_rate=5 or --set workload.aggregate_rate=5" in text


def test_cli_server_types_are_the_observers() -> None:
    """The ``--server-type`` choices (written out so the command starts without aiohttp) are the observer's."""
    from simpy_llm.cli import _SERVER_TYPES
    from simpy_llm.observe.server_info import SERVER_TYPES

    assert _SERVER_TYPES == SERVER_TYPES
