"""simpy_llm.explore.sweep(): grid order, seeds, determinism, column naming and input errors.

Every run is the quickstart scenario cut to a few hundred requests (well under a second).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simpy_llm import ScenarioError, Simulation, explore, load_scenario
from simpy_llm.explore import column_name, summary_columns
from simpy_llm.explore import sweeps as sweep_module

SMALL = {"workload.num_requests": 200}
TP = "throughput.requests_per_s"


def sweep(*args, **kwargs):
    """explore.sweep, in this process unless told otherwise (the executors have their own
    tests, in test_sweep_executors.py; a process pool per test would only add start-up time)."""
    kwargs.setdefault("executor", "serial")
    return explore.sweep(*args, **kwargs)


@pytest.fixture
def count_runs(monkeypatch):
    """The number of runs started so far (run_point calls), as a one-item list."""
    calls = [0]
    real = sweep_module.run_point

    def counting(path, overrides):
        calls[0] += 1
        return real(path, overrides)

    monkeypatch.setattr(sweep_module, "run_point", counting)
    return calls


def test_points_are_the_grid_product_in_order(quickstart_path):
    """Rows are the Cartesian product of the grid, first key slowest, in the values' order."""
    frame = sweep(
        quickstart_path,
        {"serving.engine.max_num_seqs": [64, 8], "workload.aggregate_rate": [10.0, 20.0, 30.0]},
        overrides=SMALL,
    )
    assert frame[["serving.engine.max_num_seqs", "workload.aggregate_rate"]].to_records(index=False).tolist() == [
        (64, 10.0), (64, 20.0), (64, 30.0), (8, 10.0), (8, 20.0), (8, 30.0),
    ]
    assert list(frame.index) == list(range(6))


def test_columns_are_grid_keys_seed_summary_then_wall(quickstart_path):
    """Columns: the grid keys as given, ``seed``, the summary columns, and ``wall_s`` last."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [10.0], "serving.engine.max_num_seqs": [32]}, overrides=SMALL)
    columns = list(frame.columns)
    assert columns[:3] == ["workload.aggregate_rate", "serving.engine.max_num_seqs", "seed"]
    assert columns[-1] == "wall_s"
    assert len(set(columns)) == len(columns)
    assert {TP, "latency_s.ttft.p99", "duration_s.value", "latency_s_by_class.ttft.p99[interactive]"} <= set(columns)
    assert frame["seed"].dtype == np.int64
    assert all(frame[c].dtype == np.float64 for c in columns[3:])


def test_summary_columns_match_a_run_by_hand(quickstart_path):
    """The summary columns of a one-point sweep are that run's summary_frame rows, named by column_name."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [15.0]}, overrides=SMALL)
    results = Simulation(load_scenario(quickstart_path, {**SMALL, "workload.aggregate_rate": 15.0})).run(progress=False)
    expected = {
        column_name(s, m, st, g): v for s, m, st, g, v in results.summary_frame().itertuples(index=False, name=None)
    }
    got = frame.drop(columns=["workload.aggregate_rate", "seed", "overloaded", "wall_s"]).iloc[0].to_dict()
    assert list(got) == list(expected)
    assert got == pytest.approx(expected, nan_ok=True, rel=0, abs=0)


def test_column_name_drops_a_metric_equal_to_its_section():
    """Names are section.metric.statistic, without a metric equal to the section, with [group] when grouped."""
    assert column_name("throughput", "throughput", "requests_per_s", "") == "throughput.requests_per_s"
    assert column_name("latency_s", "ttft", "p99", "") == "latency_s.ttft.p99"
    assert column_name("requests", "requests", "dropped_by_class", "gold/max_queue") == "requests.dropped_by_class[gold/max_queue]"
    assert column_name("goodput", "by_class", "fraction", "batch") == "goodput.by_class.fraction[batch]"


def test_seeds_replicate_each_point(quickstart_path):
    """With seeds, each point runs once per seed (seeds fastest) and the seed column holds the seed used."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [10.0, 20.0]}, overrides=SMALL, seeds=[1, 2, 3])
    assert frame["seed"].tolist() == [1, 2, 3, 1, 2, 3]
    assert frame["workload.aggregate_rate"].tolist() == [10.0] * 3 + [20.0] * 3
    assert frame["latency_s.e2e.mean"].iloc[:3].nunique() == 3  # different seeds, different runs


def test_seed_column_without_seeds_is_the_scenarios_seed(quickstart_path):
    """Without seeds the run uses (and reports) the scenario's own seed, or the one the overrides set."""
    assert sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides=SMALL)["seed"].tolist() == [42]
    overridden = sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides=[*(f"{k}={v}" for k, v in SMALL.items()), "seed=7"])
    assert overridden["seed"].tolist() == [7]


