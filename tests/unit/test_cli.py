"""The ``simpy-llm`` command line: validate, and run's input errors and outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from simpy_llm.cli import main
from simpy_llm.loading import load_scenario, scenario_from_dict, scenario_hash


def _write(tmp_path: Path, data: Any, name: str = "s.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(data))
    return f


def _bad_cv(tmp_path: Path, quickstart_data: dict) -> Path:
    quickstart_data["workload"]["clients"][1]["arrival"]["cv"] = -1.0
    return _write(tmp_path, quickstart_data, "bad.yaml")


# --------------------------------------------------------------------------- validate


def test_validate_prints_ok_for_quickstart(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """validate exits 0 and prints '<file>: ok' for the shipped quickstart."""
    assert main(["validate", str(quickstart_path)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{quickstart_path}: ok"
    assert err == ""


def test_validate_bad_scenario_exits_2_with_path_on_stderr(
    tmp_path: Path, quickstart_data: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad scenario exits 2; stderr names the file, the key path and what is allowed."""
    f = _bad_cv(tmp_path, quickstart_data)
    assert main(["validate", str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert str(f) in err
    assert "workload.clients[1].arrival.cv: must be > 0" in err


def test_validate_checks_every_file(
    tmp_path: Path, quickstart_path: Path, quickstart_data: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """With several files, good ones print ok, bad ones are reported, and the status is 2."""
    bad = _bad_cv(tmp_path, quickstart_data)
    assert main(["validate", str(bad), str(quickstart_path)]) == 2
    out, err = capsys.readouterr()
    assert f"{quickstart_path}: ok" in out
    assert str(bad) in err and f"{bad}: ok" not in out


def test_validate_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that does not exist is reported on stderr with exit status 2."""
    f = tmp_path / "missing.yaml"
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "cannot read file" in err


def test_validate_invalid_yaml_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A YAML syntax error exits 2 and stderr gives the file and line."""
    f = tmp_path / "broken.yaml"
    f.write_text("seed: 1\nworkload: [1, 2\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err
    assert re.search(r"not valid YAML: line \d+, column \d+", err)


def test_validate_applies_set_overrides(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """validate --set checks the overridden scenario: a bad override value is reported at its path."""
    assert main(["validate", str(quickstart_path), "--set", "workload.aggregate_rate=-1"]) == 2
    assert "workload.aggregate_rate: must be > 0" in capsys.readouterr().err


def test_validate_set_to_missing_list_index_exits_2(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An override addressing a list item that does not exist exits 2 naming the path."""
    assert main(["validate", str(quickstart_path), "--set", "workload.clients.3.rate_fraction=1"]) == 2
    err = capsys.readouterr().err
    assert "workload.clients.3: no list item '3' (the list has 2)" in err


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse rejects an unknown command with exit status 2."""
    with pytest.raises(SystemExit) as info:
        main(["simulate", "x.yaml"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --------------------------------------------------------------------------- run


def test_run_bad_scenario_exits_2_without_simulating(
    tmp_path: Path, quickstart_data: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """run on a bad scenario exits 2, prints the path on stderr, nothing on stdout, writes nothing."""
    f = _bad_cv(tmp_path, quickstart_data)
    out_dir = tmp_path / "out"
    assert main(["run", str(f), "--out", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "workload.clients[1].arrival.cv" in err
    assert not out_dir.exists()


def test_run_negative_seed_option_is_reported_at_seed(
    quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--seed goes through validation like any override: a negative seed exits 2 at path 'seed'."""
    assert main(["run", str(quickstart_path), "--seed", "-1"]) == 2
    assert "seed: must be >= 0" in capsys.readouterr().err


def test_run_set_to_missing_list_index_exits_2(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run --set with a missing list index exits 2 naming the path."""
    assert main(["run", str(quickstart_path), "--set", "workload.clients.9.id=x"]) == 2
    assert "workload.clients.9" in capsys.readouterr().err


def test_run_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run on a file that does not exist exits 2 with the file named on stderr."""
    f = tmp_path / "nope.yaml"
    assert main(["run", str(f)]) == 2
    assert str(f) in capsys.readouterr().err


def test_run_writes_outputs_and_reports_requests_and_wall_time(
    tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run --out writes records.csv, summary.json and manifest.json; its last line reports requests and wall seconds."""
    out_dir = tmp_path / "out"
    code = main(["run", str(quickstart_path), "--set", "workload.num_requests=300", "--out", str(out_dir)])
    assert code == 0
    for name in ("records.csv", "summary.json", "manifest.json"):
        assert (out_dir / name).is_file(), name
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert re.fullmatch(
        r"simulated 300 requests in \d+\.\d\d wall seconds \((?:[\d,]+|inf) requests per wall-second\)",
        lines[-1],
    ), lines[-1]


def test_run_records_one_row_per_request(
    tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """records.csv holds a header and one row per simulated request."""
    out_dir = tmp_path / "out"
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=300", "--out", str(out_dir)]) == 0
    rows = (out_dir / "records.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 300
    capsys.readouterr()


def test_run_manifest_holds_the_scenario_actually_run(
    tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manifest's scenario (with --set and --seed applied: --seed is the root seed of the
    scenario and of its workload) loads back to the scenario run, with its hash."""
    out_dir = tmp_path / "out"
    args = ["run", str(quickstart_path), "--set", "workload.num_requests=300", "--seed", "7", "--out", str(out_dir)]
    assert main(args) == 0
    capsys.readouterr()
    manifest = json.loads((out_dir / "manifest.json").read_text())
    expected = load_scenario(quickstart_path, ["workload.num_requests=300", "seed=7", "workload.seed=7"])
    assert scenario_from_dict(manifest["scenario"]) == expected
    assert manifest["scenario_sha256"] == scenario_hash(expected)


def test_run_without_out_writes_no_files(
    tmp_path: Path, quickstart_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --out, run prints its summary but creates no files."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=50"]) == 0
    assert "simulated 50 requests in" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_run_prints_an_overload_warning(quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run offered twice what its replica serves ends with the overload warning on the
    terminal; a run within capacity does not."""
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=3000", "--set", "workload.aggregate_rate=40"]) == 0
    out, _ = capsys.readouterr()
    assert "warning: Overload" in " ".join(out.split())
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=3000"]) == 0
    out, _ = capsys.readouterr()
    assert "Overload" not in out


def test_run_without_slo_section_says_goodput_counts_every_completion(
    quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no slo section there is no target to meet: the run table says that goodput counts
    every completed request instead of claiming that all of them met their SLO."""
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=50", "--set", "slo={}"]) == 0
    out = " ".join(re.sub("[│┃]", " ", capsys.readouterr().out).split())  # the table's cells, unwrapped
    assert "no slo section: every completed request counts" in out
    assert "met their SLO" not in out


def test_serve_refuses_an_unwritable_trace_before_serving(
    tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve --trace under a path whose parent is a file exits 2 naming --trace and the path,
    before any server starts."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["serve", str(quickstart_path), "--port", "0", "--trace", str(blocker / "trace")]) == 2
    out, err = capsys.readouterr()
    assert "--trace" in err and str(blocker) in err
    assert "serving" not in out
