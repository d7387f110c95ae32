"""Replica groups on device profiles: energy, cost, cold starts and thermal throttling.

References are the documented formulas (``docs/devices.md``): energy = devices x
(active_w x busy + idle_w x idle), cost = devices x price x hours, a cold start delays the
first request by ``load_s``, and throttled steps take ``1 / throttle_factor`` as long.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from simpy_llm import Simulation, scenario_from_dict
from simpy_llm.config import ScenarioError
from tests.helpers import tiny_groups

DEVICE = {
    "id": "test-gpu", "role": "target", "vendor": "none", "description": "a test device",
    "compute": {"sustained_tflops": 100.0, "memory_bandwidth_gb_per_s": 1000.0},
    "memory": {"memory_gb": 80}, "energy": {"active_w": 400.0, "idle_w": 50.0},
    "price_per_hour_usd": 3.6, "sources": ["made up for a test"],
}


def _on_device(tmp_path, device: dict | None = None, **group: object) -> dict:
    path = tmp_path / "device.yaml"
    path.write_text(yaml.safe_dump(device or DEVICE))
    return tiny_groups({"name": "g", "count": 1, "device": str(path), **group})


def test_energy_and_cost_follow_busy_time_and_price(tmp_path):
    """energy_j = active_w x busy + idle_w x (duration - busy) per replica; cost = price x
    duration / 3600; per token and per request figures divide by the completed ones."""
    data = _on_device(tmp_path)
    data["serving"]["replica_groups"][0]["count"] = 2
    res = Simulation(scenario_from_dict(data)).run()
    s = res.summary()
    dur = s["duration_s"]
    busy = s["engine"]["busy_s"]
    expected = [400.0 * b + 50.0 * (dur - b) for b in busy]
    assert s["devices"]["energy_j_per_replica"] == pytest.approx(expected, rel=1e-12)
    assert s["devices"]["cost_usd"] == pytest.approx(2 * 3.6 * dur / 3600, rel=1e-12)
    f = res.to_dataframe()
    done = f[f["status"] == "completed"]
    assert s["devices"]["energy_j_per_output_token"] == pytest.approx(sum(expected) / done["output_tokens"].sum())
    tokens = done["prompt_tokens"].sum() + done["output_tokens"].sum()
    assert s["devices"]["cost_usd_per_1k_tokens"] == pytest.approx(2 * 3.6 * dur / 3600 / (tokens / 1000))
    assert s["devices"]["gpus"] == 2 and "cold_starts" not in s["engine"]


def test_a_cold_start_delays_the_first_request_by_the_load_time(tmp_path):
    """A device with cold_start.load_s: the first request's TTFT grows by exactly load_s,
    later ones (the model loaded) not at all; the load counts as busy time."""
    def run(device: dict):
        data = _on_device(tmp_path, device)
        data["workload"]["aggregate_rate"] = 0.2  # requests seconds apart: each alone
        return Simulation(scenario_from_dict(data)).run()

    plain = run(DEVICE).to_dataframe()
    cold = run({**DEVICE, "cold_start": {"load_s": 0.5}})
    f = cold.to_dataframe()
    assert f["arrival_s"][1] > 0.5 + plain["e2e_s"][0]
    assert f["ttft_s"][0] == pytest.approx(plain["ttft_s"][0] + 0.5, rel=1e-9)
    assert (f["ttft_s"][1:] - plain["ttft_s"][1:]).abs().max() < 1e-9
    s = cold.summary()["engine"]
    assert s["cold_starts"] == 1 and s["cold_start_s"] == 0.5
    assert cold.summary()["engine"]["busy_s"][0] == pytest.approx(run(DEVICE).summary()["engine"]["busy_s"][0] + 0.5)


def test_warm_retention_unloads_an_idle_replica(tmp_path):
    """With warm_retention_s, a replica idle longer than it pays the load again: one cold start
    per gap between requests longer than the retention, plus the first."""
    device = {**DEVICE, "cold_start": {"load_s": 0.05}}
    data = _on_device(tmp_path, device, warm_retention_s=0.5)
    data["workload"]["aggregate_rate"] = 1.0
    res = Simulation(scenario_from_dict(data)).run()
    f = res.to_dataframe().sort_values("arrival_s")
    ends = f["completion_s"].cummax().shift()
    gaps = (f["arrival_s"] + 0.0 - ends) > 0.5  # idle longer than the retention before this request
    assert res.summary()["engine"]["cold_starts"] == 1 + int(gaps.sum())
    assert gaps.sum() > 10


def test_throttling_slows_steps_after_continuous_busy_time_in_both_engine_modes(tmp_path):
    """A device that throttles after 0.3 s busy to half speed: a long lone request's decode
    steps take twice as long once 0.3 s of busy time has passed, and the fast engine cuts its
    decode stretch there, so both engine modes write the same records."""
    device = {**DEVICE, "thermal": {"throttle_after_s": 0.3, "throttle_factor": 0.5}}
    data = _on_device(tmp_path, device)
    data["workload"].update(num_requests=1)
    client = data["workload"]["clients"][0]
    client["input_distribution"] = {"type": "constant", "params": {"value": 40}}
    client["output_distribution"] = {"type": "constant", "params": {"value": 400}}
    data["serving"]["replica_groups"][0]["engine"]["kv_num_blocks"] = 1024
    fast = Simulation(scenario_from_dict(data)).run().to_dataframe()
    per_step = copy.deepcopy(data)
    per_step["simulation"] = {"mode": "event_per_step"}
    slow = Simulation(scenario_from_dict(per_step)).run().to_dataframe()
    assert fast.equals(slow)
    # Reference: prefill 2000 + 20 x 40 us; decode steps 2100 us each, doubled from the first
    # step that starts at least 0.3 s after the replica got busy.
    t, steps = 2.8e-3, 0
    while steps < 399:
        t += 2.1e-3 * (2 if t >= 0.3 - 1e-12 else 1)
        steps += 1
    assert fast["e2e_s"][0] == pytest.approx(t, rel=1e-9)


@pytest.mark.parametrize(
    ("device", "group", "fragment"),
    [
        ({**DEVICE, "role": "draft"}, {}, "draft device"),
        ({**DEVICE, "availability": [{"start_s": 1.0, "end_s": 2.0}]}, {}, "availability"),
        (DEVICE, {"warm_retention_s": 10.0}, "nothing to pay again"),
    ],
)
def test_a_device_a_replica_cannot_use_is_refused(tmp_path, device, group, fragment):
    """A draft device, availability windows and warm retention without a cold start are
    refused at the group's device key path."""
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(_on_device(tmp_path, device, **group))
    assert "serving.replica_groups[0]" in str(err.value) and fragment in str(err.value)


