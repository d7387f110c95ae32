"""``simpy-llm sweep``: grids from --grid, seeds, the results directory, the table, and bad input (exit 2)."""

from __future__ import annotations

import pandas as pd
import pytest

from simpy_llm.cli import main
from simpy_llm.explore.cli import GridError, parse_grid

SMALL = ["--set", "workload.num_requests=120", "--workers", "1"]


def test_grid_sweep_prints_a_table_and_writes_the_frame(quickstart_path, tmp_path, capsys):
    """A two-key grid under two seeds prints one table row per run and writes the frame to DIR/sweep.csv."""
    code = main([
        "sweep", str(quickstart_path), "--grid", "workload.aggregate_rate=5,20", "--grid", "serving.engine.max_num_seqs=16",
        "--seeds", "1,2", "--out", str(tmp_path), *SMALL,
    ])
    out, err = capsys.readouterr()
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert frame[["workload.aggregate_rate", "serving.engine.max_num_seqs", "seed"]].to_records(index=False).tolist() == [
        (5.0, 16, 1), (5.0, 16, 2), (20.0, 16, 1), (20.0, 16, 2),
    ]
    assert "throughput.requests_per_s" in out and "latency_s.ttft.p99" in out
    assert "4 runs, 4 simulated" in out


def test_rerun_with_out_loads_every_run(quickstart_path, tmp_path, capsys):
    """Running the same sweep again with the same --out simulates nothing and says the runs were loaded."""
    args = ["sweep", str(quickstart_path), "--grid", "workload.aggregate_rate=5,20", "--out", str(tmp_path), *SMALL]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert f"2 runs (2 loaded from {tmp_path}), 0 simulated" in capsys.readouterr().out


def test_metrics_option_keeps_and_shows_those_columns(quickstart_path, tmp_path, capsys):
    """--metrics keeps only the named summary columns in the frame and shows them in the table."""
    code = main([
        "sweep", str(quickstart_path), "--grid", "workload.aggregate_rate=5", "--metrics", "requests.arrived,latency_s.e2e.mean",
        "--out", str(tmp_path), *SMALL,
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert list(pd.read_csv(tmp_path / "sweep.csv").columns) == [
        "workload.aggregate_rate", "seed", "overloaded", "requests.arrived", "latency_s.e2e.mean", "wall_s",
    ]
    assert "requests.arrived" in out and "120" in out


def test_set_overrides_apply_to_every_point(quickstart_path, tmp_path, capsys):
    """--set values reach every run (here the request count), beside the grid's key."""
    assert main(["sweep", str(quickstart_path), "--grid", "seed=1,2", "--out", str(tmp_path), *SMALL]) == 0
    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert frame["requests.arrived"].tolist() == [120.0, 120.0]
    assert frame["seed"].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grid", "serving.engine.max_num_seq=8"], "max_num_seq"),
        (["--grid", "serving.engine.max_num_seqs=8,-1"], "max_num_seqs"),
        (["--grid", "workload.aggregate_rate"], "KEY=V1,V2"),
        (["--grid", "workload.aggregate_rate="], "no values"),
        (["--grid", "workload.aggregate_rate=[1,"], "not valid YAML"),
        (["--grid", "seed=1", "--grid", "seed=2"], "given twice"),
        ([], "at least one --grid"),
        (["--grid", "workload.aggregate_rate=5", "--seeds", "1,x"], "--seeds"),
        (["--grid", "workload.aggregate_rate=5", "--metrics", "throughput.request_per_s"], "closest: throughput.requests_per_s"),
        (["--grid", "workload.aggregate_rate=5", "--workers", "0"], "--workers"),
    ],
    ids=["unknown key", "bad value", "no equals", "no values", "bad yaml", "key twice", "no grid", "bad seeds", "unknown metric", "no workers"],
)
def test_bad_input_exits_2_with_a_message(quickstart_path, capsys, args, message):
    """Bad input exits with status 2 and a message on stderr naming the problem, without a traceback."""
    code = main(["sweep", str(quickstart_path), "--workers", "1", *args, "--set", "workload.num_requests=60"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_missing_scenario_exits_2(tmp_path, capsys):
    """A scenario file that does not exist is bad input: exit 2 naming the file."""
    assert main(["sweep", str(tmp_path / "nope.yaml"), "--grid", "seed=1"]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_parse_grid_reads_yaml_scalars_and_flow_lists():
    """--grid values are YAML: numbers, null, booleans, quoted strings with commas, and bracketed lists."""
    assert parse_grid(["a=1,2.5,null,true,'x,y'", "b=[1, 2],[3]"]) == {"a": [1, 2.5, None, True, "x,y"], "b": [[1, 2], [3]]}
    with pytest.raises(GridError, match="KEY=V1"):
        parse_grid(["=1,2"])


def test_scheduler_runs_the_sweep_on_a_dask_cluster(quickstart_path, tmp_path, capsys):
    """--scheduler ADDRESS runs the points on that Dask cluster, giving the rows of a run in this process."""
    import warnings

    distributed = pytest.importorskip("distributed", reason="needs the explore extra (dask.distributed): pip install -e '.[explore]'")
    import dask

    # dask's own start-up warnings (a slow machine) are not the sweep's; a loaded machine
    # starts worker processes slowly: more than the default 30 s.
    with warnings.catch_warnings(), dask.config.set({"distributed.comm.timeouts.connect": "120s"}):
        warnings.filterwarnings("ignore", module="distributed")
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0")
    try:
        grid = ["--grid", "workload.aggregate_rate=5,20", "--set", "workload.num_requests=120"]
        code = main(["sweep", str(quickstart_path), *grid, "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "dask")])
        assert code == 0, capsys.readouterr().err
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="distributed")
            cluster.close()
    assert main(["sweep", str(quickstart_path), *grid, "--workers", "1", "--out", str(tmp_path / "here")]) == 0
    on_dask = pd.read_csv(tmp_path / "dask" / "sweep.csv").drop(columns="wall_s")
    here = pd.read_csv(tmp_path / "here" / "sweep.csv").drop(columns="wall_s")
    pd.testing.assert_frame_equal(on_dask, here, check_exact=True)


def test_scheduler_with_a_bad_address_exits_2(quickstart_path, capsys):
    """A scheduler address Dask cannot use is bad input: exit 2 naming the address."""
    pytest.importorskip("distributed", reason="needs the explore extra (dask.distributed): pip install -e '.[explore]'")
    assert main(["sweep", str(quickstart_path), "--grid", "seed=1", "--scheduler", "bogus://nowhere:1"]) == 2
    assert "bogus://nowhere:1" in capsys.readouterr().err
