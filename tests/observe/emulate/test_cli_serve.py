"""`simpy-llm serve`: input errors (the serving itself is tested in test_truth)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from simpy_llm.cli import main


def test_bad_scenario_exits_2_naming_the_key(tmp_path: Path, slow_data: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """serve with an invalid scenario exits 2 and names the bad key, without listening."""
    slow_data["serving"]["replicas"] = 0
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(slow_data))
    assert main(["serve", str(f), "--port", "0"]) == 2
    assert "serving.replicas" in capsys.readouterr().err


def test_port_in_use_exits_2(tmp_path: Path, slow_data: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """serve on a port already taken exits 2 with a message saying where it could not listen."""
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(slow_data))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(f), "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