def test_same_inputs_give_the_same_frame_except_wall_time(quickstart_path):
    """Two identical sweeps are equal column for column, wall_s aside."""
    args = (quickstart_path, {"workload.aggregate_rate": [10.0, 25.0]})
    a = sweep(*args, overrides=SMALL, seeds=[5, 6])
    b = sweep(*args, overrides=SMALL, seeds=[5, 6])
    pd.testing.assert_frame_equal(a.drop(columns="wall_s"), b.drop(columns="wall_s"))
    assert (a["wall_s"] > 0).all()


def test_varied_key_changes_the_metric(quickstart_path):
    """The grid's value reaches the run: below saturation, throughput follows the offered load."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [1.0, 4.0]}, overrides=SMALL)
    low, high = frame[TP].tolist()
    assert low == pytest.approx(1.0, rel=0.3)
    assert high == pytest.approx(4.0, rel=0.3)


def test_list_and_mapping_overrides_agree_and_the_grid_wins(quickstart_path):
    """Overrides as "k=v" strings equal the mapping form, and a grid key also overridden takes the grid's value."""
    grid = {"workload.aggregate_rate": [12.0]}
    as_map = sweep(quickstart_path, grid, overrides=SMALL)
    as_list = sweep(quickstart_path, grid, overrides=["workload.num_requests=200", "workload.aggregate_rate=3"])
    pd.testing.assert_frame_equal(as_map.drop(columns="wall_s"), as_list.drop(columns="wall_s"))


def test_numpy_grid_values_are_plain_numbers(quickstart_path):
    """A numpy array of values works (numpy scalars are passed on as Python numbers)."""
    frame = sweep(quickstart_path, {"serving.engine.max_num_seqs": np.array([16, 32])}, overrides=SMALL)
    assert frame["serving.engine.max_num_seqs"].tolist() == [16, 32]


def test_bad_key_raises_the_loaders_error_naming_it(quickstart_path):
    """An unknown grid key surfaces as the loader's ScenarioError naming the key path."""
    with pytest.raises(ScenarioError, match="max_num_seq"):
        sweep(quickstart_path, {"serving.engine.max_num_seq": [8]}, overrides=SMALL)


def test_bad_value_at_a_later_point_fails_before_any_run(quickstart_path, count_runs):
    """Every point is loaded before the first run: an invalid value anywhere costs no simulation."""
    with pytest.raises(ScenarioError, match="max_num_seqs"):
        sweep(quickstart_path, {"serving.engine.max_num_seqs": [8, 16, -1]}, overrides=SMALL)
    assert count_runs[0] == 0


@pytest.mark.parametrize("grid", [{}, {"workload.aggregate_rate": []}], ids=["empty grid", "empty values"])
def test_empty_grid_or_values_is_a_value_error(quickstart_path, grid):
    """An empty grid, or a key with no values, is a ValueError."""
    with pytest.raises(ValueError, match=r"empty|no values"):
        sweep(quickstart_path, grid, overrides=SMALL)


def test_grid_values_must_be_a_list(quickstart_path):
    """A single value where a list is expected (a string would otherwise be iterated) is a TypeError."""
    with pytest.raises(TypeError, match="list of values"):
        sweep(quickstart_path, {"name": "abc"}, overrides=SMALL)


def test_seeds_set_twice_is_an_error(quickstart_path):
    """seeds= together with a seed in the grid or the overrides is a ValueError."""
    with pytest.raises(ValueError, match="one place"):
        sweep(quickstart_path, {"seed": [1, 2]}, overrides=SMALL, seeds=[3])
    with pytest.raises(ValueError, match="one place"):
        sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides={**SMALL, "seed": 1}, seeds=[3])


