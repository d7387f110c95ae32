"""Generating workloads without simulating them: determinism, agreement with the simulation, CLI."""

from __future__ import annotations

import json

import numpy as np

from simpy_llm import Simulation, load_scenario
from simpy_llm.cli import main
from simpy_llm.workload.export import generate_requests


def test_generation_is_deterministic_per_seed():
    """The same scenario and seed generate identical requests; another seed does not."""
    a = generate_requests(load_scenario("scenarios/two_clients.yaml", ["workload.num_requests=3000"]))
    b = generate_requests(load_scenario("scenarios/two_clients.yaml", ["workload.num_requests=3000"]))
    c = generate_requests(load_scenario("scenarios/two_clients.yaml", ["workload.num_requests=3000", "seed=1"]))
    assert a.equals(b)
    assert not a.equals(c)


def test_generated_requests_equal_the_simulated_arrivals():
    """The table lists the requests the simulation receives: same ids, send times, lengths and
    clients (the clients' networks deliver each ``upload_s`` after it was sent)."""
    scenario = load_scenario("scenarios/two_clients.yaml", ["workload.num_requests=2000"])
    table = generate_requests(scenario)
    c = Simulation(scenario).run().columns
    assert np.array_equal(table.request_id.to_numpy(), c["request_id"])
    assert np.allclose(table.arrival_time_s.to_numpy(), c["arrival_s"] - c["upload_s"], rtol=0, atol=1e-9)
    assert np.array_equal(table.input_tokens.to_numpy(), c["prompt_tokens"])
    assert np.array_equal(table.output_tokens.to_numpy(), c["output_tokens"])
    assert list(table.client_id) == list(c["client_id"])


def test_servegen_generation_is_deterministic():
    """ServeGen clients generate identical requests for one seed."""
    overrides = ["workload.horizon_s=120"]
    a = generate_requests(load_scenario("scenarios/servegen_m_large_day.yaml", overrides))
    b = generate_requests(load_scenario("scenarios/servegen_m_large_day.yaml", overrides))
    assert len(a) > 100 and a.equals(b)


def test_workload_command_writes_trace_summary_and_plots(tmp_path, capsys):
    """`simpy-llm workload` writes a trace v2 file that reads back, a summary with per-client
    rates and CVs, and PNG histograms with --plots."""
    from simpy_llm.workload.traces import read_trace_v2

    out = tmp_path / "wl"
    code = main(["workload", "scenarios/two_clients.yaml", "--out", str(out), "--set", "workload.num_requests=1500", "--plots"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 1500
    assert set(summary["clients"]) == {"high-volume-batch", "realtime-chat"}
    assert summary["clients"]["high-volume-batch"]["interarrival_cv"] > 2.0  # gamma cv 3.5: bursty
    trace_files = sorted(p.name for p in out.iterdir())
    assert {"hist_input_tokens.png", "hist_output_tokens.png", "hist_interarrival_s.png"} <= set(trace_files)
    trace = read_trace_v2(out / "trace.csv")
    assert len(trace.frame) == 1500
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("generated 1500 requests in ")


def test_azure_replay_keeps_count_order_times_and_tokens():
    """Replaying the Azure conversation trace at rate_scale 2 gives one record per row, in
    order, at half the recorded offsets, with the recorded token counts."""
    import csv
    from datetime import datetime

    scenario = load_scenario(
        "scenarios/azure_conversation_replay.yaml",
        ["workload.traces.0.max_requests=3000", "workload.traces.0.rate_scale=2.0"],
    )
    c = Simulation(scenario).run().columns
    with open("data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[:3000]

    def seconds(stamp: str) -> float:
        return datetime.fromisoformat(stamp[:26]).timestamp()

    t0 = seconds(rows[0]["TIMESTAMP"])
    expected = np.array([(seconds(r["TIMESTAMP"]) - t0) / 2.0 for r in rows])
    assert len(c["request_id"]) == 3000
    assert np.all(np.diff(c["arrival_s"]) >= 0)
    assert np.allclose(c["arrival_s"], expected, rtol=0, atol=2e-6)
    assert np.array_equal(c["prompt_tokens"], [int(r["ContextTokens"]) for r in rows])
    assert np.array_equal(c["output_tokens"], [int(r["GeneratedTokens"]) for r in rows])


def test_mooncake_replay_carries_prefix_blocks():
    """Replayed Mooncake rows carry each row's hash ids as prefix blocks of 512 tokens, and
    the replay runs through the simulation."""
    from simpy_llm import scenario_from_dict
    from simpy_llm.config.schema import TraceSource
    from simpy_llm.workload.traces import load_trace, trace_rows
    from tests.helpers import tiny_scenario

    path = "data/mooncake/conversation_trace.jsonl"
    with open(path) as fh:
        raw = [json.loads(line) for _, line in zip(range(200), fh, strict=False)]  # the first 200 lines
    rows = list(trace_rows(load_trace(TraceSource(path=path, format="mooncake", max_requests=200))))
    assert [r[3]["prefix_blocks"] for r in rows] == [tuple(x["hash_ids"]) for x in raw]
    assert {r[3]["prefix_block_tokens"] for r in rows} == {512}

    data = tiny_scenario()
    for key in ("clients", "aggregate_rate", "num_requests"):
        del data["workload"][key]
    data["workload"]["traces"] = [{"path": path, "format": "mooncake", "max_requests": 200}]
    data["serving"]["engine"].update(max_num_batched_tokens=8192, kv_num_blocks=200_000, max_num_seqs=64)
    res = Simulation(scenario_from_dict(data)).run()
    assert len(res) == 200
    assert np.array_equal(res.columns["prompt_tokens"], [x["input_length"] for x in raw])
