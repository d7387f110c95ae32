"""simpy_llm.explore.sweep() on executors: the same rows on a process pool, a Dask
LocalCluster and serially; resuming from a results directory; random search; Optuna
studies; replications' confidence intervals.

Every run is the quickstart scenario cut to 150 requests (a few hundredths of a second).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from simpy_llm import ScenarioError
from simpy_llm.explore import RandomSearch, replications, sweep, sweeps
from simpy_llm.explore.sweeps import FRAME_FILE

SMALL = {"workload.num_requests": 150}
GRID = {"workload.aggregate_rate": [10.0, 30.0], "serving.engine.max_num_seqs": [8, 64]}
TP = "throughput.requests_per_s"
NEEDS_EXPLORE = "needs the explore extra (dask.distributed, optuna): pip install -e '.[explore]'"
P99 = "latency_s.ttft.p99"


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Assert two sweep frames equal column for column and value for value, wall_s aside."""
    pd.testing.assert_frame_equal(a.drop(columns="wall_s"), b.drop(columns="wall_s"), check_exact=True)


@pytest.fixture(scope="module")
def serial_frame(quickstart_path_module):
    """The reference: GRID x seeds 1, 2 run in this process."""
    return sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], executor="serial")


@pytest.fixture(scope="module")
def quickstart_path_module():
    """Path of the shipped quickstart scenario (for module-scoped fixtures)."""
    return Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


@pytest.fixture(scope="module")
def pool():
    """One two-process pool shared by the tests of this module (forked from the fork server: a spawned
    worker takes seconds to import the simulator)."""
    executor = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"))
    try:
        yield executor
    finally:
        executor.shutdown(cancel_futures=True)


@pytest.fixture(scope="module")
def dask_client():
    """A two-process Dask LocalCluster on loopback and its Client, closed at the end.

    Warnings dask itself raises while starting or stopping (about a slow, loaded machine)
    are not errors here: they say nothing about the sweep."""
    distributed = pytest.importorskip("distributed", reason=NEEDS_EXPLORE)
    import dask

    # A loaded CI machine starts worker processes slowly: give them more than the default 30 s.
    with warnings.catch_warnings(), dask.config.set({"distributed.comm.timeouts.connect": "120s"}):
        warnings.filterwarnings("ignore", module="distributed")
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        )
    try:
        client = distributed.Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="distributed")
            cluster.close()


def test_process_pool_gives_the_serial_rows(quickstart_path_module, serial_frame, monkeypatch):
    """The default executor (a process pool) gives exactly the serial rows, in point order, every
    run done by the pool's workers (no head start in this process)."""
    monkeypatch.setattr(sweeps._Runner, "head_start", False)
    pooled = sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], max_workers=2)
    same_rows(pooled, serial_frame)
    assert pooled.attrs == {"runs": 8, "loaded": 0, "executor": "pool"}


def test_head_start_in_this_process_gives_the_same_rows(quickstart_path_module, serial_frame):
    """With the default head start (runs done here while the pool's workers start), the rows are the same."""
    same_rows(sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], max_workers=2), serial_frame)


def test_dask_cluster_gives_the_serial_rows(quickstart_path_module, serial_frame, dask_client):
    """A dask.distributed Client (a LocalCluster of two processes) gives exactly the serial rows."""
    on_dask = sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], executor=dask_client)
    same_rows(on_dask, serial_frame)


def test_a_given_executor_is_used_and_left_open(quickstart_path_module, serial_frame, pool):
    """Any concurrent.futures.Executor works, gives the serial rows, and is not shut down by sweep."""
    same_rows(sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], executor=pool), serial_frame)
    assert pool.submit(int, "7").result() == 7  # still open


