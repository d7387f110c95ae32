"""Output paths are checked before any work: every command with ``--out`` refuses a path it
cannot write, naming it and the operating system's reason, before it simulates or sends
anything. (Paths are made unwritable by a file standing where a directory must be: that
holds for any user, the superuser included, unlike permission bits.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from simpy_llm.cli import main
from simpy_llm.output_paths import OutputPathError, check_output_dir, check_output_file

CALIBRATION_TRACE = str(Path(__file__).resolve().parents[1] / "data" / "calibration" / "llamacpp_open_loop")


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A regular file: no directory can be made at it or under it."""
    f = tmp_path / "taken"
    f.write_text("x")
    return f


def test_check_output_dir_leaves_the_file_system_as_it_was(tmp_path: Path) -> None:
    """A missing directory passes (it can be made) and is not left behind; an existing one
    keeps exactly its files (the probe file is removed)."""
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").write_text("x")
    check_output_dir(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]


def test_check_output_dir_refuses_a_file_and_a_path_under_a_file(a_file: Path) -> None:
    """A file where the directory goes, or on its way, is refused with the OS's reason."""
    with pytest.raises(OutputPathError, match=f"^--out {a_file}: cannot write a directory there: it is a file$"):
        check_output_dir(a_file)
    with pytest.raises(OutputPathError, match=f"^--out {a_file}/sub: cannot write a directory there: Not a directory$"):
        check_output_dir(a_file / "sub")


def test_check_output_file_refuses_a_directory_and_a_parent_that_is_a_file(tmp_path: Path, a_file: Path) -> None:
    """A file to write cannot be a directory, nor sit under a file; an absent one in a new
    directory is fine (the directory can be made; it is not left behind)."""
    with pytest.raises(OutputPathError, match="cannot write a file there: it is a directory"):
        check_output_file(tmp_path)
    with pytest.raises(OutputPathError, match=f"cannot write a file there: {a_file} is a file, not a directory$"):
        check_output_file(a_file / "p.yaml")
    assert check_output_file(tmp_path / "new" / "p.yaml") == tmp_path / "new" / "p.yaml"
    assert not (tmp_path / "new").exists()


def test_run_refuses_an_unwritable_out_before_simulating(quickstart_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``run --out FILE`` exits 2 with the path and reason and prints no summary (it used to
    simulate, then fail writing)."""
    assert main(["run", str(quickstart_path), "--set", "workload.num_requests=50", "--progress", "off", "--out", str(a_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"--out {a_file}: cannot write a directory there: it is a file"


def test_workload_refuses_an_unwritable_out_before_generating(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``workload --out`` under a file exits 2 before generating anything."""
    assert main(["workload", "scenarios/workloads/two_clients.yaml", "--out", str(a_file / "w")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"--out {a_file}/w: cannot write a directory there: Not a directory"


def test_sweep_refuses_an_unwritable_out_before_any_run(quickstart_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sweep --out FILE`` exits 2 with the message before running a point."""
    args = ["sweep", str(quickstart_path), "--grid", "seed=1,2", "--set", "workload.num_requests=20", "--workers", "1"]
    assert main([*args, "--out", str(a_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"--out {a_file}: cannot write a directory there: it is a file"


def test_capacity_refuses_an_unwritable_out_before_any_probe(quickstart_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``capacity --out FILE`` exits 2 before the search (it used to search, then fail writing the card)."""
    assert main(["capacity", str(quickstart_path), "--slo", "ttft_p99=0.5", "--out", str(a_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"simpy-llm capacity: --out {a_file}: cannot write a directory there: it is a file"


def test_calibrate_refuses_unwritable_outputs_before_replaying(tmp_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``calibrate compare --out FILE``, ``calibrate fit --out DIR`` (a profile is a file) and
    ``fit --report FILE`` exit 2 with the path, before any replay."""
    assert main(["calibrate", "compare", CALIBRATION_TRACE, "--out", str(a_file)]) == 2
    assert main(["calibrate", "fit", CALIBRATION_TRACE, "--out", str(tmp_path)]) == 2
    assert main(["calibrate", "fit", CALIBRATION_TRACE, "--out", str(tmp_path / "p.yaml"), "--report", str(a_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"--out {a_file}: cannot write a directory there: it is a file",
        f"--out {tmp_path}: cannot write a file there: it is a directory",
        f"--report {a_file}: cannot write a directory there: it is a file",
    ]


def test_observe_refuses_an_unwritable_out_before_sending(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``observe --out`` under a file exits 2 with the path before it contacts the server (the
    URL here has no server: reaching for it would be another error)."""
    args = ["observe", "scenarios/workloads/two_clients.yaml", "--url", "http://127.0.0.1:9", "--set", "num_requests=3"]
    assert main([*args, "--out", str(a_file / "obs")]) == 2
    assert capsys.readouterr().err.strip() == f"--out {a_file}/obs: cannot write a directory there: Not a directory"
