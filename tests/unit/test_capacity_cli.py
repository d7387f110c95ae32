"""``simpy-llm capacity``: the card printed and written, the replicas search, bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from simpy_llm.cli import main
from simpy_llm.explore.capacity import _doctest_scenario

FAST = ["--warmup-requests", "100", "--measure-requests", "1000", "--quiet"]


@pytest.fixture
def scenario_file(tmp_path):
    """A single FIFO server with 40 ms constant service, as a YAML file."""
    path = tmp_path / "md1.yaml"
    path.write_text(yaml.safe_dump(_doctest_scenario()))
    return str(path)


def test_capacity_prints_the_card_and_writes_it(scenario_file, tmp_path, capsys):
    """The command prints the capacity card and --out writes JSON, CSV, Markdown and PNG."""
    out = tmp_path / "card"
    code = main(["capacity", scenario_file, "--slo", "queue_delay_mean=0.08", "--tolerance", "0.1",
                 "--out", str(out), *FAST])
    assert code == 0
    text = capsys.readouterr().out
    assert "max stable load" in text and "max SLO-goodput load" in text
    card = json.loads((out / "capacity.json").read_text())
    assert card["criteria"]["slo"] == {"queue_delay_mean": 0.08}
    assert 0 < card["max_goodput_load"] < card["max_stable_load"] < 30
    assert sorted(p.name for p in out.iterdir()) == ["capacity.csv", "capacity.json", "capacity.md", "capacity.png"]


def test_capacity_replicas_answers_how_many(scenario_file, capsys):
    """--replicas --load N prints the fewest replicas meeting the SLOs at that load."""
    code = main(["capacity", scenario_file, "--replicas", "--load", "40", "--slo", "queue_delay_mean=0.02", *FAST])
    assert code == 0
    text = capsys.readouterr().out
    assert "replicas needed" in text
    line = next(ln for ln in text.splitlines() if "replicas needed" in ln)
    assert int(line.rsplit(":", 1)[1]) >= 2


def test_capacity_takes_set_overrides_and_seeds(scenario_file, tmp_path):
    """--set applies to every probe and --seeds runs each load under every seed."""
    out = tmp_path / "card"
    code = main(["capacity", scenario_file, "--set", "serving.replicas=2", "--seeds", "3,4", "--low", "20",
                 "--high", "80", "--tolerance", "0.5", "--out", str(out), *FAST])
    assert code == 0
    card = json.loads((out / "capacity.json").read_text())
    assert {p["seed"] for p in card["probes"]} == {3, 4}
    assert card["max_stable_load"] > 25  # above one server's capacity: the override gave two


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "latency_p99=1"], "unknown metric 'latency'"),
        (["--slo", "ttft_p99"], "METRIC_STAT=SECONDS"),
        (["--tolerance", "2"], "tolerance"),
        (["--seeds", "a,b"], "--seeds must be comma-separated integers"),
        (["--replicas", "--low", "3"], "with --replicas give the load with --load"),
        (["--load", "3"], "--load is the fixed load of a --replicas search"),
        (["--set", "serving.bogus=1"], "bogus"),
        (["--min-goodput", "2"], "min_goodput_fraction"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(scenario_file, argv, message, capsys):
    """Bad SLOs, bounds, seeds, flag combinations and overrides exit with status 2 and say why."""
    assert main(["capacity", scenario_file, *argv, *FAST]) == 2
    assert message in capsys.readouterr().err


def test_missing_scenario_exits_2(tmp_path, capsys):
    """A scenario file that does not exist exits with status 2 naming it."""
    missing = str(tmp_path / "nope.yaml")
    assert main(["capacity", missing, *FAST]) == 2
    assert "nope.yaml" in capsys.readouterr().err