def test_rows_and_columns_follow_point_order_whatever_the_completion_order(quickstart_path_module):
    """Rows, and columns some runs lack, are in point order even when later points finish first
    (a slow first point on a thread pool): the frame equals the serial one."""
    grid = {"workload.num_requests": [600, 20, 20, 20]}
    with concurrent.futures.ThreadPoolExecutor(4) as threads:
        frame = sweep(quickstart_path_module, grid, executor=threads)
    assert frame["workload.num_requests"].tolist() == [600, 20, 20, 20]
    assert frame["requests.arrived"].tolist() == [600.0, 20.0, 20.0, 20.0]
    same_rows(frame, sweep(quickstart_path_module, grid, executor="serial"))


def test_bad_executor_is_a_type_error(quickstart_path_module):
    """An executor of another kind is a TypeError naming what is allowed; a string other than 'serial' a ValueError."""
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        sweep(quickstart_path_module, GRID, overrides=SMALL, executor=object())
    with pytest.raises(ValueError, match="'serial'"):
        sweep(quickstart_path_module, GRID, overrides=SMALL, executor="threads")


def test_resumed_sweep_runs_nothing_new(quickstart_path_module, tmp_path):
    """A second call with the same results_dir loads every run (same wall_s, files untouched) and runs none."""
    first = sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], executor="serial", results_dir=tmp_path)
    files = {p.name: p.read_text() for p in (tmp_path / "runs").iterdir()}
    assert len(files) == 8 and first.attrs == {"runs": 8, "loaded": 0, "executor": "serial"}
    again = sweep(quickstart_path_module, GRID, overrides=SMALL, seeds=[1, 2], executor="serial", results_dir=tmp_path)
    assert again.attrs == {"runs": 0, "loaded": 8, "executor": "serial"}
    pd.testing.assert_frame_equal(again, first, check_exact=True)  # wall_s too: loaded, not rerun
    assert {p.name: p.read_text() for p in (tmp_path / "runs").iterdir()} == files


def test_partial_results_dir_completes_only_the_missing_runs(quickstart_path_module, tmp_path, pool):
    """With some run files removed, a rerun runs just those and keeps the others' stored rows."""
    first = sweep(quickstart_path_module, GRID, overrides=SMALL, executor="serial", results_dir=tmp_path)
    files = sorted((tmp_path / "runs").iterdir())
    removed = [files[0], files[2]]
    for path in removed:
        path.unlink()
    kept = {p.name: p.read_text() for p in files if p not in removed}
    again = sweep(quickstart_path_module, GRID, overrides=SMALL, executor=pool, results_dir=tmp_path)
    assert again.attrs == {"runs": 2, "loaded": 2, "executor": "given"}
    same_rows(again, first)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [p.name for p in files]
    assert all((tmp_path / "runs" / name).read_text() == text for name, text in kept.items())


def test_results_dir_holds_one_json_per_run_and_the_frame(quickstart_path_module, tmp_path):
    """Each run file records its overrides and row; sweep.csv holds the frame."""
    frame = sweep(quickstart_path_module, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, seeds=[4], executor="serial", results_dir=tmp_path)
    (path,) = (tmp_path / "runs").iterdir()
    data = json.loads(path.read_text())
    assert data["overrides"] == {"workload.num_requests": 150, "workload.aggregate_rate": 10.0, "seed": 4, "workload.seed": 4}
    assert data["row"]["seed"] == 4 and data["row"][TP] == frame[TP].iloc[0]
    written = pd.read_csv(tmp_path / FRAME_FILE)
    assert list(written.columns) == list(frame.columns)
    assert written[TP].tolist() == frame[TP].tolist()


def test_a_changed_scenario_file_invalidates_stored_runs(quickstart_path_module, tmp_path):
    """A stored run is keyed by the scenario file's content: an edited copy runs again."""
    copy = tmp_path / "scenario.yaml"
    copy.write_text(quickstart_path_module.read_text())
    store = tmp_path / "results"
    sweep(copy, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, executor="serial", results_dir=store)
    copy.write_text(quickstart_path_module.read_text() + "\n# edited\n")
    again = sweep(copy, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, executor="serial", results_dir=store)
    assert again.attrs == {"runs": 1, "loaded": 0, "executor": "serial"}
    assert len(list((store / "runs").iterdir())) == 2


