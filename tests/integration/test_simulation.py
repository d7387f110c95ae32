"""End-to-end behaviour of Simulation runs."""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, load_scenario
from tests.helpers import columns_equal, run, tiny_scenario


def test_quickstart_completes_every_request():
    """The quickstart (cut to 500 requests) completes all of them and reports sane metrics."""
    res = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=500"])).run()
    s = res.summary()
    assert {k: s["requests"][k] for k in ("arrived", "completed", "dropped", "in_flight")} == {
        "arrived": 500, "completed": 500, "dropped": 0, "in_flight": 0
    }
    assert 0 < s["latency_s"]["ttft"]["p50"] < s["latency_s"]["e2e"]["p50"]
    assert 0 < s["kv_utilization"]["time_weighted_mean"] <= 1
    assert s["throughput"]["output_tokens_per_s"] > 0


def test_progress_slicing_does_not_change_results():
    """Running in progress slices (for a progress bar) gives the same records as one run."""
    overrides = ["workload.num_requests=800"]
    plain = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run()
    calls = []
    sliced = Simulation(load_scenario("scenarios/quickstart.yaml", overrides)).run(
        progress=lambda done, total, now: calls.append((done, total, now))
    )
    assert columns_equal(plain, sliced) == []
    assert len(calls) > 10
    assert calls[-1][0] == 800 and calls[-1][1] == 800
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_until_leaves_requests_in_flight():
    """With simulation.until_s before the workload drains, unfinished requests are
    recorded as in_flight and the duration is until_s."""
    data = tiny_scenario()
    data["workload"]["num_requests"] = 200
    data["simulation"] = {"until_s": 1.0}
    res = run(data)
    s = res.summary()
    assert s["requests"]["in_flight"] > 0
    assert s["duration_s"] == 1.0
    assert s["requests"]["arrived"] == s["requests"]["completed"] + s["requests"]["dropped"] + s["requests"]["in_flight"]


def test_horizon_stops_arrivals():
    """With horizon_s every arrival happens before the horizon."""
    data = tiny_scenario()
    del data["workload"]["num_requests"]
    data["workload"]["horizon_s"] = 2.0
    res = run(data)
    assert len(res) > 50
    assert res.columns["arrival_s"].max() <= 2.0


def test_least_loaded_spreads_requests_over_replicas():
    """least_loaded sends work to every replica of an evenly loaded pool."""
    data = tiny_scenario()
    data["serving"]["replicas"] = 3
    data["serving"]["router"] = {"kind": "least_loaded"}
    data["workload"]["num_requests"] = 300
    res = run(data)
    counts = [int((res.columns["replica"] == i).sum()) for i in range(3)]
    assert min(counts) > 50


def test_goodput_counts_only_requests_meeting_their_slo():
    """A TTFT target no request can meet gives zero goodput; a loose one counts all."""
    data = tiny_scenario()
    data["slo"] = {"default": {"ttft_s": 1e-9}}
    assert run(data).summary()["goodput"]["fraction"] == 0.0
    data["slo"] = {"default": {"ttft_s": 1e9, "tpot_s": 1e9, "e2e_s": 1e9}}
    assert run(data).summary()["goodput"]["fraction"] == 1.0


def test_a_simulation_runs_once():
    """Calling run() twice raises instead of silently returning stale results."""
    sim = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=10"]))
    sim.run()
    with pytest.raises(RuntimeError):
        sim.run()


def test_save_writes_parquet_equal_to_csv(tmp_path):
    """With pyarrow installed, save() also writes records.parquet holding the same table as records.csv."""
    import pandas as pd

    pytest.importorskip("pyarrow", reason="needs the parquet extra (pyarrow): pip install -e '.[parquet]'")
    res = Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=300"])).run()
    out = res.save(tmp_path)
    from_parquet = pd.read_parquet(out / "records.parquet")
    from_csv = pd.read_csv(out / "records.csv", keep_default_na=False, na_values=[""])
    assert len(from_parquet) == len(from_csv) == 300
    for name in ("request_id", "prompt_tokens", "output_tokens"):
        assert (from_parquet[name].to_numpy() == from_csv[name].to_numpy()).all()
    assert (from_parquet["arrival_s"].to_numpy() == from_csv["arrival_s"].to_numpy()).all()
    assert list(from_parquet["client_id"]) == list(from_csv["client_id"])
