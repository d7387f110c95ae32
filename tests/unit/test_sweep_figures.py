"""What a sweep's rows say: whole-run seeds, identical replications, the overload flag, the point
an error belongs to, and the process pool from a plain script."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from simpy_llm import ScenarioError, Simulation, load_scenario
from simpy_llm.cli import main
from simpy_llm.explore import replications, run_point, sweep
from simpy_llm.explore.sweeps import IdenticalReplicationsWarning, SweepPointError
from simpy_llm.metrics.diagnostics import overload_judged
from simpy_llm.policies import routing_policies
from tests.unit.test_rate_windows import deterministic_server

ROOT = Path(__file__).resolve().parents[2]
BY_REFERENCE = ROOT / "scenarios" / "two_clients_by_reference.yaml"
FLEET = ROOT / "scenarios" / "heterogeneous_fleet.yaml"
SMALL = {"workload.num_requests": 60}


# --- seeds --------------------------------------------------------------------------------
def test_seeds_vary_a_workload_that_carries_its_own_seed():
    """two_clients_by_reference reads a workload file with ``seed: 42``: each seed of a sweep
    is the whole run's root seed, so the three runs' arrivals differ (their offered rates and
    workload seeds too)."""
    frame = sweep(BY_REFERENCE, {"serving.replicas": [2]}, seeds=[1, 2, 3], overrides=SMALL, executor="serial",
                  metrics=["throughput.offered_requests_per_s", "latency_s.e2e.mean"])
    offered = frame["throughput.offered_requests_per_s"].tolist()
    assert len(set(offered)) == 3
    assert len(set(frame["latency_s.e2e.mean"].tolist())) == 3
    for seed in (1, 2, 3):
        assert load_scenario(BY_REFERENCE, {"seed": seed, "workload.seed": seed}).workload.seed == seed


def test_a_seed_without_a_workload_seed_gives_the_run_the_scenario_seed_gives(quickstart_path):
    """Without a workload seed of its own the workload follows the scenario's seed, so a sweep's
    seed 4 gives the row of the run with only ``seed: 4`` set, figure for figure."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [15.0]}, seeds=[4], overrides=SMALL, executor="serial")
    alone = run_point(quickstart_path, {**SMALL, "workload.aggregate_rate": 15.0, "seed": 4})
    row = frame.iloc[0]
    for name, value in alone.items():
        if name != "wall_s":
            assert row[name] == value or (math.isnan(row[name]) and math.isnan(value)), name


def test_a_workload_seed_in_the_overrides_holds_the_workload_under_seeds():
    """``workload.seed`` given in the overrides is kept: the seeds then vary the serving side only,
    and every run sees the same arrivals (the same offered rate). This fleet's serving side draws
    nothing at random, so the rows come out identical, and the sweep says so."""
    with pytest.warns(IdenticalReplicationsWarning, match="seeds 1, 2 gave identical rows"):
        frame = sweep(BY_REFERENCE, {"serving.replicas": [2]}, seeds=[1, 2], overrides={**SMALL, "workload.seed": 5},
                      executor="serial", metrics=["throughput.offered_requests_per_s"])
    assert frame["seed"].tolist() == [1, 2]
    offered = frame["throughput.offered_requests_per_s"].tolist()
    assert offered[0] == offered[1]


def test_cli_seed_sets_the_workload_seed_too(capsys):
    """``--seed 7`` on a scenario whose workload file has ``seed: 42`` runs both with 7: two seeds
    give two different summaries (the workload's arrivals move)."""
    outputs = []
    for seed in ("1", "2"):
        assert main(["run", str(BY_REFERENCE), "--set", "workload.num_requests=60", "--seed", seed, "--progress", "off"]) == 0
        outputs.append(capsys.readouterr().out.split("simulated 60 requests")[0])
    assert outputs[0] != outputs[1]


# --- identical replications ----------------------------------------------------------------
@pytest.fixture
def deterministic_path(tmp_path) -> Path:
    path = tmp_path / "dd1.yaml"
    path.write_text(yaml.safe_dump(deterministic_server(n=40)))
    return path