def test_a_corrupt_run_file_is_run_again(quickstart_path_module, tmp_path):
    """An unreadable run file (a crash mid-write elsewhere) counts as missing and is rewritten."""
    sweep(quickstart_path_module, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, executor="serial", results_dir=tmp_path)
    (path,) = (tmp_path / "runs").iterdir()
    path.write_text("{not json")
    again = sweep(quickstart_path_module, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, executor="serial", results_dir=tmp_path)
    assert again.attrs == {"runs": 1, "loaded": 0, "executor": "serial"}
    assert json.loads(path.read_text())["row"]["seed"] == 42


def test_random_search_is_reproducible_and_in_range(quickstart_path_module, pool):
    """A RandomSearch draws the same points for the same seed (and other points for another), within its space."""
    space = {"workload.aggregate_rate": (5.0, 30.0), "serving.engine.max_num_seqs": [8, 16, 64]}
    a = sweep(quickstart_path_module, random=RandomSearch(space=space, n=4, seed=3), overrides=SMALL, executor="serial")
    b = sweep(quickstart_path_module, random=RandomSearch(space=space, n=4, seed=3), overrides=SMALL, executor=pool)
    same_rows(a, b)
    assert list(a.columns[:3]) == ["workload.aggregate_rate", "serving.engine.max_num_seqs", "seed"]
    assert a["workload.aggregate_rate"].between(5.0, 30.0).all()
    assert set(a["serving.engine.max_num_seqs"]) <= {8, 16, 64}
    other = RandomSearch(space=space, n=4, seed=4).points()
    assert other != RandomSearch(space=space, n=4, seed=3).points()


def test_random_search_draws_follow_their_dimensions():
    """Integer ranges give integers within bounds, log ranges stay in bounds, a frozen scipy distribution is sampled."""
    search = RandomSearch(
        space={"a": (1, 4), "b": (1.0, 100.0, "log"), "c": (2, 2000, "log"), "d": stats.norm(10.0, 1e-9)},
        n=200,
        seed=0,
    )
    points = search.points()
    a, b, c, d = zip(*points, strict=True)
    assert set(a) == {1, 2, 3, 4}
    assert all(1.0 <= x <= 100.0 for x in b) and np.median(b) == pytest.approx(10.0, rel=0.4)
    assert all(isinstance(x, int) and 2 <= x <= 2000 for x in c)
    assert d == pytest.approx([10.0] * 200)


@pytest.mark.parametrize(
    ("space", "match"),
    [
        ({}, "empty"), ({"a": []}, "no choices"), ({"a": (3, 1)}, "low <= high"), ({"a": (0.0, 1.0, "log")}, "low > 0"),
        ({"a": "x"}, "each value must be"),
    ],
)
def test_random_search_rejects_a_bad_space(space, match):
    """A bad space is an error naming the key and what a dimension may be."""
    with pytest.raises((ValueError, TypeError), match=match):
        RandomSearch(space=space, n=1)


def test_exactly_one_source_of_points(quickstart_path_module):
    """Giving none, or two, of grid / random / study is a ValueError."""
    with pytest.raises(ValueError, match="exactly one"):
        sweep(quickstart_path_module, overrides=SMALL)
    with pytest.raises(ValueError, match="exactly one"):
        sweep(quickstart_path_module, GRID, random=RandomSearch(space={"seed": [1]}, n=1), overrides=SMALL)


def test_optuna_study_is_told_every_trial(quickstart_path_module):
    """Each trial runs under every seed, its row carries the trial number, and the study is told the seed mean."""
    optuna = pytest.importorskip("optuna", reason=NEEDS_EXPLORE)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0))
    space = {"serving.engine.max_num_seqs": optuna.distributions.IntDistribution(4, 64, log=True)}
    frame = sweep(
        quickstart_path_module, study=study, space=space, objective=P99, n_trials=5,
        overrides=SMALL, seeds=[1, 2], executor="serial", metrics=[P99],
    )
    assert list(frame.columns) == ["serving.engine.max_num_seqs", "trial", "seed", "overloaded", P99, "wall_s"]
    assert len(study.trials) == 5
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert sorted(frame["trial"].unique()) == [0, 1, 2, 3, 4]
    for trial in study.trials:
        rows = frame[frame["trial"] == trial.number]
        assert rows["seed"].tolist() == [1, 2]
        assert rows["serving.engine.max_num_seqs"].tolist() == [trial.params["serving.engine.max_num_seqs"]] * 2
        assert trial.value == pytest.approx(rows[P99].mean(), rel=0, abs=0)