def test_metrics_keeps_the_named_columns_in_order(quickstart_path):
    """metrics keeps only those summary columns, in the order given, beside the grid, seed and wall_s."""
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, metrics=["latency_s.ttft.p99", TP])
    assert list(frame.columns) == ["workload.aggregate_rate", "seed", "overloaded", "latency_s.ttft.p99", TP, "wall_s"]


def test_unknown_metric_fails_after_the_first_run_with_close_matches(quickstart_path, count_runs):
    """A metric no run has is a ValueError naming the closest columns, raised after the first run."""
    with pytest.raises(ValueError, match=r"throughput\.request_per_s.*closest: throughput\.requests_per_s"):
        sweep(quickstart_path, {"workload.aggregate_rate": [10.0, 20.0, 30.0]}, overrides=SMALL, metrics=["throughput.request_per_s"])
    assert count_runs[0] == 1


def test_metric_group_appearing_in_a_later_run_is_kept(quickstart_path):
    """A grouped column absent from the first run but present in a later one is kept, NaN where absent."""
    frame = sweep(quickstart_path, {"serving.replicas": [1, 2]}, overrides=SMALL, metrics=["gpu_utilization.per_replica[1]"])
    first, second = frame["gpu_utilization.per_replica[1]"].tolist()
    assert math.isnan(first)
    assert 0 < second <= 1


def test_metric_group_no_run_has_is_an_error(quickstart_path):
    """A grouped column of a known figure that no run ends up having is a ValueError."""
    with pytest.raises(ValueError, match=r"per_replica\[5\]"):
        sweep(quickstart_path, {"serving.replicas": [1, 2]}, overrides=SMALL, metrics=["gpu_utilization.per_replica[5]"])


def test_metrics_may_not_name_the_fixed_columns(quickstart_path):
    """seed, wall_s and the grid keys are always columns; naming them in metrics is a ValueError."""
    with pytest.raises(ValueError, match="always a column"):
        sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, metrics=["wall_s"])


def test_progress_prints_one_line_per_run(quickstart_path, capsys):
    """progress=True prints one line per finished run on standard error, and nothing on standard output."""
    sweep(quickstart_path, {"workload.aggregate_rate": [10.0, 20.0]}, overrides=SMALL, seeds=[1, 2], progress=True)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == ""
    assert len(lines) == 4
    assert lines[0].startswith("sweep [1/4] workload.aggregate_rate=10.0, seed=1:")


def test_summary_columns_are_unique_and_float(quickstart_path):
    """summary_columns gives one float per summary figure under distinct names."""
    results = Simulation(load_scenario(quickstart_path, SMALL)).run(progress=False)
    columns = summary_columns(results)
    assert len(columns) == len(results.summary_frame())
    assert all(isinstance(v, float) for v in columns.values())


def test_progress_shows_a_rich_bar_when_watched(quickstart_path, capsys, monkeypatch):
    """On a terminal, progress=True draws a rich bar instead of printing one line per run."""
    import simpy_llm.progress

    monkeypatch.setattr(simpy_llm.progress, "watched", lambda stream=None: (True, False))
    frame = sweep(quickstart_path, {"workload.aggregate_rate": [10.0, 20.0]}, overrides=SMALL, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "sweep [1/2]" not in err
    assert len(frame) == 2


def test_progress_none_shows_nothing_unwatched(quickstart_path, capsys):
    """progress=None (automatic) prints nothing when nobody watches (a test, a pipe)."""
    sweep(quickstart_path, {"workload.aggregate_rate": [10.0]}, overrides=SMALL, progress=None)
    assert capsys.readouterr() == ("", "")


def test_sweeps_page_examples_run(monkeypatch):
    """Every ``>>>`` example of docs/sweeps.md gives the output it shows."""
    import doctest
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    result = doctest.testfile(str(root / "docs" / "sweeps.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_progress_lines_say_which_runs_were_loaded(quickstart_path, tmp_path, capsys):
    """With a results directory, a rerun's progress lines say each run was loaded, not how long it took."""
    grid = {"workload.aggregate_rate": [10.0, 20.0]}
    sweep(quickstart_path, grid, overrides=SMALL, results_dir=tmp_path)
    sweep(quickstart_path, grid, overrides=SMALL, results_dir=tmp_path, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "sweep [1/2] workload.aggregate_rate=10.0, seed=42: loaded",
        "sweep [2/2] workload.aggregate_rate=20.0, seed=42: loaded",
    ]