def test_identical_replications_warn_naming_the_point_and_the_seeds(deterministic_path):
    """Evenly spaced arrivals and a constant service do not depend on the seed: the three seeds
    of each point give identical rows, and the sweep warns once per point, naming it; their
    replications interval has zero width."""
    with pytest.warns(IdenticalReplicationsWarning) as caught:
        frame = sweep(deterministic_path, {"workload.aggregate_rate": [5.0, 8.0]}, seeds=[1, 2, 3], executor="serial")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert messages[0].startswith("sweep point workload.aggregate_rate=5.0: seeds 1, 2, 3 gave identical rows")
    assert messages[1].startswith("sweep point workload.aggregate_rate=8.0: seeds 1, 2, 3 gave identical rows")
    stats = replications(frame, ["latency_s.e2e.mean"])
    assert stats["std"].tolist() == [0.0, 0.0]


def test_the_command_line_prints_the_identical_replications_warning_as_one_line(deterministic_path, capsys):
    """``simpy-llm sweep`` prints each warning as one line on standard error."""
    code = main(["sweep", str(deterministic_path), "--grid", "workload.aggregate_rate=5", "--seeds", "1,2",
                 "--workers", "1", "--progress", "off"])
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines == [(
        "warning: sweep point workload.aggregate_rate=5: seeds 1, 2 gave identical rows (every summary figure "
        "equal): the runs do not depend on the seed, so their replications() interval has zero width and says "
        "nothing about the variability"
    )]


# --- the overload flag ----------------------------------------------------------------------
def test_every_row_carries_the_overload_diagnostic(quickstart_path):
    """Quickstart's replica runs 600 requests at 5/s without a queue and is swamped at 200/s:
    the flag is 0 and 1, as the runs' own diagnostics say; 60 requests are too few to judge (NaN),
    even with metrics= keeping other columns only."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [5.0, 200.0]}, overrides={"workload.num_requests": 600},
                  executor="serial", metrics=["latency_s.ttft.p50"])
    assert frame["overloaded"].tolist() == [0.0, 1.0]
    for rate, flag in ((5.0, 0.0), (200.0, 1.0)):
        results = Simulation(load_scenario(quickstart_path, {"workload.num_requests": 600, "workload.aggregate_rate": rate})).run()
        codes = [d["code"] for d in results.summary()["diagnostics"]]
        assert ("overload" in codes) == (flag == 1.0) and overload_judged(results)
    short = sweep(quickstart_path, {"workload.aggregate_rate": [200.0]}, overrides=SMALL, executor="serial")
    assert math.isnan(short["overloaded"].item())


def test_replications_leave_the_flag_out_unless_named(quickstart_path):
    """The flag is not a figure to average by default; named, its mean is the share of seeds overloaded."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [200.0]}, seeds=[1, 2],
                  overrides={"workload.num_requests": 600}, executor="serial", metrics=["latency_s.ttft.p50"])
    assert replications(frame)["metric"].tolist() == ["latency_s.ttft.p50"]
    assert replications(frame, ["overloaded"])["mean"].tolist() == [1.0]


def test_the_sweep_table_shows_the_flag(quickstart_path, capsys):
    """The command line's table has an ``overloaded`` column (no, yes) and says how many runs were."""
    code = main(["sweep", str(quickstart_path), "--grid", "workload.aggregate_rate=5,200", "--set",
                 "workload.num_requests=600", "--workers", "1", "--progress", "off"])
    assert code == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("5 ", "200 "))]
    assert [row[4] for row in rows] == ["no", "yes"]  # rate, │, seed, │, overloaded
    assert "overloaded" in out.splitlines()[1]
    assert "1 of 2 runs overloaded" in out


# --- the point an error belongs to --------------------------------------------------------------
def test_a_point_that_does_not_load_is_named_with_what_to_do():
    """heterogeneous_fleet's router is power_of_d with params {d: 2}; a grid over
    serving.router.kind keeps the params, which round_robin rejects: the error names the
    point and says how to replace the whole block."""
    with pytest.raises(SweepPointError) as info:
        sweep(FLEET, {"serving.router.kind": ["least_loaded", "round_robin"]}, seeds=[3], overrides=SMALL,
              executor="serial")
    error = info.value
    assert isinstance(error, ScenarioError)
    assert error.point == {"serving.router.kind": "least_loaded", "seed": 3}
    text = str(error)
    assert text.startswith(f"{FLEET} at sweep point serving.router.kind=least_loaded, seed=3: 1 problem(s) in scenario")
    assert "serving.router.params.d: unknown key" in text
    assert "vary serving.router itself with mappings, e.g. --grid 'serving.router={kind: least_loaded}'" in text