def test_optuna_trials_give_the_same_rows_serially(quickstart_path_module, pool):
    """A seeded sampler drives the same trials, and the same rows, on a process pool and serially."""
    optuna = pytest.importorskip("optuna", reason=NEEDS_EXPLORE)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {"workload.aggregate_rate": optuna.distributions.FloatDistribution(5.0, 30.0)}

    def run(**kwargs):
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
        return sweep(quickstart_path_module, study=study, space=space, objective=TP, n_trials=3, overrides=SMALL, metrics=[TP], **kwargs)

    serial, pooled = run(executor="serial"), run(executor=pool)
    same_rows(serial, pooled)
    assert pooled["trial"].tolist() == [0, 1, 2]


def test_study_arguments_are_checked(quickstart_path_module):
    """study= needs space, objective and n_trials; those go with study= only."""
    optuna = pytest.importorskip("optuna", reason=NEEDS_EXPLORE)
    study = optuna.create_study()
    space = {"workload.aggregate_rate": optuna.distributions.FloatDistribution(5.0, 30.0)}
    with pytest.raises(ValueError, match="objective"):
        sweep(quickstart_path_module, study=study, space=space, n_trials=1, overrides=SMALL, executor="serial")
    with pytest.raises(ValueError, match="n_trials"):
        sweep(quickstart_path_module, study=study, space=space, objective=TP, overrides=SMALL, executor="serial")
    with pytest.raises(ValueError, match="study= only"):
        sweep(quickstart_path_module, GRID, n_trials=3, overrides=SMALL, executor="serial")
    with pytest.raises(TypeError, match="optuna distribution"):
        sweep(quickstart_path_module, study=study, space={"seed": [1, 2]}, objective=TP, n_trials=1, overrides=SMALL)
    assert study.trials == []


def test_study_with_an_invalid_point_fails_its_trials(quickstart_path_module):
    """A trial whose value the scenario rejects raises the ScenarioError, and the study is told the trial failed."""
    optuna = pytest.importorskip("optuna", reason=NEEDS_EXPLORE)
    study = optuna.create_study()
    space = {"serving.engine.max_num_seqs": optuna.distributions.IntDistribution(-5, -1)}
    with pytest.raises(ScenarioError, match="max_num_seqs"):
        sweep(quickstart_path_module, study=study, space=space, objective=TP, n_trials=2, overrides=SMALL, executor="serial")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]


def test_replications_match_a_hand_computed_t_interval():
    """replications gives n, mean, sample std and mean -/+ t_{0.975, n-1} s / sqrt(n) per point and metric."""
    frame = pd.DataFrame(
        {
            "rate": [1.0, 1.0, 1.0, 1.0, 2.0, 2.0],
            "seed": [1, 2, 3, 4, 1, 2],
            "ttft": [1.0, 2.0, 4.0, 5.0, 7.0, math.nan],
            "tput": [10.0, 10.0, 10.0, 10.0, 3.0, 5.0],
            "wall_s": [0.1] * 6,
        }
    )
    out = replications(frame, level=0.95)
    assert list(out.columns) == ["rate", "metric", "n", "mean", "std", "ci_low", "ci_high"]
    assert out[["rate", "metric"]].to_records(index=False).tolist() == [(1.0, "ttft"), (1.0, "tput"), (2.0, "ttft"), (2.0, "tput")]
    first = out.iloc[0]
    # ttft at rate 1: mean 3, deviations -2 -1 1 2, s^2 = 10/3, t_{0.975,3} = 3.182446305284263
    half = 3.182446305284263 * math.sqrt(10.0 / 3.0) / 2.0
    assert (first["n"], first["mean"], first["std"]) == (4, 3.0, pytest.approx(math.sqrt(10.0 / 3.0), rel=1e-12))
    assert (first["ci_low"], first["ci_high"]) == (pytest.approx(3.0 - half, rel=1e-12), pytest.approx(3.0 + half, rel=1e-12))
    assert out.iloc[1][["std", "ci_low", "ci_high"]].tolist() == [0.0, 10.0, 10.0]
    lone = out.iloc[2]  # one value once NaN is left out: no spread, no interval
    assert lone["n"] == 1 and lone["mean"] == 7.0 and math.isnan(lone["std"]) and math.isnan(lone["ci_low"])
    # tput at rate 2: mean 4, s = sqrt(2), t_{0.975,1} = 12.706204736174698
    assert out.iloc[3]["ci_high"] == pytest.approx(4.0 + 12.706204736174698 * math.sqrt(2.0) / math.sqrt(2.0), rel=1e-12)