def test_a_device_must_match_the_latency_models_gpu():
    """A shipped H100 profile under a latency model profiled on an A100 is refused."""
    data = tiny_groups({
        "name": "g", "device": "h100-sxm",
        "latency_model": {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "A100-80", "tp": 1}},
    })
    with pytest.raises(ScenarioError, match="is a H100, but the latency model runs on A100-80"):
        scenario_from_dict(data)


@pytest.mark.parametrize(("source", "bandwidth"), [("host_memory", 64e9), ("local_nvme", 7e9)])
def test_weights_from_sets_the_cold_start_by_the_weight_bytes(source, bandwidth):
    """weights_from: the first request waits while each GPU reads its share of the weights
    (Llama-3.1-8B on two H100s: its weight bytes per GPU) at the source's bandwidth (host
    memory over the H100's 64 GB/s PCIe link; a 7 GB/s NVMe drive), to the nanosecond."""
    from simpy_llm.serving.hardware import Hardware, gpu_spec, model_spec

    latency = {"kind": "blis_linear", "params": {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 2}}
    data = tiny_groups({"name": "g", "latency_model": latency})
    data["workload"]["aggregate_rate"] = 0.1
    plain = Simulation(scenario_from_dict(data)).run().to_dataframe()
    data["serving"]["replica_groups"][0]["weights_from"] = source
    cold = Simulation(scenario_from_dict(data)).run()
    load = Hardware(model=model_spec("llama-3.1-8b-instruct"), gpu=gpu_spec("H100"), tp=2).weight_bytes_per_gpu / bandwidth
    f = cold.to_dataframe()
    assert f["ttft_s"][0] == pytest.approx(plain["ttft_s"][0] + load, rel=1e-9)
    assert cold.summary()["engine"]["cold_start_s"] == pytest.approx(load, rel=1e-12)
