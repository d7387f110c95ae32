"""A replayed trace v2's header takes effect: warm-up requests and the server block."""

from __future__ import annotations

import pytest

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from simpy_llm.workload.traces import Trace, write_trace_v2


def _trace(tmp_path, header: dict) -> str:
    n = 40
    frame = {
        "arrival_time_us": [i * 20_000 for i in range(n)],
        "input_tokens": [30 + i for i in range(n)],
        "output_tokens": [10] * n,
    }
    _yaml, csv = write_trace_v2(Trace({"created_at": "2026-01-01T00:00:00Z", **header}, frame), tmp_path / "run")
    return str(csv)


def _scenario(path: str, **source: object) -> dict:
    return {
        "workload": {"traces": [{"path": path, **source}]},
        "serving": {
            "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 256, "kv_block_size": 16, "kv_num_blocks": 256},
            "latency_model": {"kind": "blis_linear", "params": {"beta0_us": 2000.0, "beta1_us": 20.0, "beta2_us": 100.0}},
        },
    }


def test_warm_up_requests_are_simulated_and_left_out_of_the_summary(tmp_path):
    """The header's warm_up_requests first rows are simulated (they complete and load the
    replica) but are flagged warm_up and excluded from the latency statistics."""
    path = _trace(tmp_path, {"warm_up_requests": 10})
    res = Simulation(scenario_from_dict(_scenario(path))).run()
    frame = res.to_dataframe()
    assert frame["warm_up"].tolist() == [1] * 10 + [0] * 30
    assert (frame["status"] == "completed").all()
    s = res.summary()
    assert s["requests"]["warm_up"] == 10
    measured = frame.loc[frame["warm_up"] == 0, "ttft_s"]
    assert s["latency_s"]["ttft"]["mean"] == pytest.approx(measured.mean(), rel=1e-12)


def test_a_server_block_that_contradicts_the_engine_is_rejected_naming_both(tmp_path):
    """A trace recorded with max_num_seqs 4 cannot be replayed on an engine with 16 unless
    the scenario says to ignore the server block; matching settings replay as they are."""
    path = _trace(tmp_path, {"server": {"type": "vllm", "max_num_seqs": 4, "block_size": 16}})
    with pytest.raises(ScenarioError) as err:
        Simulation(scenario_from_dict(_scenario(path))).run()
    assert err.value.paths == ["serving.engine.max_num_seqs"]
    assert "server.max_num_seqs = 4" in str(err.value) and "server_block: ignore" in str(err.value)
    assert Simulation(scenario_from_dict(_scenario(path, server_block="ignore"))).run().summary()["requests"]["completed"] == 40
    data = _scenario(path)
    data["serving"]["engine"]["max_num_seqs"] = 4
    assert Simulation(scenario_from_dict(data)).run().summary()["requests"]["completed"] == 40