def test_replications_level_and_columns_are_checked():
    """A level outside (0, 1) or a column not in the frame is a ValueError."""
    frame = pd.DataFrame({"rate": [1.0], "seed": [1], "ttft": [1.0], "wall_s": [0.1]})
    with pytest.raises(ValueError, match="level"):
        replications(frame, level=95)
    with pytest.raises(ValueError, match="'nope'"):
        replications(frame, metrics=["nope"])


def test_replications_of_a_sweep_group_by_the_grid_keys(quickstart_path_module, serial_frame):
    """On a sweep frame, replications groups by the grid's keys, with n = the number of seeds."""
    out = replications(serial_frame, [TP, P99])
    assert out[list(GRID)].drop_duplicates().to_records(index=False).tolist() == [(10.0, 8), (10.0, 64), (30.0, 8), (30.0, 64)]
    assert (out["n"] == 2).all() and len(out) == 8
    assert (out["ci_low"] <= out["mean"]).all() and (out["mean"] <= out["ci_high"]).all()


def test_unknown_objective_is_an_error_and_fails_the_trial(quickstart_path_module):
    """An objective no run has is a ValueError naming the closest column; the asked trial is told failed."""
    optuna = pytest.importorskip("optuna", reason=NEEDS_EXPLORE)
    study = optuna.create_study()
    space = {"workload.aggregate_rate": optuna.distributions.FloatDistribution(5.0, 30.0)}
    with pytest.raises(ValueError, match=r"closest: throughput\.requests_per_s"):
        sweep(quickstart_path_module, study=study, space=space, objective="throughput.request_per_s", n_trials=2, overrides=SMALL, executor="serial")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]


PLUGIN = '''
from simpy_llm.policies.routing import routing_policies


@routing_policies.register("sweep_test_last_replica")
class LastReplica:
    """Every request to the last replica."""

    def choose(self, request, view):
        return len(view) - 1
'''


def test_plugins_are_imported_in_the_workers(quickstart_path_module, tmp_path, pool, monkeypatch):
    """plugins= (a file) is imported in each worker too, so a scenario naming its policy runs on a pool."""
    import sys

    import yaml

    from simpy_llm.policies.routing import routing_policies

    monkeypatch.setattr(routing_policies, "_items", dict(routing_policies._items))  # noqa: SLF001
    before = set(sys.modules)
    plugin = tmp_path / "last_replica.py"
    plugin.write_text(PLUGIN)
    data = yaml.safe_load(quickstart_path_module.read_text())
    data["serving"]["replicas"] = 2
    data["serving"]["router"] = {"kind": "sweep_test_last_replica"}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    try:
        frame = sweep(scenario, {"seed": [1, 2]}, overrides=SMALL, plugins=[str(plugin)], executor=pool, metrics=["gpu_utilization.per_replica[0]"])
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("_simpy_llm_plugin_"):
                del sys.modules[name]
    assert frame["gpu_utilization.per_replica[0]"].tolist() == [0.0, 0.0]  # nothing routed to replica 0