def test_a_grid_of_mappings_replaces_the_whole_block_and_shows_it_as_written(capsys):
    """``--grid 'serving.router={kind: round_robin},{kind: least_loaded}'`` replaces the router
    block, params included, and the table shows each value as it was written."""
    code = main(["sweep", str(FLEET), "--grid", "serving.router={kind: round_robin},{kind: least_loaded}",
                 "--set", "workload.num_requests=60", "--workers", "1", "--progress", "off"])
    assert code == 0
    out = capsys.readouterr().out
    assert "{kind: round_robin}" in out and "{kind: least_loaded}" in out
    scenario = load_scenario(FLEET, {"serving.router": {"kind": "least_loaded"}})
    assert scenario.serving.router.kind == "least_loaded" and not scenario.serving.router.params


def test_replications_group_points_that_are_whole_blocks():
    """Points holding mappings (whole router blocks) are grouped per block by replications,
    each with its own mean over its two seeds."""
    routers = [{"kind": "round_robin"}, {"kind": "power_of_d", "params": {"d": 2}}]
    frame = sweep(FLEET, {"serving.router": routers}, seeds=[1, 2], overrides=SMALL, executor="serial",
                  metrics=["latency_s.e2e.mean"])
    stats = replications(frame)
    assert stats["serving.router"].tolist() == routers
    for router, mean in zip(routers, stats["mean"], strict=True):
        rows = frame[[value == router for value in frame["serving.router"]]]
        assert mean == pytest.approx(rows["latency_s.e2e.mean"].mean(), rel=1e-12)


@pytest.fixture
def failing_router():
    """A router that fails on its third request."""

    @routing_policies.register("fails_late")
    class FailsLate:
        def __init__(self) -> None:
            self.seen = 0

        def choose(self, request, view):
            self.seen += 1
            if self.seen == 3:
                raise RuntimeError("this router gives up")
            return 0

    yield "fails_late"
    routing_policies._items.pop("fails_late")  # the test registered it


def test_a_run_that_fails_carries_its_point_in_a_note(quickstart_path, failing_router):
    """An error raised while a point runs keeps its type and message and gains a note naming the point."""
    with pytest.raises(RuntimeError, match="this router gives up") as info:
        sweep(quickstart_path, {"workload.aggregate_rate": [5.0]}, seeds=[2],
              overrides={**SMALL, "serving.router.kind": failing_router}, executor="serial")
    assert info.value.__notes__ == ["at sweep point workload.aggregate_rate=5.0, seed=2"]


# --- a plain script -------------------------------------------------------------------------
SCRIPT = """\
from simpy_llm.explore import sweep, replications
{indent}frame = sweep({scenario!r}, {{"workload.aggregate_rate": [5.0, 10.0]}}, seeds=[1, 2],
{indent}              overrides={{"workload.num_requests": 30}})
{indent}print(replications(frame, ["requests.completed"])["mean"].tolist(), frame.attrs["executor"])
"""


def _run_script(tmp_path: Path, guarded: bool) -> subprocess.CompletedProcess[str]:
    body = SCRIPT.format(scenario=str(ROOT / "scenarios" / "quickstart.yaml"), indent="    " if guarded else "")
    if guarded:
        head, rest = body.split("\n", 1)
        body = head + '\nif __name__ == "__main__":\n' + rest
    path = tmp_path / "snippet.py"
    path.write_text(body)
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_plain_script_runs_the_sweep_in_its_own_process_with_one_warning(tmp_path):
    """The README's kind of snippet, saved as a script without an ``if __name__ == "__main__":``
    block, runs (a pool's workers would run the script again): the sweep runs in the script's
    process, prints its result, and a single warning says what to do."""
    done = _run_script(tmp_path, guarded=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[30.0, 30.0] serial"
    warning = [line for line in done.stderr.splitlines() if "Warning" in line]
    assert len(warning) == 1 and 'outside an \'if __name__ == "__main__":\' block' in warning[0]
    assert "Traceback" not in done.stderr and "bootstrapping" not in done.stderr


def test_a_guarded_script_runs_on_the_process_pool(tmp_path):
    """Under ``if __name__ == "__main__":`` the same sweep uses the pool, without a warning."""
    done = _run_script(tmp_path, guarded=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[30.0, 30.0] pool"
    assert "Warning" not in done.stderr


def test_rows_are_numbers_of_the_flag_and_the_figures(quickstart_path):
    """The flag column is float (1.0, 0.0 or NaN), next to seed, before the summary columns."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [5.0]}, overrides=SMALL, executor="serial")
    columns = list(frame.columns)
    assert columns[:3] == ["workload.aggregate_rate", "seed", "overloaded"]
    assert frame["overloaded"].dtype == np.float64
