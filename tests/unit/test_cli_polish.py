"""The command line's rough edges: --version, help on every scenario option, the list of files
written, and an empty scenario file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import simpy_llm
from simpy_llm import Simulation, load_scenario
from simpy_llm.cli import main

SCENARIO_COMMANDS = ("run", "workload", "serve", "observe", "validate")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``simpy-llm --version`` prints the program name and version and exits 0."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"simpy-llm {simpy_llm.__version__}"


@pytest.mark.parametrize("command", SCENARIO_COMMANDS)
def test_every_scenario_command_documents_set_and_plugin(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each command that reads a scenario explains ``--set`` and offers ``--plugin`` in its help."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--set KEY=VALUE override a scenario value" in text
    assert "--plugin MODULE_OR_FILE import a module" in text


def _wrote(out: str) -> tuple[list[str], Path]:
    match = re.search(r"^wrote (.+) in (\S+)$", out, re.MULTILINE)
    assert match, out
    return match.group(1).split(", "), Path(match.group(2))


def test_run_lists_every_file_it_wrote(tmp_path: Path, quickstart_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The "wrote" line names exactly the files that appeared in --out (time series included when sampled)."""
    out_dir = tmp_path / "out"
    args = ["run", str(quickstart_path), "--out", str(out_dir), "--progress", "off"]
    args += ["--set", "workload.num_requests=40", "--set", "simulation.timeseries_interval_s=1.0"]
    assert main(args) == 0
    names, where = _wrote(capsys.readouterr().out)
    assert where == out_dir
    assert sorted(names) == sorted(p.name for p in out_dir.iterdir())
    assert {"records.csv", "preemptions.csv", "timeseries.csv", "summary.json", "manifest.json"} <= set(names)


def test_save_reports_written_files_and_still_returns_the_directory(tmp_path: Path, quickstart_path: Path) -> None:
    """``save(dir, written=list)`` returns the directory as before and fills the list with the files, in order."""
    results = Simulation(load_scenario(quickstart_path, ["workload.num_requests=30"])).run()
    written: list[Path] = []
    assert results.save(tmp_path / "a", written=written) == tmp_path / "a"
    assert sorted(written) == sorted((tmp_path / "a").iterdir())
    assert written[0].name == "records.csv" and written[-1].name == "manifest.json"
    assert "timeseries.csv" not in [p.name for p in written]  # not sampled, not written


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank lines", "comment"])
def test_an_empty_scenario_file_says_so(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty file (or one holding only comments) is reported as an empty file, not as a NoneType."""
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: 1 problem(s)" in err and "empty file" in err
    assert "NoneType" not in err
